"""The columnar Beam path: Arrow tables of (user, item) rows through sharded per-user and per-item steps.

One Beam element carries up to ``batch_rows`` pairs (or a whole shard), so Beam's per-element cost is
paid per batch, not per pair; the arithmetic is the vectorised kernels of
:mod:`transforms.selection.columnar_kernels`. Stages of one Basic round (shapes after each step):

  Batch          Table(user, item)                        element API gathered per bundle, or batches
  Pack           Packed(user, item)                       zstd-compressed Arrow IPC (batches.Packed)
  ShardCount     S                                        ceil(rows / rows_per_shard), singleton
  ShardUsers     (user shard, Packed(user, item))         fingerprint(user) mod S; users with more than
                                                          Delta_0 rows in a batch pre-capped there
  GroupUsers     (user shard, [Packed])                   every row of a user in one element
  Cap            (user shard, Table(user, item, degree))  distinct, bottom-k to Delta_0 (Alg. 1 l.4-5)
  Partials       (item shard, Packed(item, hi, mid, lo, holders))  per-item exact partial sums of the
                                                          weights of this user shard, fingerprint(item) mod S
  GroupItems     (item shard, [Packed])                   one row per (user shard, item): a hot item is
                                                          S rows, never a hot key
  NoisyThreshold (round, item key bytes)                  weight + noise >= rho (Alg. 1 l.7-8)

Everything a runner shuffles or keeps is Packed (docs/columnar.md, "Packed tables"): the encoded size of
those PCollections is the run's memory on the in-memory DirectRunner and its shuffle volume elsewhere.

Memory: a user shard holds ~rows_per_shard rows (default 2M, ~60-100 MB of Arrow) plus, for a user
with huge degree, at most Delta_0 rows per input batch (pre-capping); an item shard holds at most
S rows per item. At 10^9 users the shard count grows with the rows, not the shard size.
"""

from __future__ import annotations

import os
from typing import Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.transforms.core import tables as C
from dp_partition_beam.transforms.core.batches import (
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    ShardCount,
    binary_array,
    by_item_shard,
    chunks,
    dictionary_codes,
    pack,
    pack_pairs,
    split_by_shard,
    unpack_all,
    unpacked,
    user_chunks,
)
from dp_partition_beam.transforms.core.dofns import SideInputCache, WorkerRngDoFn
from dp_partition_beam.transforms.core.fingerprint import fingerprint64, from_key_bytes
from dp_partition_beam.transforms.core.noise import only_value
from dp_partition_beam.transforms.selection import mad_kernels as K

__all__ = ["ShardedUsers", "RunSeed", "BasicRound", "decode_tagged"]


def fresh_run_seed(_):
    """A 128-bit seed from OS entropy, drawn on a worker (unseeded runs: the subsampling priorities)."""
    return int.from_bytes(os.urandom(16), "big")


class RunSeed(beam.PTransform):
    """A singleton PCollection: ``seed`` if given, else a fresh 128-bit seed from OS entropy on a worker.

    Unseeded runs key only their bottom-k subsampling priorities with it (so every batch and shard of a
    run agrees on a user's priorities); noise is drawn from each worker's own OS-entropy generator.
    """

    def __init__(self, seed: Optional[int], label=None):
        super().__init__(label)
        self._seed = seed

    def expand(self, pbegin):
        start = pbegin | "One" >> beam.Create([None])  # None
        if self._seed is not None:
            return start | "Given" >> beam.Map(lambda _, s: s, self._seed)  # seed
        return start | "Draw" >> beam.Map(fresh_run_seed)  # seed from os.urandom


class ShardUsersFn(beam.DoFn):
    """Packed(user, item) -> (user shard, Packed(user, item)); pre-caps users with > k rows in the batch."""

    def __init__(self, k: Optional[int], round_: int):
        self._k, self._round = k, round_

    def process(self, packed, num_shards, seed):
        if packed.num_rows == 0:
            return
        table = packed.table()
        codes, users = dictionary_codes(table.column(USER))
        if self._k is not None and int(np.bincount(codes).max()) > self._k:
            # a subset's bottom-k keeps a superset of the final bottom-k (same priorities): exact
            table = C.cap_pairs(table, self._k, seed, self._round).select([USER, ITEM])
            codes, users = dictionary_codes(table.column(USER))
        # one fingerprint per distinct user of the batch (~10 rows each), not per row
        shards = (fingerprint64(users) % np.uint64(num_shards)).astype(np.int64)[codes]
        for shard, rows in split_by_shard(table, shards, num_shards):
            yield shard, pack_pairs(rows)


def distinct_user_chunks(shard, packed):
    """(shard, [Packed(user, item)]) -> (shard, Table) pieces of the shard's distinct pairs, sorted by
    user and cut between users (every user's rows in one piece of about DEFAULT_CHUNK_ROWS rows)."""
    table, user_codes = C.distinct_sorted_by_user(unpack_all(packed))
    for piece in user_chunks(table, user_codes):
        yield shard, piece


class ShardedUsers(beam.PTransform):
    """Table(user, item) batches -> (user shard, Table(user, item)): every user's rows in one element.

    The elements are pieces of a shard's distinct pairs cut between users (about 65k rows: no element
    grows with the data, see transforms.core.batches.DEFAULT_CHUNK_ROWS), so every per-user step runs
    per piece.

    Args:
      seed: singleton side input (``beam.pvalue.AsSingleton``) of the run's seed (:class:`RunSeed`).
      precap_k: Delta_0 to pre-cap heavy users per batch (exact for one bottom-k of the full sets), or
        None to keep every row (DP-SIPS re-subsamples each round from the remaining items).
      rows_per_shard: the target shard size (rows); S = ceil(input rows / rows_per_shard).
    Returns ``(sharded, num_shards)`` where ``num_shards`` is the singleton PCollection S.
    """

    def __init__(self, seed, precap_k: Optional[int], rows_per_shard: int = DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._seed, self._k, self._rows_per_shard = seed, precap_k, rows_per_shard

    def expand(self, batches):
        # the input waits for its row count (a side input of ShardUsers): packed, it is ~2.4x smaller
        packed = batches | "Pack" >> beam.Map(pack_pairs)  # Packed(user, item)
        num_shards = packed | "ShardCount" >> ShardCount(self._rows_per_shard)  # S
        sharded = (
            packed
            | "ShardUsers" >> beam.ParDo(ShardUsersFn(self._k, 0), beam.pvalue.AsSingleton(num_shards), self._seed)
            # (user shard, Packed(user, item))
            | "GroupUsers" >> beam.GroupByKey()  # (user shard, [Packed])
            | "UserChunks" >> beam.FlatMapTuple(distinct_user_chunks)  # (user shard, Table(user, item))
        )
        return sharded, num_shards


class CapFn(beam.DoFn):
    """(user shard, Table(user, item)) -> (user shard, Table(user, item, degree)) capped to Delta_0."""

    def __init__(self, k: int, round_: int):
        self._k, self._round = k, round_

    def process(self, element, seed, released=None):
        shard, table = element
        if released:
            table = C.drop_items(table, pa.array(released, type=pa.binary()))  # DP-SIPS: post-processing
        capped = C.cap_pairs(table, self._k, seed, self._round)
        if capped.num_rows:
            yield shard, capped


class BasicPartialsFn(beam.DoFn):
    """(user shard, capped) -> (item shard, Packed(item, hi, mid, lo, holders)) of Basic's weights."""

    def __init__(self, weighting: str):
        self._weighting = weighting

    def process(self, element, num_shards):
        _, capped = element
        partials = C.basic_partials(capped, self._weighting)
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

    def release(self, element, p):
        """The released items (and holders) of ``element`` under round plan ``p``."""
        _, partials = element
        w = C.merge_partials(unpacked(partials))
        noisy = C.noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), p.noise, p.noise_scale, self._seed, p.index, self._rng
        )
        idx = np.flatnonzero(noisy >= p.threshold)  # Alg. 1 line 8
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


def decode_tagged(element):
    """(round, item key bytes) -> (round, item)."""
    r, item = element
    return r, from_key_bytes(item)


def decode_key_value(element):
    """(item key bytes, value) -> (item, value)."""
    item, value = element
    return from_key_bytes(item), value


def barrier(pcoll, label: str):
    """(shard, table) pieces materialised (a GroupByKey on the shard keys: one group per shard).

    A consumer that reads a side input computed from ``pcoll`` itself must not be fused into the stage
    that produces ``pcoll`` (the FnApiRunner would wait for its own output); this break prevents it.
    Also the checkpoint of noisy tables: a retried consumer reads the same materialised draw.
    """
    return (
        pcoll
        | f"{label}Pack" >> beam.MapTuple(pack_piece)  # (shard, Packed table): materialised compressed
        | f"{label}" >> beam.GroupByKey()  # (shard, [Packed])
        | f"{label}Pieces" >> beam.FlatMapTuple(each_piece)  # (shard, table)
    )


def pack_piece(shard, table):
    """(shard, table) -> (shard, Packed table), key columns dictionary-encoded (user-sorted pieces)."""
    return shard, pack_pairs(table)


def unpack_piece(shard, packed):
    """(shard, Packed table) -> (shard, table)."""
    return shard, packed.table()


def each_piece(shard, packed):
    for p in packed:
        yield shard, p.table()


def checkpoint(pcoll, label: str):
    """(key, value) with unique keys, materialised by a GroupByKey (one draw, whatever retries)."""
    return (
        pcoll
        | f"{label}" >> beam.GroupByKey()  # (key, [value])
        | f"{label}One" >> beam.MapTuple(only_value)  # (key, value)
    )


class HoldersOfReleasedFn(beam.DoFn):
    """(item shard, [partials]) -> (item key bytes, holders) for the released items (side-input list)."""

    def __init__(self):
        self._released = SideInputCache()  # Arrow array of the released items

    def process(self, element, released):
        if not released:
            return
        w = C.merge_partials(unpacked(element[1]))
        kept = C.keep_items(w, self._released.get(released, binary_array))
        yield from zip(kept.column(ITEM).to_pylist(), kept.column("holders").to_pylist())


def zero_holders_of_tagged(element):
    """(round, item key bytes) -> (item key bytes, 0)."""
    return element[1], 0


def released_bytes(element):
    """(round, item key bytes) -> item key bytes."""
    return element[1]


def _seed_arg(pipeline_input, seed: Optional[int], label: str):
    """The seed argument of the capping DoFns: the int, or the run's OS-entropy seed as a side input."""
    if seed is not None:
        return seed
    return beam.pvalue.AsSingleton(pipeline_input.pipeline | label >> RunSeed(None))


def _counts(holders, counts_plan, seed, min_users):
    """(item bytes, holders) of released items -> (item, noisy_count) (the count release's tail)."""
    from dp_partition_beam.transforms.selection.counts import NoisyCounts

    return (
        holders
        | "DecodeHolders" >> beam.Map(decode_key_value)  # (item, holders)
        | "NoisyCounts" >> NoisyCounts(counts_plan, seed, min_users)  # (item, noisy_count >= M)
    )


class ColumnarSingleRound(beam.PTransform):
    """One Basic round (weighted_gaussian, weighted_laplace, count_*): batches -> ((round, item), counts).

    ``counts`` is ``(item, noisy_count)`` of the released items when ``counts_plan`` is given, else None.
    """

    def __init__(self, plan, params, seed, counts_plan=None, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._plan, self._params, self._seed = plan, params, seed
        self._counts_plan, self._rows_per_shard = counts_plan, rows_per_shard

    def expand(self, batches):
        k = self._params.max_contributions
        seed_arg = _seed_arg(batches, self._seed, "RunSeed")
        sharded, num_shards = batches | "Users" >> ShardedUsers(seed_arg, k, self._rows_per_shard)
        # (user shard, Table(user, item)), S
        capped = sharded | "Cap" >> beam.ParDo(CapFn(k, 0), seed_arg)  # (user shard, Table(user, item, degree))
        with_holders = self._counts_plan is not None
        out = capped | "Round1" >> BasicRound(
            self._plan, self._seed, beam.pvalue.AsSingleton(num_shards), with_holders
        )  # (round, item bytes) [, (item bytes, holders)]
        released, holders = out if with_holders else (out, None)
        tagged = released | "Decode" >> beam.Map(decode_tagged)  # (round, item)
        if not with_holders:
            return tagged, None
        return tagged, _counts(holders, self._counts_plan, self._seed, self._params.min_users)


class ColumnarDPSIPS(beam.PTransform):
    """DP-SIPS: rounds of Basic; items released earlier removed, sets re-subsampled each round.

    Privacy: round r runs Basic (l2 sensitivity 1) on a dataset that is a function of the raw user sets
    and of the *released* output of rounds < r only; removing released items is post-processing, and
    re-subsampling to Delta_0 keeps each user's round-r contribution within Basic's sensitivity. The
    rounds compose adaptively under ``params.accounting`` (privacy/accounting.py).

    Stages per round r: Cap_r (drop U_<r from the full distinct sets (side input), bottom-k with round
    r's priorities) -> Basic round r -> Checkpoint_r (materialised: the output and the next round's
    removal see the same draw). Counts (optional) count holders in one round-0 subsample of the full sets.
    """

    def __init__(self, plans, params, seed, counts_plan=None, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._plans, self._params, self._seed = plans, params, seed
        self._counts_plan, self._rows_per_shard = counts_plan, rows_per_shard

    def expand(self, batches):
        k = self._params.max_contributions
        seed_arg = _seed_arg(batches, self._seed, "RunSeed")
        full, num_shards = batches | "Users" >> ShardedUsers(seed_arg, None, self._rows_per_shard)
        # (user shard, Table(user, item)) all rows; every round reads them: kept packed
        full = full | "PackFull" >> beam.MapTuple(pack_piece)  # (user shard, Packed(user, item))
        shards_si = beam.pvalue.AsSingleton(num_shards)
        outputs, released_so_far = [], None  # (round, item bytes) of rounds < r
        for plan in self._plans:
            r = plan.index
            removed = removed_before(released_so_far, r)  # side input of U_<r, None in round 1
            capped = (
                full
                | f"Unpack{r}" >> beam.MapTuple(unpack_piece)  # (user shard, Table(user, item))
                | f"Cap{r}" >> beam.ParDo(CapFn(k, r), seed_arg, removed)
            )  # (shard, capped \\ U_<r)
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
        return tagged, _counts(holders, self._counts_plan, self._seed, self._params.min_users)


def all_rounds(outputs):
    """The releases of every round: ((round, item bytes), (round, item)) PCollections."""
    released = tuple(outputs) | "AllRounds" >> beam.Flatten()  # (round, item bytes)
    return released, released | "Decode" >> beam.Map(decode_tagged)  # (round, item)


def removed_before(released_so_far, r: int):
    """Side input (a list) of the item bytes released in rounds < r, or None in round 1 (nothing yet)."""
    if released_so_far is None:
        return None
    return beam.pvalue.AsList(released_so_far | f"Released{r}" >> beam.Map(released_bytes))


def released_through(released_so_far, released_r, r: int):
    """(round, item bytes) released in rounds <= r: round r's release added to the earlier ones."""
    if released_so_far is None:
        return released_r
    return (released_so_far, released_r) | f"Union{r}" >> beam.Flatten()


def holders_in_round0_sets(full, released, k, seed_arg, shards_si):
    """(item bytes, holders) of every released item in one round-0 subsample of the full sets (the count
    release of the re-subsampling algorithms, DP-SIPS and MAD-SIPS)."""
    released_list = beam.pvalue.AsList(released | "ReleasedBytes" >> beam.Map(released_bytes))
    holders = (
        full
        | "CapForCounts" >> beam.ParDo(CapFn(k, 0), seed_arg)  # (shard, capped round 0)
        | "CountPartials" >> beam.ParDo(BasicPartialsFn("count"), shards_si)  # (item shard, Packed partials)
        | "GroupCounts" >> beam.GroupByKey()  # (item shard, [Packed partials])
        | "Holders" >> beam.ParDo(HoldersOfReleasedFn(), released_list)  # (item bytes, holders>0)
    )
    zeros = released | "Zeros" >> beam.Map(zero_holders_of_tagged)  # (item bytes, 0)
    return (
        (holders, zeros)
        | "HoldersAndZeros" >> beam.Flatten()
        | "SumHolders" >> beam.CombinePerKey(sum)  # (item bytes, holders) every released item
    )


def swap(element):
    return element[1], element[0]


# --------------------------------------------------------------------------------------------------
# MAD and MAD2R (MAD paper Alg. 3 and 4)
# --------------------------------------------------------------------------------------------------


class MADInitPartialsFn(beam.DoFn):
    """(user shard, capped) -> (item shard, partials of w_init)  (Alg. 3 lines 3-5)."""

    def __init__(self, b_min: float, d_max: float):
        self._b_min, self._d_max = b_min, d_max

    def process(self, element, num_shards):
        partials = C.mad_init_partials(element[1], self._b_min, self._d_max)
        yield from by_item_shard(partials, num_shards)  # packed


class MADExcessFn(beam.DoFn):
    """(item shard, [w_init partials]) -> Table(item, r) of the hot items (r > 0, Alg. 3 line 6); and
    ``trunc`` output (item shard, partials of w_trunc = min(w_init, tau)) (line 8)."""

    TRUNC = "trunc"

    def process(self, element, tau):  # tau: a float, or a singleton side input (DPNE's tau_k)
        shard, partials = element
        hot, trunc = C.mad_item_excess(C.merge_partials(unpacked(partials)), tau)
        yield from chunks(hot)
        for piece in chunks(trunc):
            yield beam.pvalue.TaggedOutput(self.TRUNC, (shard, pack(piece)))


class MADExcessConstFn(MADExcessFn):
    """:class:`MADExcessFn` with a constant tau held by the DoFn (selection: tau is known at construction)."""

    def __init__(self, tau: float):
        self._tau_const = float(tau)

    def process(self, element):
        yield from MADExcessFn.process(self, element, self._tau_const)


class MADContributionFn(beam.DoFn):
    """(user shard, capped[+bias]) -> (item shard, partials of the users' contributions) (Alg. 3 l.9-17).

    The hot items' r(i) arrive as a side-input list of tables (one per item shard that has any).
    """

    def __init__(self, d_max, b_min, b_max):
        self._params = (d_max, b_min, b_max)
        self._hot = SideInputCache()  # one table of the hot items' r(i)

    def process(self, element, hot_tables, num_shards, tau):  # tau: a float or a singleton side input
        hot = self._hot.get(hot_tables, hot_items_table)
        partials = C.mad_contribution_partials(element[1], hot, tau, *self._params)
        yield from by_item_shard(partials, num_shards)  # packed


def hot_items_table(hot_tables):
    """One Table(item, r) of the hot items (side-input list of tables), or None if there are none.

    Only the tables: under Beam's BundleBasedDirectRunner with injected bundle failures the list was seen
    to hold (shard, table) tuples of the sibling 'trunc' output too (flaky, tests only); any wrong weight
    would still fail the Beam == reference comparison.
    """
    tables = [t for t in hot_tables if isinstance(t, pa.Table)]
    return C.concat(tables) if tables else None


class MADContributionConstFn(MADContributionFn):
    """:class:`MADContributionFn` with a constant tau held by the DoFn (selection)."""

    def __init__(self, tau, d_max, b_min, b_max):
        MADContributionFn.__init__(self, d_max, b_min, b_max)
        self._tau_const = float(tau)

    def process(self, element, hot_tables, num_shards):
        yield from MADContributionFn.process(self, element, hot_tables, num_shards, self._tau_const)


class MADWeightsColumnar(beam.PTransform):
    """(user shard, capped) -> (item shard, [partials]) whose merged sum per item is MAD's w(i).

    Stages (Alg. 3 line numbers):
      InitPartials  (item shard, Table(item, w_init parts))   l.3-5, adaptive users add 1/|S_u|
      GroupInit     (item shard, [partials])
      Excess        Table(item, r) of hot items (r > 0)      l.6 (erratum max); side input of the users
                    trunc: (item shard, w_trunc partials)    l.8
      Contrib       (item shard, contribution partials)      l.9-17 per user (Alg. 2 for biased users)
      AllParts      (item shard, [partials])                 w(i) = w_trunc(i) + sum of contributions (l.12)
    Input: (user shard, Table(user, item, degree)) with every user's rows in one element (``CapFn``'s
    output), or Table(user, item, degree, bias) for biased rounds (MAD2R round 2, MAD-SIPS). Output:
    (item shard, [Packed(item, hi, mid, lo, holders)]); ``merge_partials`` of a group gives Table(item,
    weight, holders) with MAD's w(i) correctly rounded, bit-identical to the reference's ``mad_weights``.
    The hot items are at most n_adaptive / tau (w_init > tau >= 1): a side input (docs/columnar.md
    discusses the bound).
    """

    def __init__(self, tau, d_max, b_min, b_max, num_shards, label=None):
        super().__init__(label)
        # tau: a float, or a singleton side input when it is known only at run time (DPNE's tau_k = rho_k +
        # beta sigma_k, privacy.calibration.mad_tau, always >= 1)
        self._tau_si = tau if isinstance(tau, beam.pvalue.AsSideInput) else None
        K.check_mad_params(1.0 if self._tau_si is not None else tau, d_max, b_min, b_max)
        tau = None if self._tau_si is not None else float(tau)
        self._tau, self._d_max, self._b_min, self._b_max = tau, d_max, b_min, b_max
        self._num_shards = num_shards

    def _tau_arg(self):
        return self._tau if self._tau_si is None else self._tau_si

    def expand(self, capped):
        excess = (
            capped
            | "InitPartials" >> beam.ParDo(MADInitPartialsFn(self._b_min, self._d_max), self._num_shards)
            # (item shard, w_init partials)
            | "GroupInit" >> beam.GroupByKey()  # (item shard, [Packed partials])
            | "Excess"
            >> (
                beam.ParDo(MADExcessFn(), self._tau_si)
                if self._tau_si is not None
                else beam.ParDo(MADExcessConstFn(self._tau))
            ).with_outputs(MADExcessFn.TRUNC, main="hot")
        )  # hot: Table(item, r); trunc: (item shard, w_trunc partials)
        hot = beam.pvalue.AsList(excess.hot)
        if self._tau_si is not None:
            contrib = beam.ParDo(
                MADContributionFn(self._d_max, self._b_min, self._b_max), hot, self._num_shards, self._tau_si
            )
        else:
            contrib = beam.ParDo(
                MADContributionConstFn(self._tau, self._d_max, self._b_min, self._b_max), hot, self._num_shards
            )
        contributions = barrier(capped, "Barrier") | "Contrib" >> contrib  # (item shard, contribution partials)
        return (
            (excess[MADExcessFn.TRUNC], contributions)
            | "AllParts" >> beam.Flatten()  # (item shard, partials)
            | "GroupParts" >> beam.GroupByKey()  # (item shard, [Packed partials])
        )


class MADRound(beam.PTransform):
    """(user shard, capped[+bias]) -> (round, item bytes) [+ (item bytes, holders)]: MAD weights, noise, rho."""

    def __init__(self, plan, params, seed, num_shards, b_min=1.0, b_max=1.0, with_holders=False, label=None):
        super().__init__(label)
        self._plan, self._params, self._seed, self._num_shards = plan, params, seed, num_shards
        self._b_min, self._b_max, self._with_holders = b_min, b_max, with_holders

    def expand(self, capped):
        p = self._plan
        grouped = capped | "MADWeights" >> MADWeightsColumnar(
            p.tau, self._params.d_max, self._b_min, self._b_max, self._num_shards
        )  # (item shard, [Packed partials])
        out = grouped | "NoisyThreshold" >> beam.ParDo(
            NoisyThresholdFn(p, self._seed, self._with_holders)
        ).with_outputs(NoisyThresholdFn.HOLDERS, main="released")  # (round, item bytes); holders
        if self._with_holders:
            return out.released, out[NoisyThresholdFn.HOLDERS]
        return out.released


class ColumnarMAD(beam.PTransform):
    """MAD (one round): batches -> ((round, item), counts or None)."""

    def __init__(self, plans, params, seed, counts_plan=None, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._plan, self._params, self._seed = plans[0], params, seed
        self._counts_plan, self._rows_per_shard = counts_plan, rows_per_shard

    def expand(self, batches):
        k = self._params.max_contributions
        seed_arg = _seed_arg(batches, self._seed, "RunSeed")
        sharded, num_shards = batches | "Users" >> ShardedUsers(seed_arg, k, self._rows_per_shard)
        capped = sharded | "Cap" >> beam.ParDo(CapFn(k, 0), seed_arg)  # (user shard, Table(user, item, degree))
        with_holders = self._counts_plan is not None
        out = capped | "Round1" >> MADRound(
            self._plan, self._params, self._seed, beam.pvalue.AsSingleton(num_shards), with_holders=with_holders
        )
        released, holders = out if with_holders else (out, None)
        tagged = released | "Decode" >> beam.Map(decode_tagged)  # (round, item)
        if not with_holders:
            return tagged, None
        return tagged, _counts(holders, self._counts_plan, self._seed, self._params.min_users)


class Round1StatusFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (item shard, Table(item, released, holders, bias)) of the items that
    are released in round 1 (noisy w1 >= rho_1, Alg. 4 line 7) or kept for round 2 with their bias
    (lines 10-14); the other items (hopeless) are dropped. One draw per item for both uses."""

    def __init__(self, r1, r2, params, seed):
        super().__init__(seed)
        self._r1, self._r2, self._params = r1, r2, params

    def process(self, element):
        shard, partials = element
        w = C.merge_partials(unpacked(partials))
        r1, r2, p = self._r1, self._r2, self._params
        noisy = C.noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), r1.noise, r1.noise_scale, self._seed, r1.index, self._rng
        )  # Alg. 4 line 6
        released = noisy >= r1.threshold  # line 7
        kept, b = C.round2_biases(noisy, r2.threshold, r1.noise_scale, p.c_lb, p.c_ub)  # lines 10-14
        rows = np.flatnonzero(released | kept)
        if len(rows):
            yield (
                shard,
                pa.table(
                    {
                        ITEM: w.column(ITEM).take(rows),
                        "released": released[rows],
                        "holders": w.column("holders").take(rows),
                        "bias": b[rows],
                    }
                ),
            )


def released1_rows(element):
    """(item shard, status) -> (1, item bytes) for the items released in round 1."""
    table = element[1]
    for item in table.filter(table.column("released")).column(ITEM).to_pylist():
        yield 1, item


def released1_holders(element):
    """(item shard, status) -> (item bytes, holders) for the items released in round 1."""
    t = element[1].filter(element[1].column("released"))
    yield from zip(t.column(ITEM).to_pylist(), t.column("holders").to_pylist())


def bias_table(element):
    """(item shard, status) -> Table(item, bias) of the items round 2 keeps (not released)."""
    t = element[1]
    kept = t.filter(pc.invert(t.column("released")))
    return kept.select([ITEM, "bias"])


class AttachBiasesFn(beam.DoFn):
    """(user shard, capped) -> (user shard, Table(user, item, degree, bias)) of the round-2 items (line 13)."""

    def __init__(self):
        self._biases = SideInputCache()  # one Table(item, bias)

    def process(self, element, bias_tables):
        biases = self._biases.get(bias_tables, concat_or_none)
        if biases is None or biases.num_rows == 0:
            return
        sets = C.attach_biases(element[1], biases)
        if sets.num_rows:
            yield element[0], sets


def concat_or_none(tables):
    """One table of a side-input list of tables, or None if the list is empty."""
    return C.concat(tables) if tables else None


class ColumnarMAD2R(beam.PTransform):
    """MAD2R (MAD paper Alg. 4): batches -> ((round, item), counts or None).

    Round 1: unbiased MAD on the capped sets (users subsampled once, line 1); its noisy weights never
    leave the item stage: one DoFn releases U_1 and computes round 2's biases from the same draw, and
    that status is checkpointed (one draw per item whatever retries). Round 2: the capped sets minus
    U_1 and U_low, with biases b(i) (side input), biased MAD with h(t) = b_max/sqrt(t), noise, rho_2.
    """

    def __init__(self, plans, params, seed, counts_plan=None, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        (self._r1, self._r2), self._params, self._seed = plans, params, seed
        self._counts_plan, self._rows_per_shard = counts_plan, rows_per_shard

    def expand(self, batches):
        p, r1, r2 = self._params, self._r1, self._r2
        k = p.max_contributions
        seed_arg = _seed_arg(batches, self._seed, "RunSeed")
        sharded, num_shards = batches | "Users" >> ShardedUsers(seed_arg, k, self._rows_per_shard)
        shards_si = beam.pvalue.AsSingleton(num_shards)
        capped = sharded | "Cap" >> beam.ParDo(CapFn(k, 0), seed_arg)  # (user shard, capped) (line 1)
        status = barrier(
            capped
            | "R1MADWeights" >> MADWeightsColumnar(r1.tau, p.d_max, 1.0, 1.0, shards_si)  # (item shard, [parts])
            | "R1Status" >> beam.ParDo(Round1StatusFn(r1, r2, p, self._seed)),
            "R1Checkpoint",
        )  # (item shard, Table(item, released, holders, bias)), materialised: one draw per item
        released1 = status | "R1Released" >> beam.FlatMap(released1_rows)  # (1, item bytes)
        biases = status | "R2Biases" >> beam.Map(bias_table)  # Table(item, bias)
        round2_sets = barrier(capped, "R2Barrier") | "Round2Sets" >> beam.ParDo(
            AttachBiasesFn(), beam.pvalue.AsList(biases)
        )
        # (user shard, Table(user, item, degree, bias)) = S_u minus U_1 and U_low (line 13)
        with_holders = self._counts_plan is not None
        out2 = round2_sets | "Round2" >> MADRound(
            r2, p, self._seed, shards_si, p.b_min, p.b_max, with_holders=with_holders
        )  # (2, item bytes) [, holders]
        released2, holders2 = out2 if with_holders else (out2, None)
        tagged = (
            (released1, released2)
            | "Union" >> beam.Flatten()  # (round, item bytes)
            | "Decode" >> beam.Map(decode_tagged)  # (round, item)
        )
        if not with_holders:
            return tagged, None
        holders = (status | "Holders1" >> beam.FlatMap(released1_holders), holders2) | "AllHolders" >> beam.Flatten()
        return tagged, _counts(holders, self._counts_plan, self._seed, p.min_users)
