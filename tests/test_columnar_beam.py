"""SelectPartitions on the columnar path (issue 16): element and batch input, key types, shard counts.

Under a seed every algorithm must release exactly what the in-memory reference releases, whatever the
input form (pairs, Arrow RecordBatches, Tables, a mix), the batch size and the number of shards.
"""

import random

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.transforms import window

from privacy.selection import SelectionParams
from transforms import reference
from transforms.selection.select import SelectPartitions

from beam_helpers import collect

RND = random.Random(5)
PAIRS = [(f"u{RND.randrange(700)}", f"i{min(int(RND.paretovariate(0.9)), 400)}") for _ in range(9000)]
PARAMS = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=6, d_max=8)
SETS = reference.user_sets_from_pairs(PAIRS)


def _as_batches(pairs, size, kind):
    out = []
    for a in range(0, len(pairs), size):
        users, items = zip(*pairs[a : a + size])
        t = pa.table({"user": list(users), "item": list(items), "extra": list(range(len(users)))})
        out.append(t.to_batches()[0] if kind == "record_batch" else t)
    return out


@pytest.mark.parametrize("algorithm", ["basic", "count_laplace", "mad", "mad2r", "dp_sips"])
def test_batch_input_equals_element_input_and_the_reference(algorithm, monkeypatch):
    from transforms.core import batches

    monkeypatch.setattr(batches, "DEFAULT_CHUNK_ROWS", 300)  # shards cut into pieces of a few users
    want = sorted(reference.select(SETS, algorithm, PARAMS, seed=4))
    assert want
    batches = _as_batches(PAIRS, 1000, "record_batch")
    mixed = _as_batches(PAIRS[:4000], 700, "table") + PAIRS[4000:]
    for label, elements in (("pairs", PAIRS), ("batches", batches), ("mixed", mixed)):
        got = collect(
            lambda p: (
                p
                | f"Create{label}" >> beam.Create(elements, reshuffle=False)
                | SelectPartitions(algorithm, PARAMS, seed=4, rows_per_shard=2500, batch_rows=999)
            )
        )
        assert sorted(got) == want, label


def test_non_string_keys_round_trip():
    """int users, tuple and bytes items: exact key bytes, decoded back to the original values."""
    pairs = [(int(u[1:]), (i, len(i)) if int(u[1:]) % 2 else i.encode()) for u, i in PAIRS]
    sets = reference.user_sets_from_pairs(pairs)
    want = reference.select(sets, "basic", PARAMS, seed=9)
    got = collect(lambda p: p | beam.Create(pairs) | SelectPartitions("basic", PARAMS, seed=9), fmt=repr)
    assert sorted(got) == sorted(repr(i) for i in want) and want
    assert {type(i) for i in want} <= {tuple, bytes}


def test_unseeded_run_releases_the_heavy_items():
    """Unseeded (OS entropy: run seed on a worker, worker noise): heavy items are released."""
    pairs = [(f"u{u}", "common") for u in range(3000)] + [(f"u{u}", f"rare{u}") for u in range(3000)]
    for algorithm in ("basic", "mad2r", "dp_sips"):
        got = collect(lambda p: p | beam.Create(pairs) | SelectPartitions(algorithm, PARAMS))
        assert got == ["common"], algorithm


def test_windowed_input_is_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="global window"):
        with beam.Pipeline("DirectRunner") as p:
            _ = (
                p
                | beam.Create(PAIRS[:10])
                | beam.Map(lambda kv: window.TimestampedValue(kv, 10))
                | beam.WindowInto(window.FixedWindows(60))
                | SelectPartitions("basic", PARAMS, seed=1)
            )


def test_bad_batches_fail_with_a_clear_error():
    for bad, match in (
        (pa.table({"uid": ["a"], "item": ["x"]}), "columns"),
        (pa.table({"user": ["a", None], "item": ["x", "y"]}), "null"),
        ("not a pair", "pairs or Arrow batches"),
    ):
        with pytest.raises(Exception, match=match):
            with beam.Pipeline("DirectRunner") as p:
                _ = p | beam.Create([bad]) | SelectPartitions("basic", PARAMS, seed=1)
