"""The shared columnar engine: Arrow tables of (user, item) rows through sharded per-user and per-item steps.

Used by every parallel selection algorithm (:mod:`transforms.selection.basic`, :mod:`~.mad`,
:mod:`~.mad_sips`) and by DPNE (:mod:`transforms.dpne.dpne`): the run seed, user sharding, capping
(bottom-k), checkpoints and fusion barriers, the round bookkeeping of the multi-round algorithms and
the holders of the released items. The arithmetic is the table kernels of
:mod:`transforms.core.tables`. Stages of one Basic round (shapes after each step; the round itself is
:class:`transforms.selection.basic.BasicRound`):

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
import zlib
from typing import Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa

from dp_partition_beam.transforms.core.batches import (
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    ShardCount,
    binary_array,
    bounded_pieces,
    concat,
    dictionary_codes,
    pack_pairs,
    split_by_shard,
    unpack_all,
    unpacked,
    user_chunks,
)
from dp_partition_beam.transforms.core.dofns import SideInputCache
from dp_partition_beam.transforms.core.fingerprint import fingerprint64, from_key_bytes
from dp_partition_beam.transforms.core.noise import only_value
from dp_partition_beam.transforms.core.tables import (
    cap_pairs,
    distinct_sorted_by_user,
    drop_items,
    keep_items,
    merge_partials,
)

__all__ = ["ShardedUsers", "RunSeed", "CapFn", "checkpoint", "barrier", "run_seed_arg", "decode_tagged"]


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
            table = cap_pairs(table, self._k, seed, self._round).select([USER, ITEM])
            codes, users = dictionary_codes(table.column(USER))
        # one fingerprint per distinct user of the batch (~10 rows each), not per row
        shards = (fingerprint64(users) % np.uint64(num_shards)).astype(np.int64)[codes]
        for shard, rows in split_by_shard(table, shards, num_shards):
            for piece in bounded_pieces(rows):  # long keys: a batch's rows of a shard can pass the bound
                yield shard, pack_pairs(piece)


def distinct_user_chunks(shard, packed):
    """(shard, [Packed(user, item)]) -> (shard, Table) pieces of the shard's distinct pairs, sorted by
    user and cut between users (every user's rows in one piece of about DEFAULT_CHUNK_ROWS rows)."""
    table, user_codes = distinct_sorted_by_user(unpack_all(packed))
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
            table = drop_items(table, pa.array(released, type=pa.binary()))  # DP-SIPS: post-processing
        capped = cap_pairs(table, self._k, seed, self._round)
        if capped.num_rows:
            yield shard, capped


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
        | f"{label}Pack" >> beam.MapTuple(keyed_piece)  # ((shard, crc32), Packed table): materialised compressed
        | f"{label}" >> beam.GroupByKey()  # ((shard, crc32), [Packed])
        | f"{label}Pieces" >> beam.FlatMapTuple(each_keyed_piece)  # (shard, table)
    )


def keyed_piece(shard, table):
    """(shard, table) -> ((shard, crc32 of the packed bytes), Packed table): a key per piece, so a barrier's
    groups hold one piece each. Beam's Flink batch GroupByKey first concatenates the values of a key into
    one record (a Concatenate combine), which must fit a sort buffer: keyed by shard alone, a barrier's
    record grew with the shard (a 4M-pair MAD-SIPS job failed on the standalone cluster, docs/engines.md).
    The key is a function of the piece (deterministic under retries); equal keys only share a group."""
    packed = pack_pairs(table)
    return (shard, zlib.crc32(packed.data)), packed


def each_keyed_piece(key, packed):
    """((shard, crc32), [Packed]) -> (shard, table) per piece."""
    for p in packed:
        yield key[0], p.table()


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
        w = merge_partials(unpacked(element[1]))
        kept = keep_items(w, self._released.get(released, binary_array))
        yield from zip(kept.column(ITEM).to_pylist(), kept.column("holders").to_pylist())


def zero_holders_of_tagged(element):
    """(round, item key bytes) -> (item key bytes, 0)."""
    return element[1], 0


def released_bytes(element):
    """(round, item key bytes) -> item key bytes."""
    return element[1]


def run_seed_arg(pipeline_input, seed: Optional[int], label: str):
    """The seed argument of the capping DoFns: the int, or the run's OS-entropy seed as a side input."""
    if seed is not None:
        return seed
    return beam.pvalue.AsSingleton(pipeline_input.pipeline | label >> RunSeed(None))


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


def swap(element):
    return element[1], element[0]


def concat_or_none(tables):
    """One table of a side-input list of tables, or None if the list is empty."""
    return concat(tables) if tables else None
