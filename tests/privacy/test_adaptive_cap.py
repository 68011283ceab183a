"""MAD-SIPS's adaptive cap (privacy/cap.py, docs/mad_sips.md "Adaptive cap"): grid, histogram sensitivity,
the choice, the budget split, the reference and the Beam path under a seed."""

import math
import random

import apache_beam as beam
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import calibration
from dp_partition_beam.privacy import cap as cap_plans
from dp_partition_beam.privacy.cap import CapPlan, cap_grid, choose_cap, degree_buckets, degree_histogram
from dp_partition_beam.privacy.selection import (
    SelectionParams,
    adaptive_cap_sigmas,
    algorithm_spec,
    plan_cap,
    plan_rounds,
    resolve_params,
)
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.selection.reference import mad_sips_round
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect
from tests.support.user_sets import pairs_of

PARAMS = SelectionParams(epsilon=1.0, delta=1e-5, threshold="gaussian")  # the Gaussian rounds' calibration


def small_degree_sets(rng, n_users, n_items, heavy):
    """Most users hold 1-3 items (Higgs-like), ``heavy`` users 20-60: the cap has room below Delta_0."""
    sets = {}
    for u in range(n_users):
        d = rng.choice([1, 1, 1, 2, 2, 3]) if u >= heavy else rng.randint(20, 60)
        sets[f"u{u}"] = [f"i{int(rng.paretovariate(1.0)) % n_items}" for _ in range(d)]
    return sets


# --- grid and histogram ----------------------------------------------------------------------------


@pytest.mark.parametrize("d0", [1, 2, 5, 100, 101, 10_000])
def test_cap_grid_is_increasing_from_1_to_delta0_in_steps_of_at_most_sqrt2_rounded(d0):
    grid = cap_grid(d0)
    assert grid[0] == 1 and grid[-1] == d0
    assert all(a < b for a, b in zip(grid, grid[1:]))
    # consecutive values below Delta_0 are round(2^(j/2)): ratio <= sqrt(2) up to rounding (<= 2 for 1 -> 2)
    assert all(b <= max(2, math.ceil(a * math.sqrt(2) + 0.5)) for a, b in zip(grid, grid[1:-1]))


def test_cap_grid_for_delta0_100():
    assert cap_grid(100) == (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 100)


@settings(max_examples=200, deadline=None)
@given(
    degrees=st.lists(st.integers(1, 500), max_size=60),
    added=st.integers(1, 500),
    d0=st.sampled_from([1, 4, 40, 100, 300]),
)
def test_one_user_changes_one_bucket_by_one(degrees, added, d0):
    """l2 sensitivity 1 (privacy/cap.py step 1): D' = D + one user of any degree (also above Delta_0)."""
    grid = cap_grid(d0)
    h = degree_histogram(np.array(degrees, dtype=np.int64), grid)
    h2 = degree_histogram(np.array(degrees + [added], dtype=np.int64), grid)
    diff = h2 - h
    assert int(np.abs(diff).sum()) == 1 and float(np.sqrt((diff**2).sum())) == 1.0
    assert int(h.sum()) == len(degrees)


def test_degree_buckets_are_the_intervals_between_grid_values():
    grid = (1, 2, 3, 4, 6, 8, 10)
    d = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1000])
    assert degree_buckets(d, grid).tolist() == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6]


# --- the choice --------------------------------------------------------------------------------------


def _plan(grid, sigma=1.0, quantile=0.99, z=2.0):
    return CapPlan(tuple(grid), sigma, quantile, 0.01, z, tuple(() for _ in grid))


def _brute_force_cap(noisy, plan):
    total = sum(noisy)
    for j, g in enumerate(plan.grid[:-1]):
        sd = plan.noise_scale * math.sqrt(len(plan.grid) - 1 - j)
        if sum(noisy[j + 1 :]) + plan.z * sd <= (1 - plan.quantile) * total:
            return g
    return plan.grid[-1]


@settings(max_examples=300, deadline=None)
@given(
    counts=st.lists(st.floats(-50, 5000, allow_nan=False), min_size=4, max_size=4),
    sigma=st.floats(0.01, 30),
    quantile=st.floats(0.5, 0.999),
)
def test_choose_cap_is_the_smallest_grid_value_whose_raised_tail_fits(counts, sigma, quantile):
    plan = _plan((1, 2, 4, 8), sigma, quantile)
    assert choose_cap(counts, plan) == _brute_force_cap(counts, plan)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3000), min_size=5, max_size=5), bucket=st.integers(0, 4), more=st.integers(1, 500)
)
def test_more_users_above_never_lower_the_cap(counts, bucket, more):
    """Adding users to a bucket raises the tails above every lower grid value more than (1 - q) of the
    added count raises the allowance: the cap never goes down below that bucket."""
    plan = _plan((1, 2, 3, 5, 9), 1.0, 0.99)
    before = choose_cap(counts, plan)
    bumped = list(counts)
    bumped[bucket] += more
    after = choose_cap(bumped, plan)
    if before < plan.grid[bucket]:
        assert after >= before


def test_small_or_empty_data_keeps_delta0():
    plan = plan_cap("mad_sips", PARAMS)
    assert choose_cap(np.zeros(len(plan.grid)), plan) == 100
    assert choose_cap(np.full(len(plan.grid), -5.0), plan) == 100
    few = np.zeros(len(plan.grid))
    few[0] = 2000  # 2,000 users of degree 1: sigma_H ~ 39 keeps the tail's margin above 0.5% of them
    assert choose_cap(few, plan) == 100
    many = np.zeros(len(plan.grid))
    many[0] = 1_000_000
    assert choose_cap(many, plan) == 1


def test_a_cap_too_small_by_noise_alone_is_rare():
    """Higgs-like true histogram: the users above 11 are 3 sigma_tail above the allowance of the default q.
    Choosing 11 or less needs a noise of more than 5 standard deviations of the tail (z = 2 plus the 3 of
    the gap): probability < 3e-7 per draw, < 1e-4 over these 300 seeded draws (the false-failure rate)."""
    plan = plan_cap("mad_sips", PARAMS)
    grid = plan.grid
    j11 = grid.index(11)
    sd = plan.noise_scale * math.sqrt(len(grid) - 1 - j11)
    hist = np.zeros(len(grid), dtype=np.int64)
    hist[0] = 250_000
    allowance = (1 - plan.quantile) * 250_000
    hist[j11 + 1] = int(allowance + 3 * sd) + 1  # all just above 11
    from dp_partition_beam.transforms.selection.mad_sips_kernels import noisy_cap

    caps = [noisy_cap(hist, plan, seed, None) for seed in range(300)]
    assert min(caps) > 11 and max(caps) <= 100


# --- the budget split ----------------------------------------------------------------------------------


@pytest.mark.parametrize("release_counts", [False, True])
def test_histogram_and_rounds_share_the_selections_mu2_exactly(release_counts):
    params = resolve_params("mad_sips", PARAMS.replace(release_counts=release_counts))
    spec = algorithm_spec("mad_sips")
    sigma_rounds, sigma_h = adaptive_cap_sigmas(spec, params)
    plan = plan_cap("mad_sips", params)
    assert plan.noise_scale == sigma_h
    # the rounds split sigma_rounds by the budget split (GDP): sum 1/sigma_r^2 = 1/sigma_rounds^2
    for rounds in plan.rounds:
        mu2_rounds = math.fsum(1.0 / r.noise_scale**2 for r in rounds)
        assert mu2_rounds == pytest.approx(1.0 / sigma_rounds**2, rel=1e-9)
        mu2 = mu2_rounds + 1.0 / sigma_h**2
        if not release_counts:  # the whole GDP part: (epsilon, delta/2) like the fixed-cap plan
            sigma_sel = calibration.analytic_gaussian_sigma(1.0, 0.5e-5)
            assert mu2 <= 1.0 / sigma_sel**2 * (1 + 1e-9)
            assert calibration.gaussian_delta(1.0 / math.sqrt(mu2), 1.0) <= 0.5e-5 * (1 + 1e-9)
    assert sigma_h == pytest.approx(sigma_rounds * math.sqrt(0.99 / 0.01))


def test_rounds_of_each_cap_are_calibrated_for_that_many_novel_items():
    plan = plan_cap("mad_sips", PARAMS)
    params = resolve_params("mad_sips", PARAMS)
    previous = None
    for g, rounds in zip(plan.grid, plan.rounds):
        last = rounds[-1]
        # the biased rounds' novel-item bound min(b_max/sqrt(t), 1) (privacy review L3)
        h = lambda t: np.minimum(params.b_max / np.sqrt(t), 1.0)  # noqa: E731
        want = calibration.gaussian_threshold(last.noise_scale, last.delta, g, h)
        assert last.threshold == want
        if previous is not None:
            assert last.threshold >= previous  # more novel items, higher threshold
        previous = last.threshold
    assert plan.rounds_for(100) == plan_rounds("mad_sips", PARAMS)
    assert plan.rounds_for(16)[-1].threshold < 0.96 * plan.rounds_for(100)[-1].threshold


# --- parameters ------------------------------------------------------------------------------------------


def test_defaults_and_errors():
    assert resolve_params("mad_sips", PARAMS).cap_quantile == cap_plans.DEFAULT_CAP_QUANTILE
    # with the keep-table last round (mad_sips's default threshold) the cap is off unless asked for
    for table in (PARAMS.replace(threshold=None), PARAMS.replace(threshold="optimal")):
        assert resolve_params("mad_sips", table).cap_quantile == 1.0 and plan_cap("mad_sips", table) is None
    assert resolve_params("mad_sips", PARAMS.replace(threshold=None, cap_quantile=0.9)).cap_quantile == 0.9
    assert resolve_params("mad2r", PARAMS).cap_quantile == 1.0 and plan_cap("mad2r", PARAMS) is None
    assert plan_cap("mad_sips", PARAMS.replace(cap_quantile=1.0)) is None
    assert plan_cap("mad_sips", PARAMS.replace(accounting="basic")) is None  # off by default under basic
    with pytest.raises(ValueError, match="mad_sips option"):
        plan_rounds("mad2r", PARAMS.replace(cap_quantile=0.99))
    with pytest.raises(ValueError, match="accounting='gdp'"):
        plan_rounds("mad_sips", PARAMS.replace(cap_quantile=0.99, accounting="basic"))
    with pytest.raises(ValueError, match="cap_quantile"):
        PARAMS.replace(cap_quantile=0.0)
    with pytest.raises(ValueError, match="cap_budget"):
        PARAMS.replace(cap_budget=0.6)
    with pytest.raises(ValueError, match="not a value of the grid"):
        plan_cap("mad_sips", PARAMS).rounds_for(17)


# --- reference and Beam ------------------------------------------------------------------------------------

SETS = small_degree_sets(random.Random(7), 3000, 400, 10)
SMALL = SelectionParams(
    epsilon=4.0,
    delta=1e-4,
    max_contributions=40,
    d_max=6,
    budget_split=(0.2, 0.3, 0.5),
    cap_quantile=cap_plans.DEFAULT_CAP_QUANTILE,  # asked for: with the default keep table it is off
    cap_budget=0.5,
)


def test_reference_chooses_a_cap_below_delta0_and_uses_its_rounds():
    result = reference.release(SETS, "mad_sips", SMALL, seed=0)
    plan = plan_cap("mad_sips", SMALL)
    assert result.cap in plan.grid and result.cap < 40
    assert result.rounds == plan.rounds_for(result.cap)
    assert reference.release(SETS, "mad_sips", SMALL, seed=0).cap == result.cap  # seeded: reproducible
    # every user sends at most the cap's items in a round
    params = resolve_params("mad_sips", SMALL)
    capped, _, _ = mad_sips_round(SETS, set(), None, result.rounds[0], params, seed=0, cap=result.cap)
    assert max(len(items) for items in capped.values()) == result.cap


def test_at_the_default_budget_a_cap_of_16_lowers_every_threshold_below_the_fixed_plans():
    """The histogram's 1% of mu^2 raises sigma by 0.5%; 16 novel items instead of 100 lower rho by ~5%."""
    fixed = plan_rounds("mad_sips", PARAMS.replace(cap_quantile=1.0))
    adaptive = plan_cap("mad_sips", PARAMS)
    assert all(a.noise_scale > f.noise_scale for a, f in zip(adaptive.rounds_for(16), fixed))
    assert all(a.threshold < 0.97 * f.threshold for a, f in zip(adaptive.rounds_for(16), fixed))
    assert all(a.threshold > f.threshold for a, f in zip(adaptive.rounds_for(100), fixed))


def _beam_rounds(sets, params, seed):
    return collect(
        lambda p: (
            p
            | beam.Create(pairs_of(sets))
            | SelectPartitions("mad_sips", params, seed=seed, output_rounds=True, rows_per_shard=2000)
            | beam.MapTuple(lambda r, i: f"{r}\t{i}")
        )
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_equals_reference_with_the_adaptive_cap(seed):
    result = reference.release(SETS, "mad_sips", SMALL, seed=seed)
    assert result.cap < 40
    got = _beam_rounds(SETS, SMALL, seed)
    want = sorted(f"{r}\t{i}" for r, items in result.per_round.items() for i in items)
    assert sorted(got) == want and want


def test_unseeded_beam_run_with_the_adaptive_cap_releases_held_items():
    held = {i for items in SETS.values() for i in items}
    got = collect(lambda p: p | beam.Create(pairs_of(SETS)) | SelectPartitions("mad_sips", SMALL))
    assert got and set(got) <= held
