"""Kernels of the count release shared by the Beam transform and the reference (docs/counts.md)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Dict, Hashable, Iterable, Mapping, Optional

from dp_partition_beam.transforms.core.discrete_gaussian import DiscreteGaussian

#: the randomness-contract purpose of the count noise (key: the item; round: CountPlan.round)
COUNT_NOISE_PURPOSE = "count_noise"


class CountNoise:
    """``noisy(item, count) = count + X_item``, X ~ N_Z(0, sigma^2) drawn exactly (an int).

    Seeded: X_item is a function of (seed, 'count_noise', round, item). Unseeded: OS entropy (``os.urandom``).
    """

    def __init__(self, sigma2: Fraction, seed: Optional[int], round_: int):
        self._dg = DiscreteGaussian(sigma2, seed, COUNT_NOISE_PURPOSE, round_)

    def noisy(self, item: Any, count: int) -> int:
        return int(count) + self._dg.draw(item)


def at_least(element, min_users: int) -> bool:
    """(item, noisy_count) -> whether noisy_count >= min_users (the floor; post-processing)."""
    return element[1] >= min_users


def holder_counts(
    user_sets: Mapping[Hashable, Iterable[Hashable]], released: Iterable[Hashable]
) -> Dict[Hashable, int]:
    """Number of users holding each released item (0 if none); other items are never counted."""
    counts = {item: 0 for item in released}
    for items in user_sets.values():
        for item in set(items):
            if item in counts:
                counts[item] += 1
    return counts


def noisy_counts(
    counts: Mapping[Hashable, int], sigma2: Fraction, seed: Optional[int], round_: int, min_users: int = 0
) -> Dict[Hashable, int]:
    """``{item: count + X_item}`` with the floor ``>= min_users`` applied if ``min_users > 0`` (0 keeps
    every item, negative noisy counts included: they are unbiased); same draws as the Beam transform."""
    noise = CountNoise(sigma2, seed, round_)
    out = {item: noise.noisy(item, c) for item, c in counts.items()}
    if min_users > 0:
        out = {item: c for item, c in out.items() if c >= min_users}
    return out
