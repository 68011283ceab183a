"""Noise and threshold calibration for weight-and-threshold partition selection (pure math).

Every parallel selector in this package follows the weight-and-threshold template (MAD paper,
Algorithm 1 and Theorem 3.3; DPSU paper, Algorithm 1 and Theorems 4.1, 5.1, A.1, A.2, B.1, B.2):
each user contributes at most ``Delta_0`` (``max_contributions``) distinct items, a weighting
algorithm with bounded sensitivity assigns weights to items, noise is added, and items whose noisy
weight reaches a threshold ``rho`` are released. This module computes the noise scale and ``rho``:

* Gaussian noise (l2 sensitivity): ``sigma`` is the analytic Gaussian mechanism (Balle & Wang 2018,
  "Improving the Gaussian mechanism for differential privacy", Theorem 8 / Algorithm 1) calibrated to
  ``(epsilon, delta/2)``, and
  ``rho = max_{t=1..Delta_0} h(t) + sigma * PhiInv((1 - delta/2) ** (1/t))``
  (MAD paper Theorem 3.3, DPSU Theorems 5.1 / B.2 / A.2), where ``h(t)`` bounds the weight of an
  item held only by the new user when that user has ``t`` such novel items (novel l_inf
  sensitivity, MAD paper Definition 3.2).
* Laplace noise (l1 sensitivity): scale ``sensitivity / epsilon`` and
  ``rho = max_t h(t) + (sensitivity/epsilon) * log(1 / (2 * (1 - (1 - delta) ** (1/t))))``
  (DPSU Theorems 4.1 / B.1 / A.1). The Laplace part is pure ``epsilon``-DP on the common support,
  so the whole ``delta`` goes to the novel-item event (unlike the Gaussian's ``delta/2``).

The four single-round selectors of the DPSU paper (section 1.1, appendix B) are:

* weighted Gaussian: each of a user's ``d`` items gets ``1/sqrt(d)``; ``sigma = AGM(eps, delta/2, 1)``,
  ``h(t) = 1/sqrt(t)`` (DPSU Theorem B.2);
* count Gaussian: each item gets 1; ``sigma = AGM(eps, delta/2, sqrt(Delta_0))``, ``h(t) = 1``
  (DPSU Theorem A.2, rescaled);
* weighted Laplace: each item gets ``1/d``; ``Lap(1/eps)``, ``h(t) = 1/t`` (DPSU Theorem B.1);
* count Laplace: each item gets 1; ``Lap(Delta_0/eps)``, ``h(t) = 1`` (DPSU Theorem A.1, rescaled).

Numerics: all quantities are computed in log space / via upper tails so that they are finite and
accurate for ``epsilon`` in [0.001, 100] and ``delta`` down to 1e-30 (and well beyond): the term
``e^eps * Phi(.)`` is never formed directly, and ``PhiInv(q)`` for ``q`` within 1e-30 of 1 is taken
as ``-ndtri(1 - q)`` with ``1 - q`` computed by ``expm1``/``log1p``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Tuple

import numpy as np
from scipy import optimize, special

from dp_partition_beam.privacy.validation import check_int, check_range

__all__ = [
    "Calibration",
    "analytic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_log_delta",
    "gaussian_epsilon",
    "gaussian_threshold",
    "gaussian_threshold_with_argmax",
    "laplace_scale",
    "laplace_threshold",
    "laplace_threshold_with_argmax",
    "calibrate_weighted_gaussian",
    "calibrate_count_gaussian",
    "calibrate_weighted_laplace",
    "calibrate_count_laplace",
    "default_gaussian_h",
    "default_laplace_h",
    "MAX_EPSILON",
    "passes_threshold",
]

# Largest epsilon accepted by the calibration functions (the product itself caps epsilon at 100).
MAX_EPSILON = 1000.0
# Chunk size for the vectorised max over t = 1..Delta_0 (bounds memory for huge Delta_0).
_CHUNK = 1 << 20
# Relative upward safety margin on computed sigma / epsilon (see analytic_gaussian_sigma).
_SIGMA_MARGIN = 1e-10

HFunction = Callable[[np.ndarray], np.ndarray]


def passes_threshold(noisy, rho):
    """The release rule of every weight-and-threshold step: an item is kept iff ``noisy >= rho``.

    Every threshold here is calibrated on the upper tail that INCLUDES rho: :func:`gaussian_threshold`
    bounds ``1 - P[w + Z < rho]^t``, :func:`laplace_threshold` likewise, and DPNE's ``rho_k`` solves
    ``P[N(0, sigma_k^2) >= rho_k] = q_k`` (privacy/dpne.py). Releasing at ``>`` against such a bound is
    safe but a mismatch in the other direction is not: a release at ``>=`` against a bound of the tail
    ``> rho`` misses the mass at rho when the noise is discrete (OpenDP issue 2922). Every release
    step calls this one function (tests/guarantees/test_threshold_invariants.py checks that no other
    comparison with a threshold exists). Works on floats and numpy arrays."""
    return noisy >= rho


# --------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------


def _check_epsilon(epsilon, name="epsilon", allow_zero=False) -> float:
    return check_range(name, epsilon, 0.0, MAX_EPSILON, lo_open=not allow_zero)


def _check_delta(delta, name="delta") -> float:
    return check_range(name, delta, 0.0, 1.0, lo_open=True, hi_open=True)


def _check_positive(name, value) -> float:
    return check_range(name, value, 0.0, math.inf, lo_open=True)


# --------------------------------------------------------------------------------------------------
# Analytic Gaussian mechanism (Balle & Wang 2018)
# --------------------------------------------------------------------------------------------------


def _log_delta(s: float, epsilon: float) -> float:
    """log of ``Phi(1/(2s) - eps*s) - e^eps * Phi(-1/(2s) - eps*s)`` for the normalised ``s = sigma/D``.

    Computed as ``a + log(1 - exp(b - a))`` with ``a = log Phi(1/(2s) - eps s)`` and
    ``b = eps + log Phi(-1/(2s) - eps s)``; returns ``-inf`` if the difference underflows.
    """
    a = float(special.log_ndtr(0.5 / s - epsilon * s))
    b = epsilon + float(special.log_ndtr(-0.5 / s - epsilon * s))
    d = b - a
    if not d < 0.0:
        return -math.inf
    # log(1 - e^d) for d < 0 (log1mexp), accurate on both sides of -log 2.
    if d > -math.log(2.0):
        l1m = math.log(-math.expm1(d))
    else:
        l1m = math.log1p(-math.exp(d))
    return a + l1m


def gaussian_log_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Natural log of :func:`gaussian_delta` (finite where ``gaussian_delta`` would underflow).

    See :func:`gaussian_delta` for the formula (Balle & Wang 2018, Theorem 8).
    """
    sigma = _check_positive("sigma", sigma)
    epsilon = _check_epsilon(epsilon, allow_zero=True)
    sensitivity = _check_positive("sensitivity", sensitivity)
    return _log_delta(sigma / sensitivity, epsilon)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta of the Gaussian mechanism ``N(0, sigma^2)`` with l2 sensitivity ``D`` at ``epsilon``.

    Balle & Wang 2018, Theorem 8 (also DPSU paper section 5 / Theorem 5.1, MAD paper
    Proposition 2.4, Gaussian DP paper (Dong, Roth, Su 2019) Corollary 2.13 with ``mu = D/sigma``)::

        delta(eps) = Phi(D/(2 sigma) - eps sigma/D) - e^eps * Phi(-D/(2 sigma) - eps sigma/D)

    The mechanism is (eps, delta)-DP iff ``delta >= delta(eps)``. Evaluated in log space (no overflow
    of ``e^eps``, no cancellation); returns 0.0 only when the true value is below ~1e-308.
    """
    return math.exp(gaussian_log_delta(sigma, epsilon, sensitivity))


def _round_up_root(func_le_target: Callable[[float], bool], x: float) -> float:
    """Smallest float >= ``x`` (stepping up by ulps, then geometrically) with ``func_le_target``."""
    step = 0
    while not func_le_target(x):
        step += 1
        if step <= 8:
            x = math.nextafter(x, math.inf)
        else:
            x *= 1.0 + 2.0 ** (step - 60)  # geometric growth; only reached on pathological input
        if step > 200:  # pragma: no cover - would mean the bracket search failed
            raise ArithmeticError("could not round the root up")
    return x


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma such that ``N(0, sigma^2)`` on an l2-sensitivity-``D`` query is (eps, delta)-DP.

    Analytic Gaussian mechanism (Balle & Wang 2018, Theorem 8 and Algorithm 1; DPSU paper
    section 5 uses it with ``delta/2``; MAD paper Proposition 2.4): the smallest ``sigma`` with::

        Phi(D/(2 sigma) - eps sigma/D) - e^eps * Phi(-D/(2 sigma) - eps sigma/D) <= delta.

    The left side is strictly decreasing in sigma. We solve in log space for ``s = sigma/D`` by a
    geometric bracket search and Brent's method on ``log s``, then round up ulp by ulp until the
    inequality holds as evaluated. A relative safety margin of 1e-10 covers the float64 evaluation
    error, so the result is never below the true minimum and within a relative 1e-9 of it
    (verified against 60-digit mpmath in the tests).

    Args:
      epsilon: in (0, 1000]; tested for [0.001, 100].
      delta: in (0, 1); tested for [1e-30, 0.5] (and much smaller).
      sensitivity: l2 sensitivity ``D`` > 0 (sigma scales linearly in it).

    Raises:
      ValueError: naming the offending parameter, its value and the allowed range.
    """
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    sensitivity = _check_positive("sensitivity", sensitivity)
    log_target = math.log(delta)

    def g(log_s: float) -> float:
        v = _log_delta(math.exp(log_s), epsilon)
        return max(v, -1e300) - log_target  # -inf -> very negative (still a valid sign for brentq)

    # Bracket: g(lo) > 0 >= g(hi). Start near the classical calibration sqrt(2 log(1.25/delta))/eps.
    guess = math.sqrt(2.0 * (math.log(1.25) - log_target)) / epsilon
    lo = hi = math.log(max(min(guess, 1e100), 1e-100))
    while g(lo) <= 0.0:
        lo -= 1.0
        if lo < -700:  # pragma: no cover - delta(s) -> 1 as s -> 0, and delta < 1
            raise ArithmeticError("failed to bracket sigma from below")
    while g(hi) > 0.0:
        hi += 1.0
        if hi > 700:  # pragma: no cover
            raise ArithmeticError("failed to bracket sigma from above")
    log_s = optimize.brentq(g, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)
    # brentq returns a point within xtol of the root, on either side: take the upper end, then
    # make sure the inequality holds as evaluated.
    # Safety margin of 1e-10 (relative): the float64 evaluation of log(delta(s)) has a relative
    # error of up to ~1e-10 for tiny eps and delta (cancellation between the two Phi terms), which
    # moves the root by < 2e-11 relative over the tested range (checked against mpmath in tests).
    sigma = math.exp(log_s) * (1.0 + _SIGMA_MARGIN) * sensitivity
    return _round_up_root(lambda x: _log_delta(x / sensitivity, epsilon) <= log_target, sigma)


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest epsilon >= 0 for which ``N(0, sigma^2)`` (l2 sensitivity ``D``) is (epsilon, delta)-DP.

    Inverse of :func:`gaussian_delta` in epsilon (Balle & Wang 2018, Theorem 8; the delta there is
    decreasing in epsilon). Returns 0.0 when the mechanism is already (0, delta)-DP. Rounded up, so
    ``gaussian_delta(sigma, gaussian_epsilon(sigma, delta)) <= delta``. Used for reports (e.g. the
    per-round epsilon under Gaussian-DP accounting, see ``privacy.accounting``).
    """
    sigma = _check_positive("sigma", sigma)
    delta = _check_delta(delta)
    sensitivity = _check_positive("sensitivity", sensitivity)
    s = sigma / sensitivity
    log_target = math.log(delta)
    if _log_delta(s, 0.0) <= log_target:
        return 0.0

    def g(eps: float) -> float:
        return max(_log_delta(s, eps), -1e300) - log_target

    lo, hi = 0.0, 1.0
    while g(hi) > 0.0:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError(f"sigma={sigma!r} is too small for delta={delta!r}: epsilon would exceed 1e12")
    eps = optimize.brentq(g, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    return _round_up_root(lambda e: _log_delta(s, e) <= log_target, eps * (1.0 + _SIGMA_MARGIN) + 1e-15)


# --------------------------------------------------------------------------------------------------
# Thresholds
# --------------------------------------------------------------------------------------------------


def default_gaussian_h(t: np.ndarray) -> np.ndarray:
    """``h(t) = 1/sqrt(t)``: novel l_inf sensitivity of the weighted Gaussian / MAD weights."""
    return 1.0 / np.sqrt(t)


def default_laplace_h(t: np.ndarray) -> np.ndarray:
    """``h(t) = 1/t``: novel l_inf sensitivity of the weighted Laplace weights (DPSU Thm B.1)."""
    return 1.0 / t


def _eval_h(h: HFunction, t: np.ndarray) -> np.ndarray:
    out = np.asarray(h(t), dtype=float)
    if out.shape != t.shape:
        try:
            out = np.broadcast_to(out, t.shape)
        except ValueError:
            raise ValueError(
                f"h must map an array of t to an array of the same shape {t.shape}, got shape {out.shape}"
            ) from None
    if not np.all(np.isfinite(out)):
        raise ValueError("h must return finite values for t = 1..max_contributions")
    return out


def _max_over_t(
    max_contributions: int, h: HFunction, noise_term: Callable[[np.ndarray], np.ndarray]
) -> Tuple[float, int]:
    """``max_{t=1..D0} h(t) + noise_term(t)`` and its (smallest) argmax, vectorised in chunks."""
    best, best_t = -math.inf, 0
    for start in range(1, max_contributions + 1, _CHUNK):
        t = np.arange(start, min(start + _CHUNK, max_contributions + 1), dtype=float)
        vals = _eval_h(h, t) + noise_term(t)
        k = int(np.argmax(vals))
        if vals[k] > best:
            best, best_t = float(vals[k]), int(t[k])
    return best, best_t


def gaussian_threshold_with_argmax(
    sigma: float, delta: float, max_contributions: int, h: Optional[HFunction] = None
) -> Tuple[float, int]:
    """Like :func:`gaussian_threshold`, also returning the maximising ``t`` (smallest if tied)."""
    sigma = _check_positive("sigma", sigma)
    delta = _check_delta(delta)
    max_contributions = check_int("max_contributions", max_contributions, 1)
    h = default_gaussian_h if h is None else h
    log1p_half = math.log1p(-delta / 2.0)  # log(1 - delta/2) < 0

    def noise_term(t: np.ndarray) -> np.ndarray:
        # PhiInv((1 - delta/2)^(1/t)) = -PhiInv(q), q = 1 - (1 - delta/2)^(1/t) (upper tail).
        q = -np.expm1(log1p_half / t)
        return sigma * -special.ndtri(q)

    return _max_over_t(max_contributions, h, noise_term)


def gaussian_threshold(sigma: float, delta: float, max_contributions: int, h: Optional[HFunction] = None) -> float:
    """Threshold of Gaussian weight-and-threshold selection.

    MAD paper Algorithm 1 / Theorem 3.3; DPSU paper Theorems 5.1, B.2 (``h = 1/sqrt(t)``) and
    A.2 (``h = 1``)::

        rho = max_{t=1..Delta_0} h(t) + sigma * PhiInv((1 - delta/2) ** (1/t))

    With this rho, the probability that any of the ``t <= Delta_0`` novel items of a new user (each
    of weight <= h(t)) survives the threshold is at most ``delta/2``.

    Args:
      sigma: Gaussian noise standard deviation (> 0), e.g. ``analytic_gaussian_sigma(eps, delta/2)``.
      delta: the TOTAL delta of the round (the function uses ``delta/2``), in (0, 1).
      max_contributions: Delta_0 >= 1.
      h: vectorised novel l_inf sensitivity bound, called on a float array ``t = [1., 2., ...]``;
        default ``1/sqrt(t)``. Count Gaussian uses ``lambda t: np.ones_like(t)`` (with
        ``sigma = analytic_gaussian_sigma(eps, delta/2, sensitivity=sqrt(Delta_0))``);
        MAD2R round 2 uses ``b_max/sqrt(t)``.

    ``PhiInv(p)`` for ``p = (1 - delta/2)^(1/t)`` within 1e-30 of 1 is evaluated as
    ``-ndtri(-expm1(log1p(-delta/2)/t))`` (upper tail, no cancellation); the max over t is
    vectorised (Delta_0 = 100,000 takes a few milliseconds).
    """
    return gaussian_threshold_with_argmax(sigma, delta, max_contributions, h)[0]


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale ``b = sensitivity / epsilon`` of the Laplace mechanism (Dwork & Roth 2014, Thm 3.6)."""
    epsilon = _check_epsilon(epsilon)
    sensitivity = _check_positive("sensitivity", sensitivity)
    return sensitivity / epsilon


def laplace_threshold_with_argmax(
    epsilon: float,
    delta: float,
    max_contributions: int,
    h: Optional[HFunction] = None,
    sensitivity: float = 1.0,
) -> Tuple[float, int]:
    """Like :func:`laplace_threshold`, also returning the maximising ``t`` (smallest if tied)."""
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    max_contributions = check_int("max_contributions", max_contributions, 1)
    sensitivity = _check_positive("sensitivity", sensitivity)
    h = default_laplace_h if h is None else h
    scale = sensitivity / epsilon
    log1p_d = math.log1p(-delta)

    def noise_term(t: np.ndarray) -> np.ndarray:
        q = -np.expm1(log1p_d / t)  # 1 - (1 - delta)^(1/t)
        return scale * (-math.log(2.0) - np.log(q))  # scale * log(1 / (2 q))

    return _max_over_t(max_contributions, h, noise_term)


def laplace_threshold(
    epsilon: float,
    delta: float,
    max_contributions: int,
    h: Optional[HFunction] = None,
    sensitivity: float = 1.0,
) -> float:
    """Threshold of Laplace weight-and-threshold selection with noise ``Lap(sensitivity/epsilon)``.

    DPSU paper Theorem 4.1 / B.1 (``h = 1/t``, sensitivity 1) and A.1 (``h = 1``)::

        rho = max_{t=1..Delta_0} h(t) + (sensitivity/epsilon) * log(1 / (2 * (1 - (1 - delta)^(1/t))))

    The FULL delta is used here: the Laplace part is pure epsilon-DP on the common support, and the
    novel-item event gets probability <= delta.

    Two uses:
      * weighted Laplace (each of a user's ``d`` items gets ``1/d``, l1 sensitivity 1):
        ``laplace_threshold(eps, delta, D0)`` (default ``h(t) = 1/t``, sensitivity 1);
      * count Laplace (each item +1, l1 sensitivity Delta_0, noise ``Lap(Delta_0/eps)``):
        ``laplace_threshold(eps, delta, D0, h=lambda t: np.ones_like(t), sensitivity=D0)``.

    ``1 - (1 - delta)^(1/t)`` is computed as ``-expm1(log1p(-delta)/t)``.
    """
    return laplace_threshold_with_argmax(epsilon, delta, max_contributions, h, sensitivity)[0]


# --------------------------------------------------------------------------------------------------
# Convenience: single-round calibrations
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Calibrated noise and threshold of one weight-and-threshold round.

    Attributes:
      noise: ``'gaussian'`` or ``'laplace'``.
      noise_scale: Gaussian standard deviation sigma, or Laplace scale b.
      threshold: rho; release items whose noisy weight is >= rho.
      epsilon, delta: the (epsilon, delta) this round is calibrated for / reported with (see
        ``privacy.accounting.multi_round_calibration`` for multi-round semantics).
    """

    noise: str
    noise_scale: float
    threshold: float
    epsilon: float
    delta: float


def calibrate_weighted_gaussian(
    epsilon: float, delta: float, max_contributions: int, h: Optional[HFunction] = None
) -> Calibration:
    """Weighted Gaussian / Basic / MAD (one round): ``sigma = AGM(eps, delta/2, 1)``,
    ``rho = gaussian_threshold(sigma, delta, D0, h)`` with default ``h = 1/sqrt(t)``.

    DPSU paper Theorem B.2 (Algorithm 8); MAD paper Theorem 3.3 and Corollary 5.2.
    """
    sigma = analytic_gaussian_sigma(epsilon, delta / 2.0, 1.0)
    rho = gaussian_threshold(sigma, delta, max_contributions, h)
    return Calibration("gaussian", sigma, rho, float(epsilon), float(delta))


def calibrate_count_gaussian(epsilon: float, delta: float, max_contributions: int) -> Calibration:
    """Count Gaussian: each of a user's (<= Delta_0) items gets +1, l2 sensitivity ``sqrt(Delta_0)``.

    ``sigma = AGM(eps, delta/2, sensitivity=sqrt(Delta_0))`` and
    ``rho = gaussian_threshold(sigma, delta, Delta_0, h=lambda t: np.ones_like(t))`` (a novel item
    has count exactly 1). Equivalent to DPSU Theorem A.2 applied to the counts scaled by
    ``1/sqrt(Delta_0)``.
    """
    max_contributions = check_int("max_contributions", max_contributions, 1)
    sigma = analytic_gaussian_sigma(epsilon, delta / 2.0, math.sqrt(max_contributions))
    rho = gaussian_threshold(sigma, delta, max_contributions, h=np.ones_like)
    return Calibration("gaussian", sigma, rho, float(epsilon), float(delta))


def calibrate_weighted_laplace(epsilon: float, delta: float, max_contributions: int) -> Calibration:
    """Weighted Laplace (DPSU Algorithm 7, Theorem B.1): scale ``1/eps``, ``h(t) = 1/t``, full delta."""
    b = laplace_scale(epsilon, 1.0)
    rho = laplace_threshold(epsilon, delta, max_contributions)
    return Calibration("laplace", b, rho, float(epsilon), float(delta))


def calibrate_count_laplace(epsilon: float, delta: float, max_contributions: int) -> Calibration:
    """Count Laplace: each item +1, l1 sensitivity Delta_0: scale ``Delta_0/eps``, ``h(t) = 1``.

    ``rho = laplace_threshold(eps, delta, D0, h=lambda t: np.ones_like(t), sensitivity=D0)``
    (DPSU Theorem A.1 applied to the counts scaled by ``1/Delta_0``).
    """
    max_contributions = check_int("max_contributions", max_contributions, 1)
    b = laplace_scale(epsilon, float(max_contributions))
    rho = laplace_threshold(epsilon, delta, max_contributions, h=np.ones_like, sensitivity=float(max_contributions))
    return Calibration("laplace", b, rho, float(epsilon), float(delta))


def mad_tau(rho: float, sigma: float, beta: float) -> float:
    """MAD's adaptive threshold ``tau = max(1, rho + beta sigma)`` (MAD paper Alg. 3; selection and DPNE).

    Raising tau is always allowed: MAD's privacy holds for every tau >= 1 (Lemmas 5.3, 5.6), and
    tau only decides how much weight is rerouted, not the noise or threshold.
    """
    if not math.isfinite(rho):
        return math.inf
    return max(1.0, float(rho) + float(beta) * float(sigma))
