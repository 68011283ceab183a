"""The count release on Beam (SelectPartitions with release_counts, ReleaseCounts) against the reference,
and the statistics of the released counts.

False-failure rates: the statistical tests reject at p < 1e-7 each (4 tests: < 4e-7 in total); the
unseeded Beam run checks |noisy - true| <= 8 sigma per item (P[|X| > 8 sigma] < 1.3e-15 per item).
"""

import math
import random

import apache_beam as beam
import numpy as np
import pytest
from scipy import stats

from dp_partition_beam.privacy import counts as C
from dp_partition_beam.privacy.selection import SelectionParams, plan_counts
from dp_partition_beam.transforms import SelectPartitions, reference
from dp_partition_beam.transforms.selection import counts_kernels
from dp_partition_beam.transforms.selection.counts import ReleaseCounts
from dp_partition_beam.transforms.testing.beam import format_tsv

from tests.support.beam_helpers import collect
from tests.support.user_sets import pairs_of, random_user_sets

ALPHA = 1e-7


def _kv(kv):
    return f"{kv[0]}\t{kv[1]}"


def _parse(lines):
    out = {}
    for line in lines:
        k, v = line.split("\t")
        assert k not in out, f"item {k} output twice"
        out[k] = int(v)
    return out


@pytest.fixture(scope="module")
def sets():
    return random_user_sets(random.Random(3), 2500, 150, 12)


@pytest.mark.parametrize(
    "algorithm,kw",
    [
        ("basic", dict(min_users=5)),
        ("count_laplace", dict()),
        ("mad", dict(min_users=20)),
        ("mad2r", dict()),
        ("dp_sips", dict(budget_split=(0.3, 0.3, 0.4))),
        ("policy_gaussian", dict(count_budget=0.5)),
        ("mad2r", dict(accounting="basic", min_users=10)),
    ],
)
def test_beam_counts_equal_the_reference_under_a_seed(sets, algorithm, kw):
    params = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, **kw)
    want = reference.select_counts(sets, algorithm, params, seed=11)
    got = _parse(
        collect(lambda p: p | beam.Create(pairs_of(sets)) | SelectPartitions(algorithm, params, seed=11), fmt=_kv)
    )
    assert got == want
    assert len(want) > 10
    if params.min_users > 0:  # min_users = 0 keeps every item, negative noisy counts included (unbiased)
        assert all(c >= params.min_users for c in got.values())


def test_rounds_and_allowlist_equal_the_reference(sets):
    params = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, min_users=3)
    allow = sorted({i for items in sets.values() for i in items})[::2]
    result = reference.release(sets, "mad2r", params, seed=5, allowlist=allow)
    kept = result.counts
    want = {(r, item, kept[item]) for r, items in result.per_round.items() for item in items if item in kept}

    def build(p):
        allow_pc = p | "Allow" >> beam.Create(allow)
        return (
            p
            | beam.Create(pairs_of(sets))
            | SelectPartitions("mad2r", params, seed=5, output_rounds=True, allowlist=allow_pc)
        )

    lines = collect(build, fmt=lambda e: f"{e[0]}\t{e[1][0]}\t{e[1][1]}")
    got = {(int(r), i, int(c)) for r, i, c in (line.split("\t") for line in lines)}
    assert got == want and len(got) > 5
    assert {i for _, i, _ in got} <= set(allow)
    # the allowlist really restricts: without it, items outside it are released
    assert reference.select(sets, "mad2r", params, seed=5) - set(allow)


def test_release_counts_counts_only_released_items_and_zero_holders(sets):
    capped = reference.bound_contributions(sets, 4, seed=1)
    released = ["i0", "i3", "i7", "never-held"]
    plan = plan_counts("basic", SelectionParams(epsilon=1.0, delta=1e-6, max_contributions=4, release_counts=True))
    true = counts_kernels.holder_counts(capped, released)
    assert true["never-held"] == 0 and true["i0"] > 0
    want = counts_kernels.noisy_counts(true, plan.sigma2, 99, plan.round)

    def build(p):
        rel = p | "Released" >> beam.Create(released)
        return p | beam.Create(sorted(capped.items())) | ReleaseCounts(rel, plan, seed=99)

    assert _parse(collect(build, fmt=_kv)) == want  # exactly the released items, the 0-holder one included


def test_unseeded_beam_counts_are_ints_near_the_truth(sets):
    params = SelectionParams(epsilon=4.0, delta=1e-5, max_contributions=20, release_counts=True, count_budget=0.5)
    plan = plan_counts("basic", params)
    got = _parse(collect(lambda p: p | beam.Create(pairs_of(sets)) | SelectPartitions("basic", params), fmt=_kv))
    true = counts_kernels.holder_counts(sets, got)  # every user holds <= 12 < 20 items: capping is the identity
    assert len(got) > 20
    assert all(abs(got[i] - true[i]) <= 8 * plan.noise_scale for i in got)
    again = _parse(collect(lambda p: p | beam.Create(pairs_of(sets)) | SelectPartitions("basic", params), fmt=_kv))
    assert again != got  # fresh OS-entropy noise each run


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


def test_counts_in_multi_processing_mode_equal_the_reference(sets):
    """Two worker processes (DoFns imported by module name, the sampler's source set up per worker)."""
    params = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, min_users=1)
    want = reference.select_counts(sets, "mad", params, seed=21)
    got = _parse(
        collect(
            lambda p: p | beam.Create(pairs_of(sets)) | SelectPartitions("mad", params, seed=21),
            mode="multi_processing",
            workers=2,
            fmt=format_tsv,  # a package function: the workers import DoFns by module name
        )
    )
    assert got == want and len(got) > 10
