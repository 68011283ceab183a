"""Statistical lower bounds on epsilon from observed output frequencies (empirical privacy audit).

A mechanism M is (epsilon, delta)-DP iff for every pair of neighbouring datasets D, D' and every
event E: ``Pr[M(D') in E] <= e^epsilon Pr[M(D) in E] + delta`` (and with D, D' swapped). Running M
``n`` times on each dataset with fresh randomness and counting how often E happens gives
Clopper-Pearson intervals on both probabilities; if the intervals hold, then

    epsilon >= log((p_lo(D') - delta) / p_hi(D))                                  (*)

so (*) is a lower bound on the true epsilon with the stated confidence (the method of Jagielski et
al. 2020, "Auditing differentially private machine learning", and Google's DP stochastic tester).
An audit *fails* when the lower bound exceeds the claimed epsilon: then, unless one of the
Clopper-Pearson bounds failed (probability <= the ``alpha`` spent on them), the mechanism is not
(epsilon, delta)-DP.

Pure functions (numpy/scipy), no Beam. The cases and the runner are in :mod:`transforms.testing.audit`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Tuple

from scipy import stats

from dp_partition_beam.privacy.validation import check_int, check_range


def clopper_pearson(successes: int, trials: int, alpha: float) -> Tuple[float, float]:
    """One-sided Clopper-Pearson bounds ``(lo, hi)`` on a binomial probability.

    ``Pr[p < lo] <= alpha`` and ``Pr[p > hi] <= alpha`` separately (exact, conservative), so using
    both costs ``2 * alpha``.
    """
    n = check_int("trials", trials, 1)
    k = check_int("successes", successes, 0, n)
    a = check_range("alpha", alpha, 0.0, 0.5, lo_open=True)
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(p_hi_base: float, p_lo_neighbour: float, delta: float) -> float:
    """``log((p_lo(D') - delta) / p_hi(D))`` from (*), or 0 when it is not positive/defined."""
    num = p_lo_neighbour - delta
    if num <= 0.0 or p_hi_base <= 0.0:
        return 0.0
    if p_hi_base >= 1.0 and num <= 1.0:
        return max(0.0, math.log(num))
    return max(0.0, math.log(num / p_hi_base))


@dataclasses.dataclass(frozen=True)
class AuditBound:
    """The audited lower bound of one event under one neighbouring pair.

    Attributes:
      events_base, events_neighbour: how often the event E happened in ``runs`` runs on D and on D'.
      runs: runs per dataset.
      epsilon_lb: max over the four directions (E and not-E, D->D' and D'->D) of (*).
      alpha: the probability spent on each of the four one-sided Clopper-Pearson bounds.
    """

    events_base: int
    events_neighbour: int
    runs: int
    delta: float
    alpha: float
    epsilon_lb: float


def audit_bound(events_base: int, events_neighbour: int, runs: int, delta: float, alpha: float) -> AuditBound:
    """Lower bound on epsilon from event counts under D and D' (``runs`` runs each).

    Uses four one-sided bounds (lower and upper on Pr_D[E] and on Pr_D'[E]); the complement event's
    bounds are ``1 - hi`` and ``1 - lo``. If the mechanism is (epsilon, delta)-DP, the returned bound
    exceeds epsilon with probability at most ``4 * alpha``.
    """
    lo0, hi0 = clopper_pearson(events_base, runs, alpha)
    lo1, hi1 = clopper_pearson(events_neighbour, runs, alpha)
    candidates = (
        epsilon_lower_bound(hi0, lo1, delta),  # E, D' vs D
        epsilon_lower_bound(hi1, lo0, delta),  # E, D vs D'
        epsilon_lower_bound(1.0 - lo0, 1.0 - hi1, delta),  # not E, D' vs D
        epsilon_lower_bound(1.0 - lo1, 1.0 - hi0, delta),  # not E, D vs D'
    )
    return AuditBound(events_base, events_neighbour, runs, delta, alpha, max(candidates))


def expected_epsilon_lower_bound(p_base: float, p_neighbour: float, runs: int, delta: float, alpha: float) -> float:
    """The bound :func:`audit_bound` gives when the counts equal their expectations (for designing cases)."""
    k0 = int(round(p_base * runs))
    k1 = int(round(p_neighbour * runs))
    return audit_bound(k0, k1, runs, delta, alpha).epsilon_lb


def zero_event_false_failure(runs: int, delta: float) -> float:
    """Upper bound on Pr[an event of probability <= delta happens at least once in ``runs`` runs]."""
    return min(1.0, runs * delta)
