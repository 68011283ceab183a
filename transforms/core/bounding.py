"""Contribution bounding: (user, item) pairs grouped per user, distinct items capped to Delta_0."""

from __future__ import annotations

from typing import Optional

import apache_beam as beam

from dp_partition_beam.privacy.validation import check_int
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn


class CapUserItemsFn(WorkerRngDoFn):
    """(user, iterable[item]) -> (user, [item]) with at most ``max_contributions`` items.

    Uniform subsample (MAD paper Alg. 1 lines 4-5) by bottom-k priorities, streaming with O(Delta_0)
    memory (:func:`transforms.core.randomness.subsample`). Duplicate items count once.
    """

    def __init__(self, max_contributions: int, seed: Optional[int], round_: int):
        super().__init__(seed)
        self._k = max_contributions
        self._round = round_

    def process(self, element):
        user, items = element
        yield user, randomness.subsample(items, self._k, user, self._round, self._seed, self._rng)


class BoundContributions(beam.PTransform):
    """(user, item) pairs -> (user, [items]) with distinct items, at most ``max_contributions`` each.

    Stages:
      GroupByUser     (user, [item])       duplicates allowed
      CapToDelta0     (user, [item])       uniform random subset of <= Delta_0 distinct items

    One shuffle: the bottom-k subsample already sees all of a user's items and drops repeats
    (a repeat has the same priority), so a separate Distinct (a second shuffle of every pair) is
    not needed.

    Args:
      max_contributions: Delta_0.
      seed: None (OS entropy on workers) or the reproducible-mode seed.
      round_: the round number used in the randomness contract (DP-SIPS re-subsamples every round).
    """

    def __init__(self, max_contributions: int, seed: Optional[int] = None, round_: int = 0, label=None):
        super().__init__(label)
        self._k = check_int("max_contributions", max_contributions, 1)
        self._seed = seed
        self._round = round_

    def expand(self, pairs):
        return (
            pairs
            | "GroupByUser" >> beam.GroupByKey()  # (user, [item]) with repeats
            | "CapToDelta0" >> beam.ParDo(CapUserItemsFn(self._k, self._seed, self._round))  # (user, [item]) |.| <= D0
        )
