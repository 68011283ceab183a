"""Privacy budget accounting for multi-round selection (DP-SIPS, MAD2R) and DPNE (pure math).

Two accountings are offered for R rounds with budget fractions ``f_1..f_R`` (positive, summing to 1):

``'basic'`` (what the MAD paper prints, Theorem 5.1): round r is an independent weight-and-threshold
run with budget ``(f_r eps, f_r delta)``, i.e. ``sigma_r = AGM(f_r eps, f_r delta / 2)`` and
``rho_r = gaussian_threshold(sigma_r, f_r delta, Delta_0, h_r)``; basic composition gives
``(sum f_r eps, sum f_r delta) = (eps, delta)``.

``'gdp'`` (the default; exact composition of the Gaussian parts): ``sigma = AGM(eps, delta / 2)``,
``sigma_r = sigma / sqrt(f_r)``, ``rho_r = gaussian_threshold(sigma_r, f_r delta, Delta_0, h_r)``.

Why ``'gdp'`` is (eps, delta)-DP. Fix neighbouring inputs S, S' = S + {v}. In every round the
weighting algorithm (chosen adaptively from earlier outputs) has l2 sensitivity <= 1 and novel
l_inf sensitivity <= h_r(t) (MAD paper Definition 3.2, Theorem 3.3 and the proof of Theorem 5.1,
section 5.1). As in the proof of Theorem 3.3, release the extended noisy weight vectors
``w~_ext,r`` (zero weight outside the support). Their joint release is the adaptive composition of
Gaussian mechanisms with sensitivity 1 and noise ``sigma_r``, i.e. of ``mu_r``-GDP mechanisms with
``mu_r = 1/sigma_r``; by Dong, Roth & Su 2019 ("Gaussian differential privacy", Corollary 3.3) it
is ``mu``-GDP with ``mu^2 = sum_r mu_r^2 = sum_r f_r / sigma^2 = 1/sigma^2`` - the same privacy
profile as a single Gaussian mechanism with noise ``sigma``. A ``mu``-GDP mechanism is
(eps, delta')-DP with ``delta' = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (GDP paper
Corollary 2.13, identical to Balle & Wang 2018 Theorem 8 with ``mu = 1/sigma``), which equals
``delta/2`` by the choice ``sigma = AGM(eps, delta/2)``. The released sets differ from a
post-processing of these vectors only if a novel item of round r (at most Delta_0 of them, each
of weight <= h_r(t)) passes ``rho_r``; by the threshold argument of MAD Theorem 3.3 this has
probability <= ``f_r delta / 2``, and a union bound over rounds gives ``delta/2``. In total
(eps, delta/2 + delta/2) = (eps, delta). The same argument gives DPNE Theorem 2.1
(:func:`geometric_sigma_schedule`).

The 'gdp' accounting yields noticeably smaller per-round noise than 'basic' for the same
(eps, delta) (e.g. split (0.1, 0.9) at eps = 1), hence more released items.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from dp_partition_beam.privacy.calibration import (
    Calibration,
    analytic_gaussian_sigma,
    gaussian_epsilon,
    gaussian_threshold,
)
from dp_partition_beam.privacy.validation import check_choice, check_fractions, check_int, check_range

#: multi-round accounting: exact Gaussian-DP composition (default) or the paper's basic split
ACCOUNTINGS = ("gdp", "basic")

__all__ = [
    "split_budget",
    "gdp_compose",
    "gdp_round_sigmas",
    "geometric_sigma_schedule",
    "multi_round_calibration",
]

HFunction = Callable[[np.ndarray], np.ndarray]


def split_budget(epsilon: float, delta: float, fractions: Sequence[float]) -> List[Tuple[float, float]]:
    """Basic-composition split: round r gets ``(f_r * epsilon, f_r * delta)``.

    Basic composition (Dwork & Roth 2014, Theorem 3.16) of the per-round guarantees gives the total
    (epsilon, delta); this is the split of MAD paper Theorem 5.1 / Algorithm 4 and of DP-SIPS.

    Raises:
      ValueError: if epsilon <= 0, delta not in (0, 1), or ``fractions`` are not positive numbers
        summing to 1 (the message names ``fractions``).
    """
    epsilon = check_range("epsilon", epsilon, 0.0, math.inf, lo_open=True)
    delta = check_range("delta", delta, 0.0, 1.0, lo_open=True, hi_open=True)
    fr = check_fractions("fractions", fractions)
    return [(f * epsilon, f * delta) for f in fr]


def gdp_compose(sigmas: Sequence[float]) -> float:
    """Noise of the single Gaussian mechanism equivalent to composing sensitivity-1 Gaussians.

    ``1/sigma*^2 = sum_k 1/sigma_k^2``: adaptive composition of ``mu_k``-GDP mechanisms
    (``mu_k = 1/sigma_k``) is ``sqrt(sum mu_k^2)``-GDP (Dong, Roth & Su 2019, Corollary 3.3;
    DPNE paper Proposition 2.3).
    """
    try:
        vals = [float(s) for s in sigmas]
    except (TypeError, ValueError):
        raise ValueError(f"sigmas must be a non-empty list of positive numbers, got {sigmas!r}") from None
    if not vals:
        raise ValueError(f"sigmas must be a non-empty list of positive numbers, got {sigmas!r}")
    for i, s in enumerate(vals):
        check_range(f"sigmas[{i}]", s, 0.0, math.inf, lo_open=True)
    # 1/sqrt(sum (1/s)^2), written to avoid overflow / underflow for extreme sigmas.
    m = min(vals)
    return m / math.sqrt(math.fsum((m / s) ** 2 for s in vals))


def gdp_round_sigmas(sigma: float, fractions: Sequence[float]) -> List[float]:
    """Per-round noise ``sigma_r = sigma / sqrt(f_r)`` so that ``gdp_compose(result) == sigma``.

    Round r receives the fraction ``f_r`` of the GDP budget ``mu^2 = 1/sigma^2`` (see the module
    docstring and Dong, Roth & Su 2019, Corollary 3.3).
    """
    sigma = check_range("sigma", sigma, 0.0, math.inf, lo_open=True)
    fr = check_fractions("fractions", fractions)
    return [sigma / math.sqrt(f) for f in fr]


def geometric_sigma_schedule(sigma_star: float, num_levels: int, decay: float = 1.0) -> List[float]:
    """Noise levels ``sigma_k = decay * sigma_{k-1}`` (k = 1..T) with ``1/sigma*^2 = sum 1/sigma_k^2``.

    DPNE paper Theorem 2.1: the T n-gram levels compose (GDP, Proposition 2.3) to one Gaussian
    mechanism with noise ``sigma*`` = AGM(eps, delta/2). Solved in closed form:
    ``sigma_1 = sigma* * sqrt(sum_{k=0}^{T-1} decay^(-2k))``. ``decay = 1`` gives
    ``sigma_k = sigma* sqrt(T)``; ``decay < 1`` puts less noise on later (longer) n-grams.
    """
    sigma_star = check_range("sigma_star", sigma_star, 0.0, math.inf, lo_open=True)
    num_levels = check_int("num_levels", num_levels, 1)
    decay = check_range("decay", decay, 0.0, math.inf, lo_open=True)
    # Sum of decay^(-2k) relative to its largest term, to avoid overflow for small decay.
    logs = [-2.0 * k * math.log(decay) for k in range(num_levels)]
    top = max(logs)
    total = math.fsum(math.exp(x - top) for x in logs)
    log_sigma1 = math.log(sigma_star) + 0.5 * (top + math.log(total))
    log_decay = math.log(decay)
    return [math.exp(log_sigma1 + k * log_decay) for k in range(num_levels)]


def multi_round_calibration(
    epsilon: float,
    delta: float,
    fractions: Sequence[float],
    accounting: str = "gdp",
    max_contributions: int = 100,
    h_per_round: Optional[Sequence[Optional[HFunction]]] = None,
    sigma: Optional[float] = None,
) -> List[Calibration]:
    """Per-round Gaussian noise and thresholds of a multi-round selection (DP-SIPS, MAD2R).

    Args:
      epsilon, delta: total user-level budget.
      fractions: budget fractions ``f_r`` (positive, summing to 1), e.g. MAD2R's ``(0.1, 0.9)``.
      accounting: ``'gdp'`` (default) or ``'basic'``; see the module docstring.
      max_contributions: Delta_0.
      h_per_round: one novel l_inf sensitivity bound per round (``None`` entries or ``None`` for all
        mean ``1/sqrt(t)``; MAD2R round 2 passes ``lambda t: b_max / np.sqrt(t)``, MAD paper
        Lemma 5.3).
      sigma: 'gdp' only: the sensitivity-1 noise of the whole GDP budget, in place of
        ``AGM(epsilon, delta / 2)`` (the selection's share when counts are released: privacy/counts.py;
        ``delta`` is then the thresholds' delta).

    Returns:
      One :class:`~privacy.calibration.Calibration` per round, with ``noise='gaussian'``,
      ``noise_scale = sigma_r``, ``threshold = rho_r = gaussian_threshold(sigma_r, f_r delta, D0,
      h_r)`` and ``delta = f_r * delta`` in both accountings. The reported ``epsilon`` is
        * 'basic': ``f_r * epsilon`` (the round's share; the shares sum to ``epsilon``);
        * 'gdp': ``gaussian_epsilon(sigma_r, f_r * delta / 2)``, the epsilon that round r on its
          own satisfies together with ``delta_r = f_r * delta`` (informational: these do NOT add up
          to ``epsilon``; their sum exceeds it, because the whole run is (epsilon, delta)-DP by
          the tighter GDP composition, not by adding per-round epsilons).
    """
    fr = check_fractions("fractions", fractions)
    accounting = check_choice("accounting", accounting, ACCOUNTINGS)
    max_contributions = check_int("max_contributions", max_contributions, 1)
    if h_per_round is None:
        hs: List[Optional[HFunction]] = [None] * len(fr)
    else:
        hs = list(h_per_round)
        if len(hs) != len(fr):
            raise ValueError(f"h_per_round must have one entry per round ({len(fr)} fractions), got {len(hs)}")
    budgets = split_budget(epsilon, delta, fr)
    out: List[Calibration] = []
    if accounting == "basic":
        for (eps_r, delta_r), h in zip(budgets, hs):
            sigma_r = analytic_gaussian_sigma(eps_r, delta_r / 2.0)
            rho_r = gaussian_threshold(sigma_r, delta_r, max_contributions, h)
            out.append(Calibration("gaussian", sigma_r, rho_r, eps_r, delta_r))
    else:
        if sigma is None:
            sigma = analytic_gaussian_sigma(epsilon, delta / 2.0)
        else:
            sigma = check_range("sigma", sigma, 0.0, math.inf, lo_open=True)
        for sigma_r, (_, delta_r), h in zip(gdp_round_sigmas(sigma, fr), budgets, hs):
            rho_r = gaussian_threshold(sigma_r, delta_r, max_contributions, h)
            eps_r = gaussian_epsilon(sigma_r, delta_r / 2.0)
            out.append(Calibration("gaussian", sigma_r, rho_r, eps_r, delta_r))
    return out
