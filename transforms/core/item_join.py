"""Per-item values joined onto the user pieces by item shard: what a worker holds is bounded by a shard.

The multi-round algorithms need, in each user piece of round r, a value of every item of the piece that
an earlier round decided (MAD-SIPS's status of round r - 1: released, bias, hopeless). Sent as a side
input, that table reaches every worker whole: it grows with the number of distinct items (docs/scaling.md:
24.7 B per distinct input item in every SDK process), which stops fitting a worker between 10^9 and 10^10
pairs. :class:`AttachItemColumns` joins it instead, columnar, in two keyed steps (shapes after each step):

  Requests   (join key, Packed(item, piece shard, piece id))   the distinct items of each piece, by
                                                               join key f = fingerprint(item) mod S*J
  Values     (join key, Packed(item, c_1..c_n))                the per-item table by the same key
  JoinItems  (join key, {requests, values})                    CoGroupByKey: one key's requests and
                                                               values (<= ~rows / (S*J) rows)
  Answers    ((piece shard, piece id), Packed(item, c_1..c_n)) each request's values (null where the
                                                               item has none), back to its piece
  Pieces     ((piece shard, piece id), Packed piece)           the pieces, keyed alike
  JoinPieces ((piece shard, piece id), {pieces, answers})      CoGroupByKey: one piece and its answers
  Attach     (piece shard, Table(..., c_1..c_n))               the piece's rows in their order, with
                                                               their item's values

A group holds one join key's rows (about rows / (S*J)) or one piece (<= ~65k rows) and its answers: never
the whole table. S is the run's shard count (rows / rows_per_shard), J = :data:`JOIN_SPLIT`. A piece id is
the CRC-32 of its packed bytes (:func:`transforms.core.engine.keyed_piece`: a function of the piece, the
same under retries); two equal pieces share a group and get the same answers.

The join changes only how values travel, never a row or a value: the outputs under a seed are those of
the side-input path they replace (tests/transforms/core/test_item_join.py, and every Beam == reference
test of the algorithms that use it).
"""

from __future__ import annotations

from typing import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.transforms.core.batches import (
    ITEM,
    Packed,
    bounded_pieces,
    concat,
    shard_ids,
    split_by_shard,
)
from dp_partition_beam.transforms.core.engine import keyed_piece
from dp_partition_beam.transforms.core.tables import ItemIndex

__all__ = ["AttachItemColumns", "JOIN_SPLIT"]

#: J: join keys per shard (f = fingerprint(item) mod S*J): a join group holds about rows / (S*J) rows
JOIN_SPLIT = 4

_PIECE_SHARD, _PIECE_ID = "piece_shard", "piece_id"


def join_keys(items, num_shards: int, split: int) -> np.ndarray:
    """The join key f = fingerprint(item) mod S*J of each item (f mod S is the item's shard)."""
    return shard_ids(items, max(1, int(num_shards)) * split)


def requests_of_piece(element, num_shards: int, split: int):
    """((shard, piece id), Packed piece) -> (join key, Packed(item, piece shard, piece id)): the piece's
    distinct items, each to its join key."""
    (shard, pid), packed = element
    items = pc.unique(packed.table().column(ITEM).combine_chunks())
    if len(items) == 0:
        return
    n = len(items)
    table = pa.table(
        {
            ITEM: items,
            _PIECE_SHARD: np.full(n, shard, dtype=np.int64),
            _PIECE_ID: np.full(n, pid, dtype=np.int64),
        }
    )
    for key, rows in split_by_shard(table, join_keys(items, num_shards, split), num_shards * split):
        for piece in bounded_pieces(rows):
            yield key, Packed.of(piece)


def values_by_join_key(element, num_shards: int, split: int, columns: Sequence[str]):
    """(any key, Table(item, columns...)) -> (join key, Packed(item, columns...))."""
    if element[1].num_rows == 0:
        return
    table = element[1].select([ITEM, *columns])
    for key, rows in split_by_shard(table, join_keys(table.column(ITEM), num_shards, split), num_shards * split):
        for piece in bounded_pieces(rows):
            yield key, Packed.of(piece)


class AnswerRequestsFn(beam.DoFn):
    """(join key, {requests: [Packed], values: [Packed]}) -> ((piece shard, piece id), Packed(item, columns))
    for every request (the columns null where the item has no value)."""

    def __init__(self, columns: Sequence[str], schema: pa.Schema):
        self._columns, self._schema = tuple(columns), schema

    def process(self, element):
        _, grouped = element
        requests = [p.table() for p in grouped["requests"]]
        if not requests:
            return  # values no piece asked for
        values = [p.table() for p in grouped["values"]]
        values = concat(values) if values else self._schema.empty_table()
        if values.num_rows != len(pc.unique(values.column(ITEM).combine_chunks())):
            raise ValueError("AttachItemColumns: more than one value row for one item")
        asked = concat(requests)
        pos = ItemIndex(values.column(ITEM)).positions(asked.column(ITEM))
        take = pa.array(np.where(pos >= 0, pos, 0), mask=pos < 0) if values.num_rows else None
        answer = {ITEM: asked.column(ITEM)}
        for c in self._columns:
            field = self._schema.field(c)
            if take is None:
                answer[c] = pa.nulls(asked.num_rows, field.type)
            else:
                answer[c] = values.column(c).combine_chunks().take(take)
        answers = pa.table(answer)
        shards = asked.column(_PIECE_SHARD).to_numpy()
        ids = asked.column(_PIECE_ID).to_numpy()
        order = np.lexsort((ids, shards))
        shards, ids = shards[order], ids[order]
        answers = answers.take(pa.array(order))
        cuts = np.flatnonzero((np.diff(shards) != 0) | (np.diff(ids) != 0)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(order)]):
            lo, hi = int(lo), int(hi)
            yield (int(shards[lo]), int(ids[lo])), Packed.of(answers.slice(lo, hi - lo).combine_chunks())


class AttachAnswersFn(beam.DoFn):
    """((piece shard, piece id), {pieces: [Packed], answers: [Packed]}) -> (piece shard, Table(piece columns,
    columns...)): each row of the piece with its item's values, in the piece's row order."""

    def __init__(self, columns: Sequence[str], schema: pa.Schema):
        self._columns, self._schema = tuple(columns), schema

    def process(self, element):
        (shard, _), grouped = element
        answers = [p.table() for p in grouped["answers"]]
        answers = concat(answers) if answers else None
        index = None
        if answers is not None:
            # equal pieces (one group) asked the same items twice: keep one answer per item
            items = answers.column(ITEM).combine_chunks()
            distinct = pc.unique(items)
            if len(distinct) != len(items):
                answers = answers.take(pc.index_in(distinct, value_set=items))
            index = ItemIndex(answers.column(ITEM))
        for packed in grouped["pieces"]:
            piece = packed.table()
            if index is None:
                raise ValueError("AttachItemColumns: a piece got no answers (its requests were lost)")
            pos = index.positions(piece.column(ITEM))
            if (pos < 0).any():
                raise ValueError("AttachItemColumns: an item of a piece got no answer")
            take = pa.array(pos)
            for c in self._columns:
                piece = piece.append_column(c, answers.column(c).combine_chunks().take(take))
            yield shard, piece


class AttachItemColumns(beam.PTransform):
    """(user shard, Table or Packed(user, item, ...)) pieces -> (user shard, Table(user, item, ...,
    columns...)): each row with its item's values from ``values``, null where it has none.

    Args:
      values: PCollection of (any key, Table(item, columns...)), at most one row per item in all (e.g.
        MAD-SIPS's checkpointed status, keyed by item shard).
      num_shards: singleton side input of S (the run's shard count: plan-sized).
      schema: the Arrow schema of the values' tables (item and the columns): the columns' types when an
        item has no value.
      columns: the value columns to attach (default: every column of ``schema`` but item).
      split: J, join keys per shard.
    """

    def __init__(self, values, num_shards, schema: pa.Schema, columns=None, split: int = JOIN_SPLIT, label=None):
        super().__init__(label)
        self._values, self._num_shards, self._schema = values, num_shards, schema
        self._columns = tuple(columns) if columns is not None else tuple(n for n in schema.names if n != ITEM)
        self._split = int(split)
        if self._split < 1:
            raise ValueError(f"split must be >= 1, got {split!r}")
        missing = [c for c in (ITEM, *self._columns) if c not in schema.names]
        if missing:
            raise ValueError(f"AttachItemColumns: the schema has no column {missing}")

    def expand(self, pieces):
        cols = self._columns
        schema = pa.schema([self._schema.field(c) for c in (ITEM, *cols)])
        keyed = pieces | "KeyPieces" >> beam.MapTuple(keyed_piece)  # ((shard, piece id), Packed piece)
        requests = keyed | "Requests" >> beam.FlatMap(requests_of_piece, self._num_shards, self._split)
        # (join key, Packed(item, piece shard, piece id))
        values = self._values | "Values" >> beam.FlatMap(values_by_join_key, self._num_shards, self._split, cols)
        # (join key, Packed(item, columns))
        answers = (
            {"requests": requests, "values": values}
            | "JoinItems" >> beam.CoGroupByKey()  # (join key, {requests: [Packed], values: [Packed]})
            | "Answers" >> beam.ParDo(AnswerRequestsFn(cols, schema))
            # ((piece shard, piece id), Packed(item, columns))
        )
        return (
            {"pieces": keyed, "answers": answers}
            | "JoinPieces" >> beam.CoGroupByKey()  # ((shard, piece id), {pieces: [Packed], answers: [Packed]})
            | "Attach" >> beam.ParDo(AttachAnswersFn(cols, schema))  # (shard, Table(..., columns))
        )
