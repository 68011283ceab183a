"""The adaptive cap of MAD-SIPS: each round's Delta from a noisy histogram of user degrees (docs/mad_sips.md).

Pure math, no Beam. Every round of a weight-and-threshold selection pays, in its threshold, for a new user
with ``Delta_0`` novel items (``rho ~ sigma PhiInv(1 - delta_r / (2 Delta_0))``, MAD paper Theorem 3.3),
whatever the data. When almost every user holds far fewer items than ``Delta_0`` (the MAD paper's Higgs:
99.9% of the users hold at most 22), a smaller cap lowers every threshold at almost no loss. The cap is
chosen privately:

1. **Histogram.** The grid :func:`cap_grid` (``round(2^(j/2)) < Delta_0``, then ``Delta_0``) cuts the
   degrees into buckets ``(g_{j-1}, g_j]`` (the last bucket also holds every degree above ``Delta_0``);
   ``n_j`` users fall in bucket j. Adding or removing a user changes one ``n_j`` by 1: l2 sensitivity 1.
2. **Noise.** ``n~_j = n_j + sigma_H Z_j`` with ``sigma_H = sigma_sel / sqrt(cap_budget)``: the
   histogram is a Gaussian mechanism of ``mu_H^2 = cap_budget mu_sel^2``, and the rounds share the rest,
   ``sigma_rounds = sigma_sel / sqrt(1 - cap_budget)`` (exact Gaussian-DP composition).
3. **Choice** (post-processing): :func:`choose_cap` returns the smallest ``g_j`` whose noisy tail
   ``T_j = sum_{i > j} n~_i`` (users above ``g_j``), raised by ``z`` standard deviations, is at most
   ``(1 - cap_quantile)`` of the noisy user count ``sum_i n~_i``; ``Delta_0`` if none. On small data the
   noise keeps the cap at ``Delta_0``.
4. **Rounds.** Every round re-subsamples each user to the chosen cap ``Delta`` (bottom-k, as before) and
   uses the thresholds calibrated for ``Delta`` novel items: :attr:`CapPlan.rounds` holds the plan of
   every grid value, all computed before any data is read.

Only the chosen cap (an integer of the public grid) is released (in the report); the noisy counts are
compared and dropped, like the selection's noisy weights (docs/security.md).

**Automatic weight cap** (``weight_cap='auto'``, MAD-SIPS with its keep-table last round; docs/mad_sips.md,
"Automatic weight cap"): the same noisy histogram (one draw, ``cap_budget`` of the budget, whether or not the
cap above is adaptive) also picks the keep table's weight cap, again as post-processing:
:func:`choose_weight_cap` reads the noisy median degree ``m`` (the upper end of the bucket where the noisy
cumulative count reaches half the noisy total), aims at ``WEIGHT_CAP_FACTOR / sqrt(m)`` and rounds it up
onto the public candidates :data:`WEIGHT_CAP_CANDIDATES`. :class:`WeightCapPlan` fixes the last round of
every candidate before any data is read, their tables at one RDP order and budget (so that the choice
composes: privacy.selection.plan_weight_cap); a candidate's table is built when the run has chosen it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence, Tuple

import numpy as np

from dp_partition_beam.privacy.thresholding import KeepTableSpec
from dp_partition_beam.privacy.validation import check_int, check_range

__all__ = [
    "DEFAULT_CAP_QUANTILE",
    "DEFAULT_CAP_BUDGET",
    "MEDIAN_CAP_BUDGET",
    "CAP_Z",
    "CapPlan",
    "cap_grid",
    "degree_buckets",
    "degree_histogram",
    "choose_cap",
    "check_cap_quantile",
    "check_cap_budget",
    "WEIGHT_CAP_CANDIDATES",
    "WEIGHT_CAP_COMMON_ORDER_OF",
    "WEIGHT_CAP_FACTOR",
    "WEIGHT_CAP_MIN_SIGNAL",
    "WeightCapPlan",
    "choose_weight_cap",
    "noisy_median_degree",
]

#: MAD-SIPS's default: the cap at most 2% of the users exceed (docs/mad_sips.md, "Adaptive cap")
DEFAULT_CAP_QUANTILE = 0.98

#: the histogram's share of the selection's Gaussian budget mu_sel^2 (sigma of the rounds x 1.005)
DEFAULT_CAP_BUDGET = 0.01

#: the histogram's share when only ``weight_cap='auto'`` reads it (the median, not the adaptive cap's 2% tail):
#: where the choice is 1 the share is all it costs (retail -0.1% and Higgs -0.04% at 0.002 against -0.4% at
#: 0.01), and the median of a few thousand users is still found (docs/mad_sips.md, "Automatic weight cap")
MEDIAN_CAP_BUDGET = 0.002

#: the choice raises each noisy tail by CAP_Z of its standard deviations (a cap chosen too small by the
#: noise alone has probability < 2.3% per grid value)
CAP_Z = 2.0

#: ``weight_cap='auto'``: the caps it chooses from, 2^(-k/2) without 2^(-1/2) (whose table keeps an item
#: with only 2.8% less weight than no cap's, W50 17.7 against 18.2 at epsilon 1, Delta_0 100, while users
#: with one item lose 29% of theirs): 1, 0.5, 0.354, 0.25, 0.177, 0.125
WEIGHT_CAP_CANDIDATES = (1.0,) + tuple(2.0 ** (-k / 2.0) for k in range(2, 7))

#: ``weight_cap='auto'``: every candidate's table is built at the order, RDP budget and grid that the
#: calibration finds for this candidate (privacy.selection.plan_weight_cap): no cap's, so that data of users
#: with few items (where the choice is 1) loses only the histogram's share; the other tables' W50 are then
#: up to 3.8% above those at their own best orders (epsilon 0.5-4, Delta_0 100; 0.25's order: 1.5-2.4% for
#: c = 1, and retail and Higgs lost 1.5-2% of their items instead of 0.4%)
WEIGHT_CAP_COMMON_ORDER_OF = 1.0

#: ``weight_cap='auto'`` aims at WEIGHT_CAP_FACTOR / sqrt(median user degree): the best cap of the five
#: corpora measured (docs/mad_sips.md, "Weight cap")
WEIGHT_CAP_FACTOR = 1.5

#: ``weight_cap='auto'`` keeps 1 (no cap) unless the noisy user count is at least WEIGHT_CAP_MIN_SIGNAL times
#: the standard deviation of the noise on the whole histogram, ``sigma_H sqrt(len(grid))``: on fewer users
#: the noise moves the median by whole buckets (200 users of degree 1 at cap_budget 0.002: 0.177 was chosen
#: 27% of the time without the rule), and a cap chosen too small costs users with few items most of their
#: weight. About 1,300 users at epsilon 1, delta 1e-5, Delta_0 100 and cap_budget 0.002 (580 at 0.01)
WEIGHT_CAP_MIN_SIGNAL = 4.0


def check_cap_quantile(q) -> float:
    """``cap_quantile`` in (0, 1]; 1 turns the adaptive cap off (every round caps at Delta_0)."""
    return check_range("cap_quantile", q, 0.0, 1.0, lo_open=True)


def check_cap_budget(b) -> float:
    """``cap_budget`` in (0, 0.5]."""
    return check_range("cap_budget", b, 0.0, 0.5, lo_open=True)


def cap_grid(max_contributions: int) -> Tuple[int, ...]:
    """The candidate caps: ``round(2^(j/2))`` below ``Delta_0``, then ``Delta_0`` (1, 2, 3, 4, 6, 8, 11, 16,
    23, 32, 45, 64, 91, 100 for Delta_0 = 100): steps of sqrt(2), so the chosen cap is within a factor
    sqrt(2) of the best grid-free one."""
    d0 = check_int("max_contributions", max_contributions, 1)
    out, j = [], 0
    while True:
        g = int(round(2.0 ** (j / 2.0)))
        if g >= d0:
            break
        if not out or g > out[-1]:
            out.append(g)
        j += 1
    return tuple(out) + (d0,)


def degree_buckets(degrees: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """The bucket of each degree (>= 1): the first j with ``degree <= grid[j]``; degrees above the last
    grid value (Delta_0) fall in the last bucket."""
    d = np.asarray(degrees, dtype=np.int64)
    return np.minimum(np.searchsorted(np.asarray(grid, dtype=np.int64), d, side="left"), len(grid) - 1)


def degree_histogram(degrees: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """``n_j``: the number of users in each bucket of ``grid`` (int64, one entry per grid value)."""
    return np.bincount(degree_buckets(degrees, grid), minlength=len(grid)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class CapPlan:
    """The adaptive cap's public plan (all of it fixed before any data is read).

    Attributes:
      grid: the candidate caps, increasing, the last one Delta_0.
      noise_scale: sigma_H, the Gaussian noise of each histogram count (l2 sensitivity 1).
      quantile: ``cap_quantile``; the cap aims at <= (1 - quantile) of the users above it.
      budget: ``cap_budget``, the histogram's share of the selection's mu^2.
      z: the safety margin of :func:`choose_cap` in standard deviations.
      rounds: the calibrated rounds (``privacy.selection.RoundPlan`` tuples) for each grid value.
    """

    grid: Tuple[int, ...]
    noise_scale: float
    quantile: float
    budget: float
    z: float
    rounds: Tuple[tuple, ...]

    def rounds_for(self, cap: int) -> tuple:
        """The rounds calibrated for ``cap`` (a grid value)."""
        try:
            return self.rounds[self.grid.index(int(cap))]
        except ValueError:
            raise ValueError(f"cap {cap!r} is not a value of the grid {list(self.grid)}") from None

    def as_report(self) -> dict:
        return {
            "grid": list(self.grid),
            "noise_scale": self.noise_scale,
            "quantile": self.quantile,
            "budget": self.budget,
            "z": self.z,
        }


def choose_cap(noisy_counts: Sequence[float], plan: CapPlan) -> int:
    """The smallest grid value ``g_j`` with ``T_j + z sigma_H sqrt(J - 1 - j) <= (1 - quantile) N``.

    ``T_j = sum_{i > j} n~_i`` is the noisy number of users above ``g_j`` (its noise has standard
    deviation ``sigma_H sqrt(J - 1 - j)``), ``N = sum_i n~_i`` the noisy number of users. Post-processing
    of the noisy histogram; ``Delta_0`` (the last grid value, ``T = 0``) when nothing smaller qualifies or
    when N <= 0.
    """
    n = np.asarray(noisy_counts, dtype=np.float64)
    grid = plan.grid
    if n.shape != (len(grid),):
        raise ValueError(f"noisy_counts must have one entry per grid value ({len(grid)}), got shape {n.shape}")
    total = math.fsum(n)
    allowed = (1.0 - plan.quantile) * total
    for j in range(len(grid) - 1):
        tail = math.fsum(n[j + 1 :])
        if tail + plan.z * plan.noise_scale * math.sqrt(len(grid) - 1 - j) <= allowed:
            return grid[j]
    return grid[-1]


def noisy_median_degree(noisy_counts: Sequence[float], grid: Sequence[int]) -> int:
    """The upper end ``g_j`` of the first bucket whose noisy cumulative count ``sum_{i <= j} n~_i`` reaches
    half the noisy total (the last grid value, Delta_0, when the total is <= 0). Post-processing."""
    n = np.asarray(noisy_counts, dtype=np.float64)
    if n.shape != (len(grid),):
        raise ValueError(f"noisy_counts must have one entry per grid value ({len(grid)}), got shape {n.shape}")
    total = math.fsum(n)
    if not total > 0.0:
        return int(grid[-1])
    for j in range(len(grid)):
        if math.fsum(n[: j + 1]) >= total / 2.0:
            return int(grid[j])
    return int(grid[-1])  # unreachable: the full sum is the total


@dataclasses.dataclass(frozen=True)
class WeightCapPlan:
    """``weight_cap='auto'``'s public plan: the noisy degree histogram and the last round per candidate cap.

    Attributes:
      grid: the histogram's buckets (:func:`cap_grid` of Delta_0; the adaptive cap's, when both are on).
      noise_scale: sigma_H, the Gaussian noise of each histogram count (one histogram for both choices).
      budget: ``cap_budget``, the histogram's share of the selection's mu^2.
      candidates: the weight caps it can choose, decreasing (:data:`WEIGHT_CAP_CANDIDATES`).
      factor: the target is ``factor / sqrt(noisy median degree)`` (:data:`WEIGHT_CAP_FACTOR`).
      common: the keep-table last round (a ``privacy.selection.RoundPlan``) of the candidate
        :data:`WEIGHT_CAP_COMMON_ORDER_OF`, whose order, RDP budget and grid every candidate's table shares
        (its table may be left out: :meth:`without_tables`).
      specs: each candidate's :class:`privacy.thresholding.KeepTableSpec` (``common``'s with the candidate's
        contributions). A candidate's table is built from it when first asked for (:meth:`last_round`; once
        per process): a plan, and the pipeline's steps, carry a few numbers per candidate, and a run builds
        only the table it chose.
    """

    grid: Tuple[int, ...]
    noise_scale: float
    budget: float
    candidates: Tuple[float, ...]
    factor: float
    common: object
    specs: Tuple[KeepTableSpec, ...]

    def spec(self, weight_cap: float) -> KeepTableSpec:
        """The ``KeepTableSpec`` of ``weight_cap`` (a candidate)."""
        try:
            return self.specs[self.candidates.index(float(weight_cap))]
        except ValueError:
            raise ValueError(f"weight cap {weight_cap!r} is not one of {list(self.candidates)}") from None

    def last_round(self, weight_cap: float):
        """The last round calibrated for ``weight_cap`` (a candidate): ``common`` with the candidate's table and
        its W50 as the threshold. Its (epsilon, delta) are ``common``'s: every table shares the order, the RDP
        budget and the conversion delta (``thresholding.to_dp`` reads only those). The table is ``common``'s
        when the spec is its own, else built from the spec (cached per process)."""
        spec = self.spec(weight_cap)
        own = self.common.keep_table
        table = own if own is not None and KeepTableSpec.of(own) == spec else spec.build()
        return dataclasses.replace(self.common, threshold=table.weight_for(0.5), keep_table=table)

    def without_tables(self) -> "WeightCapPlan":
        """This plan without ``common``'s table (~340 KB pickled), for the pipeline's steps: they build the
        chosen candidate's table from its spec."""
        return dataclasses.replace(self, common=self.common.without_keep_table())

    def as_report(self) -> dict:
        return {
            "grid": list(self.grid),
            "noise_scale": self.noise_scale,
            "budget": self.budget,
            "candidates": list(self.candidates),
            "factor": self.factor,
        }


def choose_weight_cap(noisy_counts: Sequence[float], plan: WeightCapPlan) -> float:
    """The smallest candidate at or above ``factor / sqrt(m)``, ``m`` the :func:`noisy_median_degree`
    (1 when the target is above 1, and when the noisy user count is below :data:`WEIGHT_CAP_MIN_SIGNAL`
    ``sigma_H sqrt(len(grid))``: too few users for the median). Rounded up: a cap too small costs the users
    with few items most of their weight, one a step too large only part of the gain (docs/mad_sips.md,
    "Automatic weight cap")."""
    if math.fsum(noisy_counts) < WEIGHT_CAP_MIN_SIGNAL * plan.noise_scale * math.sqrt(len(plan.grid)):
        return max(plan.candidates)  # too few users for the median (WEIGHT_CAP_MIN_SIGNAL): no cap
    target = plan.factor / math.sqrt(noisy_median_degree(noisy_counts, plan.grid))
    above = [c for c in plan.candidates if c >= target]
    return min(above) if above else max(plan.candidates)
