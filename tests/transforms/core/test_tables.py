"""The columnar path's building blocks against their scalar oracles (issue 16, points 4 and 5).

* key bytes: injective (str vs non-str keys never collide) and decodable;
* ``fingerprint64`` (numpy, vectorised over Arrow columns) == ``fingerprint_of`` (pure Python);
* ``draw64`` (vectorised) == ``draw64_of``; ``keyed_uniform`` is the documented formula;
* fixed64 limbs == ``round_half_even(w * 2^64)``; limb sums convert to the correctly rounded total,
  whatever the order or the split into partial sums;
* ``cap_pairs`` (vectorised bottom-k) == ``randomness.subsample`` for every user, whatever the batch
  split, also on fingerprint ties; capped/partial tables own their buffers (pickled size ~ rows).
"""

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.transforms.core import fingerprint as fp
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import tables as C
from dp_partition_beam.transforms.core.batches import concat, normalise_batch, pack, pack_pairs, pairs_table, unpack_all
from dp_partition_beam.transforms.core.fixed64 import exact_sum64, fixed64_of, limbs_of, value_of_limbs
from dp_partition_beam.transforms.selection.basic_kernels import basic_partials
from dp_partition_beam.transforms.selection.mad_kernels import mad_contribution_partials

keys_st = st.one_of(
    st.text(max_size=30),
    st.binary(max_size=12),
    st.integers(-(10**20), 10**20),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.tuples(st.text(max_size=5), st.integers(0, 9)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(keys_st, max_size=40))
def test_vectorised_fingerprints_equal_the_scalar_oracle(keys):
    arr = fp.key_bytes_array(keys)
    assert fp.fingerprint64(arr).tolist() == [fp.fingerprint_of(fp.to_key_bytes(k)) for k in keys]
    if len(keys) > 3:  # an Arrow slice (non-zero offset) hashes the same values
        assert fp.fingerprint64(arr.slice(2)).tolist() == fp.fingerprint64(arr).tolist()[2:]


@settings(max_examples=300, deadline=None)
@given(keys_st, keys_st)
def test_key_bytes_are_injective_and_decodable(a, b):
    assert fp.from_key_bytes(fp.to_key_bytes(a)) == (a if not isinstance(a, list) else tuple(a)) or a != a
    if fp.to_key_bytes(a) == fp.to_key_bytes(b):
        assert type(a) is type(b) and (a == b or (a != a and b != b))


def test_str_keys_are_their_utf8_and_others_are_marked():
    assert fp.to_key_bytes("é") == "é".encode()
    assert fp.to_key_bytes(b"x") != fp.to_key_bytes("x") and fp.to_key_bytes(b"x")[:1] == b"\xff"
    with pytest.raises(TypeError, match="keys must be"):
        fp.to_key_bytes(object())
    # long strings (many 8-byte words) and the empty string
    keys = ["", "a" * 8, "a" * 9, "é" * 1000, "x" * 10_000]
    assert fp.fingerprint64(pa.array(keys)).tolist() == [fp.fingerprint_of(k.encode()) for k in keys]
    assert len(set(fp.fingerprint64(pa.array(keys)).tolist())) == len(keys)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=3)
)
def test_vectorised_draws_equal_the_scalar_oracle(k0, k1, fps):
    key = randomness.DrawKey(k0, k1)
    arrays = [np.array([f, f ^ 1], dtype=np.uint64) for f in fps]
    got = randomness.draw64(key, *arrays).tolist()
    assert got == [randomness.draw64_of(key, *[f for f in fps]), randomness.draw64_of(key, *[f ^ 1 for f in fps])]


def test_seeded_uniforms_are_the_documented_formula_and_uniform():
    keys = [f"k{j}" for j in range(20_000)]
    u = randomness.keyed_uniform(7, "noise", 3, keys)
    key = randomness.draw_key(7, "noise", 3)
    vec = randomness.uniforms_of_fingerprints(key, fp.fingerprint64(pa.array(keys)))
    assert u.tolist() == vec.tolist()
    assert 0.0 < u.min() and u.max() < 1.0
    # Kolmogorov-Smirnov distance of 20,000 uniforms: 1.95/sqrt(n) is the 0.1% critical value
    s = np.sort(u)
    n = len(s)
    ks = max(np.max(np.arange(1, n + 1) / n - s), np.max(s - np.arange(n) / n))
    assert ks < 1.95 / np.sqrt(n)


weights_st = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e10, max_value=1e10)  # 50 sum < 2^41


@settings(max_examples=300, deadline=None)
@given(st.lists(weights_st, max_size=50))
def test_limbs_are_exact_and_sums_order_independent(ws):
    w = np.array(ws, dtype=np.float64)
    hi, mid, lo = limbs_of(w)
    for x, h, m, low in zip(ws, hi.tolist(), mid.tolist(), lo.tolist()):
        assert h * 2**42 + m * 2**21 + low == fixed64_of(x)
    total = float(value_of_limbs(hi.sum(), mid.sum(), lo.sum())[0])
    assert total == exact_sum64(ws) == sum(fixed64_of(x) for x in ws) / 2**64
    cut = len(ws) // 2  # two partial sums merged: same bits
    parts = [limbs_of(w[:cut]), limbs_of(w[cut:])]
    merged = [sum(p[j].sum() for p in parts) for j in range(3)]
    assert float(value_of_limbs(*merged)[0]) == total


def test_fixed64_is_exact_for_basic_weights():
    w = 1.0 / np.sqrt(np.arange(1, 5000, dtype=np.float64))
    assert all(fixed64_of(x) == x * 2**64 for x in w[:50].tolist())
    import math

    assert float(value_of_limbs(*(limb.sum() for limb in limbs_of(w)))[0]) == math.fsum(w.tolist())


def _capped_dict(table):
    out = {}
    for u, i in zip(table.column("user").to_pylist(), table.column("item").to_pylist()):
        out.setdefault(fp.from_key_bytes(u), set()).add(fp.from_key_bytes(i))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cap_pairs_equals_subsample_whatever_the_batching(seed):
    rng = random.Random(seed)
    pairs = [(f"u{rng.randrange(80)}", f"i{rng.randrange(400)}") for _ in range(6000)]
    pairs += [("heavy", f"i{j}") for j in range(3000)] + [("heavy", "i1")] * 5  # repeats count once
    sets = {}
    for u, i in pairs:
        sets.setdefault(u, []).append(i)
    want = {u: set(randomness.subsample(items, 9, u, 4, seed, None)) for u, items in sets.items()}
    whole = C.cap_pairs(pairs_table(*zip(*pairs)), 9, seed, 4)
    assert _capped_dict(whole) == want
    # pre-capping each batch, then capping the union, keeps the same sets (what ShardUsersFn relies on)
    rng.shuffle(pairs)
    batches = [C.cap_pairs(pairs_table(*zip(*pairs[a : a + 700])), 9, seed, 4) for a in range(0, len(pairs), 700)]
    again = C.cap_pairs(concat([b.select(["user", "item"]) for b in batches]), 9, seed, 4)
    assert _capped_dict(again) == want
    deg = dict(zip(whole.column("user").to_pylist(), whole.column("degree").to_pylist()))
    assert all(deg[fp.to_key_bytes(u)] == len(v) for u, v in want.items())


def test_cap_pairs_breaks_priority_ties_by_key_bytes(monkeypatch):
    """Equal 64-bit priorities (fingerprint collisions) are ordered by the smaller key bytes, as subsample does."""
    monkeypatch.setattr(randomness, "pair_priorities", lambda key, u, i: np.zeros(len(u), dtype=np.uint64))
    monkeypatch.setattr(randomness, "draw64_of", lambda key, *f: 0)
    items = [f"i{j}" for j in range(30)]
    got = C.cap_pairs(pairs_table(["u"] * 30, items), 5, 1, 0)
    assert sorted(_capped_dict(got)["u"]) == sorted(items, key=lambda s: s.encode())[:5]
    assert set(randomness.subsample(items, 5, "u", 0, 1, None)) == _capped_dict(got)["u"]


def test_emitted_tables_own_their_buffers():
    rng = random.Random(0)
    pairs = [(f"u{rng.randrange(5000)}", f"i{rng.randrange(3000)}") for _ in range(100_000)]
    capped = C.cap_pairs(pairs_table(*zip(*pairs)), 10, 1, 0)
    partials = basic_partials(capped, "weighted_gaussian")
    for table in (capped, partials):
        assert len(pickle.dumps(table)) < 1.2 * table.nbytes + 10_000


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6), st.integers(-(2**62), 2**62)), max_size=60),
    lo=st.integers(0, 30),
    dictionary=st.sampled_from([False, True, ("user",), ("item", "x")]),
)
def test_packed_tables_round_trip_exactly(rows, lo, dictionary):
    users, items, xs = (list(c) for c in zip(*rows)) if rows else ([], [], [])
    table = pa.table(
        {"user": pa.array(users, pa.binary()), "item": pa.array(items, pa.binary()), "x": pa.array(xs, pa.int64())}
    ).slice(min(lo, len(rows)))  # a slice: packs only its rows
    packed = pickle.loads(pickle.dumps(pack(table, dictionary)))
    assert packed.num_rows == table.num_rows
    got = packed.table()
    assert got.schema == table.schema and got.equals(table)  # types (binary, not dictionary) and values
    assert unpack_all([packed, pack(table)]).equals(concat([table, table]))


def test_packing_shrinks_pair_tables():
    rng = random.Random(0)
    pairs = [(f"u{i // 10}", f"w{int(rng.paretovariate(1.1))}") for i in range(200_000)]
    table = pairs_table(*zip(*pairs))
    plain, packed = len(pickle.dumps(table)), len(pickle.dumps(pack_pairs(table)))
    assert packed < plain / 2.5, (plain, packed)  # zstd + dictionary keys: what the shuffles carry
    parts = basic_partials(C.cap_pairs(table, 100, 1, 0), "weighted_gaussian")
    assert len(pickle.dumps(pack(parts))) < len(pickle.dumps(parts)) / 1.5


def test_batches_accept_string_and_binary_columns_and_reject_nulls():
    t = normalise_batch(pa.table({"user": ["a", "b"], "item": pa.array([b"x", b"y"]), "other": [1, 2]}))
    assert t.column_names == ["user", "item"] and t.column("user").type == pa.binary()
    with pytest.raises(ValueError, match="null"):
        normalise_batch(pa.table({"user": ["a", None], "item": ["x", "y"]}))
    with pytest.raises(ValueError, match="columns"):
        normalise_batch(pa.table({"uid": ["a"], "item": ["x"]}))
    with pytest.raises(TypeError, match="string or binary"):
        normalise_batch(pa.table({"user": [1], "item": ["x"]}))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    b_min=st.floats(0.5, 1.0),
    b_max=st.one_of(st.just(1.0), st.floats(1.0, 3.0), st.just(float("inf"))),
)
def test_mad_contributions_with_biases_equal_the_per_user_kernel_in_any_row_order(seed, b_min, b_max):
    """MAD2R round 2's contributions (vectorised UserWeights over all users) == the reference's
    per-user mad_user_contributions (items in canonical order), summed exactly per item; and the
    partials do not depend on the order of the rows."""
    from dp_partition_beam.transforms.selection import mad_kernels as K

    rng = np.random.default_rng(seed)
    n_items, tau, d_max = 40, 1.0, 8.0
    sets = {f"u{u}": sorted(set(rng.integers(0, n_items, rng.integers(1, 15)).tolist())) for u in range(30)}
    bias_of = {f"i{j}": float(rng.choice([rng.random(), 1.0, 0.5, 0.0])) for j in range(n_items)}
    r_of = {f"i{j}": float(rng.random()) for j in range(0, n_items, 3)}  # the hot items
    pairs = [(u, f"i{j}") for u, items in sets.items() for j in items]
    capped = C.with_degree(pairs_table(*zip(*pairs)))
    capped = capped.append_column("bias", pa.array([bias_of[i] for _, i in pairs], pa.float64()))
    hot = pa.table({"item": pa.array([k.encode() for k in r_of], pa.binary()), "r": list(r_of.values())})

    got = C.merge_partials([mad_contribution_partials(capped, hot, tau, d_max, b_min, b_max)])
    got = dict(zip((fp.from_key_bytes(k) for k in got.column("item").to_pylist()), got.column("weight").to_pylist()))
    parts = {}
    for user in sorted(sets, key=randomness.encode_key):
        items = sorted((f"i{j}" for j in sets[user]), key=randomness.encode_key)
        contrib = K.mad_user_contributions(
            items,
            [r_of.get(i, 0.0) for i in items],
            [bias_of[i] for i in items],
            tau,
            d_max,
            b_min,
            b_max,
            require_proof_conditions=False,
        )
        for item, c in contrib:
            parts.setdefault(item, []).append(c)
    assert got == {item: exact_sum64(p) for item, p in parts.items()}

    def limbs(table):
        t = table.sort_by("item")
        return [t.column(c).to_pylist() for c in t.column_names]

    shuffled = capped.take(pa.array(rng.permutation(capped.num_rows)))
    assert limbs(mad_contribution_partials(shuffled, hot, tau, d_max, b_min, b_max)) == limbs(
        mad_contribution_partials(capped, hot, tau, d_max, b_min, b_max)
    )


def test_side_input_cache_builds_once_per_side_input_object():
    from dp_partition_beam.transforms.core.dofns import SideInputCache

    built = []
    cache = SideInputCache()
    a, b = [b"x"], [b"x"]  # equal lists, two side-input objects
    assert cache.get(None, built.append) is None and built == []
    for source in (a, a, b, b, a):
        cache.get(source, lambda s: built.append(s) or len(built))
    assert [id(s) for s in built] == [id(a), id(b), id(a)]
    assert cache.get(a, lambda s: -1) == 3  # the value built for this object
