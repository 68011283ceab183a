"""``weight_cap='auto'`` (privacy/cap.py, docs/mad_sips.md "Automatic weight cap"): the choice from the noisy
degree histogram (its rule per bucket, properties), the plan's budget with the histogram recomputed with
dp-accounting for every candidate (alone and with the adaptive cap, which shares the one histogram), the
reference's choice on data, and the refusals."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import cap as C
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.selection import (
    SelectionParams,
    _gaussian_rounds,
    algorithm_spec,
    last_round_contributions,
    plan,
    resolve_params,
)
from dp_partition_beam.transforms.selection import reference

from tests.privacy.test_mad_sips_table import _recomputed

PROPS = settings(max_examples=200, deadline=None, derandomize=True)
GRID = C.cap_grid(100)  # 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 100
AUTO = SelectionParams(1.0, 1e-5, max_contributions=100, weight_cap="auto")


def _plan_of(grid=GRID):
    return C.WeightCapPlan(tuple(grid), 1.0, 0.01, C.WEIGHT_CAP_CANDIDATES, C.WEIGHT_CAP_FACTOR, None, ())


def _all_in(j, grid=GRID, n=1000.0):
    """A noisy histogram with every user in bucket j."""
    return [n if i == j else 0.0 for i in range(len(grid))]


def test_the_candidates():
    assert C.WEIGHT_CAP_CANDIDATES == pytest.approx((1.0, 0.5, 2**-1.5, 0.25, 2**-2.5, 0.125), rel=1e-15)


@pytest.mark.parametrize(
    "median,want",
    # 1.5 / sqrt(m) rounded up onto the candidates: 1.5, 1.06, 0.87, 0.75, 0.61, 0.53 -> 1; 0.45, 0.375 -> 0.5;
    # 0.31, 0.27 -> 0.354; 0.22, 0.19 -> 0.25; 0.157, 0.15 -> 0.177
    [(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (6, 1.0), (8, 1.0), (11, 0.5), (16, 0.5), (23, 2**-1.5), (32, 2**-1.5)]
    + [(45, 0.25), (64, 0.25), (91, 2**-2.5), (100, 2**-2.5)],
)
def test_the_choice_is_the_rule_at_every_median_bucket(median, want):
    noisy = _all_in(GRID.index(median))
    assert C.noisy_median_degree(noisy, GRID) == median
    assert C.choose_weight_cap(noisy, _plan_of()) == pytest.approx(want, rel=1e-15)


def test_the_noisy_median_is_where_the_cumulative_count_reaches_half():
    noisy = [0.0] * len(GRID)
    noisy[0], noisy[5], noisy[12] = 40.0, 9.0, 51.0  # cumulative 40, 49, 100 of 100: the median bucket is 91's
    assert C.noisy_median_degree(noisy, GRID) == 91
    noisy[5] = 10.0  # through bucket 8: 50 of 101, below half (50.5): still 91
    assert C.noisy_median_degree(noisy, GRID) == 91
    noisy[5] = 11.0  # through bucket 8: 51 of 102, half
    assert C.noisy_median_degree(noisy, GRID) == 8
    # no users (or noise alone below zero): Delta_0, whose cap is the smallest candidate
    assert C.noisy_median_degree([0.0] * len(GRID), GRID) == 100
    assert C.noisy_median_degree([-3.0] + [0.0] * (len(GRID) - 1), GRID) == 100
    with pytest.raises(ValueError, match="one entry per grid value"):
        C.noisy_median_degree([1.0, 2.0], GRID)


def test_too_few_users_for_the_median_keep_no_cap():
    """Below WEIGHT_CAP_MIN_SIGNAL sigma_H sqrt(len(grid)) noisy users (4 sqrt(14) = 14.97 at sigma_H 1) the
    choice is 1 whatever the median; at it, the rule's."""
    edge = C.WEIGHT_CAP_MIN_SIGNAL * math.sqrt(len(GRID))
    high = GRID.index(91)
    assert C.choose_weight_cap(_all_in(high, n=edge), _plan_of()) == pytest.approx(2**-2.5, rel=1e-15)
    assert C.choose_weight_cap(_all_in(high, n=edge * (1 - 1e-12)), _plan_of()) == 1.0
    noisy = _all_in(high, n=1000.0)
    noisy[0] = -990.0  # the noise can make the count small whatever the buckets say
    assert C.choose_weight_cap(noisy, _plan_of()) == 1.0


def test_on_small_data_the_guard_keeps_the_cap_of_users_with_few_items():
    """200 users of degree 1 at epsilon 1, delta 1e-5, Delta_0 100 and cap_budget 0.002 (sigma_H ~ 87): the
    median alone picks a cap below 1 in about a third of the draws; with the guard, 1 in every draw (the
    guard's count is ~1,300 users). 4,000 such users of degree 91 still get 0.177 in every draw.
    2,000 seeded draws each: deterministic."""
    w = plan("mad_sips", AUTO.replace(cap_budget=0.002)).weight_caps
    rng = np.random.default_rng(0)
    for users, degree, want in ((200, 1, 1.0), (4000, 91, 2**-2.5)):
        counts = np.asarray(_all_in(GRID.index(degree), n=float(users)))
        draws = [counts + rng.normal(0.0, w.noise_scale, len(GRID)) for _ in range(2000)]
        median_alone = [w.factor / math.sqrt(C.noisy_median_degree(d, GRID)) < 0.6 for d in draws]
        chosen = {C.choose_weight_cap(d, w) for d in draws}
        assert len(chosen) == 1 and chosen.pop() == pytest.approx(want, rel=1e-15), (users, chosen)
        if users == 200:
            assert sum(median_alone) > 400  # what the guard prevents


NOISY = st.lists(st.floats(-50.0, 500.0, allow_nan=False), min_size=len(GRID), max_size=len(GRID))


@PROPS
@given(NOISY, st.integers(0, len(GRID) - 2), st.integers(1, len(GRID) - 1), st.floats(0.0, 100.0))
def test_more_users_with_many_items_never_raise_the_cap(noisy, j, step, moved):
    """Moving noisy count from a bucket to a higher one (users with more items) never raises the chosen
    cap, and the choice is always a candidate (post-processing of the histogram only)."""
    plan_ = _plan_of()
    k = min(j + step, len(GRID) - 1)
    before = C.choose_weight_cap(noisy, plan_)
    moved_up = list(noisy)
    moved_up[j] -= moved
    moved_up[k] += moved
    after = C.choose_weight_cap(moved_up, plan_)
    assert before in C.WEIGHT_CAP_CANDIDATES and after in C.WEIGHT_CAP_CANDIDATES
    assert after <= before


@pytest.mark.parametrize(
    "changes",
    [{}, {"cap_quantile": 0.98}, {"epsilon": 0.5, "delta": 1e-7}, {"release_counts": True}],
    ids=["auto", "auto_adaptive_cap", "eps0.5", "counts"],
)
def test_every_candidates_rounds_spend_exactly_the_budget_with_the_histogram(changes):
    """For every weight cap the histogram can choose (and every cap, with the adaptive cap), the rounds, the
    histogram's Gaussian (sigma_H, l2 sensitivity 1) and the candidate's table compose (RDP, dp-accounting's
    conversion) to the selection's (epsilon, delta): the choice is post-processing of that histogram."""
    params = AUTO.replace(**changes)
    p = plan("mad_sips", params)
    w = p.weight_caps
    assert w is not None and w.candidates == C.WEIGHT_CAP_CANDIDATES
    if p.cap is not None:  # one histogram for both choices
        assert (p.cap.grid, p.cap.noise_scale) == (w.grid, w.noise_scale)
    caps = [None] if p.cap is None else list(p.cap.grid)[::4]
    for cap in caps:
        for c in w.candidates:
            rounds = p.rounds_for(cap, c)
            assert rounds[-1].keep_table.contributions == last_round_contributions(params, c)
            assert max(rounds[-1].keep_table.contributions) <= c
            got_eps, got_delta = _recomputed(rounds, w.noise_scale, p.counts)
            assert params.epsilon * 0.995 <= got_eps <= params.epsilon * (1 + 1e-9), (cap, c, got_eps)
            assert 0.99 * params.delta <= got_delta <= params.delta * (1 + 1e-9), (cap, c, got_delta)
    w50 = [w.last_round(c).threshold for c in w.candidates]
    assert w50 == sorted(w50, reverse=True)  # a smaller cap keeps an item with less weight


def test_the_rounds_without_a_choice_and_the_report():
    p = plan("mad_sips", AUTO)
    fixed = plan("mad_sips", AUTO.replace(weight_cap=1.0))
    # the histogram costs the rounds its share of mu^2 (unset: 0.2% for the median alone; 1% with the
    # adaptive cap, whose tail needs more): a little more noise than without it
    assert p.params.cap_budget == C.MEDIAN_CAP_BUDGET and fixed.params.cap_budget == C.DEFAULT_CAP_BUDGET
    assert plan("mad_sips", AUTO.replace(cap_quantile=0.98)).params.cap_budget == C.DEFAULT_CAP_BUDGET
    assert [r.noise_scale for r in p.rounds[:-1]] == pytest.approx(
        [r.noise_scale / math.sqrt(1 - C.MEDIAN_CAP_BUDGET) for r in fixed.rounds[:-1]], rel=1e-9
    )
    assert p.rounds[-1].keep_table.contributions == last_round_contributions(AUTO, 1.0)  # c = 1 until chosen
    report = p.as_report(None, 0.25)
    assert report["chosen_weight_cap"] == 0.25 and report["auto_weight_cap"]["candidates"][3] == 0.25
    assert report["rounds"][-1]["threshold"] == p.weight_caps.last_round(0.25).threshold
    with pytest.raises(ValueError, match="is not one of"):
        p.weight_caps.last_round(0.3)


@pytest.mark.parametrize("degree,want", [(1, 1.0), (8, 1.0), (20, 2**-1.5), (150, 2**-2.5)])
def test_the_reference_chooses_from_the_users_degrees(degree, want):
    """4,000 users of one degree (cut at Delta_0 = 100 by the last bucket): the noise (sigma_H ~ 39 per
    bucket) cannot move the median bucket, so the choice is the rule's for that degree, under any seed."""
    sets = {f"u{u}": [f"i{(u + k) % 500}" for k in range(degree)] for u in range(4000)}
    run_plan = plan("mad_sips", AUTO)
    for seed in (0, 1, 2):
        cap, weight_cap = reference.histogram_choices(sets, run_plan, seed)
        assert cap is None and weight_cap == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize(
    "algorithm,changes,match",
    [
        ("mad2r", {}, "weight_cap='auto' is chosen from mad_sips's noisy degree histogram"),
        ("mad_sips", {"threshold": "gaussian"}, "weight_cap='auto' caps the weights of the keep-table round"),
        ("basic", {}, "weight_cap='auto' caps the weights of the keep-table round"),
    ],
)
def test_auto_is_refused_where_there_is_no_histogram_or_no_table(algorithm, changes, match):
    with pytest.raises(ValueError, match=match):
        plan(algorithm, AUTO.replace(**changes))


def test_the_value_is_a_number_in_range_or_auto():
    assert SelectionParams(1.0, 1e-5, weight_cap=" AUTO ").weight_cap == "auto"
    assert SelectionParams(1.0, 1e-5, weight_cap="0.25").weight_cap == 0.25
    for bad in ("automatic", "", "1.5", 0.0):
        with pytest.raises(ValueError, match="weight_cap"):
            SelectionParams(1.0, 1e-5, weight_cap=bad)


def test_every_candidates_table_is_built_at_one_order_and_budget():
    """The tables the histogram chooses from share (alpha, RDP epsilon, mixture delta, grid) and the conversion
    delta, those the calibration finds for the candidate 1 (no cap): the run composes at that one order
    whichever it picks. Each W50 is within 4.5% of its table's at its own best order (and 1's is its own table)."""
    p = plan("mad_sips", AUTO)
    last = [p.weight_caps.last_round(c) for c in p.weight_caps.candidates]
    tables = [q.keep_table for q in last]
    shared = {(t.alpha, t.epsilon_rdp, t.delta_rdp, t.grid_bits) for t in tables}
    assert len(shared) == 1 and len({q.delta_conversion for q in last}) == 1
    # the one (epsilon, delta) of every candidate's round is what its own table converts to
    assert {T.to_dp(q.keep_table, q.delta_conversion) for q in last} == {(last[0].epsilon, last[0].delta)}
    spec, params = algorithm_spec("mad_sips"), resolve_params("mad_sips", AUTO)
    for c, q in zip(p.weight_caps.candidates, last):
        own = _gaussian_rounds(spec, params, None, c)[-1]  # c's table at its own best order, the same budget
        assert own.threshold * 0.99 <= q.threshold <= own.threshold * 1.045, c  # (the search is on a coarse grid)
        if c == C.WEIGHT_CAP_COMMON_ORDER_OF:
            assert q.keep_table == own.keep_table and q.threshold == own.threshold


def test_a_table_built_from_its_spec_on_a_worker_is_the_plans():
    """The last round's steps carry KeepTableSpecs and build the chosen table on the worker: in a fresh
    process (the cache cleared) the build gives the plan's table exactly, probabilities included."""
    p = plan("mad_sips", AUTO)
    table = p.weight_caps.last_round(0.25).keep_table
    spec = T.KeepTableSpec.of(table)
    T._keep_table_at.cache_clear()
    rebuilt = spec.build()
    assert rebuilt is not table and rebuilt == table
    assert len(pickle.dumps(spec)) < len(pickle.dumps(table)) / 50
    known = T.keep_table(table.alpha, table.epsilon_rdp, table.delta_rdp, (0.5, 1.0), 6, 1 << 12, unseen=0.01)
    with pytest.raises(ValueError, match="only a table of an unknown domain"):
        T.KeepTableSpec.of(known)


@pytest.mark.parametrize(
    "algorithm,changes,want_cap,want_budget",
    [
        ("mad_sips", {}, "auto", C.MEDIAN_CAP_BUDGET),  # the default: the keep-table last round
        ("mad_sips", {"cap_quantile": 0.98}, "auto", C.DEFAULT_CAP_BUDGET),  # one histogram, the tail's share
        ("mad_sips", {"threshold": "gaussian"}, 1.0, C.DEFAULT_CAP_BUDGET),  # no table: no weight cap
        ("mad_sips", {"accounting": "basic"}, 1.0, C.DEFAULT_CAP_BUDGET),  # basic: the Gaussian last round
        ("mad2r", {}, 1.0, C.DEFAULT_CAP_BUDGET),  # a table but no histogram
        ("basic", {}, 1.0, C.DEFAULT_CAP_BUDGET),
    ],
)
def test_unset_weight_cap_and_share_resolve_per_algorithm(algorithm, changes, want_cap, want_budget):
    """An unset weight_cap is 'auto' exactly where MAD-SIPS's last round is a keep table, and an unset cap_budget
    is the median's share when only 'auto' reads the histogram; explicit values win."""
    params = SelectionParams(1.0, 1e-5, max_contributions=100, **changes)
    assert (params.weight_cap, params.cap_budget) == (None, None)
    resolved = resolve_params(algorithm, params)
    assert (resolved.weight_cap, resolved.cap_budget) == (want_cap, want_budget)
    p = plan(algorithm, params)
    assert (p.weight_caps is not None) == (want_cap == "auto")
    explicit = resolve_params(algorithm, params.replace(weight_cap=1.0, cap_budget=0.05))
    assert (explicit.weight_cap, explicit.cap_budget) == (1.0, 0.05)
    if p.weight_caps is not None:  # a plan that chooses from the data needs the run's choice for its report
        with pytest.raises(ValueError, match="pass the run's chosen weight_cap"):
            p.as_report()
