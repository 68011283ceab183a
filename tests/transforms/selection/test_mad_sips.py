"""MAD-SIPS (docs/mad_sips.md): plan, determinism, the relation to MAD2R, and the per-round sensitivity
that its privacy proof needs, on random neighbouring datasets (hypothesis)."""

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy.accounting import gdp_compose
from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams, plan_cap, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.batches import ITEM, USER
from dp_partition_beam.transforms.selection.mad_sips_kernels import drop_hopeless as drop_hopeless_table
from dp_partition_beam.transforms.selection.reference import drop_hopeless, mad_sips_round, previous_round_biases

PARAMS = SelectionParams(epsilon=1.0, delta=1e-5, budget_split=(0.05, 0.15, 0.8), threshold="gaussian")


def _zipf_sets(n_users=400, max_degree=60, seed=0):
    rng = np.random.default_rng(seed)
    return {f"u{u}": [f"i{int(x)}" for x in rng.zipf(1.3, size=rng.integers(1, max_degree))] for u in range(n_users)}


def test_registry_entry_and_plan():
    spec = ALGORITHMS["mad_sips"]
    assert spec.shape == "mad_sips" and spec.weighting == "mad"
    plans = plan_rounds("mad_sips", PARAMS)
    assert [p.index for p in plans] == [1, 2, 3]
    assert [p.h for p in plans] == ["1/sqrt(t)", "min(2/sqrt(t), 1)", "min(2/sqrt(t), 1)"]
    assert all(p.weighting == "mad" and p.tau >= 1.0 and p.tau >= p.threshold for p in plans)
    # GDP: the rounds and the adaptive cap's histogram compose to one Gaussian of noise AGM(epsilon, delta/2);
    # thresholds split delta/2
    cap = plan_cap("mad_sips", PARAMS)
    sigmas = [p.noise_scale for p in plans] + [cap.noise_scale]
    assert gdp_compose(sigmas) == pytest.approx(analytic_gaussian_sigma(1.0, 0.5e-5))
    assert sum(p.delta for p in plans) == pytest.approx(1e-5)
    # with the cap fixed at Delta_0 the rounds alone spend it; from round 2 on they have the same threshold
    # as MAD2R's round 2 at the same budget fraction
    fixed = plan_rounds("mad_sips", PARAMS.replace(cap_quantile=1.0))
    assert gdp_compose([p.noise_scale for p in fixed]) == pytest.approx(analytic_gaussian_sigma(1.0, 0.5e-5))
    mad2r = plan_rounds("mad2r", PARAMS.replace(budget_split=(0.2, 0.8)))
    assert fixed[2].threshold == pytest.approx(mad2r[1].threshold)


def test_any_number_of_rounds_and_basic_accounting():
    for split in [(1.0,), (0.5, 0.5), (0.1, 0.2, 0.3, 0.4)]:
        for accounting in ("gdp", "basic"):
            plans = plan_rounds("mad_sips", PARAMS.replace(budget_split=split, accounting=accounting))
            assert len(plans) == len(split)


def test_seeded_runs_are_deterministic_and_rounds_disjoint():
    sets = _zipf_sets()
    a = reference.release(sets, "mad_sips", PARAMS, seed=3)
    b = reference.release(sets, "mad_sips", PARAMS, seed=3)
    assert a.per_round == b.per_round
    union = {i for items in sets.values() for i in items}
    seen = set()
    for r, items in a.per_round.items():
        assert not items & seen, r  # released items are removed from later rounds
        seen |= items
    assert seen <= union and len(seen) > 0


def test_two_rounds_without_capped_users_is_mad2r():
    """Documented: with R = 2, every user at most Delta_0 items and no hopeless item, re-subsampling and
    the keep rule change nothing and every round-2 item was in round 1's union, so MAD-SIPS releases exactly
    what MAD2R releases."""
    sets = _zipf_sets(max_degree=30)
    params = PARAMS.replace(budget_split=(0.1, 0.9), max_contributions=40, c_ub=100.0)  # nothing hopeless
    for seed in range(3):
        assert (
            reference.select_rounds(sets, "mad_sips", params, seed=seed)[1]
            == reference.select_rounds(sets, "mad2r", params, seed=seed)[1]
        )


def test_resubsampling_reaches_items_beyond_delta0():
    """A user with more than Delta_0 items sends other items in later rounds (DP-SIPS's re-subsampling)."""
    sets = _zipf_sets(max_degree=60)
    params = PARAMS.replace(max_contributions=10, budget_split=(0.5, 0.5), c_ub=100.0)  # c_ub: drop nothing
    plans = plan_rounds("mad_sips", params)
    full = {u: list(dict.fromkeys(v)) for u, v in sets.items()}
    c1, _, w1 = mad_sips_round(full, set(), None, plans[0], params, seed=1)
    prev = (plans[0], reference.add_noise(w1, "gaussian", plans[0].noise_scale, 1, 1))
    c2, biases, _ = mad_sips_round(full, set(), prev, plans[1], params, seed=1)
    assert set(biases) == {i for v in full.values() for i in v}  # nothing dropped, items absent in round 1 too
    assert any(set(c2[u]) - set(c1[u]) for u in c1)


# --- the per-round sensitivity on random neighbours (docs/mad_sips.md, step (2) of the proof) --------

ITEMS = [f"i{j}" for j in range(10)]
user_set = st.lists(st.sampled_from(ITEMS), min_size=1, max_size=10, unique=True)
datasets = st.dictionaries(st.text("abcde", min_size=1, max_size=3), user_set, max_size=12)
weights = st.floats(-30.0, 60.0, allow_nan=False)


@given(
    datasets,
    user_set,
    st.integers(2, 10),
    st.sets(st.sampled_from(ITEMS), max_size=4),
    st.lists(weights, min_size=len(ITEMS), max_size=len(ITEMS)),
    st.sampled_from([1, 2, 3]),
    st.floats(1.0, 3.0),
    st.integers(0, 10**6),
)
@settings(max_examples=250, deadline=None)
def test_round_sensitivity_on_neighbours(sets, new_set, d0, released, prev_w, r, b_max, seed):
    """Given the same earlier outputs (released items, previous noisy weights on every item: the extended
    vector), adding one user changes round r's MAD weights by <= 1 in l2, leaves every other user's
    re-subsampled set unchanged, and gives its novel items <= h_r(t) (1/sqrt(t) in round 1, b_max/sqrt(t)
    after)."""
    params = SelectionParams(
        epsilon=1.0, delta=1e-5, max_contributions=d0, d_max=4, b_max=b_max, c_ub=1.0, threshold="gaussian"
    )
    plans = plan_rounds("mad_sips", params.replace(budget_split=(0.2, 0.3, 0.5)))
    plan = plans[r - 1]
    prev = None if r == 1 else (plans[r - 2], dict(zip(ITEMS, prev_w)))
    released = set() if r == 1 else released
    capped, biases, w = mad_sips_round(sets, released, prev, plan, params, seed)
    capped2, biases2, w2 = mad_sips_round({**sets, "NEW": new_set}, released, prev, plan, params, seed)
    assert {u: v for u, v in capped2.items() if u != "NEW"} == capped
    if biases is not None:  # the biases are a function of the past only: equal wherever both define them
        assert all(biases2[i] == b for i, b in biases.items())
    keys = set(w) | set(w2)
    l2 = math.sqrt(math.fsum((w2.get(k, 0.0) - w.get(k, 0.0)) ** 2 for k in keys))
    assert l2 <= 1.0 + 1e-9
    novel = set(capped2.get("NEW", ())) - {i for v in capped.values() for i in v}
    if novel:
        h = (1.0 if r == 1 else b_max) / math.sqrt(len(novel))
        assert max(w2[i] for i in novel) <= h + 1e-9


def test_absent_items_use_the_extended_vectors_pure_noise_entry():
    """An item outside round r-1's union is judged by sigma_{r-1} Z with Z keyed (seed, 'noise', r-1, item):
    the same decision as an item present with weight 0 and that noise."""
    params = PARAMS.replace(budget_split=(0.5, 0.5), c_ub=3.0)
    p1, p2 = plan_rounds("mad_sips", params)
    items = [f"x{j}" for j in range(300)]
    absent = previous_round_biases(items, {}, p1, p2, params, seed=7, rng=None)
    present = previous_round_biases(
        items, reference.add_noise(dict.fromkeys(items, 0.0), "gaussian", p1.noise_scale, 7, 1), p1, p2, params, 7, None
    )
    assert absent == present and 0 < len(absent) < len(items)


# --- the keep rule: a user drops its hopeless items only if it has another item --------------------


def test_users_keep_their_hopeless_items_only_when_all_are_hopeless():
    """Round 2 on constructed round-1 weights: "rare" is hopeless (far below every threshold), "hot" is not.
    A user holding both sends only "hot" (MAD2R's line 13); a user holding only "rare" still sends it, with
    bias 1, instead of sending nothing."""
    params = PARAMS.replace(budget_split=(0.5, 0.5), c_ub=1.0)
    p1, p2 = plan_rounds("mad_sips", params)
    sets = {"both": ["hot", "rare"], "only_rare": ["rare"], "only_hot": ["hot"]}
    prev = (p1, {"hot": p2.threshold, "rare": -10.0 * p1.noise_scale})
    capped, biases, w = mad_sips_round(sets, set(), prev, p2, params, seed=0)
    assert capped == {"both": ["hot"], "only_rare": ["rare"], "only_hot": ["hot"]}
    assert biases["rare"] == 1.0 and w["rare"] > 0
    assert drop_hopeless(["a", "b"], {"a": 1.0}) == ["a"] and drop_hopeless(["a", "b"], {}) == ["a", "b"]


def test_keep_rule_on_noisy_round_one_weights():
    """On Zipf data of few items per user, with real round-1 noise: the users all of whose items are
    hopeless exist and send all of them in round 2; every other user sends none of its hopeless items."""
    sets = _zipf_sets(n_users=300, max_degree=4, seed=5)
    params = PARAMS.replace(budget_split=(0.1, 0.9), c_ub=1.0)
    p1, p2 = plan_rounds("mad_sips", params)
    full = {u: list(dict.fromkeys(v)) for u, v in sets.items()}
    _, _, w1 = mad_sips_round(full, set(), None, p1, params, seed=2)
    prev = (p1, reference.add_noise(w1, "gaussian", p1.noise_scale, 2, 1))
    candidates = {i for v in full.values() for i in v}
    hopeless = candidates - set(previous_round_biases(sorted(candidates), prev[1], p1, p2, params, 2, None))
    capped, _, _ = mad_sips_round(full, set(), prev, p2, params, seed=2)
    all_hopeless = [u for u, v in full.items() if set(v) <= hopeless]
    assert all_hopeless and len(all_hopeless) < len(full)
    for u, v in full.items():
        if u in all_hopeless:
            assert sorted(capped[u]) == sorted(v)
        else:
            assert not set(capped[u]) & hopeless and set(capped[u]) == set(v) - hopeless


@given(
    st.dictionaries(st.text("abc", min_size=1, max_size=2), user_set, min_size=1, max_size=10),
    st.sets(st.sampled_from(ITEMS), max_size=10),
)
@settings(max_examples=200, deadline=None)
def test_columnar_drop_hopeless_equals_reference(sets, hopeless):
    """The columnar kernel keeps exactly the rows the reference keeps, for any sets and hopeless items."""
    rows = [(u, i) for u, items in sets.items() for i in items]
    table = pa.table(
        {
            USER: pa.array([u.encode() for u, _ in rows], pa.binary()),
            ITEM: pa.array([i.encode() for _, i in rows], pa.binary()),
        }
    )
    out = drop_hopeless_table(table, pa.array([i.encode() for i in sorted(hopeless)], pa.binary()))
    got = sorted(zip(out.column(USER).to_pylist(), out.column(ITEM).to_pylist()))
    biases = {i: 1.0 for i in ITEMS if i not in hopeless}
    want = sorted((u.encode(), i.encode()) for u, items in sets.items() for i in drop_hopeless(items, biases))
    assert got == want
