"""AttachItemColumns (transforms/core/item_join.py): per-item values joined onto the user pieces by item
shard, every row with exactly its item's values (null where none), rows and order unchanged."""

import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from dp_partition_beam.transforms.core import item_join
from dp_partition_beam.transforms.core.batches import ITEM, USER, Packed, pack_pairs
from dp_partition_beam.transforms.core.item_join import AnswerRequestsFn, AttachItemColumns

from tests.support.beam_helpers import collect_branches

SCHEMA = pa.schema([(ITEM, pa.binary()), ("bias", pa.float64()), ("hopeless", pa.bool_())])


def _pieces(rng, n_pieces, n_items):
    out = []
    for p in range(n_pieces):
        users = [f"u{p}_{j}".encode() for j in range(rng.randint(1, 6)) for _ in range(rng.randint(1, 9))]
        items = [f"i{rng.randrange(n_items)}".encode() for _ in users]
        out.append(
            (rng.randrange(3), pa.table({USER: pa.array(users, pa.binary()), ITEM: pa.array(items, pa.binary())}))
        )
    return out


def _values(rng, n_items, fraction):
    rows = [(f"i{i}".encode(), rng.random(), rng.random() < 0.3) for i in range(n_items) if rng.random() < fraction]
    table = pa.table(
        {
            ITEM: pa.array([r[0] for r in rows], pa.binary()),
            "bias": [r[1] for r in rows],
            "hopeless": [r[2] for r in rows],
        },
        schema=SCHEMA,
    )
    # keyed by an arbitrary key, cut in pieces: the join does not depend on how the values arrive
    return [(k % 4, table.slice(k * 7, 7)) for k in range(-(-table.num_rows // 7))] if table.num_rows else []


def _expected(pieces, values):
    lookup = {}
    for _, t in values:
        for item, bias, hopeless in zip(*(t.column(c).to_pylist() for c in (ITEM, "bias", "hopeless"))):
            lookup[item] = (bias, hopeless)
    out = []
    for shard, t in pieces:
        rows = [
            (u, i, *lookup.get(i, (None, None))) for u, i in zip(t.column(USER).to_pylist(), t.column(ITEM).to_pylist())
        ]
        out.append((shard, tuple(rows)))
    return sorted(out)


def _fmt(element):
    shard, table = element
    cols = [table.column(c).to_pylist() for c in (USER, ITEM, "bias", "hopeless")]
    return repr((shard, tuple(zip(*cols))))


CASES = {
    "some_missing": (11, 40, 60, 0.6, 2),
    "none_have_values": (12, 10, 30, 0.0, 2),
    "all_have_values_one_shard": (13, 25, 20, 1.0, 1),
    "many_shards": (14, 60, 500, 0.5, 7),
}


def test_every_row_gets_its_items_values_in_order():
    inputs = {}
    for name, (seed, n_pieces, n_items, fraction, shards) in CASES.items():
        rng = random.Random(seed)
        pieces = _pieces(rng, n_pieces, n_items)
        if name == "some_missing":
            pieces.append((pieces[0][0], pieces[0][1]))  # two equal pieces in one shard share a group
        inputs[name] = (pieces, _values(rng, n_items, fraction), shards)

    def build(name):
        pieces, values, shards = inputs[name]

        def run(p):
            packed = [(s, pack_pairs(t)) if i % 2 else (s, t) for i, (s, t) in enumerate(pieces)]  # both kinds
            pcs = p | f"{name}/Pieces" >> beam.Create(packed)
            vals = p | f"{name}/Vals" >> beam.Create(values)
            n = beam.pvalue.AsSingleton(p | f"{name}/S" >> beam.Create([shards]))
            return pcs | f"{name}/Attach" >> AttachItemColumns(vals, n, SCHEMA)

        return run

    got = collect_branches({name: build(name) for name in CASES}, fmt=_fmt)
    for name, (pieces, values, _) in inputs.items():
        assert sorted(eval(line) for line in got[name]) == _expected(pieces, values), name  # noqa: S307


def test_two_value_rows_for_one_item_are_an_error():
    fn = AnswerRequestsFn(("bias", "hopeless"), SCHEMA)
    values = pa.table({ITEM: pa.array([b"a", b"a"]), "bias": [0.5, 0.7], "hopeless": [False, True]}, schema=SCHEMA)
    requests = pa.table({ITEM: pa.array([b"a"]), "piece_shard": [0], "piece_id": [1]})
    with pytest.raises(ValueError, match="more than one value row"):
        list(fn.process((0, {"requests": [Packed.of(requests)], "values": [Packed.of(values)]})))


def test_join_keys_refine_the_item_shard():
    # f mod S is the item's shard: a value keyed by its item shard and a request meet at one key
    items = pa.array([f"x{i}".encode() for i in range(2000)])
    from dp_partition_beam.transforms.core.batches import shard_ids

    for s in (1, 3, 8):
        f = item_join.join_keys(items, s, item_join.JOIN_SPLIT)
        assert np.array_equal(f % s, shard_ids(items, s))
        assert f.max() < s * item_join.JOIN_SPLIT and len(np.unique(f)) == s * item_join.JOIN_SPLIT
