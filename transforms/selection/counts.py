"""``ReleaseCounts``: DP counts of distinct users for the released items only (docs/counts.md).

Input: the capped user sets ``(user, [item])`` (at most Delta_0 distinct items each: the same bounded
contributions the selection used) and a PCollection of the released items (each at most once).
Output: ``(item, noisy_count)`` with Python ints, one per released item whose noisy count is
``>= min_users``.

Stages:
  AsReleased        (item, True)                     the released items, materialised (GroupByKey)
  Barrier           (user, [item])                   materialised capped sets (no fusion deadlock)
  AttachReleased    (user, (S_u, [(item, True)]))    which of the user's items were released:
                                                     side-input dict when few, else the
                                                     hot-item-sharded join (JoinValuesToSets)
  Holders           (item, partial count)            exact int partial counts per bundle
  ZeroForReleased   (item, 0)                        every released item gets a count (0 holders too)
  SumCounts         (item, count)                    capped distinct-user count; never computed for
                                                     an item that was not released
  CountNoise        (item, count + X)                X ~ N_Z(0, sigma_c^2), exact (discrete_gaussian)
  Checkpoint        (item, noisy_count)              materialised: one draw per item, whatever retries
  MinUsers          (item, noisy_count)              noisy_count >= min_users (post-processing)

Randomness: seeded, the noise of item ``i`` is a function of ``(seed, 'count_noise', round, i)``;
unseeded, it comes from ``os.urandom`` (OS entropy, the kernel CSPRNG) on the worker.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Optional

import apache_beam as beam

from dp_partition_beam.privacy.counts import CountPlan, check_min_users
from dp_partition_beam.transforms.core.dofns import BundleDictFn, is_batch
from dp_partition_beam.transforms.core.engine import decode_key_value
from dp_partition_beam.transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS, JoinValuesToSets
from dp_partition_beam.transforms.core.noise import only_value
from dp_partition_beam.transforms.selection.counts_kernels import CountNoise, at_least

__all__ = ["ReleaseCounts", "NoisyCounts", "AddCountNoiseFn"]


def as_released(item):
    return item, True


def zero_count(element):
    """(item, True) -> (item, 0)."""
    return element[0], 0


class BundleHolderCountsFn(BundleDictFn):
    """(user, (S_u, [(item, True)])) -> (item, number of the bundle's users holding it) (exact ints)."""

    def process(self, element):
        _, (_, got) = element
        acc = self._acc
        for item, _ in got:
            acc[item] = acc.get(item, 0) + 1
        yield from self._flush_if_full()


def holder_ones(element):
    """(user, (S_u, [(item, True)])) -> (item, 1) per released item of the user (any windowing)."""
    _, (_, got) = element
    for item, _ in got:
        yield item, 1


class AddCountNoiseFn(beam.DoFn):
    """(item, count) -> (item, count + X), X ~ N_Z(0, sigma^2) exact; see :class:`CountNoise`."""

    def __init__(self, sigma2: Fraction, seed: Optional[int], round_: int):
        self._sigma2, self._seed, self._round = sigma2, seed, round_
        self._noise = None

    def setup(self):
        self._noise = CountNoise(self._sigma2, self._seed, self._round)

    def process(self, element):
        item, count = element
        yield item, self._noise.noisy(item, count)


class ReleaseCounts(beam.PTransform):
    """Capped user sets -> ``(item, noisy distinct-user count)`` for the released items (module docstring).

    Args:
      released: PCollection of released items (each once).
      plan: the :class:`privacy.counts.CountPlan` (its ``sigma2`` and ``round``).
      seed: None (OS entropy) or the reproducible-mode seed.
      min_users: keep items whose noisy count is >= min_users (0 keeps all).
      max_users_per_key, max_broadcast_items: execution options of the join (cost only, never output).
    """

    def __init__(
        self,
        released,
        plan: CountPlan,
        seed: Optional[int] = None,
        min_users: int = 0,
        max_users_per_key: int = 10_000,
        max_broadcast_items: int = DEFAULT_MAX_BROADCAST_ITEMS,
        label=None,
    ):
        super().__init__(label)
        if not isinstance(plan, CountPlan):
            raise TypeError(f"plan must be a privacy.counts.CountPlan, got {type(plan).__name__}")
        self._released, self._plan, self._seed = released, plan, seed
        self._min_users = check_min_users(min_users)
        self._join = dict(max_users_per_key=max_users_per_key, max_broadcast_items=max_broadcast_items)

    def expand(self, user_sets):
        marked = (
            self._released
            | "AsReleased" >> beam.Map(as_released)  # (item, True)
            # materialised once (a GroupByKey on the unique items): the join and the zero counts below
            # read the same released set even if the stage that drew its noise were re-executed
            | "CheckpointReleased" >> beam.GroupByKey()  # (item, [True])
            | "OneMark" >> beam.MapTuple(only_value)  # (item, True)
        )
        user_sets = (
            user_sets
            # A materialisation barrier (a GroupByKey on the unique user keys): the released items are
            # computed from these same sets, and without it the FnApiRunner can fuse this side-input
            # consumer into the stage that produces the sets, which then waits for its own output.
            | "Barrier" >> beam.GroupByKey()  # (user, [[item]]), one set per user
            | "OneSet" >> beam.MapTuple(only_value)  # (user, [item])
        )
        joined = user_sets | "AttachReleased" >> JoinValuesToSets(marked, **self._join)
        # (user, (S_u, [(item, True)])) - only the user's released items
        if is_batch(user_sets):
            holders = joined | "Holders" >> beam.ParDo(BundleHolderCountsFn())  # (item, partial count)
        else:
            holders = joined | "Holders" >> beam.FlatMap(holder_ones)  # (item, 1)
        zeros = marked | "ZeroForReleased" >> beam.Map(zero_count)  # (item, 0)
        return (
            (holders, zeros)
            | "HoldersAndZeros" >> beam.Flatten()  # (item, partial count)
            | "SumCounts" >> beam.CombinePerKey(sum)  # (item, count) for released items only
            | "Noise" >> NoisyCounts(self._plan, self._seed, self._min_users)  # (item, noisy_count >= M)
        )


class NoisyCounts(beam.PTransform):
    """(item, exact capped count) of released items -> (item, noisy_count) with noisy_count >= min_users.

    Stages: CountNoise (exact discrete Gaussian, :class:`AddCountNoiseFn`), Checkpoint (materialised:
    one draw per item whatever retries), MinUsers (post-processing floor; 0 keeps all).
    """

    def __init__(self, plan: CountPlan, seed: Optional[int] = None, min_users: int = 0, label=None):
        super().__init__(label)
        self._plan, self._seed, self._min_users = plan, seed, check_min_users(min_users)

    def expand(self, counts):
        noisy = (
            counts
            | "CountNoise" >> beam.ParDo(AddCountNoiseFn(self._plan.sigma2, self._seed, self._plan.round))
            # (item, count + X)
            | "Checkpoint" >> beam.GroupByKey()  # (item, [noisy]) materialised: drawn once
            | "OneValue" >> beam.MapTuple(only_value)  # (item, noisy_count)
        )
        if self._min_users > 0:
            noisy = noisy | "MinUsers" >> beam.Filter(at_least, self._min_users)  # (item, noisy >= M)
        return noisy


def noisy_counts_of_holders(holders, counts_plan, seed, min_users):
    """(item bytes, holders) of released items -> (item, noisy_count) (the count release's tail)."""
    return (
        holders
        | "DecodeHolders" >> beam.Map(decode_key_value)  # (item, holders)
        | "NoisyCounts" >> NoisyCounts(counts_plan, seed, min_users)  # (item, noisy_count >= M)
    )
