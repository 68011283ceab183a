"""The count release on Beam (SelectPartitions with release_counts, ReleaseCounts) against the reference,
and the statistics of the released counts.

False-failure rates: the statistical tests reject at p < 1e-7 each (4 tests: < 4e-7 in total); the
unseeded Beam run checks |noisy - true| <= 8 sigma per item (P[|X| > 8 sigma] < 1.3e-15 per item).

The Beam cases are labelled branches of one in_memory pipeline (tests/support/selection_cases.py), run once
per module by the ``branches`` fixture; each test compares its own branch with its own reference result. The
count release in multi_processing mode: tests/transforms/selection/test_multiprocessing.py.
"""

import ast
import math
import random

import apache_beam as beam
import numpy as np
import pytest
from scipy import stats

from dp_partition_beam.privacy import counts as C
from dp_partition_beam.privacy.selection import SelectionParams, plan_counts
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.selection import counts_kernels
from dp_partition_beam.transforms.selection.counts import ReleaseCounts

from tests.support.selection_cases import Branch, Select, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

ALPHA = 1e-7


SETS = random_user_sets(random.Random(3), 2500, 150, 12)  # ~13k pairs


@pytest.fixture(scope="module")
def sets():
    return SETS


SEEDED = {
    "basic": ("basic", dict(min_users=5)),
    "count_laplace": ("count_laplace", dict()),
    "mad": ("mad", dict(min_users=20)),
    "mad2r": ("mad2r", dict()),
    "dp_sips": ("dp_sips", dict(budget_split=(0.3, 0.3, 0.4))),
    "policy_gaussian": ("policy_gaussian", dict(count_budget=0.5)),
    "mad2r_basic_accounting": ("mad2r", dict(accounting="basic", min_users=10)),
}


def _seeded_params(case):
    return SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, **SEEDED[case][1])


ALLOW_PARAMS = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, min_users=3)
ALLOW = sorted({i for items in SETS.values() for i in items})[::2]
RELEASED = ["i0", "i3", "i7", "never-held"]
UNSEEDED_PARAMS = SelectionParams(epsilon=4.0, delta=1e-5, max_contributions=20, release_counts=True, count_budget=0.5)


def _release_counts_inputs():
    capped = reference.bound_contributions(SETS, 4, seed=1)
    plan = plan_counts("basic", SelectionParams(epsilon=1.0, delta=1e-6, max_contributions=4, release_counts=True))
    return capped, plan


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every Beam case of the module, from one in_memory pipeline
    (tests/support/selection_cases.py): each test compares its own branch with its own reference."""
    cases = {
        f"seeded/{case}": Select(pairs_of(SETS), algorithm, _seeded_params(case), seed=11)
        for case, (algorithm, _) in SEEDED.items()
    }
    cases["allowlist"] = Select(pairs_of(SETS), "mad2r", ALLOW_PARAMS, seed=5, output_rounds=True, allowlist=ALLOW)
    capped, plan = _release_counts_inputs()
    cases["release_counts"] = Branch(
        lambda p: (
            p
            | "Sets" >> beam.Create(sorted(capped.items()))
            | ReleaseCounts(p | "Released" >> beam.Create(RELEASED), plan, seed=99)
        )
    )
    for run in ("unseeded", "unseeded_again"):  # two applications: each draws its own OS-entropy noise
        cases[run] = Select(pairs_of(SETS), "basic", UNSEEDED_PARAMS)
    return run_cases(cases)


def _parse(lines):
    """{item: int count} of ``str((item, count))`` lines; an item output twice fails."""
    out = {}
    for line in lines:
        k, v = ast.literal_eval(line)
        assert k not in out, f"item {k} output twice"
        assert type(v) is int, line
        out[k] = v
    return out


@pytest.mark.parametrize("case", list(SEEDED))
def test_beam_counts_equal_the_reference_under_a_seed(branches, case):
    algorithm, _ = SEEDED[case]
    params = _seeded_params(case)
    want = reference.select_counts(SETS, algorithm, params, seed=11)
    got = _parse(branches[f"seeded/{case}"])
    assert got == want
    assert len(want) > 10
    if params.min_users > 0:  # min_users = 0 keeps every item, negative noisy counts included (unbiased)
        assert all(c >= params.min_users for c in got.values())


def test_rounds_and_allowlist_equal_the_reference(branches):
    """The allowlist as a PCollection (a side input), with round tags and counts."""
    result = reference.release(SETS, "mad2r", ALLOW_PARAMS, seed=5, allowlist=ALLOW)
    kept = result.counts
    want = {(r, item, kept[item]) for r, items in result.per_round.items() for item in items if item in kept}
    lines = branches["allowlist"]
    got = [(r, i, c) for r, (i, c) in map(ast.literal_eval, lines)]
    assert len(got) == len(set(got)) and set(got) == want and len(got) > 5
    assert all(type(r) is int and type(c) is int for r, _, c in got)
    assert {i for _, i, _ in got} <= set(ALLOW)
    # the allowlist really restricts: without it, items outside it are released
    assert reference.select(SETS, "mad2r", ALLOW_PARAMS, seed=5) - set(ALLOW)


def test_release_counts_counts_only_released_items_and_zero_holders(branches):
    capped, plan = _release_counts_inputs()
    true = counts_kernels.holder_counts(capped, RELEASED)
    assert true["never-held"] == 0 and true["i0"] > 0
    want = counts_kernels.noisy_counts(true, plan.sigma2, 99, plan.round)
    assert _parse(branches["release_counts"]) == want  # exactly the released items, the 0-holder one included


def test_unseeded_beam_counts_are_ints_near_the_truth(branches):
    plan = plan_counts("basic", UNSEEDED_PARAMS)
    got = _parse(branches["unseeded"])
    true = counts_kernels.holder_counts(SETS, got)  # every user holds <= 12 < 20 items: capping is the identity
    assert len(got) > 20
    assert all(abs(got[i] - true[i]) <= 8 * plan.noise_scale for i in got)
    again = _parse(branches["unseeded_again"])
    assert again != got  # fresh OS-entropy noise for each application


# --------------------------------------------------------------------------------------------------
# statistics of the released counts over many seeds
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def errors():
    """noisy - true over 150 seeds x 60 always-released items (users hold <= Delta_0 items: no capping)."""
    rng = random.Random(0)
    items = [f"w{j}" for j in range(60)]
    user_sets = {f"u{u}": rng.sample(items, 3) for u in range(2000)}
    params = SelectionParams(epsilon=2.0, delta=1e-6, max_contributions=3, release_counts=True, count_budget=0.25)
    true = counts_kernels.holder_counts(user_sets, items)
    errs = []
    for seed in range(150):
        got = reference.select_counts(user_sets, "basic", params, seed=seed)
        assert set(got) == set(items)
        errs.extend(got[i] - true[i] for i in items)
    return np.array(errs), plan_counts("basic", params)


def test_counts_are_unbiased(errors):
    errs, plan = errors
    z = errs.mean() / (plan.std / math.sqrt(len(errs)))
    assert 2 * stats.norm.sf(abs(z)) > ALPHA, z


def test_count_error_matches_the_reported_noise_scale(errors):
    errs, plan = errors
    n = len(errs)
    ratio = float(np.sum(errs.astype(float) ** 2)) / (plan.std**2)  # ~ chi2(n) for a normal; N_Z is near it
    lo, hi = stats.chi2.ppf(ALPHA / 2, n), stats.chi2.isf(ALPHA / 2, n)
    assert lo <= ratio <= hi, (ratio / n, plan.std)


def test_the_95_percent_error_bound_covers_its_share(errors):
    errs, plan = errors
    c = plan.error_bound_95
    inside = int(np.sum(np.abs(errs) <= c))
    exact = 1 - C.discrete_gaussian_tail(plan.sigma2, c)  # P[|X| <= c] (>= 0.95)
    assert exact >= 0.95
    assert stats.binomtest(inside, len(errs), exact).pvalue > ALPHA, (inside / len(errs), exact)


def test_min_users_floor_is_applied_to_the_noisy_counts(sets):
    params = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True)
    full = reference.select_counts(sets, "basic", params, seed=4)
    floor = sorted(full.values())[len(full) // 2]
    floored = reference.select_counts(sets, "basic", params.replace(min_users=floor), seed=4)
    assert floored == {i: c for i, c in full.items() if c >= floor}
    assert 0 < len(floored) < len(full)
