"""Users with more rows than a piece or a shard (issue 29, skew): grouped apart, cut across pieces, joined
again exactly (transforms/core/engine.py: ShardedUsers, HeavyUsers, PerUserFn, per_user_step)."""

import json
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core import batches, engine
from dp_partition_beam.transforms.core.batches import ITEM, USER, pairs_table, user_chunks
from dp_partition_beam.transforms.core.tables import cap_pairs
from dp_partition_beam.transforms.selection import mad_sips
from dp_partition_beam.transforms.selection.mad_sips import RoundSetsFn
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect, collect_branches
from tests.support.branch_cases import scoped
from tests.support.user_sets import pairs_of, random_user_sets

# --- user_chunks(split_users=True) ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 25))
def test_split_pieces_are_bounded_and_only_single_user_pieces_hold_part_of_a_user(sizes, max_rows):
    users = np.repeat(np.arange(len(sizes)), sizes)
    table = pa.table({USER: pa.array([f"u{u}".encode() for u in users]), ITEM: pa.array(np.arange(len(users)))})
    pieces = list(user_chunks(table, users, max_rows=max_rows, split_users=True))
    assert pa.concat_tables(pieces).equals(table)  # every row once, in order
    assert all(0 < p.num_rows <= max_rows for p in pieces)
    rows_of = {f"u{u}".encode(): n for u, n in enumerate(sizes)}
    for p in pieces:
        held = p.column(USER).to_pylist()
        if len(set(held)) > 1:  # a piece of two or more users holds every row of each
            assert all(held.count(u) == rows_of[u] for u in set(held))


# --- the join of parts equals the step on the whole user -------------------------------------------------


def one_user(n_items: int, user: bytes = b"whale") -> pa.Table:
    return pa.table({USER: pa.array([user] * n_items), ITEM: pa.array([f"i{j}".encode() for j in range(n_items)])})


def parts_then_join(fn, table, cut, *args):
    parts = [fn.part(table.slice(a, cut), *args) for a in range(0, table.num_rows, cut)]
    return [t for _, t in fn.join(7, [p for p in parts if p is not None], *args)]


@pytest.mark.parametrize("hopeless_share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("with_biases", [False, True])
def test_round_sets_of_a_user_cut_in_parts_equal_its_whole_sets(hopeless_share, with_biases):
    """MAD-SIPS round r (Alg. 4 line 13 and the re-subsampling): dropping U_<r, the hopeless items unless
    all of the user's items are hopeless, bottom-k with round r's priorities, biases attached: the same
    rows whether the user arrives whole or in parts."""
    table = one_user(500)
    rng = random.Random(3)
    items = table.column(ITEM).to_pylist()
    released = set(rng.sample(items, 40))
    if with_biases:  # round 2: round 1's status attached to each row (released: True, or null before round 1)
        hopeless = [i not in released and rng.random() < hopeless_share for i in items]
        table = pa.table(
            {
                USER: table.column(USER),
                ITEM: table.column(ITEM),
                "released": [(True if rng.random() < 0.5 else None) if i in released else False for i in items],
                "bias": [rng.random() for _ in items],
                "hopeless": hopeless,
            }
        )
    else:  # round 1: no status; U_<1 is empty
        released = set()
    fn = RoundSetsFn(2)
    args = (99, 12)
    (want,) = [t for _, t in fn.whole(7, mad_sips.without_released(table), *args)]
    for cut in (1, 37, 499, 500):
        (got,) = parts_then_join(fn, mad_sips.without_released(table), cut, *args)
        assert got.sort_by(ITEM).equals(want.sort_by(ITEM)), cut
    assert want.num_rows == 12
    assert not released & set(want.column(ITEM).to_pylist())
    if with_biases:
        kept_hopeless = [h for i, h in zip(items, hopeless) if i in set(want.column(ITEM).to_pylist())]
        assert any(kept_hopeless) == (hopeless_share == 1.0)  # hopeless items only when all are
        biases = dict(zip(items, table.column("bias").to_pylist()))
        for item, bias in zip(want.column(ITEM).to_pylist(), want.column("bias").to_pylist()):
            assert bias == (1.0 if hopeless_share == 1.0 else biases[item])


def test_cap_of_a_user_cut_in_parts_equals_its_whole_cap():
    plain = one_user(1000)
    # DP-SIPS round 3: U_<3 = {i3} attached (released true there, null elsewhere)
    table = plain.append_column(
        engine.RELEASED, pa.array([True if i == b"i3" else None for i in plain.column(ITEM).to_pylist()], pa.bool_())
    )
    fn = engine.CapFn(10, 3)
    (want,) = [t for _, t in fn.whole(7, table, 5)]
    for cut in (1, 64, 999):
        (got,) = parts_then_join(fn, table, cut, 5)
        assert got.sort_by(ITEM).equals(want.sort_by(ITEM))
    assert want.equals(
        cap_pairs(plain.filter(pa.array([i != b"i3" for i in plain.column(ITEM).to_pylist()])), 10, 5, 3)
    )


# --- ShardedUsers: heavy users grouped apart, every element bounded --------------------------------------


def whale_sets(n_users=300, whales=(("whale-a", 900), ("whale-b", 260))):
    """Zipf users and whales holding the popular items and many items of their own.

    300 Zipf users (~2k rows) beside the whales' 1,160: what the checks read is the whales (cut across 50-row
    pieces and 400-row shards) and a release of 14-19 items per algorithm; the small users only have to make
    several shards (8 of 400 rows) and a non-empty release. 1,200 users cost twice the CPU for the same paths."""
    sets = random_user_sets(random.Random(8), n_users, 300, 12)
    for name, n in whales:
        sets[name] = sorted({f"i{j}" for j in range(60)} | {f"{name}-{j}" for j in range(n - 60)})
    return sets


SELECTION = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=40, d_max=6)
ROUNDS_ALGORITHMS = ["basic", "mad", "mad2r", "dp_sips", "mad_sips"]
COUNTS_ALGORITHMS = ["dp_sips", "mad_sips"]


def _pieces_data(sets):
    return pairs_of(sets) + pairs_of({"whale-a": sets["whale-a"][:100]})  # repeated rows too


def _branches(sets):
    """Every Beam case of this file that runs with the small thresholds, as labelled branches of one pipeline."""
    pairs, table = pairs_of(sets), pairs_table(*zip(*pairs_of(sets)))
    builds = {
        "heavy-users": scoped(
            lambda p: (
                p
                | "Create" >> beam.Create([batches.pack_pairs(table)])
                | "HeavyUsers" >> engine.HeavyUsers(3, None, engine.HEAVY_USER_ROWS, 400)
                | "Format" >> beam.MapTuple(lambda u, b: f"{u.decode()}\t{b}")
            )
        ),
        "pieces": scoped(
            lambda p: (
                (
                    p
                    | "Create" >> beam.Create(_pieces_data(sets))
                    | "Batch" >> batches.ToBatches(batch_rows=97)
                    | "Shard" >> engine.ShardedUsers(4, None, 400)
                )[0]
                | "Format"
                >> beam.MapTuple(
                    lambda s, t: json.dumps([s, [[u.decode(), i.decode()] for u, i in zip(*t.to_pydict().values())]])
                )
            )
        ),
    }
    for algorithm in ROUNDS_ALGORITHMS:
        builds[f"rounds-{algorithm}"] = scoped(
            lambda p, a=algorithm: (
                p
                | "Create" >> beam.Create(pairs)
                | "Select"
                >> SelectPartitions(a, SELECTION, seed=123, output_rounds=True, rows_per_shard=400, batch_rows=97)
                | "Format" >> beam.MapTuple(lambda r, i: f"{r}\t{i}")
            )
        )
    for algorithm in COUNTS_ALGORITHMS:
        builds[f"counts-{algorithm}"] = scoped(
            lambda p, a=algorithm: (
                p
                | "Create" >> beam.Create(pairs)
                | "Select"
                >> SelectPartitions(
                    a, SELECTION.replace(release_counts=True), seed=9, rows_per_shard=400, batch_rows=97
                )
            )
        )
    return builds


@pytest.fixture(scope="module")
def small_threshold_runs():
    """One pipeline over whale_sets() with small thresholds: a piece is at most 50 rows and a user with more
    than 120 rows (after pre-capping) is heavy. {branch: [lines]}; each test below reads its own branch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batches, "DEFAULT_CHUNK_ROWS", 50)
        mp.setattr(engine, "HEAVY_USER_ROWS", 120)
        return collect_branches(_branches(whale_sets()))


def test_heavy_users_are_found_with_their_buckets(small_threshold_runs):
    assert sorted(small_threshold_runs["heavy-users"]) == ["whale-a\t3", "whale-b\t1"]  # ceil(900/400), ceil(260/400)


def test_a_heavy_users_rows_go_to_its_own_groups_by_item_bucket():
    """ShardUsersFn: whale-a's rows (3 buckets) are keyed (its shard, 1..3, whale-a), one bucket per item
    whatever the batch; everybody else's (shard, NOT_HEAVY, b"")."""
    sets = whale_sets()
    table = pairs_table(*zip(*pairs_of(sets)))
    fn = engine.ShardUsersFn(None, 0)
    bucket_of = {}
    for start in range(0, table.num_rows, 97):
        for key, packed in fn.process(batches.pack_pairs(table.slice(start, 97)), 5, 4, {b"whale-a": 3}):
            users = set(packed.table().column(USER).to_pylist())
            if key[1] == engine.NOT_HEAVY:
                assert key[2] == b"" and b"whale-a" not in users
                continue
            assert users == {b"whale-a"} and key[2] == b"whale-a" and 1 <= key[1] <= 3
            for item in packed.table().column(ITEM).to_pylist():
                assert bucket_of.setdefault(item, key) == key
    assert len(bucket_of) == 900 and len(set(bucket_of.values())) == 3


def test_sharded_users_bound_every_piece_and_keep_every_row(small_threshold_runs):
    """Pieces of at most 50 rows, every distinct row once (repeated rows of a whale dropped), and every
    piece that holds a part of the heavy whale-a holds nothing else."""
    sets = whale_sets()
    got = [json.loads(line) for line in small_threshold_runs["pieces"]]
    assert all(0 < len(rows) <= 50 for _, rows in got)
    rows = [tuple(r) for _, piece in got for r in piece]
    assert sorted(rows) == sorted(pairs_of(sets)) and len(rows) == len(set(rows))  # distinct, all kept
    whale = [piece for _, piece in got if any(u == "whale-a" for u, _ in piece)]
    assert len(whale) >= 18 and all({u for u, _ in piece} == {"whale-a"} for piece in whale)


# --- every parallel algorithm with whales: still the reference's output ----------------------------------


@pytest.mark.parametrize("algorithm", ROUNDS_ALGORITHMS)
def test_algorithms_with_heavy_users_equal_the_reference(algorithm, small_threshold_runs):
    """Whales cut across pieces and shards (and, pre-capped per batch, still heavy for basic and MAD):
    the seeded rounds are the reference's, which sees every user whole (a branch of the shared pipeline)."""
    _, per_round = reference.select_rounds(whale_sets(), algorithm, SELECTION, seed=123)
    got = small_threshold_runs[f"rounds-{algorithm}"]
    assert sorted(got) == sorted(f"{r}\t{i}" for r, items in per_round.items() for i in items), algorithm
    assert per_round[1]


@pytest.mark.parametrize("algorithm", COUNTS_ALGORITHMS)
def test_counts_with_heavy_users_equal_the_reference(algorithm, small_threshold_runs):
    want = reference.select_counts(whale_sets(), algorithm, SELECTION.replace(release_counts=True), seed=9)
    got = small_threshold_runs[f"counts-{algorithm}"]
    assert sorted(got) == sorted(str(kv) for kv in want.items()) and want, algorithm


# --- ItemIndex: the lookup of a big side input, built once -----------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=12), unique=True, max_size=60),
    st.lists(st.binary(max_size=12), max_size=80),
    st.booleans(),
    st.sampled_from([1, 2, None]),
)
def test_item_index_positions_equal_arrows_index_in(items, column, fallback, bucket_bits):
    """Also with 2 or 4 buckets in all (bucket_bits): long runs of fingerprints share a bucket."""
    from dp_partition_beam.transforms.core.tables import ItemIndex

    values = pa.array(items, pa.binary())
    queries = pa.array(column + items[:5], pa.binary())  # some hits for sure
    if bucket_bits is None:
        index = ItemIndex(values)
    else:
        few = type("FewBuckets", (ItemIndex,), {"MAX_BUCKET_BITS": bucket_bits})
        index = few(values)
        assert len(index._starts) == (1 << min(bucket_bits, max(1, len(items).bit_length() + 1))) + 1
    if fallback:
        index._exact = False  # the path taken when two items share a fingerprint
    want = pc.index_in(queries, value_set=values).fill_null(-1).to_numpy(zero_copy_only=False)
    assert list(index.positions(queries)) == list(want)


def test_item_index_checks_the_bytes_of_a_fingerprint_hit():
    """A query whose fingerprint equals an item's but whose bytes differ is absent: the check a collision
    of 64-bit fingerprints needs, simulated by giving the index's only slot the query's fingerprint."""
    from dp_partition_beam.transforms.core.fingerprint import fingerprint64
    from dp_partition_beam.transforms.core.tables import ItemIndex

    query = pa.array([b"zz"], pa.binary())
    index = ItemIndex(pa.array([b"a"], pa.binary()), fingerprints=fingerprint64(query))  # b"a" with b"zz"'s
    assert list(index.positions(query)) == [-1]
    assert list(ItemIndex(pa.array([b"zz"], pa.binary())).positions(query)) == [0]
    assert list(index.positions(pa.array([b"a"], pa.binary()))) == [-1]  # b"a" no longer on its slot
    assert list(ItemIndex(pa.array([b"a"], pa.binary())).positions(pa.array([b"a", b"zz"], pa.binary()))) == [0, -1]


class _TagFn(engine.PerUserFn):
    """Marks which of whole / join produced each user's rows."""

    def whole(self, shard, table, *args):
        yield shard, pa.table({USER: table.column(USER), "via": pa.array(["whole"] * table.num_rows)})

    def join(self, shard, parts, *args):
        table = pa.concat_tables(parts)
        yield shard, pa.table({USER: table.column(USER), "via": pa.array(["join"] * table.num_rows)})


def _users_via(element):
    table = engine.table_of(element[1])
    users = [u.decode() for u in table.column(USER).to_pylist()]
    return json.dumps(sorted(set(zip(users, table.column("via").to_pylist()))))


def test_a_one_user_piece_may_be_part_of_a_cut_user_so_it_is_joined():
    """per_user_step runs ``whole`` on a piece of two or more users; a one-user piece may be part of a user cut
    across pieces: ``part``, then the join step."""
    pieces = [
        (0, pa.table({USER: [b"a", b"b"], ITEM: [b"x", b"y"]})),  # two users: whole
        (1, pa.table({USER: [b"c", b"c"], ITEM: [b"x", b"y"]})),  # one user
    ]
    fn = _TagFn()

    def build(p):
        return engine.per_user_step(p | beam.Create(pieces), "Step", fn)

    got = sorted(pair for line in collect(build, fmt=_users_via) for pair in map(tuple, json.loads(line)))
    assert got == [("a", "whole"), ("b", "whole"), ("c", "join")]
    p = beam.Pipeline()
    engine.per_user_step(p | beam.Create(pieces), "Step", fn)
    labels = {t.unique_name for t in p.to_runner_api().components.transforms.values()}
    assert "StepGroup" in labels
