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
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence, Tuple

import numpy as np

from dp_partition_beam.privacy.validation import check_int, check_range

__all__ = [
    "DEFAULT_CAP_QUANTILE",
    "DEFAULT_CAP_BUDGET",
    "CAP_Z",
    "CapPlan",
    "cap_grid",
    "degree_buckets",
    "degree_histogram",
    "choose_cap",
    "check_cap_quantile",
    "check_cap_budget",
]

#: MAD-SIPS's default: the cap at most 2% of the users exceed (docs/mad_sips.md, "Adaptive cap")
DEFAULT_CAP_QUANTILE = 0.98

#: the histogram's share of the selection's Gaussian budget mu_sel^2 (sigma of the rounds x 1.005)
DEFAULT_CAP_BUDGET = 0.01

#: the choice raises each noisy tail by CAP_Z of its standard deviations (a cap chosen too small by the
#: noise alone has probability < 2.3% per grid value)
CAP_Z = 2.0


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
