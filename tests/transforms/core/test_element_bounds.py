"""No element that crosses a shuffle grows with the data (docs/engines.md, "Element sizes").

Found on the standalone Flink cluster (issue 29): a 4M-pair MAD-SIPS job failed with "The record exceeds
the maximum size of a sort buffer (current maximum: 3276800 bytes)": the item-shard partial sums of a whole
user shard went into one element (``by_item_shard``), and pieces cut by rows alone (65,536 rows of partial
sums, ~3.5 MB) passed the bound too. Every table a DoFn emits towards a GroupByKey is now cut into pieces of
at most ``MAX_ELEMENT_BYTES`` (a row is never cut).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dp_partition_beam.transforms.core.batches import (
    DEFAULT_CHUNK_ROWS,
    ITEM,
    MAX_ELEMENT_BYTES,
    bounded_pieces,
    by_item_shard,
    chunks,
    piece_rows,
    user_chunks,
)


def partials(n_items: int, key_len: int = 12) -> pa.Table:
    """Rows shaped like the partial sums the weighting kernels emit: item bytes, three float64 parts,
    holders (fixed-width keys, so every piece of a bounded cut is within the bound exactly)."""
    items = pa.array([f"{i:0{key_len}d}".encode() for i in range(n_items)], type=pa.binary())
    rng = np.random.default_rng(3)
    return pa.table(
        {
            ITEM: items,
            "hi": rng.random(n_items),
            "mid": rng.random(n_items),
            "lo": rng.random(n_items),
            "holders": rng.integers(1, 100, n_items),
        }
    )


def test_a_bounded_cut_keeps_every_row_and_bounds_every_piece():
    table = partials(200_000)
    assert table.nbytes > 5 * MAX_ELEMENT_BYTES  # the case that failed: one element of every row
    pieces = list(bounded_pieces(table))
    assert len(pieces) >= 5
    assert all(p.nbytes <= MAX_ELEMENT_BYTES for p in pieces), max(p.nbytes for p in pieces)
    assert pa.concat_tables(pieces).equals(table)  # nothing lost, nothing reordered


def test_rows_alone_did_not_bound_the_bytes():
    """The old cut (DEFAULT_CHUNK_ROWS rows) of such rows passes the bound; the default cut does not."""
    table = partials(DEFAULT_CHUNK_ROWS)
    assert table.nbytes > MAX_ELEMENT_BYTES
    assert all(p.nbytes <= MAX_ELEMENT_BYTES for p in chunks(table))
    assert piece_rows(table) < DEFAULT_CHUNK_ROWS


@pytest.mark.parametrize("num_shards", [1, 2, 7])
def test_item_shard_elements_are_bounded_and_complete(num_shards):
    table = partials(150_000)
    out = list(by_item_shard(table, num_shards))
    assert {shard for shard, _ in out} <= set(range(num_shards))
    tables = [packed.table() for _, packed in out]
    assert all(t.nbytes <= MAX_ELEMENT_BYTES for t in tables), max(t.nbytes for t in tables)
    got = pa.concat_tables(tables).sort_by(ITEM)
    assert got.equals(table.sort_by(ITEM))


def test_a_row_wider_than_the_bound_is_a_piece_of_its_own():
    wide = pa.table({ITEM: pa.array([b"x" * (2 * MAX_ELEMENT_BYTES), b"y", b"z"], type=pa.binary())})
    pieces = list(bounded_pieces(wide))
    assert [p.num_rows for p in pieces] == [1, 1, 1]
    assert pa.concat_tables(pieces).equals(wide)


def test_user_pieces_are_bounded_but_never_cut_a_user():
    n_users, per_user = 20_000, 10
    users = np.repeat(np.arange(n_users), per_user)
    table = pa.table(
        {
            "user": pa.array([f"user-{u:08d}".encode() for u in users], type=pa.binary()),
            ITEM: pa.array([f"item-{i:012d}".encode() for i in range(users.size)], type=pa.binary()),
        }
    )
    pieces = list(user_chunks(table, users))
    assert len(pieces) > 1 and all(p.nbytes <= MAX_ELEMENT_BYTES for p in pieces)
    seen = [set(p.column("user").to_pylist()) for p in pieces]
    assert sum(len(s) for s in seen) == n_users  # every user in exactly one piece
    assert pa.concat_tables(pieces).equals(table)


def test_per_user_step_outputs_cross_its_flatten_packed_and_come_back_equal():
    """per_user_step's tables cross its Flatten packed (a runner keeps that PCollection whole): the packing
    steps give the same table back; a barrier keeps an already packed table as it is (no second packing)."""
    from dp_partition_beam.transforms.core.batches import Packed
    from dp_partition_beam.transforms.core.engine import keyed_piece, pack_piece, table_of, unpack_piece

    table = pa.table({"user": pa.array([b"u1", b"u1", b"u2"]), ITEM: pa.array([b"a", b"b", b"a"]), "degree": [2, 2, 1]})
    key, packed = pack_piece(7, table)
    assert key == 7 and isinstance(packed, Packed) and packed.num_rows == 3
    assert unpack_piece(key, packed)[1].equals(table) and table_of(packed).equals(table)
    assert table_of(table) is table
    (shard, crc), kept = keyed_piece(3, packed)
    assert shard == 3 and kept is packed
    assert keyed_piece(3, table)[0] == (shard, crc)  # the same key whether it arrived packed or not
