"""MAD / MAD2R on Beam (SelectPartitions, the columnar path) against the reference, and Theorem 6.1
(stochastic dominance). The MAD weights stage itself: tests/transforms/selection/test_select.py; MAD and MAD2R
in multi_processing mode: tests/transforms/selection/test_multiprocessing.py.

The Beam cases are labelled branches of one in_memory pipeline per DEFAULT_CHUNK_ROWS setting
(tests/support/selection_cases.py), run once per module by the ``branches`` fixture; each test compares its
own branch with its own reference result."""

import random

import numpy as np
import pytest
from scipy.stats import norm

from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.testing.synthetic import heavy_light_sets

from tests.support.selection_cases import Select, count_lines, rounds_lines, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

SETS = random_user_sets(random.Random(4), 1500, 300, 15)  # ~10k pairs, users above Delta_0 = 8
# ~1.25k pairs: one-row batches are the slow extreme (an element per pair through every batch step): two 700-row
# shards cut into 150-row pieces keep the case's shape (several shards, several pieces each) at a third of the CPU of
# 600 users' 4k pairs; 11-12 items released
SMALL_SETS = random_user_sets(random.Random(4), 200, 300, 15)


def _params(**changes):
    return SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, d_max=6, **changes)


ACCOUNTING = ["gdp", "basic"]
KEEP_TABLE = {"items": (False, 1.0), "counts": (True, 1.0), "weight_cap": (False, 0.3)}  # release_counts, weight_cap
KEEP_TABLE_ROWS_PER_SHARD = 900  # the items' runs: 12 user shards of ~10k rows
# (rows_per_shard, batch_rows, chunk_rows): one shard; many user/item shards, small batches, pieces of a few users
# (what a big shard is cut into before every shuffle); one-row batches in 700-row shards cut into 150-row pieces
SHARDS = {"one_shard": (10**9, 65_536, None), "sharded_small_batches": (700, 50, 37), "one_row_batches": (700, 1, 150)}


def _keep_table_params(case):
    release_counts, weight_cap = KEEP_TABLE[case]
    return _params(threshold="optimal", release_counts=release_counts, weight_cap=weight_cap)


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every case; one in_memory pipeline per DEFAULT_CHUNK_ROWS setting (it is
    read at run time by every case of a pipeline): the default one, 37 and 150."""
    default = {}
    for algorithm in ("mad", "mad2r"):
        for accounting in ACCOUNTING:
            default[f"rounds/{algorithm}/{accounting}"] = Select(
                pairs_of(SETS), algorithm, _params(accounting=accounting), seed=123, output_rounds=True
            )
    for case in KEEP_TABLE:
        params = _keep_table_params(case)
        if params.release_counts:
            default[f"keep_table/{case}"] = Select(pairs_of(SETS), "mad2r", params, seed=123)
        else:
            default[f"keep_table/{case}"] = Select(
                pairs_of(SETS), "mad2r", params, seed=123, output_rounds=True, rows_per_shard=KEEP_TABLE_ROWS_PER_SHARD
            )
    by_chunk = {}
    for case, (rows_per_shard, batch_rows, chunk_rows) in SHARDS.items():
        for algorithm in ("mad", "mad2r"):
            sets = SMALL_SETS if batch_rows == 1 else SETS
            by_chunk.setdefault(chunk_rows, {})[f"shards/{algorithm}/{case}"] = Select(
                pairs_of(sets),
                algorithm,
                _params(),
                seed=123,
                output_rounds=True,
                rows_per_shard=rows_per_shard,
                batch_rows=batch_rows,
            )
    by_chunk[None].update(default)
    out = {}
    for chunk_rows, cases in by_chunk.items():
        out.update(run_cases(cases, chunk_rows=chunk_rows))
    return out


@pytest.mark.parametrize("algorithm", ["mad", "mad2r"])
@pytest.mark.parametrize("accounting", ACCOUNTING)
def test_select_mad_algorithms_equal_reference(branches, algorithm, accounting):
    """Seeded Beam == reference, every round (one shard, default batches)."""
    plans, per_round = reference.select_rounds(SETS, algorithm, _params(accounting=accounting), seed=123)
    assert branches[f"rounds/{algorithm}/{accounting}"] == rounds_lines(per_round)
    assert all(per_round.values())  # every round released something: a non-trivial check
    if algorithm == "mad2r":
        assert not per_round[1] & per_round[2]  # round 2 removes U1 (Alg. 4 line 13)


@pytest.mark.parametrize("case", list(KEEP_TABLE))
def test_mad2r_keep_table_equals_reference(branches, case):
    """threshold='optimal' (docs/mad_sips.md): MAD2R's round 2 as the keep table over biased Basic weights
    rounded onto C (capped at weight_cap); seeded Beam == reference, with the counts' holders of round 2 from
    the table's partials (the items' runs in 900-row shards of ~10k rows: several user/item shards)."""
    params = _keep_table_params(case)
    result = reference.release(SETS, "mad2r", params, seed=123)
    assert result.rounds[-1].noise == "keep_table" and result.per_round[2]
    cap = params.weight_cap  # C up to the cap
    assert max(result.rounds[-1].keep_table.contributions) == pytest.approx(cap, rel=0.05)
    if params.release_counts:
        assert branches[f"keep_table/{case}"] == count_lines(result.counts) and result.counts
    else:
        assert branches[f"keep_table/{case}"] == rounds_lines(result.per_round)


def test_stochastic_dominance_on_section_6_2_instance():
    """Theorem 6.1 on the MAD paper's section 6.2 instance (n = 15,000, m = 1,000, eps = 1, delta = 1e-5).

    Per item: MAD's release probability Phi((w* - rho)/sigma) >= Basic's for items below Phi(beta),
    and >= Phi(beta) otherwise (exact, from the weights). Statistically: over 30 seeded trials,
    MAD (d_max = 4) releases more light items than Basic; the gap must exceed 6 standard errors of
    the difference (false-failure rate < 1e-8 given the ~+130 item expected gap, sd ~ 15).
    """
    sets = heavy_light_sets(15_000, 1_000, 2, seed=0)
    params = SelectionParams(epsilon=1.0, delta=1e-5, d_max=4, threshold="gaussian")
    (basic_plan,) = plan_rounds("basic", params)
    (mad_plan,) = plan_rounds("mad", params)
    assert (mad_plan.noise_scale, mad_plan.threshold) == (basic_plan.noise_scale, basic_plan.threshold)
    sigma, rho = basic_plan.noise_scale, basic_plan.threshold
    w_basic = reference.basic_weights(sets)
    w_mad = reference.mad_weights(sets, mad_plan.tau, params.d_max)
    beta = params.beta
    for item, wb in w_basic.items():
        p_b = norm.cdf((wb - rho) / sigma)
        p_m = norm.cdf((w_mad[item] - rho) / sigma)
        if p_b < norm.cdf(beta):
            assert p_m >= p_b - 1e-12
        else:
            assert p_m >= norm.cdf(beta) - 1e-12
    trials = 30
    diffs = []
    for seed in range(trials):
        b = reference.noisy_threshold(w_basic, basic_plan, seed=seed)
        m = reference.noisy_threshold(w_mad, mad_plan, seed=seed + 1000)
        assert "heavy" in b and "heavy" in m
        diffs.append(len(m) - len(b))
    diffs = np.array(diffs, dtype=float)
    se = diffs.std(ddof=1) / np.sqrt(trials)
    assert diffs.mean() > 6 * se, (diffs.mean(), se)
    # the analytic means agree with the simulation (5 standard errors)
    exp_gap = sum(norm.cdf((w_mad[i] - rho) / sigma) - norm.cdf((w_basic[i] - rho) / sigma) for i in w_basic)
    assert abs(diffs.mean() - exp_gap) < 5 * se + 1e-9


def test_stochastic_dominance_under_the_l2_rule():
    """Theorem 6.1's per-item statement under MAD's default release, the l2 keep rule (docs/thresholding.md), on the
    section 6.2 instance: with tau the weight the rule keeps with probability Phi(beta), every item Basic keeps with
    probability below Phi(beta) MAD keeps at least as often, and every other at least Phi(beta) (exact, from the
    weights; the rule is nondecreasing and MAD's weights of light items only grow)."""
    sets = heavy_light_sets(15_000, 1_000, 2, seed=0)
    params = SelectionParams(epsilon=1.0, delta=1e-5, d_max=4)
    (mad_plan,) = plan_rounds("mad", params)
    rule = mad_plan.keep_table
    assert mad_plan.noise == "keep_rule"
    w_basic = reference.basic_weights(sets)
    w_mad = reference.mad_weights(sets, mad_plan.tau, params.d_max)
    items = list(w_basic)
    p_b = rule.keep_probability(np.array([w_basic[i] for i in items]))
    p_m = rule.keep_probability(np.array([w_mad[i] for i in items]))
    phi_beta = norm.cdf(params.beta)
    below = p_b < phi_beta
    assert below.sum() > 900 and np.all(p_m[below] >= p_b[below] - 1e-12)
    assert np.all(p_m[~below] >= phi_beta - 1e-9)
    assert p_m[below].sum() > p_b[below].sum() + 50  # the rerouted weight is worth items (here +~90 expected)


def test_mad_tau_is_one_rule_for_selection_and_dpne():
    """One rule for MAD's tau (privacy.calibration.mad_tau): max(1, rho + beta*sigma) in every family.

    In selection rho > 1 always (h(1) = 1 plus a positive noise margin), so tau = rho + beta*sigma; in
    DPNE rho_k of k >= 2 can be far below 1 and the same function raises tau to 1 (the proof needs
    tau >= 1, Lemma 5.3; a larger tau only reroutes less weight)."""
    from dp_partition_beam.privacy.calibration import mad_tau

    assert mad_tau(0.5, 0.1, 0.0) == 1.0 and mad_tau(0.2, 0.1, 2.0) == 1.0
    assert mad_tau(3.0, 1.0, 2.0) == 5.0
    for beta in (0.0, 2.0):
        params = SelectionParams(epsilon=100, delta=0.4, max_contributions=1, beta=beta)
        (mad,) = plan_rounds("mad", params)
        assert mad.tau == mad_tau(mad.threshold, mad.noise_scale, beta) == mad.threshold + beta * mad.noise_scale
        assert mad.tau > 1.0


@pytest.mark.parametrize("algorithm", ["mad", "mad2r"])
@pytest.mark.parametrize("case", list(SHARDS))
def test_mad_family_output_does_not_depend_on_shards_or_batches(branches, algorithm, case):
    """The columnar MAD/MAD2R under a seed: one shard (~10k rows), many user/item shards (700 rows) with
    50-row batches and pieces of 37 rows (a few users: what a big shard is cut into before every shuffle),
    one-row batches (the slow extreme: 200 users, ~1.25k rows, 700-row shards in 150-row pieces): same rounds."""
    rows_per_shard, batch_rows, _ = SHARDS[case]
    sets = SMALL_SETS if batch_rows == 1 else SETS
    _, per_round = reference.select_rounds(sets, algorithm, _params(), seed=123)
    assert branches[f"shards/{algorithm}/{case}"] == rounds_lines(per_round)
    assert per_round[1] and (algorithm == "mad" or per_round[2])
