"""Empirical privacy audit (issue 9, point 1): try to break the claimed epsilon with worst cases.

Every run uses fresh, unseeded randomness (OS entropy). False-failure rate: each case's bound spends
``ALPHA`` on each of its 4 one-sided Clopper-Pearson bounds, ``ALPHA = 1e-6 / (4 * #cases)``, so a
correct (epsilon, delta)-DP implementation fails ``test_audited_lower_bound_within_claim`` with
probability <= 1e-6 over the whole suite. The single-user-item check runs each algorithm
``UNIQUE_RUNS`` times at delta = 1e-12: a correct implementation releases one of the added user's
items with probability <= delta per run, so it fails with probability <= #algorithms * UNIQUE_RUNS *
1e-12 (about 2e-7); it detects a per-user release probability of 1.5e-4 or more with probability
>= 95%. The long version with more runs is ``benchmarks/privacy_audit.py``.
"""

import dataclasses
import math

import pytest

from dp_partition_beam.privacy.audit import (
    audit_bound,
    clopper_pearson,
    epsilon_lower_bound,
    expected_epsilon_lower_bound,
    zero_event_false_failure,
)
from dp_partition_beam.transforms.testing import audit

from tests.support.plan_memo import memoised_plans

CASES = audit.standard_cases()
ALPHA = 1e-6 / (4 * len(CASES))
# Runs per dataset, by cost of the reference (the whole file stays around a minute on 2 cores).
RUNS = {
    "mad/dmax": 1500,
    "mad/optimal_dmax": 1500,
    "mad_sips/resample": 1500,
    "dp_sips/resample": 2000,
    "mad2r/tip": 4000,
    "mad_sips/tip": 4000,
    "mad_sips/cap_tip": 2000,  # one copy per call
    "mad_sips/weight_cap_tip": 4000,
    "mad_sips/weight_cap_auto_tip": 2000,  # one copy per call (the histogram is the call's)
    "mad/tip": 6000,
    "dp_sips/tip": 5000,
    "dpne/tip": 4000,
    "dpne/mad_sips_tip": 4000,
    "dpne/bigram": 1500,  # 100 copies of 84 users per call
    "dpne/optimal_tip": 4000,
    "dpne/optimal_bigram": 1500,
    "dpne/mad_sips_bigram": 1500,
    "count_gaussian/all": 3000,
    "count_laplace/all": 3000,
}
DEFAULT_RUNS = 10_000
POLICY_RUNS = 300  # one sequential run per call
UNIQUE_ALGORITHMS = sorted({c.algorithm for c in CASES})
UNIQUE_RUNS = 10_000


@pytest.fixture(scope="module", autouse=True)
def _one_plan_per_parameters():
    """The reference computes each (algorithm, params)'s public plan once for the whole file (as
    SelectPartitions does once per run) instead of once per call: the one-copy-per-call cases (MAD-SIPS's
    adaptive cap and weight_cap 'auto', the policies) spent most of their time recalibrating the same plan.
    Every call still draws fresh histograms, subsamples and noise, so the trials and their statistics are
    unchanged (tests/support/plan_memo.py)."""
    with memoised_plans():
        yield


def _runs(case):
    if case.name in RUNS:
        return RUNS[case.name]
    return POLICY_RUNS if case.copies_per_call == 1 else DEFAULT_RUNS


# --- the statistics --------------------------------------------------------------------------------


def test_clopper_pearson_matches_closed_forms():
    # k = 0: hi = 1 - alpha^(1/n); k = n: lo = alpha^(1/n).
    lo, hi = clopper_pearson(0, 100, 0.01)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.01 ** (1 / 100), rel=1e-9)
    lo, hi = clopper_pearson(100, 100, 0.01)
    assert hi == 1.0 and lo == pytest.approx(0.01 ** (1 / 100), rel=1e-9)
    lo, hi = clopper_pearson(50, 100, 0.025)
    assert 0.39 < lo < 0.5 < hi < 0.61 and lo == pytest.approx(1 - hi, rel=1e-9)


def test_clopper_pearson_coverage_is_at_least_nominal():
    # Exact binomial check: Pr_p[hi(K) < p] <= alpha for a grid of p (the one-sided guarantee).
    from scipy import stats

    n, alpha = 60, 0.05
    his = [clopper_pearson(k, n, alpha)[1] for k in range(n + 1)]
    los = [clopper_pearson(k, n, alpha)[0] for k in range(n + 1)]
    for p in [0.01 * i for i in range(1, 100)]:
        pmf = stats.binom.pmf(range(n + 1), n, p)
        assert sum(pm for pm, h in zip(pmf, his) if h < p) <= alpha + 1e-12
        assert sum(pm for pm, l in zip(pmf, los) if l > p) <= alpha + 1e-12


def test_epsilon_lower_bound_formula():
    assert epsilon_lower_bound(0.01, 0.5, 0.0) == pytest.approx(math.log(50))
    assert epsilon_lower_bound(0.01, 0.5, 0.1) == pytest.approx(math.log(40))
    assert epsilon_lower_bound(0.0, 0.5, 0.0) == 0.0  # undefined -> no evidence
    assert epsilon_lower_bound(0.5, 0.4, 0.0) == 0.0
    assert epsilon_lower_bound(0.5, 0.05, 0.1) == 0.0  # delta swallows the event


def test_audit_bound_uses_both_directions_and_the_complement():
    fwd = audit_bound(10, 1000, 10_000, 0.0, 1e-3).epsilon_lb
    back = audit_bound(1000, 10, 10_000, 0.0, 1e-3).epsilon_lb
    comp = audit_bound(10_000 - 10, 10_000 - 1000, 10_000, 0.0, 1e-3).epsilon_lb
    assert fwd == pytest.approx(back) == pytest.approx(comp) and 2.5 < fwd < math.log(100)
    assert audit_bound(500, 500, 1000, 0.0, 1e-3).epsilon_lb == 0.0
    assert zero_event_false_failure(1000, 1e-9) == pytest.approx(1e-6)


def test_audit_detects_a_mechanism_weaker_than_claimed():
    # Power check: run the eps=4 mechanism but claim eps=0.5; the audit must flag it. (If this
    # fails, the harness could not catch a real violation of this size.)
    case = next(c for c in CASES if c.name == "weighted_laplace/tip")
    e0, e1 = audit.run_counts(case, 4000)
    bound = audit_bound(e0, e1, 4000, case.delta, ALPHA)
    assert bound.epsilon_lb > 0.5, bound


def test_neighbouring_datasets_differ_by_exactly_one_user():
    for case in CASES + audit.unique_item_cases(["basic"]):
        base, d_prime = audit.case_datasets(case, 3)
        extra = set(d_prime) - set(base)
        assert len(extra) == 3 and all(d_prime[u] == base[u] for u in base)  # one added user per copy
        for u in extra:
            assert len(d_prime[u]) == case.targets


def test_copies_are_independent_runs():
    # The disjoint-copies shortcut: the per-copy event rate of one call on B copies matches B calls on
    # one copy (the same case, basic/tip at p ~ 0.05). Two-sample check at a 1e-6 false-failure rate.
    case = next(c for c in CASES if c.name == "basic/tip")
    n = 1500
    _, in_one_call = audit.run_counts(case, n)
    _, separate = audit.run_counts(dataclasses.replace(case, copies_per_call=1), n)
    lo_a, hi_a = clopper_pearson(in_one_call, n, 2.5e-7)
    lo_b, hi_b = clopper_pearson(separate, n, 2.5e-7)
    assert lo_a <= hi_b and lo_b <= hi_a, (in_one_call, separate)


@pytest.mark.parametrize("name", ["dpne/bigram", "dpne/mad_sips_bigram", "dpne/optimal_bigram"])
def test_bigram_copies_share_one_public_level_two(name):
    # The DPNE level-2 cases rely on level 1 releasing every copy's words (module docstring of
    # transforms/testing/audit.py): then |S_1|, |V_2| and level 2's thresholds are the same in every call
    # on D and D', and each copy's bigram passes by its own noise only. Check the premise on 3 calls each.
    from dp_partition_beam.transforms.dpne.reference import dpne_reference

    case = next(c for c in CASES if c.name == name)
    levels = []
    for data in audit.case_datasets(case, case.copies_per_call) * 3:
        texts = {u: " ".join(items) for u, items in data.items()}
        res = dpne_reference(texts, "dpne", case.params)
        words = {w for items in data.values() for w in items}
        assert res.ngrams[1] == words
        lvl = res.levels[1]
        rounds = [r["rho"] for r in lvl.get("rounds", [])]
        levels.append((lvl["s_prev"], lvl["v_k"], lvl.get("rho"), lvl["spurious_prob"], rounds))
    assert len(set(map(repr, levels))) == 1, levels
    assert levels[0][:2] == (2 * case.copies_per_call, (2 * case.copies_per_call) ** 2)


# --- the audit -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_audited_lower_bound_within_claim(case):
    runs = _runs(case)
    result = audit.run_audit(case, runs, ALPHA)
    assert result.bound.epsilon_lb <= case.claimed_epsilon, result.row()
    # The neighbour adds weight to the targets: the event must be observed (the case is not vacuous).
    assert result.bound.events_neighbour > 0, result.row()


@pytest.mark.parametrize("algorithm", UNIQUE_ALGORITHMS)
def test_single_user_items_never_released(algorithm):
    (case,) = audit.unique_item_cases([algorithm])
    runs = POLICY_RUNS if case.copies_per_call == 1 else UNIQUE_RUNS
    e0, e1 = audit.run_counts(case, runs)
    assert case.delta <= 1e-6
    assert (e0, e1) == (0, 0), f"{case.name}: an item held by one user was released in {e1} of {runs} runs"


@pytest.mark.parametrize(
    "algorithm",
    [
        *["basic", "count_gaussian", "dp_sips", "mad2r", "mad_sips", "dpne"],
        *["weighted_laplace", "count_laplace", "policy_laplace", "mad"],
    ],
)
def test_single_user_items_never_released_by_the_keep_table(algorithm):
    """threshold 'optimal' (basic's round, MAD-SIPS's last round; docs/thresholding.md, docs/mad_sips.md): an
    item of one user is kept with probability F(its weight) <= delta_rdp c^2 <= 1e-12 per run (and MAD-SIPS's
    Gaussian rounds release it with probability <= their delta_r / 2); the l1 curve of the Laplace algorithms
    with f(t) <= delta t <= 1e-12; MAD's l2 rule with f(t) <= c t^2 <= delta."""
    # at delta 1e-12 a policy's curve needs fewer than the default max_sequential_pairs (its rounding reserve)
    extra = {"max_sequential_pairs": 10**5} if algorithm == "policy_laplace" else {}
    (case,) = audit.unique_item_cases([algorithm], threshold="optimal", **extra)
    e0, e1 = audit.run_counts(case, POLICY_RUNS if case.copies_per_call == 1 else UNIQUE_RUNS)
    assert (e0, e1) == (0, 0), f"{case.name}: an item held by one user was released in {e1} of {UNIQUE_RUNS} runs"


def test_audit_cases_cover_every_algorithm():
    from dp_partition_beam.privacy.selection import ALGORITHMS

    assert set(ALGORITHMS) | {"dpne"} == {c.algorithm for c in CASES}


def test_the_tip_case_has_a_nontrivial_bound_in_expectation():
    # Design check from the public plan: basic/tip's holders put the target in the noise tail so the
    # audit can certify a positive epsilon (not a vacuous test).
    from scipy import stats

    from dp_partition_beam.privacy.selection import plan_rounds

    case = next(c for c in CASES if c.name == "basic/tip")
    (plan,) = plan_rounds("basic", case.params)
    p0 = stats.norm.sf((plan.threshold - case.holders) / plan.noise_scale)
    p1 = stats.norm.sf((plan.threshold - case.holders - 1) / plan.noise_scale)
    assert expected_epsilon_lower_bound(p0, p1, DEFAULT_RUNS, case.delta, ALPHA) > 1.0


def test_the_count_case_is_on_the_released_count_and_nontrivial_in_expectation():
    """basic/counts: the event needs the target released AND its noisy count >= min_count; from the
    public plans (selection round, discrete Gaussian pmf) the audit can certify a positive epsilon."""
    import numpy as np
    from scipy import stats

    from dp_partition_beam.privacy.selection import plan_counts, plan_rounds

    case = next(c for c in CASES if c.name == "basic/counts")
    assert case.params.release_counts and case.min_count is not None
    (plan,) = plan_rounds("basic", case.params)
    counts = plan_counts("basic", case.params)
    s2 = float(counts.sigma2)
    xs = np.arange(-int(40 * s2**0.5), int(40 * s2**0.5) + 1)
    pmf = np.exp(-(xs**2) / (2 * s2))
    pmf /= pmf.sum()
    k = case.holders
    p0 = stats.norm.sf((plan.threshold - k) / plan.noise_scale) * pmf[xs >= case.min_count - k].sum()
    p1 = stats.norm.sf((plan.threshold - k - 1) / plan.noise_scale) * pmf[xs >= case.min_count - k - 1].sum()
    assert expected_epsilon_lower_bound(p0, p1, DEFAULT_RUNS, case.delta, ALPHA) > 0.5
    # the event really reads the count: it happens far less often than the release alone (expected
    # 0.07 vs 0.18 per copy on D'; over 2000 copies the gap is > 10 standard deviations)
    _, d_prime = audit.case_datasets(case, 2000)
    released = audit._release(dataclasses.replace(case, min_count=-(10**9)), d_prime)
    with_floor = audit._release(case, d_prime)
    assert len(with_floor) < 0.6 * len(released), (len(with_floor), len(released))


def test_the_resample_case_exercises_resubsampling():
    """mad_sips/resample: the added user holds twice Delta_0 targets; round 1 takes Delta_0 of them and
    round 2 re-subsamples its unreleased ones, so across the rounds it sends more than Delta_0 targets."""
    from dp_partition_beam.privacy.selection import plan_rounds, resolve_params
    from dp_partition_beam.transforms import reference
    from dp_partition_beam.transforms.selection.reference import mad_sips_round

    case = next(c for c in CASES if c.name == "mad_sips/resample")
    params = resolve_params("mad_sips", case.params)  # the algorithm's budget split and C_ub
    d0 = params.max_contributions
    _, d_prime = audit.case_datasets(case, 1)
    assert len(d_prime["c0added"]) == case.targets == 2 * d0
    p1, p2, _ = plan_rounds("mad_sips", params)
    c1, _, w1 = mad_sips_round(d_prime, set(), None, p1, params, seed=4)
    noisy = reference.add_noise(w1, "gaussian", p1.noise_scale, 4, 1)
    released = {i for i, x in noisy.items() if x >= p1.threshold}
    c2, _, _ = mad_sips_round(d_prime, released, (p1, noisy), p2, params, seed=4)
    assert len(c1["c0added"]) == d0
    assert len(set(c1["c0added"]) | set(c2["c0added"])) > d0
