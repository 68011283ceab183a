"""MAD-SIPS with ``threshold='optimal'`` (docs/mad_sips.md, "The last round as a keep table"): the plan's
RDP accounting recomputed (with dp-accounting's conversion), one table for every cap, the contributions
and the neighbouring-datasets step of the proof as properties, the columnar kernel against the reference,
and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.selection import SelectionParams, last_round_contributions, plan
from dp_partition_beam.transforms.core.batches import ITEM, USER
from dp_partition_beam.transforms.core.fixed64 import exact_sum64
from dp_partition_beam.transforms.core.tables import merge_partials
from dp_partition_beam.transforms.selection import mad_kernels as K
from dp_partition_beam.transforms.selection.mad_kernels import table_round_partials
from dp_partition_beam.transforms.selection.reference import table_round_weights

PROPS = settings(max_examples=60, deadline=None, derandomize=True)
PARAMS = SelectionParams(2.0, 1e-5, max_contributions=20, threshold="optimal")
B_MIN, B_MAX = 0.5, 2.0  # MAD-SIPS's defaults (MAD2R's)
C20 = last_round_contributions(PARAMS)
#: a table object for its contribution set only (round_down); the keep probabilities do not matter here
ROUNDER = T.KeepTable(10, (0.0, 1.0), 2.0, 1.0, 1e-6, C20)


def _recomputed(rounds, cap_sigma=None, count_plan=None):
    """(epsilon', delta') of the theorem from a plan's public numbers, the conversion by dp-accounting. With a
    count plan: its continuous Gaussian (noise sigma_1, l2 sensitivity sqrt(l0)) joins the RDP composition and
    the kernel lemma's slack the delta (docs/counts.md (b): e^kappa (H + e^{2 kappa} - 1))."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from dp_partition_beam.privacy import counts

    *gaussian, last = rounds
    table = last.keep_table
    sigmas = [r.noise_scale for r in gaussian] + ([] if cap_sigma is None else [cap_sigma])
    if count_plan is not None:
        sigmas.append(count_plan.sigma_continuous / math.sqrt(count_plan.l0))
    rdp_total = table.alpha * math.fsum(1.0 / (2.0 * s * s) for s in sigmas) + table.epsilon_rdp
    eps, _ = rdp.compute_epsilon([table.alpha], [rdp_total], last.delta_conversion)
    h = table.delta_rdp + last.delta_conversion
    if count_plan is not None:
        kappa = count_plan.l0 * counts.kernel_gamma(count_plan.tau2)
        h = math.exp(kappa) * (h + math.expm1(2 * kappa))
    delta = math.fsum([r.delta / 2.0 for r in gaussian] + [h])
    return eps, delta


@pytest.mark.parametrize(
    "changes",
    [
        {"cap_quantile": 0.98},
        {},  # the default with a table: no adaptive cap
        {"release_counts": True},
        {"release_counts": True, "cap_quantile": 0.98},
        {"epsilon": 0.5, "delta": 1e-7, "cap_quantile": 0.98},
    ],
    ids=["adaptive_cap", "fixed_cap", "counts", "counts_adaptive_cap", "eps0.5"],
)
def test_the_plan_spends_exactly_its_budget(changes):
    """Every cap's rounds compose (theorem of docs/mad_sips.md) to the selection's (epsilon, delta): not more
    (the guarantee), and not much less (the table gets the rest)."""
    params = PARAMS.replace(**changes)
    p = plan("mad_sips", params)
    eps, delta = params.epsilon, params.delta  # with counts too: they join the RDP composition
    caps = [None] if p.cap is None else list(p.cap.grid)
    for cap in caps:
        rounds = p.rounds_for(cap)
        assert [r.noise for r in rounds] == ["gaussian"] * (len(rounds) - 1) + ["keep_table"]
        got_eps, got_delta = _recomputed(rounds, None if p.cap is None else p.cap.noise_scale, p.counts)
        assert eps * 0.995 <= got_eps <= eps * (1 + 1e-9), (cap, got_eps)
        assert got_delta <= delta * (1 + 1e-9) and got_delta >= 0.99 * delta, (cap, got_delta)


@pytest.mark.parametrize("split", [(0.1, 0.9), (0.05, 0.15, 0.8)])
def test_dp_sips_last_round_table_spends_exactly_its_budget(split):
    """DP-SIPS's last round as a table over Basic's own weights (C = {1/sqrt(d)}, no rounding)."""
    params = PARAMS.replace(budget_split=split)
    p = plan("dp_sips", params)
    assert p.cap is None and [r.noise for r in p.rounds][-1] == "keep_table"
    assert p.rounds[-1].weighting == "weighted_gaussian"
    assert p.rounds[-1].keep_table.contributions == T.basic_contributions(params.max_contributions)
    got_eps, got_delta = _recomputed(p.rounds)
    assert 0.995 * params.epsilon <= got_eps <= params.epsilon * (1 + 1e-9)
    assert 0.99 * params.delta <= got_delta <= params.delta * (1 + 1e-9)
    gaussian = plan("dp_sips", params.replace(threshold="gaussian")).rounds
    assert p.rounds[-1].threshold < gaussian[-1].threshold


def test_mad2r_last_round_table_spends_exactly_its_budget():
    """MAD2R's round 2 as the table over biased Basic weights (MAD-SIPS's contribution set)."""
    p = plan("mad2r", PARAMS)
    assert [r.noise for r in p.rounds] == ["gaussian", "keep_table"] and p.rounds[-1].weighting == "biased_basic"
    assert p.rounds[-1].keep_table.contributions == C20
    got_eps, got_delta = _recomputed(p.rounds)
    assert 0.995 * PARAMS.epsilon <= got_eps <= PARAMS.epsilon * (1 + 1e-9)
    assert 0.99 * PARAMS.delta <= got_delta <= PARAMS.delta * (1 + 1e-9)


@pytest.mark.parametrize("algorithm", ["basic", "dp_sips", "mad2r", "mad_sips"])
@pytest.mark.parametrize("eps,count_budget", [(1.0, 0.25), (4.0, 0.5)])
def test_counts_compose_with_the_table_in_rdp(algorithm, eps, count_budget):
    """With release_counts the counts keep the gdp split's noise and join the table's RDP composition: the
    whole release spends (epsilon, delta), and the table's W50 is below the Gaussian last round's rho."""
    params = PARAMS.replace(epsilon=eps, release_counts=True, count_budget=count_budget, cap_quantile=1.0)
    params = params.replace(weight_cap=1.0)  # no histogram (weight_cap 'auto': tests/privacy/test_auto_weight_cap.py)
    p = plan(algorithm, params)
    g = plan(algorithm, params.replace(threshold="gaussian"))
    assert p.counts == g.counts  # the counts are as precise as with the Gaussian threshold
    assert p.rounds[-1].noise == "keep_table"
    for r, q in zip(p.rounds[:-1], g.rounds[:-1]):  # the earlier rounds: the gdp share's sigma and rho
        assert (r.noise_scale, r.threshold) == (q.noise_scale, q.threshold)
    got_eps, got_delta = _recomputed(p.rounds, None, p.counts)
    assert 0.995 * eps <= got_eps <= eps * (1 + 1e-9)
    assert 0.99 * params.delta <= got_delta <= params.delta * (1 + 1e-9)
    assert p.rounds[-1].threshold < g.rounds[-1].threshold


def test_one_table_serves_every_cap_and_the_gaussian_rounds_are_unchanged():
    p = plan("mad_sips", PARAMS.replace(cap_quantile=0.98))
    g = plan("mad_sips", PARAMS.replace(threshold="gaussian"))
    assert plan("mad_sips", PARAMS).cap is None  # the table's default: no adaptive cap
    tables = {id(rs[-1].keep_table) for rs in p.cap.rounds}
    assert len(tables) == 1
    for rs, gs in zip(p.cap.rounds, g.cap.rounds):
        for r, q in zip(rs[:-1], gs[:-1]):  # rounds 1..R-1: the gdp plan's sigma, rho and tau
            assert (r.noise_scale, r.threshold, r.tau) == (q.noise_scale, q.threshold, q.tau)
    last = p.rounds[-1]
    assert last.weighting == "biased_basic" and last.h == "table" and last.threshold == last.keep_table.weight_for(0.5)
    # the table keeps an item with less weight than the Gaussian last round's threshold at every cap
    assert last.threshold < min(gs[-1].threshold for gs in g.cap.rounds)
    report = last.as_report()
    assert report["noise"] == "keep_table" and report["noise_scale"] is None and report["keep_table"]["alpha"] > 1


def test_refusals():
    for algorithm in ("mad_sips", "mad2r", "dp_sips"):
        with pytest.raises(ValueError, match="accounting='gdp'"):
            plan(algorithm, PARAMS.replace(accounting="basic"))
    with pytest.raises(ValueError, match="weight_cap"):  # single-round MAD's l2 rule has no weight cap
        plan("mad", PARAMS.replace(weight_cap=0.5))


def test_the_contribution_set_reaches_below_the_smallest_weight():
    """C runs from 1 down to below Lemma 5.4's smallest weight b_min/sqrt(Delta_0), in steps of 2^(-1/16)."""
    cs = np.array(C20)
    assert cs[-1] == 1.0 - 2.0**-40 and cs[0] < B_MIN / math.sqrt(20) and cs[1] >= B_MIN / math.sqrt(20) * (1 - 1e-9)
    assert np.allclose(cs[1:] / cs[:-1], 2 ** (1 / 16), rtol=1e-12)


@pytest.mark.parametrize("cap", [1.0, 0.5, 0.3, 0.2, 0.12, 0.05, 0.01])
def test_the_weight_cap_keeps_the_grid_at_or_below_it(cap):
    """weight_cap c: C is the grid's values <= c, its largest one step of 2^(-1/16) at most below c, still
    reaching below Lemma 5.4's smallest weight (or below c, when c is smaller); c = 1 is today's C."""
    cs = np.array(last_round_contributions(PARAMS.replace(weight_cap=cap)))
    assert cs[-1] <= cap and cs[-1] > cap * 2 ** (-1 / 16)
    assert cs[0] < min(cap, B_MIN / math.sqrt(20)) and np.allclose(cs[1:] / cs[:-1], 2 ** (1 / 16), rtol=1e-12)
    assert set(cs.tolist()) <= set(T.geometric_contributions(min(cap, 0.1)))
    if cap == 1.0:
        assert tuple(cs.tolist()) == C20


@PROPS
@given(
    biases=st.lists(st.floats(B_MIN, 1.0), min_size=1, max_size=40),
    cap=st.floats(0.01, 1.0),
    b_max=st.sampled_from([1.0, 2.0, 3.0]),
)
def test_capped_contributions_are_below_the_cap_in_c_and_l2_bounded(biases, cap, b_max):
    """With a weight cap the rounded contributions are values of the capped C, none above the cap, each the
    largest value of C at or below min(weight, cap), and their squares still sum to <= 1 (exactly)."""
    cs = last_round_contributions(PARAMS.replace(weight_cap=cap, max_contributions=40))
    rounder = T.KeepTable(10, (0.0, 1.0), 2.0, 1.0, 1e-6, cs)
    w = K.user_weights(np.array(biases), B_MIN, b_max)
    c = rounder.round_down(w)
    assert set(c.tolist()) <= set(cs) and np.all(c <= cap)
    bound = np.minimum(w, cap)
    assert np.all(c <= bound) and np.all(c >= bound * 2 ** (-1 / 16))
    assert exact_sum64(list(c * c)) <= 1.0


@pytest.mark.parametrize("algorithm", ["mad_sips", "mad2r"])
def test_a_weight_cap_lowers_the_tables_weight_and_spends_the_same_budget(algorithm):
    """The capped table absorbs steps up to c only: it keeps an item with less weight (W50 falls with c) at
    the same (epsilon, delta), its C the capped set; the Gaussian rounds are unchanged."""
    base = PARAMS.replace(epsilon=1.0, max_contributions=100)
    w50, previous = {}, None
    for cap in (1.0, 0.5, 0.25):
        rounds = plan(algorithm, base.replace(weight_cap=cap)).rounds
        table = rounds[-1].keep_table
        assert table.contributions == last_round_contributions(base.replace(weight_cap=cap))
        assert T.table_violations(table) == {"decreasing": 0, "above_step": 0, "unseen": 0}
        eps, delta = _recomputed(rounds)
        assert eps == pytest.approx(1.0, abs=1e-9) and delta <= 1e-5 * (1 + 1e-12)
        if previous is not None:
            assert [r.noise_scale for r in rounds[:-1]] == previous
        previous = [r.noise_scale for r in rounds[:-1]]
        w50[cap] = table.weight_for(0.5)
    assert w50[1.0] > w50[0.5] > w50[0.25]


@pytest.mark.parametrize(
    "algorithm,changes",
    [("mad_sips", {"threshold": "gaussian"}), ("mad2r", {"threshold": "gaussian"}), ("basic", {}), ("dp_sips", {})],
)
def test_the_weight_cap_is_refused_without_a_biased_table_round(algorithm, changes):
    with pytest.raises(ValueError, match="weight_cap=0.5 caps the weights of the keep-table round"):
        plan(algorithm, PARAMS.replace(weight_cap=0.5, **changes))
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="weight_cap"):
            PARAMS.replace(weight_cap=bad)


#: public biases in [b_min, 1], one per item of a 12-item universe (a round's biases are per item)
BIASES = st.lists(st.floats(B_MIN, 1.0), min_size=12, max_size=12)


@st.composite
def users(draw, max_users=6):
    """{user: [(item, bias)]}: distinct items of a 12-item universe with their public biases."""
    biases = draw(BIASES)
    out = {}
    for u in range(draw(st.integers(1, max_users))):
        items = draw(st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True))
        out[f"u{u}"] = [(f"i{i}", biases[i]) for i in items]
    return out


@PROPS
@given(biases=st.lists(st.floats(B_MIN, 1.0), min_size=1, max_size=20))
def test_rounded_contributions_are_in_c_and_l2_bounded(biases):
    """Lemma 5.4 after rounding: every contribution is a value of C, at most 4.2% below its weight, and a
    user's squares sum to <= 1 (exactly: fixed-point sum)."""
    w = K.user_weights(np.array(biases), B_MIN, B_MAX)
    c = ROUNDER.round_down(w)
    assert set(c.tolist()) <= set(C20)
    assert np.all(c <= w) and np.all(c >= w * 2 ** (-1 / 16))
    assert exact_sum64(list(c * c)) <= 1.0


def test_weights_on_the_grid_round_onto_it():
    """1/sqrt(d) for d = 2^j is 2^(-8j/16), a grid value up to float error (1/sqrt(2) is one ulp below the
    float 2^-0.5): it must round onto its own value of C, not a step (4.2%) lower."""
    for d in (1, 2, 4, 8, 16):
        (c,) = set(ROUNDER.round_down(K.user_weights(d)).tolist())
        assert 1 / math.sqrt(d) * (1 - 1e-9) <= c <= 1 / math.sqrt(d), d


@PROPS
@given(data=users(), v_items=st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True))
def test_adding_a_user_moves_each_index_by_at_most_m_c(data, v_items):
    """The neighbouring pair of the proof, step (2): with the same public biases, adding user v changes the
    totals only on v's items, and each item's table index by 0..m_c = ceil(c/H) + 1 for v's contribution c
    (and Sigma c^2 <= 1): exactly what Lemma 2 covers."""
    biases = {i: b for rows in data.values() for i, b in rows}  # public: one per item
    sets = {u: [i for i, _ in rows] for u, rows in data.items()}
    v_items = [f"i{i}" for i in v_items]  # an item no other user holds gets bias 1 (a novel item)
    before = table_round_weights(sets, biases, B_MIN, B_MAX, ROUNDER)
    after = table_round_weights({**sets, "v": v_items}, biases, B_MIN, B_MAX, ROUNDER)
    w_v = K.user_weights(np.array([biases.get(i, 1.0) for i in v_items]), B_MIN, B_MAX)
    c_v = dict(zip(v_items, ROUNDER.round_down(w_v)))
    assert exact_sum64([c * c for c in c_v.values()]) <= 1.0
    h_bits = 10
    for item in set(before) | set(after):
        j0 = math.floor(math.ldexp(before.get(item, 0.0), h_bits))
        j1 = math.floor(math.ldexp(after.get(item, 0.0), h_bits))
        if item not in c_v:
            assert j0 == j1
        else:
            assert 0 <= j1 - j0 <= math.ceil(math.ldexp(c_v[item], h_bits)) + 1, (item, j0, j1, c_v[item])


@PROPS
@given(data=users(), with_bias=st.booleans())
def test_the_columnar_kernel_equals_the_reference(data, with_bias):
    """table_round_partials (Beam) == table_round_weights (reference), bit for bit, any row order."""
    rows = [(u, i, b) for u, items in data.items() for i, b in items][::-1]
    cols = {USER: pa.array([r[0] for r in rows], pa.binary()), ITEM: pa.array([r[1].encode() for r in rows])}
    if with_bias:
        cols["bias"] = pa.array([r[2] for r in rows], pa.float64())
    b_min, b_max = (B_MIN, B_MAX) if with_bias else (1.0, 1.0)
    got = merge_partials([table_round_partials(pa.table(cols), b_min, b_max, ROUNDER)])
    got = dict(zip(got.column(ITEM).to_pylist(), got.column("weight").to_pylist()))
    biases = {i: b for items in data.values() for i, b in items} if with_bias else {}
    want = table_round_weights({u: [i for i, _ in items] for u, items in data.items()}, biases, b_min, b_max, ROUNDER)
    assert got == {i.encode(): w for i, w in want.items()}
