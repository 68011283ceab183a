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
  HeavyUsers     (user, B)                                users with > HEAVY_USER_ROWS rows, B buckets
                                                          of ~rows_per_shard / 2 rows
  ShardUsers     ((user shard, bucket, user), Packed)     fingerprint(user) mod S; users with more than
                                                          Delta_0 rows in a batch pre-capped there; a
                                                          heavy user's rows by item bucket (1..B)
  GroupUsers     ((user shard, bucket, user), [Packed])   light users whole (bucket 0), heavy by bucket
  UserChunks     (user shard, Table(user, item))          distinct, by user, pieces of <= ~65k rows
  Cap            (user shard, Table(user, item, degree))  bottom-k to Delta_0 (Alg. 1 l.4-5); the parts
                                                          of a user cut across pieces joined
                                                          (per_user_step)
  Partials       (item shard, Packed(item, hi, mid, lo, holders))  per-item exact partial sums of the
                                                          weights of this user shard, fingerprint(item) mod S
  GroupItems     (item shard, [Packed])                   one row per (user shard, item): a hot item is
                                                          S rows, never a hot key
  NoisyThreshold (round, item key bytes)                  weight + noise >= rho (Alg. 1 l.7-8)

Everything a runner shuffles or keeps is Packed (docs/columnar.md, "Packed tables"): the encoded size of
those PCollections is the run's memory on the in-memory DirectRunner and its shuffle volume elsewhere.

Memory: a user group holds ~rows_per_shard rows (default 2M, ~60-100 MB of Arrow): a user with more
than HEAVY_USER_ROWS rows is grouped apart, by item bucket, in groups of ~rows_per_shard rows; an item
shard holds at most S rows per item. At 10^9 users the shard count grows with the rows, not the shard
size (docs/columnar.md, "Bounds").
"""

from __future__ import annotations

import abc
import os
import zlib
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.transforms.core.batches import (
    DEFAULT_CHUNK_ROWS,
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    Packed,
    ShardCount,
    binary_array,
    bounded_pieces,
    by_item_shard,
    concat,
    dictionary_codes,
    pack_pairs,
    shard_ids,
    split_by_shard,
    unpack_all,
    unpacked,
    user_chunks,
)
from dp_partition_beam.transforms.core.dofns import BundleListsFn, SideInputCache
from dp_partition_beam.transforms.core.fingerprint import from_key_bytes
from dp_partition_beam.transforms.core.noise import only_value
from dp_partition_beam.transforms.core.tables import (
    cap_pairs,
    distinct_sorted_by_user,
    keep_items,
    merge_partials,
)

__all__ = [
    "ShardedUsers",
    "RunSeed",
    "PerUserFn",
    "per_user_step",
    "CapFn",
    "checkpoint",
    "barrier",
    "run_seed_arg",
    "decode_tagged",
]


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


#: A user with more rows than this in the input (after pre-capping per batch) is "heavy": its rows are
#: grouped by (user shard, item bucket, user) instead of with its shard (:class:`ShardedUsers`).
HEAVY_USER_ROWS = DEFAULT_CHUNK_ROWS

#: The group key of a shard's other users: (user shard, NOT_HEAVY, b"").
NOT_HEAVY = 0


def user_row_counts(packed, num_shards, k: Optional[int]):
    """Packed(user, item) batch -> (user shard, Packed(user, rows)): each user's rows in the batch (at
    most ``k``, what the batch's pre-capping keeps, when given)."""
    codes, users = dictionary_codes(packed.table().column(USER))
    rows = np.bincount(codes, minlength=len(users))
    if k is not None:
        rows = np.minimum(rows, k)
    counts = pa.table({USER: users, "rows": rows.astype(np.int64)})
    shards = shard_ids(users, num_shards)
    for shard, part in split_by_shard(counts, shards, num_shards):
        for piece in bounded_pieces(part):
            yield shard, Packed.of(piece)


def heavy_users_of_shard(element, heavy_rows: int, rows_per_group: int):
    """(user shard, [Packed(user, rows)]) -> (user, item buckets) of the shard's users with more than
    ``heavy_rows`` rows in all: ceil(rows / rows_per_group) buckets, so each bucket's group holds about
    ``rows_per_group`` rows."""
    counts = unpack_all(element[1])
    codes, users = dictionary_codes(counts.column(USER))
    rows = np.bincount(codes, weights=counts.column("rows").to_numpy(), minlength=len(users))
    for u in np.flatnonzero(rows > heavy_rows):
        yield users[int(u)].as_py(), -(-int(rows[u]) // rows_per_group)


class ShardUsersFn(beam.DoFn):
    """Packed(user, item) -> ((user shard, bucket, user), Packed(user, item)); pre-caps users with > k
    rows in the batch. A heavy user's rows (side input dict user -> B buckets) go to the key (shard,
    1 + fingerprint(item) mod B, user); everybody else's to (shard, NOT_HEAVY, b"")."""

    def __init__(self, k: Optional[int], round_: int):
        self._k, self._round = k, round_
        self._heavy = SideInputCache()  # Arrow array of the heavy users

    def process(self, packed, num_shards, seed, heavy=None):
        if packed.num_rows == 0:
            return
        table = packed.table()
        codes, users = dictionary_codes(table.column(USER))
        if self._k is not None and int(np.bincount(codes).max()) > self._k:
            # a subset's bottom-k keeps a superset of the final bottom-k (same priorities): exact
            table = cap_pairs(table, self._k, seed, self._round).select([USER, ITEM])
            codes, users = dictionary_codes(table.column(USER))
        # one fingerprint per distinct user of the batch (~10 rows each), not per row
        user_shards = shard_ids(users, num_shards)
        if heavy:
            is_heavy = pc.is_in(users, value_set=self._heavy.get(heavy, binary_array)).to_numpy(zero_copy_only=False)
            for u in np.flatnonzero(is_heavy):
                user = users[int(u)].as_py()
                rows = table.filter(pa.array(codes == u))
                buckets = heavy[user]
                for bucket, part in split_by_shard(rows, shard_ids(rows.column(ITEM), buckets), buckets):
                    for piece in bounded_pieces(part):
                        yield (int(user_shards[u]), 1 + bucket, user), pack_pairs(piece)
            if is_heavy.any():
                light = ~is_heavy[codes]
                table, codes = table.filter(pa.array(light)), codes[light]
        shards = user_shards[codes]
        for shard, rows in split_by_shard(table, shards, num_shards):
            for piece in bounded_pieces(rows):  # long keys: a batch's rows of a shard can pass the bound
                yield (shard, NOT_HEAVY, b""), pack_pairs(piece)


class HeavyUsers(beam.PTransform):
    """Packed(user, item) batches -> (user, item buckets) of the users with more than ``heavy_rows`` rows
    (after pre-capping to ``k`` per batch), counted per user shard (one small shuffle of per-batch
    counts)."""

    def __init__(self, num_shards, k: Optional[int], heavy_rows: int, rows_per_group: int, label=None):
        super().__init__(label)
        self._num_shards, self._k = num_shards, k
        self._heavy_rows, self._rows_per_group = heavy_rows, rows_per_group

    def expand(self, packed):
        return (
            packed
            | "UserRows" >> beam.FlatMap(user_row_counts, self._num_shards, self._k)  # (user shard, Packed(user, rows))
            | "GroupUserRows" >> beam.GroupByKey()  # (user shard, [Packed(user, rows)])
            | "Heavy" >> beam.FlatMap(heavy_users_of_shard, self._heavy_rows, self._rows_per_group)
            # (user, item buckets)
        )


def distinct_user_chunks(key, packed):
    """((shard, bucket, user), [Packed(user, item)]) -> (shard, Table) pieces of the group's distinct pairs, sorted by
    user, of at most about DEFAULT_CHUNK_ROWS rows, cut between users except inside a user with more
    rows, whose pieces hold only its rows (:func:`per_user_step` joins them again)."""
    table, user_codes = distinct_sorted_by_user(unpack_all(packed))
    for piece in user_chunks(table, user_codes, split_users=True):
        yield key[0], piece


class ShardedUsers(beam.PTransform):
    """Table(user, item) batches -> (user shard, Table(user, item)): pieces of distinct rows by user.

    The elements are pieces of a shard's distinct pairs, sorted by user, of at most about 65k rows (no
    element grows with the data, see transforms.core.batches.DEFAULT_CHUNK_ROWS): a piece of two or more
    users holds all their rows; a user with more rows than a piece is cut into pieces of its own. Every
    per-user step is a :class:`PerUserFn` run by :func:`per_user_step`, which joins such a user's partial
    results (bottom-k of bottom-k's: exact).

    Args:
      seed: singleton side input (``beam.pvalue.AsSingleton``) of the run's seed (:class:`RunSeed`).
      precap_k: Delta_0 to pre-cap heavy users per batch (exact for one bottom-k of the full sets), or
        None to keep every row (DP-SIPS re-subsamples each round from the remaining items).
      rows_per_shard: the target shard size (rows); S = ceil(input rows / rows_per_shard).
      heavy_rows: a user with more rows than this (after pre-capping) is grouped apart by item bucket
        (:class:`HeavyUsers`); default HEAVY_USER_ROWS.
    Returns ``(sharded, num_shards)`` where ``num_shards`` is the singleton PCollection S.
    """

    def __init__(
        self,
        seed,
        precap_k: Optional[int],
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        heavy_rows: Optional[int] = None,
        label=None,
    ):
        super().__init__(label)
        self._seed, self._k, self._rows_per_shard = seed, precap_k, rows_per_shard
        self._heavy_rows = heavy_rows or HEAVY_USER_ROWS

    def expand(self, batches):
        # the input waits for its row count (a side input of ShardUsers): packed, it is ~2.4x smaller
        packed = batches | "Pack" >> beam.Map(pack_pairs)  # Packed(user, item)
        num_shards = packed | "ShardCount" >> ShardCount(self._rows_per_shard)  # S
        shards_si = beam.pvalue.AsSingleton(num_shards)
        heavy = packed | "HeavyUsers" >> HeavyUsers(shards_si, self._k, self._heavy_rows, self._rows_per_shard // 2)
        # (user, item buckets) of the users with more than heavy_rows rows: buckets of ~rows_per_shard / 2
        # rows, so that hash imbalance keeps them below a light shard's group
        sharded = (
            packed
            | "ShardUsers" >> beam.ParDo(ShardUsersFn(self._k, 0), shards_si, self._seed, beam.pvalue.AsDict(heavy))
            # ((user shard, bucket, user), Packed(user, item))
            | "GroupUsers" >> beam.GroupByKey()  # ((user shard, bucket, user), [Packed])
            | "UserChunks" >> beam.FlatMapTuple(distinct_user_chunks)  # (user shard, Table(user, item))
        )
        return sharded, num_shards


#: The output of a :class:`PerUserFn` that carries a part of a user cut across pieces.
PART_OF_USER = "part_of_user"


def single_user(table: pa.Table) -> bool:
    """The piece holds one user's rows (pieces are sorted by user: its first and last rows agree)."""
    users = table.column(USER)
    return table.num_rows > 0 and users[0] == users[-1]


def table_of(piece):
    """The table of a piece that may arrive packed (:func:`barrier` with ``packed=True``)."""
    return piece.table() if isinstance(piece, Packed) else piece


class PerUserFn(beam.DoFn, metaclass=abc.ABCMeta):
    """A per-user step over the pieces of :class:`ShardedUsers`: ``(user shard, Table)`` -> outputs
    (a piece may arrive packed: it is unpacked here, in the step's own stage).

    A piece of two or more users holds every row of each of them: :meth:`whole` runs on it. A piece of
    one user may be a part of a user cut across pieces: :meth:`part` reduces it to rows that :meth:`join`
    (on the list of every part of the user, after a GroupByKey by user in :func:`per_user_step`) turns
    into what :meth:`whole` gives on all of the user's rows. For bottom-k subsampling the part is the
    bottom-k of the piece: the bottom-k of a union is the bottom-k of the parts' bottom-k's (priorities
    are a function of (seed, user, item), transforms.core.tables.cap_pairs), so the join is exact.
    """

    def process(self, element, *args):
        shard, table = element[0], table_of(element[1])
        if not single_user(table):
            yield from self.whole(shard, table, *args)
        elif (part := self.part(table, *args)) is not None:
            yield beam.pvalue.TaggedOutput(PART_OF_USER, ((shard, table.column(USER)[0].as_py()), part))

    @abc.abstractmethod
    def whole(self, shard, table, *args):
        """Outputs for a table that holds every row of each of its users."""

    def part(self, table, *args):
        """A small value that stands for this part of one user (None: nothing), by default the
        :meth:`whole` table of the part (right for bottom-k capping)."""
        out = [t for _, t in self.whole(None, table, *args)]
        return concat(out) if out else None

    def join(self, shard, parts, *args):
        """Outputs of one user from the list of its parts: by default :meth:`whole` on their rows."""
        yield from self.whole(shard, concat(parts).select([USER, ITEM]), *args)


class JoinPartsFn(beam.DoFn):
    """((user shard, user), [part]) -> the outputs of ``fn.join`` for that user."""

    def __init__(self, fn: PerUserFn):
        self._fn = fn

    def setup(self):
        self._fn.setup()

    def process(self, element, *args):
        (shard, _), parts = element
        yield from self._fn.join(shard, list(parts), *args)


def per_user_step(
    pieces,
    label: str,
    fn: PerUserFn,
    *args,
    packed: bool = False,
    outputs: Sequence[str] = (),
    tables: bool = True,
):
    """``pieces | label >> ParDo(fn, *args)``, with the users cut across pieces joined: their parts
    grouped by (user shard, user) and joined (``{label}Join``); the outputs flattened together.

    The parts are small (a bottom-k per piece), and there are few: a user is cut only when it has more
    rows than a piece (~65k), so the join groups hold at most (the user's rows / a piece's rows) parts.

    ``packed``: table outputs stay packed, (shard, Packed table), for consumers that unpack them in their
    own DoFn (:func:`table_of`) or materialise them (:func:`barrier` keeps them as they are).
    ``outputs``: tags of further outputs ``fn`` yields per piece (e.g. MAD-SIPS's candidates); then the
    result is ``(the step's outputs, {tag: PCollection})``. ``tables``: ``fn`` yields (shard, table)
    (packed across the Flatten); False for other values (e.g. histograms: nothing is packed).
    """
    out = pieces | label >> beam.ParDo(fn, *args).with_outputs(PART_OF_USER, *outputs, main="whole")  # whole users
    joined = (
        out[PART_OF_USER]  # ((user shard, user), part)
        | f"{label}Group" >> beam.GroupByKey()  # ((user shard, user), [part])
        | f"{label}Join" >> beam.ParDo(JoinPartsFn(fn), *args)  # the outputs of fn for the user
    )
    whole = out.whole
    if tables:
        # The two inputs come from different stages: a runner may keep the Flatten whole (the FnApiRunner
        # does: it buffered every capped table pickled, then copied the buffer into one bytes object, the
        # peak memory of a 4M-pair run): tables cross it packed.
        whole = whole | f"{label}Pack" >> beam.MapTuple(pack_piece)  # (user shard, Packed)
        joined = joined | f"{label}JoinPack" >> beam.MapTuple(pack_piece)  # (user shard, Packed)
    result = (whole, joined) | f"{label}All" >> beam.Flatten()  # the outputs of fn (tables packed)
    if tables and not packed:
        result = result | f"{label}Unpack" >> beam.MapTuple(unpack_piece)  # the outputs of fn
    return (result, {tag: out[tag] for tag in outputs}) if outputs else result


class CapFn(PerUserFn):
    """(user shard, Table(user, item)) -> (user shard, Table(user, item, degree)) capped to Delta_0.

    Run it with :func:`per_user_step` (a user cut across pieces is capped again on its parts' rows)."""

    def __init__(self, k: int, round_: int):
        self._k, self._round = k, round_

    def whole(self, shard, table, seed):
        if RELEASED in table.column_names:  # DP-SIPS: U_<r attached (released_tables), removed: post-processing
            table = table.filter(pc.is_null(table.column(RELEASED))).select([USER, ITEM])
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


def barrier(pcoll, label: str, packed: bool = False):
    """(shard, table) pieces materialised (a GroupByKey on the shard keys: one group per shard).

    A consumer that reads a side input computed from ``pcoll`` itself must not be fused into the stage
    that produces ``pcoll`` (the FnApiRunner would wait for its own output); this break prevents it.
    Also the checkpoint of noisy tables: a retried consumer reads the same materialised draw.

    ``packed``: give (shard, Packed table) instead, for an output that several stages read (each DoFn
    unpacks it in its own stage, :func:`table_of`): a runner keeps such a PCollection whole, and the
    FnApiRunner copies it once more for every stage that reads it, so it should stay compressed.
    """
    return (
        pcoll
        | f"{label}Pack" >> beam.MapTuple(keyed_piece)  # ((shard, crc32), Packed table): materialised compressed
        | f"{label}" >> beam.GroupByKey()  # ((shard, crc32), [Packed])
        | f"{label}Pieces" >> beam.FlatMapTuple(each_packed_piece if packed else each_keyed_piece)
        # (shard, table), or (shard, Packed table)
    )


def keyed_piece(shard, table):
    """(shard, table or Packed) -> ((shard, crc32 of the packed bytes), Packed table): a key per piece, so a barrier's
    groups hold one piece each. Beam's Flink batch GroupByKey first concatenates the values of a key into
    one record (a Concatenate combine), which must fit a sort buffer: keyed by shard alone, a barrier's
    record grew with the shard (a 4M-pair MAD-SIPS job failed on the standalone cluster, docs/engines.md).
    The key is a function of the piece (deterministic under retries); equal keys only share a group."""
    packed = table if isinstance(table, Packed) else pack_pairs(table)
    return (shard, zlib.crc32(packed.data)), packed


def each_keyed_piece(key, packed):
    """((shard, crc32), [Packed]) -> (shard, table) per piece."""
    for p in packed:
        yield key[0], p.table()


def each_packed_piece(key, packed):
    """((shard, crc32), [Packed]) -> (shard, Packed) per piece."""
    for p in packed:
        yield key[0], p


def pack_piece(shard, table):
    """(shard, table) -> (shard, Packed table) (:func:`pack_pairs`: the user column dictionary-encoded)."""
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


#: the column that marks an item released in an earlier round (:func:`released_tables`)
RELEASED = "released"

#: the schema of :func:`released_tables`' tables
RELEASED_SCHEMA = pa.schema([(ITEM, pa.binary()), (RELEASED, pa.bool_())])


class ReleasedTablesFn(BundleListsFn):
    """(round, item key bytes) -> (0, Table(item, released = true)), one table per bundle (at most
    ``max_buffered`` rows): the released items as the values of a join
    (:class:`transforms.core.item_join.AttachItemColumns`) or of :class:`HoldersOfReleased`. Global window
    only (as the selection's input)."""

    def process(self, element):
        self._append(0, element[1])
        yield from self._flush_if_full()


def released_table(key, items):
    """(0, [item key bytes]) -> (0, Table(item, released))."""
    return key, pa.table({ITEM: pa.array(items, pa.binary()), RELEASED: np.ones(len(items), dtype=bool)})


def released_tables(released, label: str):
    """(round, item key bytes) -> (0, Table(item, released)) tables of the released items (any number of
    them: no side input)."""
    return (
        released
        | f"{label}Lists" >> beam.ParDo(ReleasedTablesFn())  # (0, [item bytes]) per bundle
        | f"{label}Tables" >> beam.MapTuple(released_table)  # (0, Table(item, released))
    )


def released_by_item_shard(element, num_shards):
    """(0, Table(item, released)) -> (item shard, Packed(item))."""
    yield from by_item_shard(element[1].select([ITEM]), num_shards)


class HoldersOfReleasedFn(beam.DoFn):
    """(item shard, {parts: [Packed partials], released: [Packed(item)]}) -> (item key bytes, holders) for the
    shard's released items (joined by item shard, never a side input)."""

    def process(self, element):
        _, grouped = element
        released = [p.table() for p in grouped["released"]]
        if not released:
            return
        w = merge_partials(unpacked(grouped["parts"]))
        kept = keep_items(w, concat(released).column(ITEM).combine_chunks())
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
