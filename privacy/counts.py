"""Noisy counts of released items: sensitivity, the discrete Gaussian's accounting, the budget split.

Pure math, no Beam. The proofs are in docs/counts.md; this docstring states what the code relies on.

**Query.** After contribution bounding every user holds at most ``Delta_0`` distinct items (the same
capped sets the selection used). The count of item ``i`` is the number of capped users holding it.
Adding or removing one user changes at most ``Delta_0`` coordinates of the count vector, each by
exactly 1 (l_inf sensitivity 1, l_0 sensitivity ``Delta_0``, hence l2 sensitivity ``sqrt(Delta_0)``).
With DPNE the counts of all levels form one vector and ``l0 = sum_k Delta_k``.

**Mechanism.** Each released item gets ``count + X`` with ``X ~ N_Z(0, sigma_c^2)``, the discrete
Gaussian, drawn exactly (:mod:`transforms.core.discrete_gaussian`); ``sigma_c^2`` is a rational.

**Why Gaussian-DP composition applies to the discrete Gaussian (the kernel lemma, docs/counts.md).**
GDP composition (Dong, Roth & Su 2019) is stated for the continuous Gaussian; the discrete Gaussian's
privacy curve is close to but not the same as the continuous one (Canonne, Kamath & Steinke 2020
prove zCDP and give its exact one-dimensional (eps, delta) curve, not a domination by the continuous
curve), so we do not apply GDP to it directly. Instead: with ``sigma_c^2 = sigma_1^2 + tau^2``, the
law of ``X`` is within a factor ``e^{+-gamma}`` (pointwise, in pmf) of a *post-processing* of the
continuous ``N(c, sigma_1^2)`` - round a continuous draw ``y`` to an integer ``x`` with probability
proportional to ``exp(-(x - y)^2 / (2 tau^2))`` - where, by Poisson summation,
``gamma = log((1 + eta) / (1 - eta))``, ``eta = 2 sum_{k>=1} exp(-2 pi^2 tau^2 k^2)``. With ``tau^2 =
25/4``, ``gamma < 2e-53``. Hence, for ``m <= l0`` changed coordinates and any mechanism ``A`` composed
with the counts:

    H_eps(discrete) <= e^{m gamma} (H_eps(continuous) + e^{2 m gamma} - 1)

where "continuous" replaces the counts' noise by ``N(0, sigma_1^2)``: the count release is, up to the
negligible ``kappa = l0 * gamma``, a continuous Gaussian mechanism of l2 sensitivity ``sqrt(l0)`` and
noise ``sigma_1``, i.e. ``mu_c``-GDP with ``mu_c = sqrt(l0) / sigma_1``. The price is ``tau^2 = 6.25``
of extra variance (``sigma_c^2 = sigma_1^2 + 6.25``); the calibration reserves a relative ``1e-9`` of
the delta for the ``kappa`` terms and checks that they fit (:func:`check_kernel_slack`).
``tests/privacy/test_counts_accounting.py`` cross-checks the resulting (eps, delta) with dp_accounting's
privacy-loss-distribution accountant on the discrete Gaussian itself.

**Budget split** (``count_budget = f`` in (0, 1)). Without counts a Gaussian selection is
``(eps, delta)``-DP as ``mu``-GDP (``delta/2``) plus threshold events (``delta/2``); a Laplace selection
as pure ``eps``-DP plus threshold events (``delta``). With counts, by the selection's noise and its
accounting:

* ``'gdp'`` (Gaussian selections; multi-round ones with ``accounting='gdp'``): the thresholds get
  ``(1 - f)`` of their ``delta/2``; the GDP part gets ``delta_P = delta - (1 - f) delta / 2`` and
  ``mu_total = 1 / AGM(eps, delta_P)``, split ``mu_sel^2 = (1 - f) mu_total^2`` (the selection's rounds)
  and ``mu_c^2 = f mu_total^2`` (the counts). Exact composition: ``mu_sel^2 + mu_c^2 = mu_total^2``.
* ``'pure'`` (Laplace selections): the selection runs at ``eps_0 = (1 - f) eps`` and ``(1 - f) delta``
  for its thresholds; the counts get the largest ``mu_c`` with
  ``p H_{eps - eps_0}(G_mu_c) + (1 - p) H_{eps + eps_0}(G_mu_c) <= f delta``, ``p = e^eps_0 / (1 + e^eps_0)``:
  the exact composition of the worst eps_0-DP mechanism (randomised response) with the Gaussian.
* ``'basic'`` (multi-round selections with ``accounting='basic'``): the selection runs at
  ``((1 - f) eps, (1 - f) delta)`` and the counts at ``(f eps, f delta)``; basic composition.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Callable, Optional

import numpy as np
from scipy import optimize, special

from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma, gaussian_epsilon, gaussian_log_delta
from dp_partition_beam.privacy.validation import check_choice, check_int, check_range

__all__ = [
    "DEFAULT_COUNT_BUDGET",
    "KERNEL_TAU2",
    "COMPOSITIONS",
    "CountPlan",
    "SelectionShare",
    "kernel_gamma",
    "check_kernel_slack",
    "kernel_tau2",
    "discrete_sigma2",
    "discrete_gaussian_std",
    "discrete_gaussian_tail",
    "discrete_gaussian_error_bound",
    "split_gdp",
    "split_pure",
    "split_basic",
    "composed_delta_gdp",
    "composed_delta_pure",
    "check_count_budget",
    "check_min_users",
]

#: Default fraction of (epsilon, delta) spent on the counts (docs/counts.md, "Choosing count_budget":
#: measured with benchmarks/explore/bench_counts.py on the bundled sample and imdb).
DEFAULT_COUNT_BUDGET = 0.25

#: largest tau^2 of the kernel lemma (sigma_c^2 = sigma_1^2 + tau^2; gamma < 2e-53): enough for every
#: l0 <= 1e7 and delta >= 1e-30. Plans use the smallest multiple of 1/16 whose slack fits
#: (:func:`kernel_tau2`), typically about 2.
KERNEL_TAU2 = Fraction(25, 4)

#: relative share of the GDP part's delta reserved for the kernel lemma's kappa terms
DELTA_SLACK = 1e-9

#: sigma_c^2 is rounded UP to a multiple of 2^-32 (more noise is always private; keeps the sampler's
#: integers short)
SIGMA2_GRID = 1 << 32

#: relative upward nudge on split sigmas so that float rounding never exceeds the mu^2 budget
_SPLIT_MARGIN = 1e-12

COMPOSITIONS = ("gdp", "pure", "basic")

# sigma above which the report's std / error bound use the closed-form bounds instead of summing the pmf
_SUM_PMF_MAX_SIGMA = 1e5


def check_count_budget(value) -> float:
    """``count_budget`` in (0, 1) (``ValueError`` naming it otherwise)."""
    return check_range("count_budget", value, 0.0, 1.0, lo_open=True, hi_open=True)


def check_min_users(value) -> int:
    """``min_users`` an integer >= 0 (0: no floor)."""
    return check_int("min_users", value, 0)


# --------------------------------------------------------------------------------------------------
# The kernel lemma
# --------------------------------------------------------------------------------------------------


def kernel_gamma(tau2: Fraction = KERNEL_TAU2) -> float:
    """Upper bound on ``gamma = log((1 + eta) / (1 - eta))``, ``eta = 2 sum_{k>=1} exp(-2 pi^2 tau^2 k^2)``.

    ``sum_{k>=1} e^{-a k^2} <= sum_{k>=1} e^{-a k} = e^{-a} / (1 - e^{-a})`` with ``a = 2 pi^2 tau^2``.
    """
    a = 2.0 * math.pi**2 * float(tau2)
    eta = 2.0 * math.exp(-a) / -math.expm1(-a)
    eta *= 1.0 + 1e-12  # float rounding of the line above
    return math.log1p(2.0 * eta / (1.0 - eta)) * (1.0 + 1e-12)


def check_kernel_slack(l0: int, delta_p: float, tau2: Fraction = KERNEL_TAU2) -> float:
    """Checks that ``e^kappa (delta_P (1 - DELTA_SLACK) + e^{2 kappa} - 1) <= delta_P``, ``kappa = l0 gamma``.

    The GDP part is calibrated to ``delta_P (1 - DELTA_SLACK)``; this verifies that the kernel lemma's
    terms fit in the reserved ``DELTA_SLACK * delta_P`` (with a factor 2 to spare). Returns kappa.
    """
    kappa = l0 * kernel_gamma(tau2)
    extra = math.expm1(kappa) * (1.0 - DELTA_SLACK) * delta_p + math.exp(kappa) * math.expm1(2.0 * kappa)
    if not extra <= 0.5 * DELTA_SLACK * delta_p:
        raise ArithmeticError(
            f"kernel lemma slack {extra:.3g} does not fit in {DELTA_SLACK:g} * delta={delta_p:.3g} "
            f"(l0={l0}): raise KERNEL_TAU2"
        )
    return kappa


def kernel_tau2(l0: int, delta_p: float) -> Fraction:
    """Smallest ``tau^2`` (a multiple of 1/16, at most :data:`KERNEL_TAU2`) whose kernel slack fits in
    ``DELTA_SLACK * delta_P`` for ``l0`` coordinates (:func:`check_kernel_slack`)."""
    tau2 = Fraction(1, 16)
    while tau2 < KERNEL_TAU2:
        try:
            check_kernel_slack(l0, delta_p, tau2)
            return tau2
        except ArithmeticError:
            tau2 += Fraction(1, 16)
    check_kernel_slack(l0, delta_p, KERNEL_TAU2)
    return KERNEL_TAU2


def discrete_sigma2(sigma_1: float, tau2: Fraction = KERNEL_TAU2) -> Fraction:
    """``sigma_c^2 = sigma_1^2 + tau^2`` exactly, rounded UP to a multiple of 2^-32 (a Fraction)."""
    s = Fraction(float(sigma_1)) ** 2 + tau2
    num = -((-s.numerator * SIGMA2_GRID) // s.denominator)  # ceil(s * GRID)
    return Fraction(num, SIGMA2_GRID)


# --------------------------------------------------------------------------------------------------
# The discrete Gaussian's spread (for the report)
# --------------------------------------------------------------------------------------------------


def _theta_upper(sigma: float) -> float:
    """Upper bound on ``Z = sum_{x in Z} exp(-x^2 / (2 sigma^2))`` (Poisson summation)."""
    a = 2.0 * math.pi**2 * sigma * sigma
    return sigma * math.sqrt(2.0 * math.pi) * (1.0 + 2.0 * math.exp(-a) / -math.expm1(-a)) * (1.0 + 1e-13)


def _half_weights(sigma: float) -> np.ndarray:
    """``exp(-x^2/(2 sigma^2))`` for x = 0..ceil(40 sigma) (the rest is below 1e-340 of the mass)."""
    x = np.arange(0, int(math.ceil(40.0 * sigma)) + 2, dtype=np.float64)
    return np.exp(-(x * x) / (2.0 * sigma * sigma))


def discrete_gaussian_std(sigma2) -> float:
    """Standard deviation of ``N_Z(0, sigma^2)`` (summed over the pmf; ``sigma`` itself above 1e5,
    where the two agree to far below float precision). Always ``<= sigma``."""
    sigma = math.sqrt(float(sigma2))
    if sigma > _SUM_PMF_MAX_SIGMA:
        return sigma
    w = _half_weights(sigma)
    x = np.arange(len(w), dtype=np.float64)
    z = w[0] + 2.0 * math.fsum(w[1:])
    return min(sigma, math.sqrt(2.0 * math.fsum(x * x * w) / z))


def discrete_gaussian_tail(sigma2, c: int) -> float:
    """Upper bound on ``P[|X| > c]`` for ``X ~ N_Z(0, sigma^2)``.

    Summed over the pmf with the normaliser bounded from below (``Z >= sigma sqrt(2 pi)``), so it is
    never below the true tail; above sigma = 1e5 the integral bound ``2 Q(c / sigma)`` (since
    ``sum_{x > c} e^{-x^2/2s^2} <= int_c^inf``) is used.
    """
    sigma = math.sqrt(float(sigma2))
    c = int(c)
    if c < 0:
        return 1.0
    if sigma > _SUM_PMF_MAX_SIGMA:
        return min(1.0, 2.0 * float(special.ndtr(-c / sigma)))
    w = _half_weights(sigma)
    if c + 1 >= len(w):
        return 0.0
    return min(1.0, 2.0 * math.fsum(w[c + 1 :]) / (sigma * math.sqrt(2.0 * math.pi)) * (1.0 + 1e-12))


def discrete_gaussian_error_bound(sigma2, level: float = 0.95) -> int:
    """Smallest integer ``c`` with ``P[|X| <= c] >= level`` for ``X ~ N_Z(0, sigma^2)`` (conservative).

    ``P[|X| <= c]`` is summed over the pmf and divided by an upper bound on the normaliser
    (:func:`_theta_upper`), and must exceed ``level`` by 1e-12 (float error of the sum); above
    sigma = 1e5, ``c = ceil(sigma PhiInv((1 + level) / 2))`` from the integral bound of
    :func:`discrete_gaussian_tail`. A released count is within ``c`` of the (capped) true count with
    probability at least ``level``.
    """
    level = check_range("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    sigma = math.sqrt(float(sigma2))
    if sigma > _SUM_PMF_MAX_SIGMA:
        return int(math.ceil(sigma * float(special.ndtri((1.0 + level) / 2.0)) * (1.0 + 1e-12)))
    w = _half_weights(sigma)
    cum = (np.cumsum(2.0 * w) - w[0]) / _theta_upper(sigma)  # P[|X| <= c] for c = 0, 1, ... (lower bound)
    idx = np.nonzero(cum >= level + 1e-12)[0]
    if len(idx) == 0:  # pragma: no cover - the weights cover 40 sigma
        raise ArithmeticError("error bound not reached")
    return int(idx[0])


# --------------------------------------------------------------------------------------------------
# The budget split
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CountPlan:
    """The count release: its discrete Gaussian noise and what the report prints.

    Attributes:
      sigma2: ``sigma_c^2`` of ``N_Z(0, sigma_c^2)``, an exact rational (the sampler's parameter).
      noise_scale: ``sqrt(sigma2)`` (float, for the report).
      std: the noise's standard deviation (``<= noise_scale``): the count's RMSE around the capped count.
      error_bound_95: an integer ``c`` with ``P[|noisy - true| <= c] >= 0.95`` (exact pmf, conservative).
      sigma_continuous: ``sigma_1``, the continuous Gaussian the noise is (nearly) a post-processing of.
      tau2: the kernel lemma's ``tau^2 = sigma2 - sigma_1^2`` (before rounding sigma2 up).
      l0: coordinates one user can change (Delta_0, or sum of Delta_k for DPNE).
      count_budget: the fraction f.
      composition: 'gdp', 'pure' or 'basic' (module docstring).
      epsilon, delta: informational: the (eps, delta) of the count release on its own at its delta share
        (they do NOT add up with the selection's under 'gdp'/'pure': the composition is exact).
      round: the randomness-contract round of the noise (purpose 'count_noise', key = the item).
    """

    sigma2: Fraction
    noise_scale: float
    std: float
    error_bound_95: int
    sigma_continuous: float
    tau2: Fraction
    l0: int
    count_budget: float
    composition: str
    epsilon: float
    delta: float
    round: int = 0

    def as_report(self) -> dict:
        return {
            "round": "counts",
            "noise": "discrete_gaussian",
            "noise_scale": self.noise_scale,
            "noise_std": self.std,
            "error_bound_95": self.error_bound_95,
            "sigma2": f"{self.sigma2.numerator}/{self.sigma2.denominator}",
            "sigma_continuous": self.sigma_continuous,
            "kernel_tau2": float(self.tau2),
            "l0_sensitivity": self.l0,
            "l2_sensitivity": math.sqrt(self.l0),
            "count_budget": self.count_budget,
            "composition": self.composition,
            "epsilon": self.epsilon,
            "delta": self.delta,
        }


def make_count_plan(
    sigma_1: float, tau2: Fraction, l0: int, f: float, composition: str, epsilon: float, delta: float, round_=0
) -> CountPlan:
    """The plan of counts whose continuous equivalent is ``sigma_1`` (``sigma_c^2 = sigma_1^2 + tau2``)."""
    check_choice("composition", composition, COMPOSITIONS)
    s2 = discrete_sigma2(sigma_1, tau2)
    return CountPlan(
        sigma2=s2,
        noise_scale=math.sqrt(float(s2)),
        std=discrete_gaussian_std(s2),
        error_bound_95=discrete_gaussian_error_bound(s2, 0.95),
        sigma_continuous=float(sigma_1),
        tau2=tau2,
        l0=int(l0),
        count_budget=float(f),
        composition=composition,
        epsilon=float(epsilon),
        delta=float(delta),
        round=int(round_),
    )


@dataclasses.dataclass(frozen=True)
class SelectionShare:
    """What the selection gets when counts are released.

    Attributes:
      composition: 'gdp', 'pure' or 'basic'.
      epsilon: the selection's epsilon ('pure', 'basic'); under 'gdp' the informational epsilon of
        its Gaussian share alone at ``delta_threshold / 2``.
      delta_threshold: the delta passed to the threshold functions in place of the total delta
        (Gaussian thresholds use half of it, Laplace thresholds all of it); under 'basic' the
        selection's whole delta.
      sigma: 'gdp' only: the sensitivity-1 noise of the selection's whole GDP share
        (``1 / mu_sel``); rounds split it like the total (``sigma_r = sigma / sqrt(f_r)``).
      counts: the :class:`CountPlan`.
    """

    composition: str
    epsilon: float
    delta_threshold: float
    sigma: Optional[float]
    counts: CountPlan


def _up(x: float) -> float:
    return x * (1.0 + _SPLIT_MARGIN)


def _rest(total: float, part: float) -> float:
    """``total - part`` rounded down (so that part + rest <= total in real arithmetic)."""
    return math.nextafter(total - part, 0.0)


def _check_split(epsilon, delta, count_budget, l0):
    epsilon = check_range("epsilon", epsilon, 0.0, math.inf, lo_open=True)
    delta = check_range("delta", delta, 0.0, 1.0, lo_open=True, hi_open=True)
    return epsilon, delta, check_count_budget(count_budget), check_int("l0", l0, 1)


def split_gdp(epsilon: float, delta: float, count_budget: float, l0: int, round_: int = 0) -> SelectionShare:
    """'gdp' split (module docstring): Gaussian selection + counts, exact GDP composition."""
    eps, delta, f, l0 = _check_split(epsilon, delta, count_budget, l0)
    delta_thr = (1.0 - f) * delta  # the thresholds use half: (1 - f) delta / 2 in total
    delta_p = _rest(delta, delta_thr / 2.0)
    sigma_total = analytic_gaussian_sigma(eps, delta_p * (1.0 - DELTA_SLACK))  # 1 / mu_total
    tau2 = kernel_tau2(l0, delta_p)
    sigma_sel = _up(sigma_total / math.sqrt(1.0 - f))  # mu_sel^2 = (1 - f) mu_total^2
    sigma_1 = _up(math.sqrt(l0) * sigma_total / math.sqrt(f))  # l0 / sigma_1^2 = f mu_total^2
    counts = make_count_plan(
        sigma_1, tau2, l0, f, "gdp", gaussian_epsilon(sigma_1, f * delta_p, math.sqrt(l0)), f * delta_p, round_
    )
    return SelectionShare("gdp", gaussian_epsilon(sigma_sel, delta_thr / 2.0), delta_thr, sigma_sel, counts)


def _log_pure_composed(sigma_1: float, l0: int, eps: float, eps0: float) -> float:
    """log of ``p H_{eps-eps0}(G) + (1-p) H_{eps+eps0}(G)`` for the Gaussian of noise sigma_1, sensitivity sqrt(l0)."""
    lo = math.nextafter(eps - eps0, 0.0)  # H is decreasing in its epsilon: round the arguments down
    hi = math.nextafter(eps + eps0, 0.0)
    log_p = -math.log1p(math.exp(-eps0))  # log(e^eps0 / (1 + e^eps0))
    log_q = -eps0 + log_p  # log(1 / (1 + e^eps0))
    s = math.sqrt(l0)
    return float(np.logaddexp(log_p + gaussian_log_delta(sigma_1, lo, s), log_q + gaussian_log_delta(sigma_1, hi, s)))


def _smallest_sigma(log_delta_of: Callable[[float], float], log_target: float, guess: float) -> float:
    """Smallest sigma with ``log_delta_of(sigma) <= log_target`` (decreasing in sigma), rounded up."""

    def g(log_s):
        return max(log_delta_of(math.exp(log_s)), -1e300) - log_target

    lo = hi = math.log(guess)
    while g(lo) <= 0.0:
        lo -= 1.0
    while g(hi) > 0.0:
        hi += 1.0
        if hi > 700:  # pragma: no cover
            raise ArithmeticError("failed to bracket sigma")
    s = math.exp(optimize.brentq(g, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)) * (1 + 1e-10)
    while log_delta_of(s) > log_target:
        s = math.nextafter(s, math.inf) * (1 + 1e-15)
    return s


def split_pure(epsilon: float, delta: float, count_budget: float, l0: int, round_: int = 0) -> SelectionShare:
    """'pure' split (module docstring): Laplace selection (pure eps_0 + thresholds) + counts."""
    eps, delta, f, l0 = _check_split(epsilon, delta, count_budget, l0)
    eps0 = (1.0 - f) * eps
    delta_thr = (1.0 - f) * delta
    delta_p = _rest(delta, delta_thr)
    tau2 = kernel_tau2(l0, delta_p)
    target = math.log(delta_p * (1.0 - DELTA_SLACK))
    guess = analytic_gaussian_sigma(_rest(eps, eps0), delta_p, math.sqrt(l0))
    sigma_1 = _smallest_sigma(lambda s: _log_pure_composed(s, l0, eps, eps0), target, guess)
    counts = make_count_plan(
        sigma_1, tau2, l0, f, "pure", gaussian_epsilon(sigma_1, delta_p, math.sqrt(l0)), delta_p, round_
    )
    return SelectionShare("pure", eps0, delta_thr, None, counts)


def split_basic(epsilon: float, delta: float, count_budget: float, l0: int, round_: int = 0) -> SelectionShare:
    """'basic' split: selection at ((1-f) eps, (1-f) delta), counts at (f eps, f delta); basic composition."""
    eps, delta, f, l0 = _check_split(epsilon, delta, count_budget, l0)
    eps_sel, delta_sel = (1.0 - f) * eps, (1.0 - f) * delta
    eps_c, delta_c = _rest(eps, eps_sel), _rest(delta, delta_sel)
    tau2 = kernel_tau2(l0, delta_c)
    sigma_1 = analytic_gaussian_sigma(eps_c, delta_c * (1.0 - DELTA_SLACK), math.sqrt(l0))
    counts = make_count_plan(sigma_1, tau2, l0, f, "basic", eps_c, delta_c, round_)
    return SelectionShare("basic", eps_sel, delta_sel, None, counts)


# --------------------------------------------------------------------------------------------------
# Recomputing what a plan gives (tests, report)
# --------------------------------------------------------------------------------------------------


def composed_delta_gdp(sigmas_unit, count_sigma_1: float, l0: int, epsilon: float) -> float:
    """delta at ``epsilon`` of the selection's Gaussian rounds (sensitivity-1 sigmas) composed with the
    counts (continuous equivalent ``sigma_1``, l2 sensitivity sqrt(l0)), GDP: ``mu^2 = sum 1/s^2 + l0/sigma_1^2``.
    Add the thresholds' delta and the kernel slack for the total."""
    mu2 = math.fsum([1.0 / (s * s) for s in sigmas_unit] + [l0 / (count_sigma_1 * count_sigma_1)])
    return math.exp(gaussian_log_delta(1.0 / math.sqrt(mu2), epsilon))


def composed_delta_pure(eps0: float, count_sigma_1: float, l0: int, epsilon: float) -> float:
    """delta at ``epsilon`` of a pure eps0-DP selection composed with the counts (worst case: randomised
    response), for the continuous equivalent of the counts. Add the thresholds' delta for the total."""
    return math.exp(_log_pure_composed(count_sigma_1, l0, epsilon, eps0))
