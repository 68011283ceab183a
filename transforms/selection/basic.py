"""Basic (the weight-and-threshold template, MAD paper Alg. 1 and the DPSU weightings) and DP-SIPS on Beam.

Per-user weights and their partial sums are :mod:`transforms.selection.basic_kernels`; the sharding,
capping and checkpoints are the shared engine (:mod:`transforms.core.engine`, docs/columnar.md). The
runners ``_Basic`` and ``_DPSIPS`` are what :class:`transforms.SelectPartitions` runs for the shapes
'single' and 'dp_sips'; :class:`BasicRound` and :class:`NoisyThresholdFn` are reused by MAD, MAD-SIPS
and DPNE.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.batches import DEFAULT_ROWS_PER_SHARD, ITEM, by_item_shard, unpacked
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn
from dp_partition_beam.transforms.core.engine import (
    RELEASED_SCHEMA,
    CapFn,
    HoldersOfReleasedFn,
    ShardedUsers,
    all_rounds,
    checkpoint,
    decode_tagged,
    pack_piece,
    per_user_step,
    released_by_item_shard,
    released_tables,
    released_through,
    run_seed_arg,
    swap,
    unpack_piece,
    zero_holders_of_tagged,
)
from dp_partition_beam.transforms.core.item_join import AttachItemColumns
from dp_partition_beam.transforms.core.tables import item_bits, merge_partials, noisy_weights
from dp_partition_beam.transforms.selection.basic_kernels import basic_partials
from dp_partition_beam.transforms.selection.counts import noisy_counts_of_holders

__all__ = ["BasicRound", "BasicPartialsFn", "NoisyThresholdFn"]


class BasicPartialsFn(beam.DoFn):
    """(user shard, capped) -> (item shard, Packed(item, hi, mid, lo, holders)) of Basic's weights."""

    def __init__(self, weighting: str):
        self._weighting = weighting

    def process(self, element, num_shards):
        _, capped = element
        partials = basic_partials(capped, self._weighting)
        yield from by_item_shard(partials, num_shards)  # packed


class NoisyThresholdFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (round, item key bytes) for noisy weight >= rho; with ``with_holders``
    also ``holders`` output (item key bytes, number of capped holders) of each released item."""

    HOLDERS = "holders"

    def __init__(self, plan, seed: Optional[int], with_holders: bool):
        super().__init__(seed)
        self._plan, self._with_holders = plan, with_holders

    def process(self, element):
        yield from self.release(element, self._plan)

    def _low_bits(self, items, p):
        """A 128-bit rule's second draws, for the indices it asks (``L2KeepRule.keep``): keyed (seed,
        'noise_low', round, item) under a seed, the worker's generator otherwise."""
        purpose = randomness.KEEP_LOW_PURPOSE
        return lambda idx: item_bits(items.take(pa.array(idx)), self._seed, p.index, self._rng, purpose)

    def release(self, element, p):
        """The released items (and holders) of ``element`` under round plan ``p``."""
        _, partials = element
        w = merge_partials(unpacked(partials))
        if p.keep_table is not None:  # keep iff 64 random bits < F(W) * 2^64 (docs/thresholding.md)
            items = w.column(ITEM)
            bits = item_bits(items, self._seed, p.index, self._rng)
            idx = np.flatnonzero(p.keep_table.keep(w.column("weight").to_numpy(), bits, self._low_bits(items, p)))
        else:
            noisy = noisy_weights(
                w.column(ITEM), w.column("weight").to_numpy(), p.noise, p.noise_scale, self._seed, p.index, self._rng
            )
            idx = np.flatnonzero(passes_threshold(noisy, p.threshold))  # Alg. 1 line 8
        items = w.column(ITEM).take(idx).to_pylist()
        for item in items:
            yield p.index, item
        if self._with_holders:
            for item, h in zip(items, w.column("holders").take(idx).to_pylist()):
                yield beam.pvalue.TaggedOutput(self.HOLDERS, (item, h))


class BasicRound(beam.PTransform):
    """(user shard, capped) -> (round, item key bytes) released by one Basic round (DPSU weightings).

    With ``with_holders`` returns ``(released, holders)`` where holders is (item key bytes, count).
    """

    def __init__(self, plan, seed: Optional[int], num_shards, with_holders: bool = False, label=None):
        super().__init__(label)
        self._plan, self._seed, self._num_shards, self._with_holders = plan, seed, num_shards, with_holders

    def expand(self, capped):
        out = (
            capped
            | "Partials" >> beam.ParDo(BasicPartialsFn(self._plan.weighting), self._num_shards)
            # (item shard, Packed(item, hi, mid, lo, holders))
            | "GroupItems" >> beam.GroupByKey()  # (item shard, [Packed partials])
            | "NoisyThreshold"
            >> beam.ParDo(NoisyThresholdFn(self._plan, self._seed, self._with_holders)).with_outputs(
                NoisyThresholdFn.HOLDERS, main="released"
            )  # (round, item bytes); holders: (item bytes, count)
        )
        if self._with_holders:
            return out.released, out[NoisyThresholdFn.HOLDERS]
        return out.released


class _Basic(beam.PTransform):
    """One Basic round (weighted_gaussian, weighted_laplace, count_*): batches -> ((round, item), counts).

    ``counts`` is ``(item, noisy_count)`` of the released items when the plan has a count plan, else None.
    The one-round shape of the registry: :class:`transforms.selection.mad._MAD` is this transform with
    MAD's round (:meth:`round_transform`).
    """

    def __init__(self, plan, seed, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        # plan: the run's privacy.selection.SelectionPlan (one round)
        self._plan, self._params, self._seed = plan.rounds[0], plan.params, seed
        self._counts_plan, self._rows_per_shard = plan.counts, rows_per_shard

    def expand(self, batches):
        k = self._params.max_contributions
        seed_arg = run_seed_arg(batches, self._seed, "RunSeed")
        sharded, num_shards = batches | "Users" >> ShardedUsers(seed_arg, k, self._rows_per_shard)
        # (user shard, Table(user, item)), S
        capped = per_user_step(sharded, "Cap", CapFn(k, 0), seed_arg)  # (user shard, Table(user, item, degree))
        with_holders = self._counts_plan is not None
        out = capped | "Round1" >> self.round_transform(
            beam.pvalue.AsSingleton(num_shards), with_holders
        )  # (round, item bytes) [, (item bytes, holders)]
        released, holders = out if with_holders else (out, None)
        tagged = released | "Decode" >> beam.Map(decode_tagged)  # (round, item)
        if not with_holders:
            return tagged, None
        return tagged, noisy_counts_of_holders(holders, self._counts_plan, self._seed, self._params.min_users)

    def round_transform(self, num_shards, with_holders: bool):
        """(user shard, capped) -> (round, item bytes) [+ holders]: the round's weights, noise and threshold."""
        return BasicRound(self._plan, self._seed, num_shards, with_holders)


class _DPSIPS(beam.PTransform):
    """DP-SIPS: rounds of Basic; items released earlier removed, sets re-subsampled each round.

    Privacy: round r runs Basic (l2 sensitivity 1) on a dataset that is a function of the raw user sets
    and of the *released* output of rounds < r only; removing released items is post-processing, and
    re-subsampling to Delta_0 keeps each user's round-r contribution within Basic's sensitivity. The
    rounds compose adaptively under ``params.accounting`` (privacy/accounting.py).

    Stages per round r: Cap_r (drop U_<r from the full distinct sets (joined by item shard), bottom-k with round
    r's priorities) -> Basic round r -> Checkpoint_r (materialised: the output and the next round's
    removal see the same draw). Counts (optional) count holders in one round-0 subsample of the full sets.
    """

    def __init__(self, plan, seed, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._plans, self._params, self._seed = plan.rounds, plan.params, seed
        self._counts_plan, self._rows_per_shard = plan.counts, rows_per_shard

    def expand(self, batches):
        k = self._params.max_contributions
        seed_arg = run_seed_arg(batches, self._seed, "RunSeed")
        full, num_shards = batches | "Users" >> ShardedUsers(seed_arg, None, self._rows_per_shard)
        # (user shard, Table(user, item)) all rows; every round reads them: kept packed
        full = full | "PackFull" >> beam.MapTuple(pack_piece)  # (user shard, Packed(user, item))
        shards_si = beam.pvalue.AsSingleton(num_shards)
        outputs, released_so_far = [], None  # (round, item bytes) of rounds < r
        for plan in self._plans:
            r = plan.index
            if released_so_far is None:
                pieces = full | f"Unpack{r}" >> beam.MapTuple(unpack_piece)  # (user shard, Table(user, item))
            else:  # U_<r joined by item shard (any number of released items: no side input)
                removed = released_tables(released_so_far, f"Released{r}")  # (0, Table(item, released))
                pieces = full | f"Removed{r}" >> AttachItemColumns(removed, shards_si, RELEASED_SCHEMA)
                # (user shard, Table(user, item, released)), released null where the item is not in U_<r
            capped = per_user_step(pieces, f"Cap{r}", CapFn(k, r), seed_arg)  # (shard, capped \\ U_<r)
            released_r = capped | f"Round{r}" >> BasicRound(plan, self._seed, shards_si)  # (r, item bytes)
            # materialised: the output, the next round's removal and the counts see the same draw
            released_r = checkpoint(released_r | f"ByItem{r}" >> beam.Map(swap), f"Checkpoint{r}") | (
                f"Unswap{r}" >> beam.Map(swap)
            )  # (r, item bytes)
            if r < len(self._plans):
                released_so_far = released_through(released_so_far, released_r, r)  # U_<=r
            outputs.append(released_r)
        released, tagged = all_rounds(outputs)  # (round, item bytes), (round, item)
        if self._counts_plan is None:
            return tagged, None
        unpacked_full = full | "UnpackForCounts" >> beam.MapTuple(unpack_piece)  # (user shard, Table(user, item))
        holders = holders_in_round0_sets(unpacked_full, released, k, seed_arg, shards_si)  # (item bytes, holders)
        return tagged, noisy_counts_of_holders(holders, self._counts_plan, self._seed, self._params.min_users)


def holders_in_round0_sets(full, released, k, seed_arg, shards_si):
    """(item bytes, holders) of every released item in one round-0 subsample of the full sets (the count
    release of the re-subsampling algorithms, DP-SIPS and MAD-SIPS)."""
    released_items = (
        released_tables(released, "ReleasedItems")  # (0, Table(item, released))
        | "ReleasedByShard" >> beam.FlatMap(released_by_item_shard, shards_si)  # (item shard, Packed(item))
    )
    parts = (
        per_user_step(full, "CapForCounts", CapFn(k, 0), seed_arg)  # (shard, capped round 0)
        | "CountPartials" >> beam.ParDo(BasicPartialsFn("count"), shards_si)  # (item shard, Packed partials)
    )
    holders = (
        {"parts": parts, "released": released_items}
        | "GroupCounts" >> beam.CoGroupByKey()  # (item shard, {parts: [Packed partials], released: [Packed(item)]})
        | "Holders" >> beam.ParDo(HoldersOfReleasedFn())  # (item bytes, holders>0)
    )
    zeros = released | "Zeros" >> beam.Map(zero_holders_of_tagged)  # (item bytes, 0)
    return (
        (holders, zeros)
        | "HoldersAndZeros" >> beam.Flatten()
        | "SumHolders" >> beam.CombinePerKey(sum)  # (item bytes, holders) every released item
    )
