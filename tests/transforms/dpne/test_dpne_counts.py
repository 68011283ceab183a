"""Counts of released n-grams (DPNE and its DPSU baselines): Beam == reference under a seed, the plan's
budget, the floor, and the sensitivity of the per-level count vector (docs/counts.md)."""

import math

import apache_beam as beam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import counts as C
from dp_partition_beam.privacy.dpne import (
    DPNEParams,
    count_l0,
    plan_dpne_counts,
    plan_runs,
    plan_tables,
    release_privacy,
)
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import _capped, dpne_reference, user_kgrams
from dp_partition_beam.transforms.selection import counts_kernels
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.beam_helpers import collect_branches
from tests.support.dpne_cases import branch, outputs, untag

SEED = 77


@pytest.fixture(scope="module")
def records():
    recs = markov_corpus(600, vocab=30, branching=3, seed=4)
    return [(u, "\n".join(lines)) for u, lines in recs.items()]


COUNTS = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=12, release_counts=True)
DPNE_COUNTS = COUNTS.replace(eta=0.3, min_users=2)


#: every Beam == reference counts case: one labelled branch each of ONE module pipeline (``beam_counts``)
BEAM_CASES = {
    "dpne-tables": ("dpne", DPNE_COUNTS),  # keep tables (the default)
    "dpne-gaussian": ("dpne", DPNE_COUNTS.replace(threshold="gaussian")),
    "dpsu_even": ("dpsu_even", COUNTS),
    "dpsu_all": ("dpsu_all", COUNTS),
}


@pytest.fixture(scope="module")
def beam_counts(records):
    """``{case: (counts {k: {g: c}}, sorted n-gram lines)}`` from one seeded pipeline whose branches are the
    cases of :data:`BEAM_CASES` (a pipeline has seconds of fixed cost; each case still has its own branch)."""

    def build(algorithm, params):
        return branch(
            lambda p: outputs(
                p | "Create" >> beam.Create(records) | "DPNE" >> DPNE(algorithm, params, seed=SEED, num_shards=2),
                ("counts", "ngrams"),
            )
        )

    lines = collect_branches({name: build(*case) for name, case in BEAM_CASES.items()})
    out = {}
    for name in BEAM_CASES:
        got = untag(lines[name], ("counts", "ngrams"))
        counts = {}
        for line in got["counts"]:
            k, g, c = line.split("\t")
            counts.setdefault(int(k), {})[g] = int(c)
        out[name] = counts, got["ngrams"]
    return out


@pytest.mark.parametrize("case", list(BEAM_CASES))
def test_dpne_counts_beam_equal_the_reference(records, beam_counts, case):
    algorithm, params = BEAM_CASES[case]
    want = dpne_reference(records, algorithm, params, seed=SEED)
    got, ngram_lines = beam_counts[case]
    assert got == {k: v for k, v in want.counts.items() if v}
    assert ngram_lines == want.lines()  # 'ngrams' are the n-grams kept by the floor
    assert sum(len(v) for v in got.values()) > 10
    assert all(c >= params.min_users for v in got.values() for c in v.values())


def test_dpne_counts_are_near_the_level_counts(records):
    params = DPNEParams(epsilon=8, delta=1e-5, max_n=2, max_contributions=30, release_counts=True, count_budget=0.5)
    result = dpne_reference(records, "dpne", params, seed=SEED)
    grams = user_kgrams(dict((u, t) for u, t in records), 2)
    plan = result.count_plan
    for k in (1, 2):
        capped = _capped(grams[k], 30, k, SEED, None)
        true = counts_kernels.holder_counts(capped, result.counts[k])
        # P[|X| > 8 sigma] < 1.3e-15 per n-gram
        assert all(abs(result.counts[k][g] - true[g]) <= 8 * plan.noise_scale for g in true)
    assert result.summary["counts"]["noise_scale"] == plan.noise_scale


@pytest.mark.parametrize("algorithm", ["dpne", "dpsu_all", "dpsu_even", "dpsu_single"])
def test_dpne_plan_with_counts_spends_exactly_the_budget(algorithm):
    params = DPNEParams(epsilon=2, delta=1e-6, max_n=4, max_contributions=(20, 10, 10, 5), threshold="gaussian")
    if algorithm != "dpne":
        params = params.replace(threshold=None)
    with_counts = params.replace(release_counts=True, count_budget=0.3)
    plan = plan_dpne_counts(algorithm, with_counts)
    assert plan_dpne_counts(algorithm, params) is None and plan.l0 == count_l0(algorithm, with_counts)
    assert plan.l0 == (5 if algorithm == "dpsu_single" else 45)
    sigma_star, runs = plan_runs(algorithm, with_counts)
    sigmas = [r.sigma for r in runs] if algorithm in ("dpne", "dpsu_even") else [runs[0].sigma]
    gdp_delta = C.composed_delta_gdp(sigmas, plan.sigma_continuous, plan.l0, 2.0)
    thresholds = sum(r.delta_threshold for r in runs if r.delta_threshold is not None) / 2
    assert 1e-6 * (1 - 1e-6) <= gdp_delta + thresholds <= 1e-6
    assert sigma_star > plan_runs(algorithm, params)[0]  # the levels pay for the counts


def test_dpne_tables_with_counts_spend_at_most_the_budget():
    """threshold='optimal': the levels' tables and the counts compose in RDP at one order to (epsilon, delta)."""
    params = DPNEParams(epsilon=2, delta=1e-6, max_n=4, max_contributions=(20, 10, 10, 5), threshold="optimal")
    with_counts = params.replace(release_counts=True, count_budget=0.3)
    plan = plan_dpne_counts("dpne", with_counts)
    tables, alone = plan_tables(with_counts), plan_tables(params)
    assert tables.counts_rdp == pytest.approx(tables.alpha * plan.l0 / (2 * plan.sigma_continuous**2), rel=1e-12)
    priv = release_privacy(plan_runs("dpne", with_counts)[1], with_counts, plan)
    assert 2 * (1 - 1e-9) <= priv["epsilon_at_delta"] <= 2 and priv["total_delta"] <= 1e-6
    assert priv["epsilon_rdp"] == pytest.approx(sum(t.epsilon_rdp for t in tables.levels) + tables.counts_rdp)
    assert alone.counts_rdp == 0 and 2 * (1 - 1e-9) <= alone.privacy()["epsilon_at_delta"] <= 2
    assert tables.delta_slack == pytest.approx(1e-6 * 1e-9) and alone.delta_slack == 0  # the discrete kernel's


@settings(max_examples=100, deadline=None)
@given(
    texts=st.lists(st.lists(st.sampled_from(list("abcdef")), min_size=1, max_size=8), min_size=1, max_size=12),
    added=st.lists(st.sampled_from(list("abcdef")), min_size=1, max_size=10),
    caps=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    seed=st.integers(0, 2**31),
)
def test_per_level_counts_change_by_at_most_one_in_at_most_sum_of_caps(texts, added, caps, seed):
    """Adding a user changes the count vector over (k, n-gram) by +1 in at most Delta_1 + Delta_2
    coordinates (each level's capped set of the new user), whatever the pruning (a public function
    of the released sets, the same for both datasets)."""
    base = {f"u{i}": " ".join(t) for i, t in enumerate(texts)}
    bigger = dict(base, v=" ".join(added))
    g0, g1 = user_kgrams(base, 2), user_kgrams(bigger, 2)
    changed = 0
    for k in (1, 2):
        c0 = _capped(g0[k], caps[k - 1], k, seed, None)
        c1 = _capped(g1[k], caps[k - 1], k, seed, None)
        items = set().union(*c1.values()) if c1 else set()
        h0, h1 = counts_kernels.holder_counts(c0, items), counts_kernels.holder_counts(c1, items)
        diff = [h1[g] - h0[g] for g in items]
        assert all(d in (0, 1) for d in diff)
        assert sum(diff) <= caps[k - 1]
        changed += sum(diff)
    assert changed <= sum(caps) and math.sqrt(changed) <= math.sqrt(sum(caps))


def test_dpne_count_parameters_are_validated():
    with pytest.raises(ValueError, match="count_budget"):
        DPNEParams(release_counts=True, count_budget=1.5)
    with pytest.raises(ValueError, match="min_users=3 .* needs release_counts=True"):
        DPNEParams(min_users=3)
    with pytest.raises(ValueError, match="release_counts"):
        DPNEParams(release_counts="no")
