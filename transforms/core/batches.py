"""Arrow batches as Beam elements: the entry of the columnar path, shard keys, run-time shard counts.

The columnar path moves ``pyarrow.Table`` elements of (user, item) rows instead of one element per
pair. Users and items are *key bytes* (:mod:`transforms.core.fingerprint`): Arrow ``binary`` columns,
UTF-8 for ``str`` keys, so grouping is exact (no fingerprint collision can merge two users or two
items). 64-bit fingerprints only choose shards and feed seeded draws.

Shapes used by the transforms (docstrings spell them out):
  batch        Table(user: binary, item: binary)         <= ``batch_rows`` rows, owns its buffers
  (shard, T)   a table whose rows all hash to ``shard``  per-user steps see every row of their users

Shard count: ``S = max(1, ceil(rows / rows_per_shard))``, computed at run time from the number of input
rows (:class:`ShardCount`, a singleton side input), so a shard holds about ``rows_per_shard`` rows
whatever the data size (10^9 users: S grows with the data, each shard stays bounded). Rows are
assigned by ``fingerprint64(key) mod S``.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator, List, Optional, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from dp_partition_beam.privacy.validation import check_int
from dp_partition_beam.transforms.core import elements as E
from dp_partition_beam.transforms.core.dofns import in_global_window, is_batch
from dp_partition_beam.transforms.core.fingerprint import fingerprint64, to_key_bytes

__all__ = [
    "USER",
    "ITEM",
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_ROWS_PER_SHARD",
    "pairs_table",
    "normalise_batch",
    "owned",
    "split_by_shard",
    "shard_ids",
    "concat",
    "binary_array",
    "Packed",
    "pack",
    "pack_pairs",
    "unpack_all",
    "unpacked",
    "split_packed",
    "by_item_shard",
    "bounded_pieces",
    "piece_rows",
    "MAX_ELEMENT_BYTES",
    "ToBatches",
    "ShardCount",
    "require_global_window",
]

USER = "user"
ITEM = "item"
DEFAULT_BATCH_ROWS = 65_536
DEFAULT_ROWS_PER_SHARD = 1_000_000
_BINARY = pa.binary()


def key_bytes_column(keys: List) -> pa.Array:
    """A binary column of the key bytes of Python keys; all-``str`` lists are converted by Arrow in C."""
    if all(type(k) is str for k in keys):  # (Arrow would also take bytes and None: not here)
        return pa.array(keys, type=pa.string()).cast(_BINARY)  # str -> UTF-8: the key bytes of a str
    return pa.array([to_key_bytes(k) for k in keys], type=_BINARY)


def pairs_table(users: Iterable, items: Iterable) -> pa.Table:
    """Table(user, item) of key bytes from Python keys (TypeError for keys with no exact encoding)."""
    return pa.table({USER: key_bytes_column(list(users)), ITEM: key_bytes_column(list(items))})


def _key_column(batch, name: str) -> pa.Array:
    return E.column(batch, name).cast(_BINARY)


def normalise_batch(batch, transform: str = "SelectPartitions") -> pa.Table:
    """A RecordBatch/Table with string or binary ``user`` and ``item`` columns -> Table(user, item) of
    binary key bytes (other columns dropped). ``str`` values keep their UTF-8 bytes, so a string column
    and the element API give the same key bytes.

    Checked with Arrow, per batch (:mod:`transforms.core.elements`): the columns and their types, no
    nulls, no empty user or item, no whitespace-only item in a string item column;
    :class:`transforms.core.elements.InputElementError` otherwise."""
    if not isinstance(batch, (pa.RecordBatch, pa.Table)):
        raise E.InputElementError(f"{transform} expects {E.SELECT_SHAPE}; got {E.describe(batch)}")
    E.check_batch_schema(batch, transform, E.SELECT_SHAPE, ITEM)
    items = E.column(batch, ITEM)
    if pa.types.is_string(items.type) or pa.types.is_large_string(items.type):
        E.check_item_strings(items, transform, E.SELECT_SHAPE)
    table = pa.table({USER: _key_column(batch, USER), ITEM: items.cast(_BINARY)})
    check_key_bytes(table, transform)
    return table


def check_key_bytes(table: pa.Table, transform: str = "SelectPartitions", what: str = "batch") -> None:
    """No empty user or item in a Table(user, item) of key bytes (a typed key's bytes are never empty)."""
    E.check_key_column(table.column(USER), USER, transform, E.SELECT_SHAPE, what)
    E.check_key_column(table.column(ITEM), ITEM, transform, E.SELECT_SHAPE, what)


def owned(table: pa.Table) -> pa.Table:
    """A copy of ``table`` that owns exactly its buffers (a slice would pickle its parent's buffers)."""
    return table.take(pa.array(np.arange(table.num_rows)))


def shard_ids(column, num_shards: int) -> np.ndarray:
    """``fingerprint64(key) mod num_shards`` per row (int64)."""
    return (fingerprint64(column) % np.uint64(num_shards)).astype(np.int64)


def split_by_shard(table: pa.Table, shards: np.ndarray, num_shards: int) -> Iterator[Tuple[int, pa.Table]]:
    """``(shard, rows of that shard)`` for every non-empty shard; every table owns its buffers."""
    if table.num_rows == 0:
        return
    if num_shards == 1:
        yield 0, table
        return
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    for s in range(num_shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if hi > lo:
            yield s, table.take(pa.array(order[lo:hi]))  # take() copies: no parent buffers


def concat(tables: Iterable[pa.Table]) -> pa.Table:
    """One table of all ``tables`` (same schema), chunks combined."""
    tables = list(tables)
    if len(tables) == 1:
        return tables[0].combine_chunks()
    return pa.concat_tables(tables).combine_chunks()


#: Arrow IPC compression of :class:`Packed` tables. zstd level 1 on Zipf (user, item) rows: ~6.6 bytes per
#: row (4.1 with dictionary keys) against ~17.6 pickled, ~40 ns/row to pack and ~17 to unpack; levels 3
#: and 6 gain < 2% for 1.4x and 4x the time; lz4 packs to ~11.7 bytes (measured 2026-11-23, 2 cores).
#: User-sorted 65k-row pieces of the 4M-pair Zipf TSV (issue 31, 2026-11-27): both key columns
#: dictionary-encoded 3.5 bytes/row, 99 + 31 ns/row to pack + unpack; the user column alone 4.6 bytes/row,
#: 39 + 16 ns/row (an item repeats little within a piece: its dictionary costs a hash per row for 1.1 bytes);
#: none 7.3 bytes/row, 26 + 10 ns/row. pack_pairs encodes the user column only.
PACK_CODEC = "zstd"
PACK_LEVEL = 1


class Packed:
    """A table that travels compressed: the zstd-compressed Arrow IPC stream of its rows.

    Shuffled and materialised PCollections of the columnar path carry ``Packed`` tables instead of
    ``pa.Table``: a runner keeps whole PCollections (the in-memory DirectRunner holds every buffer
    until the pipeline ends) or writes them to its shuffle, so their size is the run's memory and
    shuffle volume. Packing is lossless and deterministic; :meth:`table` gives the rows back.

    Attributes:
      data: the IPC stream bytes (schema and compression recorded in the stream).
      num_rows: the number of rows (readable without unpacking).
    """

    __slots__ = ("data", "num_rows")

    def __init__(self, data: bytes, num_rows: int):
        self.data, self.num_rows = data, num_rows

    @classmethod
    def of(cls, table: pa.Table, dictionary=False) -> "Packed":
        """``table`` packed (only its rows' buffers: a slice packs as a copy).

        ``dictionary``: dictionary-encode the binary key columns first (each distinct key once per
        table: ~4 instead of ~7 bytes per (user, item) row on Zipf data); :meth:`table` decodes them.
        True for every binary column, or a collection of column names (the binary ones among them).
        """
        if dictionary:
            names = table.column_names if dictionary is True else set(dictionary)
            table = pa.table(
                [
                    pc.dictionary_encode(c) if c.type == _BINARY and name in names else c
                    for name, c in zip(table.column_names, table.columns)
                ],
                names=table.column_names,
            )
        sink = pa.BufferOutputStream()
        options = ipc.IpcWriteOptions(compression=_pack_codec())
        with ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        return cls(sink.getvalue().to_pybytes(), table.num_rows)

    def table(self) -> pa.Table:
        """The rows, unpacked (one chunk per packed batch; dictionary-encoded key columns decoded)."""
        table = ipc.open_stream(pa.py_buffer(self.data)).read_all()
        if not any(pa.types.is_dictionary(c.type) for c in table.columns):
            return table
        cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns]
        return pa.table(cols, names=table.column_names)

    def __reduce__(self):
        return Packed, (self.data, self.num_rows)

    def __repr__(self):
        return f"Packed({self.num_rows} rows, {len(self.data)} bytes)"


def _pack_codec():
    if pa.Codec.is_available(PACK_CODEC):
        return pa.Codec(PACK_CODEC, compression_level=PACK_LEVEL)
    return None  # a pyarrow built without zstd: uncompressed IPC (still one bytes object)


def pack(table: pa.Table, dictionary=False) -> Packed:
    """``Packed.of(table, dictionary)``."""
    return Packed.of(table, dictionary)


def pack_pairs(table: pa.Table) -> Packed:
    """A Table(user, item, ...) packed with its user column dictionary-encoded (the pieces are sorted or
    grouped by user: a few distinct users per piece; see PACK_CODEC's measurements)."""
    return Packed.of(table, dictionary=(USER,))


def split_packed(table: pa.Table, shards: np.ndarray, num_shards: int) -> Iterator[Tuple[int, Packed]]:
    """``(shard, Packed rows of that shard)`` for every non-empty shard (:func:`split_by_shard`, packed)."""
    for shard, rows in split_by_shard(table, shards, num_shards):
        yield shard, Packed.of(rows)


def by_item_shard(table: pa.Table, num_shards: int) -> Iterator[Tuple[int, Packed]]:
    """``(item shard, Packed rows)``: per-item rows (partial sums) to their item shard, packed, in
    :func:`bounded_pieces` (the rows of one user shard for one item shard grow with the data; the
    consumers merge every piece of a shard, so where an item's rows are cut does not matter)."""
    for shard, rows in split_by_shard(table, shard_ids(table.column(ITEM), num_shards), num_shards):
        for piece in bounded_pieces(rows):
            yield shard, Packed.of(piece)


def unpacked(packed: Iterable[Packed]) -> List[pa.Table]:
    """The tables of ``packed`` (e.g. the grouped partial sums of one item shard)."""
    return [p.table() for p in packed]


def unpack_all(packed: Iterable[Packed]) -> pa.Table:
    """One table of the rows of every packed table (same schema), chunks combined."""
    return concat(p.table() for p in packed)


def _checked_item_column(items: List) -> pa.Array:
    """The key-bytes column of a list of items, with no whitespace-only ``str`` item (Arrow's
    ``utf8_is_space`` for all-``str`` lists, the common case; ``str.isspace`` on the ``str`` items of a
    list holding typed keys)."""
    if all(type(k) is str for k in items):
        strings = pa.array(items, type=pa.string())
        E.check_item_strings(strings, "SelectPartitions", E.SELECT_SHAPE, "(user, item) pair")
        return strings.cast(_BINARY)
    if any(type(k) is str and k.isspace() for k in items):
        raise E.InputElementError(
            f"SelectPartitions expects {E.SELECT_SHAPE}; got a (user, item) pair with an item that is only whitespace"
        )
    return key_bytes_column(items)


class _ToBatchesFn(beam.DoFn):
    """(user, item) elements or Arrow batches -> Table(user, item) batches of <= ``batch_rows`` rows."""

    def __init__(self, batch_rows: int):
        self._batch_rows = batch_rows
        self._users: List = []
        self._items: List = []

    def start_bundle(self):
        self._users, self._items = [], []

    def _flush(self) -> Optional[pa.Table]:
        if not self._users:
            return None
        users, items = self._users, self._items
        self._users, self._items = [], []
        table = pa.table({USER: key_bytes_column(users), ITEM: _checked_item_column(items)})
        check_key_bytes(table, "SelectPartitions", "(user, item) pair")  # no empty user or item
        return table

    def process(self, element):
        if type(element) is tuple and len(element) == 2 and type(element[0]) is str and type(element[1]) is str:
            # the hot path: one (str, str) pair; empty and whitespace-only strings are found per flushed
            # batch by Arrow (_checked_item_column, check_key_bytes)
            self._users.append(element[0])
            self._items.append(element[1])
            if len(self._users) >= self._batch_rows:
                yield self._flush()
            return
        if isinstance(element, (pa.RecordBatch, pa.Table)):
            table = normalise_batch(element)
            for start in range(0, table.num_rows, self._batch_rows):
                yield owned(table.slice(start, self._batch_rows))
            return
        user, item = E.check_pair(element, "SelectPartitions", E.SELECT_SHAPE, ITEM)  # typed keys, or an error
        self._users.append(user)
        self._items.append(item)
        if len(self._users) >= self._batch_rows:
            yield self._flush()

    def finish_bundle(self):
        table = self._flush()
        if table is not None:
            yield in_global_window(table)


def require_global_window(pcoll, what: str) -> None:
    if not is_batch(pcoll):
        raise ValueError(
            f"{what} is a batch transform: apply it to a PCollection in the global window "
            "(e.g. beam.WindowInto(window.GlobalWindows()))"
        )


class ToBatches(beam.PTransform):
    """(user, item) elements and/or Arrow batches -> Table(user: binary, item: binary) batches.

    Pairs are gathered per bundle into tables of at most ``batch_rows`` rows; RecordBatch/Table
    elements (columns ``user`` and ``item``, string or binary) are normalised and cut to ``batch_rows``.
    Every element is checked at entry (:mod:`transforms.core.elements`: a pair's types per element, its
    strings and every batch per batch with Arrow): anything else raises
    :class:`transforms.core.elements.InputElementError`. Global window only (the columnar path is a
    batch computation).
    """

    def __init__(self, batch_rows: int = DEFAULT_BATCH_ROWS, label=None):
        super().__init__(label)
        self._batch_rows = check_int("batch_rows", batch_rows, 1)

    def expand(self, pcoll):
        require_global_window(pcoll, "SelectPartitions")
        return pcoll | "Batch" >> beam.ParDo(_ToBatchesFn(self._batch_rows))  # Table(user, item)


def _num_rows(table) -> int:
    return table.num_rows


def shard_count_of(rows: int, rows_per_shard: int) -> int:
    """``max(1, ceil(rows / rows_per_shard))``."""
    return max(1, math.ceil(rows / rows_per_shard))


class ShardCount(beam.PTransform):
    """Tables -> a singleton PCollection: the number of shards, ``max(1, ceil(rows / rows_per_shard))``."""

    def __init__(self, rows_per_shard: int = DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._rows_per_shard = check_int("rows_per_shard", rows_per_shard, 1)

    def expand(self, tables):
        return (
            tables
            | "Rows" >> beam.Map(_num_rows)  # int
            | "Total" >> beam.CombineGlobally(sum)  # int, 0 for empty input
            | "Shards" >> beam.Map(shard_count_of, self._rows_per_shard)  # S >= 1
        )


def binary_array(keys: Iterable[bytes]) -> pa.Array:
    """An Arrow binary array of key bytes (e.g. a side-input list of released or allowed items)."""
    return pa.array(list(keys), type=_BINARY)


def item_array_to_keys(column) -> List:
    """Python keys of a key-bytes column (decoded: str for UTF-8 bytes)."""
    from dp_partition_beam.transforms.core.fingerprint import from_key_bytes

    return [from_key_bytes(b) for b in column.to_pylist()]


def take_rows(table: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of ``table`` where ``mask`` holds (a copy)."""
    return table.filter(pa.array(mask)) if mask.dtype == bool else table.take(pa.array(mask))


def dictionary_codes(column) -> Tuple[np.ndarray, pa.Array]:
    """(int64 code per row, distinct values) of a key column (codes index the distinct values)."""
    enc = pc.dictionary_encode(column)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary


#: the most rows of a table that crosses a shuffle or a materialisation: Flink's sort buffers reject
#: records larger than a memory segment ("Record too large"), so no element may grow with the data
DEFAULT_CHUNK_ROWS = DEFAULT_BATCH_ROWS


#: the most bytes (Arrow buffers) of a table that crosses a shuffle (:func:`bounded_pieces`): well below
#: Flink's sort buffer on a small TaskManager (3,276,800 bytes with 256 MB of managed memory for 2 slots,
#: measured on the standalone cluster of .ci/engines.sh: a larger record fails the job, "The record
#: exceeds the maximum size of a sort buffer"); docs/engines.md
MAX_ELEMENT_BYTES = 1 << 20


def piece_rows(table: pa.Table, max_rows: Optional[int] = None, max_bytes: int = MAX_ELEMENT_BYTES) -> int:
    """Rows a piece of ``table`` may hold: ``max_rows`` (default DEFAULT_CHUNK_ROWS), fewer when that many
    rows would pass ``max_bytes``: ``rows * target // nbytes`` with ``target`` 15/16 of ``max_bytes`` (the
    rest covers a piece's own offsets and padding, and a last user's rows where pieces are cut between
    users), so pieces of rows of equal width stay within ``max_bytes``; at least 1, so a row wider than
    ``max_bytes`` is a piece of its own."""
    rows = max_rows or DEFAULT_CHUNK_ROWS
    nbytes = table.nbytes
    if table.num_rows and nbytes > max_bytes:
        target = max_bytes - max_bytes // 16
        rows = min(rows, max(1, table.num_rows * target // nbytes))
    return rows


def bounded_pieces(table: pa.Table, max_bytes: int = MAX_ELEMENT_BYTES) -> Iterator[pa.Table]:
    """``table`` in pieces of at most :func:`piece_rows` rows, each owning its buffers."""
    yield from chunks(table, piece_rows(table, max_bytes=max_bytes))


def chunks(table: pa.Table, max_rows: Optional[int] = None) -> Iterator[pa.Table]:
    """``table`` in pieces of at most ``max_rows`` rows (default :func:`piece_rows`: DEFAULT_CHUNK_ROWS and
    about MAX_ELEMENT_BYTES), each owning its buffers."""
    max_rows = max_rows or piece_rows(table)
    if table.num_rows <= max_rows:
        if table.num_rows:
            yield table
        return
    for start in range(0, table.num_rows, max_rows):
        yield owned(table.slice(start, max_rows))


def user_chunks(
    table: pa.Table, user_codes: np.ndarray, max_rows: Optional[int] = None, split_users: bool = False
) -> Iterator[pa.Table]:
    """Pieces of ``table`` (rows grouped by user: ``user_codes`` non-decreasing runs) of about
    ``max_rows`` rows, cut only between users, so every user's rows stay in one piece (a single user
    with more rows is one piece of its own). Default ``max_rows``: :func:`piece_rows`. Each piece owns
    its buffers.

    With ``split_users`` no piece exceeds ``max_rows`` rows: a user with more rows is cut into pieces
    that hold only that user's rows, so a piece of two or more users holds every row of each of them,
    and only a piece of one user can be part of a user (:func:`transforms.core.engine.per_user_step`).
    """
    max_rows = max_rows or piece_rows(table)
    n = table.num_rows
    if n <= max_rows:
        if n:
            yield table
        return
    starts = np.flatnonzero(np.r_[True, user_codes[1:] != user_codes[:-1]])  # first row of each user
    lo = 0
    if split_users:
        ends = np.r_[starts[1:], n]
        for big in np.flatnonzero(ends - starts > max_rows):
            first, last = int(starts[big]), int(ends[big])
            for a, b in _user_cuts(starts, lo, first, max_rows):
                yield owned(table.slice(a, b - a))
            for a in range(first, last, max_rows):
                yield owned(table.slice(a, min(max_rows, last - a)))
            lo = last
    for a, b in _user_cuts(starts, lo, n, max_rows):
        yield owned(table.slice(a, b - a))


def _user_cuts(starts: np.ndarray, lo: int, end: int, max_rows: int) -> Iterator[Tuple[int, int]]:
    """(first, end) rows of the pieces of rows [lo, end) (``end`` a user's first row or the last row + 1),
    cut between users (``starts``: each user's first row): about ``max_rows`` each, a user with more
    rows one piece of its own."""
    while lo < end:
        if lo + max_rows >= end:
            yield lo, end
            return
        # the last user start at or before lo + max_rows (beyond lo)
        cut_at = np.searchsorted(starts, lo + max_rows, side="right") - 1
        hi = int(starts[cut_at]) if cut_at >= 0 and starts[cut_at] > lo else None
        if hi is None:  # one user holds more than max_rows rows from lo: end at its last row
            nxt = np.searchsorted(starts, lo, side="right")
            hi = min(int(starts[nxt]), end) if nxt < len(starts) else end
        yield lo, hi
        lo = hi
