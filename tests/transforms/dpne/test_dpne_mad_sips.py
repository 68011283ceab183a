"""DPNE with MAD-SIPS inside each level (``selection='mad_sips'``, docs/dpne.md): the plan's rounds, the
reference's invariants (Prop. 2.1 downward closure, S_k in V_k, spurious rate), the absent entries of the
known domain, and privacy canaries ("releases more than single" is a benchmark claim:
tests/benchmarks/test_utility_claims.py)."""

import math

import numpy as np
import pytest
from scipy import special, stats

from dp_partition_beam.privacy.calibration import gaussian_threshold
from dp_partition_beam.privacy.dpne import (
    DPNEParams,
    dpne_composed_privacy,
    level_rounds,
    plan_runs,
    round_id,
    spurious_probability,
)
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.dpne import reference as ref
from dp_partition_beam.transforms.dpne.reference import dpne_reference, user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from .test_dpne_reference import released_subgrams_closed
from tests.support import dpne_corpus

MS = dict(selection="mad_sips")


@pytest.fixture(scope="module")
def corpus():
    return dpne_corpus.corpus()


@pytest.mark.parametrize("split", [(0.1, 0.9), (0.03, 0.07, 0.9), (1.0,)])
@pytest.mark.parametrize("eps,delta,T", [(1.0, 1e-7, 6), (4.0, 1e-6, 3)])
def test_rounds_compose_to_the_level_and_keep_the_budget(split, eps, delta, T):
    prm = DPNEParams(epsilon=eps, delta=delta, max_n=T, max_contributions=10, budget_split=split, **MS)
    _, runs = plan_runs("dpne", prm)
    all_sigmas = []
    for run in runs:
        k = run.lengths[0]
        q = None if k == 1 else spurious_probability(prm.eta, 40, 5000)
        rounds = level_rounds(run, prm, q)
        assert [rd.index for rd in rounds] == list(range(1, len(split) + 1))
        assert [rd.round_ for rd in rounds] == [round_id(k, r) for r in range(1, len(split) + 1)]
        assert rounds[0].round_ == k  # round 1 keys as the single-round level
        # GDP: sum_r 1/sigma_r^2 = 1/sigma_k^2, so the level composes to the paper's Gaussian
        assert sum(1 / rd.sigma**2 for rd in rounds) == pytest.approx(1 / run.sigma**2, rel=1e-12)
        all_sigmas += [rd.sigma for rd in rounds]
        for rd in rounds:
            assert rd.tau == pytest.approx(max(1.0, rd.rho + prm.beta * rd.sigma))
        if k == 1:  # the novel-item events: f_r delta/2 each, delta/2 in all (Theorem 2.1's level 1)
            assert sum(rd.delta_threshold for rd in rounds) == pytest.approx(delta, rel=1e-12)
            t = np.arange(1.0, run.max_contributions + 1)
            for rd in rounds:
                h = 1 / np.sqrt(t) if rd.index == 1 else np.minimum(prm.b_max / np.sqrt(t), 1.0)
                # P[one of t novel words of weight <= h(t) passes] = 1 - Phi((rho - h)/sigma)^t
                p = -np.expm1(t * stats.norm.logcdf((rd.rho - h) / rd.sigma))
                assert p.max() <= rd.delta_threshold / 2 * (1 + 1e-6)
                assert p.max() >= rd.delta_threshold / 2 * (1 - 1e-6)  # tight at the maximising t
        else:  # the spurious rates add up to the level's q_k (Prop. 2.2's bound is unchanged)
            assert sum(rd.spurious_prob for rd in rounds) == pytest.approx(q, rel=1e-12)
            for rd in rounds:
                assert stats.norm.sf(rd.rho / rd.sigma) == pytest.approx(rd.spurious_prob, rel=1e-9)
    comp = dpne_composed_privacy(all_sigmas, eps, delta)  # every round of every level, composed in GDP
    assert comp["gaussian_delta"] == pytest.approx(delta / 2, rel=1e-6)
    assert comp["total_delta"] == pytest.approx(delta, rel=1e-6)


def test_empty_domain_has_no_round():
    prm = DPNEParams(epsilon=1, delta=1e-7, max_n=2, max_contributions=5, **MS)
    _, runs = plan_runs("dpne", prm)
    rounds = level_rounds(runs[1], prm, 0.0)
    assert all(math.isinf(rd.rho) and math.isinf(rd.tau) for rd in rounds)
    assert all(d["rho"] is None for d in (rd.as_dict() for rd in rounds))
    with pytest.raises(ValueError, match="spurious rate"):
        level_rounds(runs[1], prm, None)


def test_parameters_validated_and_used_only_with_mad_sips():
    with pytest.raises(ValueError, match="selection"):
        DPNEParams(selection="sips")
    with pytest.raises(ValueError, match="budget_split"):
        DPNEParams(budget_split=(0.5, 0.6), **MS)
    with pytest.raises(ValueError, match="b_min"):
        DPNEParams(b_min=0.2, **MS)
    assert DPNEParams(budget_split="0.2,0.8", **MS).budget_split == (0.2, 0.8)
    from dp_partition_beam.privacy.dpne import FIELD_USE

    single, mad_sips = DPNEParams(), DPNEParams(**MS)
    for name in ("budget_split", "b_min", "b_max", "c_lb", "c_ub"):
        assert all(c.holds(mad_sips) for c in FIELD_USE[name].conditions)
        assert not all(c.holds(single) for c in FIELD_USE[name].conditions)
    assert not all(c.holds(mad_sips) for c in FIELD_USE["weighting"].conditions)  # MAD-SIPS's rounds are MAD
    assert all(c.holds(mad_sips) for c in FIELD_USE["beta"].conditions)


def test_seeded_reproducible_and_unseeded_random(corpus):
    _, ug, _ = corpus
    prm = DPNEParams(epsilon=4, delta=1e-6, max_n=3, max_contributions=10, eta=0.2, **MS)
    a = dpne_reference(None, "dpne", prm, seed=7, user_grams=ug)
    b = dpne_reference(None, "dpne", prm, seed=7, user_grams=ug)
    c = dpne_reference(None, "dpne", prm, seed=8, user_grams=ug)
    assert a.lines() == b.lines() and a.lines() != c.lines()
    assert a.levels == b.levels


def test_absent_entries_are_below_the_previous_threshold_on_the_known_domain():
    prm = DPNEParams(epsilon=1, delta=1e-7, max_n=3, max_contributions=5, **MS)
    _, runs = plan_runs("dpne", prm)
    prev = level_rounds(runs[1], prm, 0.05)[0]
    items = [f"g{i}" for i in range(20000)]
    got = ref.absent_entries(items, prev, True, 11, None)
    z = np.array([got[g] for g in items]) / prev.sigma
    assert z.max() < prev.rho / prev.sigma
    # the same uniform as the noise key: sigma PhiInv(U Phi(rho/sigma))
    u = randomness.keyed_uniform(11, "noise", prev.round_, items[:5])
    want = prev.sigma * special.ndtri(u * special.ndtr(prev.rho / prev.sigma))
    assert [got[g] for g in items[:5]] == pytest.approx(list(want), rel=1e-15)
    # N(0, 1) given < rho/sigma (KS, false failure 1e-6)
    b = prev.rho / prev.sigma
    cdf = lambda x: np.minimum(stats.norm.cdf(x) / stats.norm.cdf(b), 1.0)  # noqa: E731
    assert stats.kstest(z, cdf).pvalue > 1e-6
    # unseeded: the same law from a generator
    z2 = np.array(list(ref.absent_entries(items, prev, True, None, np.random.default_rng(3)).values())) / prev.sigma
    assert z2.max() < b and stats.kstest(z2, cdf).pvalue > 1e-6
    # level 1 (unknown domain): the extended vector's plain sigma Z, keyed as its noise
    first = level_rounds(runs[0], prm)[0]
    plain = ref.absent_entries(items[:5], first, False, 11, None)
    want = first.sigma * randomness.keyed_normal(11, "noise", first.round_, items[:5])
    assert [plain[g] for g in items[:5]] == pytest.approx(list(want), rel=1e-15)


def test_absent_entries_occur_when_users_exceed_the_cap():
    # 400 users hold the 6 bigrams of one popular line; 6 of them also hold a rare (valid) bigram. At
    # Delta_2 = 2 a rare bigram misses round 1's subsample with probability 5/7; the popular ones are
    # released in round 1, so round 2 re-subsamples the rare ones and queries absent_entries for the missed
    line = " ".join(f"w{i}" for i in range(7))
    recs = {f"u{n}": line for n in range(400)}
    for n, (a, b) in enumerate([(6, 0), (5, 1), (4, 2), (3, 0), (6, 2), (5, 0)]):
        recs[f"u{n}"] = [line, f"w{a} w{b}"]
    prm = DPNEParams(epsilon=4, delta=1e-6, max_n=2, max_contributions=2, eta=0.1, **MS)
    calls = []
    orig = ref.absent_entries

    def spy(items, prev, known, seed, rng):
        calls.append((len(items), known))
        return orig(items, prev, known, seed, rng)

    ref.absent_entries, saved = spy, ref.absent_entries
    try:
        res = dpne_reference(recs, "dpne", prm, seed=2)
    finally:
        ref.absent_entries = saved
    assert any(n > 0 and known for n, known in calls)
    assert len(res.ngrams[2]) > 0 and released_subgrams_closed(res.ngrams)


def test_no_single_user_ngram_released_at_eps1(corpus):
    recs, _, _ = corpus
    recs = dict(recs)
    for i in range(30):  # canaries: a line of words nobody else uses, plus one of common words
        recs[f"canary{i}"] = [f"secret{i} ssn{i} pin{i} code{i}", "w0 w1 w2 w3"]
    ug = user_kgrams(recs, 4)
    prm = DPNEParams(epsilon=1, delta=1e-7, max_n=4, max_contributions=20, **MS)
    for seed in range(4):
        out = dpne_reference(None, "dpne", prm, rng=np.random.default_rng(seed), user_grams=ug).ngrams
        assert not any(("secret" in g or "ssn" in g or "pin" in g) for gs in out.values() for g in gs)


def test_counts_on_round_one_sets(corpus):
    _, ug, truth = corpus
    prm = DPNEParams(epsilon=4, delta=1e-6, max_n=3, max_contributions=10, release_counts=True, **MS)
    res = dpne_reference(None, "dpne", prm, seed=5, user_grams=ug)
    assert res.counts and set().union(*(set(c) for c in res.counts.values())) == res.all_ngrams()
    assert res.summary["total_delta_bound"] <= 1e-6 * (1 + 1e-6)
    # the counts use round 1's subsample (round k, as selection='single') and the count noise's keys
    # (seed, 'count_noise', k, g): a word both selections release gets the same noisy count (level 1, whose
    # input sets do not depend on the released output; level k's valid sets depend on S_1, S_{k-1})
    single = dpne_reference(None, "dpne", prm.replace(selection="single"), seed=5, user_grams=ug)
    assert single.count_plan == res.count_plan
    both = set(res.counts[1]) & set(single.counts[1])
    assert len(both) > 50
    assert all(res.counts[1][g] == single.counts[1][g] for g in both)


def test_gaussian_threshold_matches_level_one_round_one():
    prm = DPNEParams(epsilon=2, delta=1e-7, max_n=2, max_contributions=7, **MS)
    _, runs = plan_runs("dpne", prm)
    r1 = level_rounds(runs[0], prm)[0]
    assert r1.rho == pytest.approx(gaussian_threshold(r1.sigma, 0.1 * 1e-7, 7), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The spurious draws as a Bernoulli subset of V_k (dpne_kernels.spurious_subset; docs/dpne.md)
# ---------------------------------------------------------------------------------------------

V3_PREV = ["a b", "b c", "c a", "b a", "a c", "c b"]  # every bigram of {a, b, c} but the repeats
V3_S1 = ["a", "b", "c"]


def test_spurious_subset_is_a_bernoulli_subset_of_v_k():
    """Each k-gram of V_k is drawn independently with probability p, so the draws outside any set A are a
    Bernoulli(p) subset of V_k minus A: supplement Alg. 1's law (Bin(|V_k| - |A|, p) uniform k-grams of V_k minus
    A) without a count of A. 3,000 seeds; every bound at a false-failure rate of 1e-6 (Bonferroni over the checks).
    """
    sampler = dpne_kernels.ValidSampler(V3_PREV, V3_S1, "both")
    domain = sorted(dpne_kernels.brute_force_valid(set(V3_PREV), set(V3_S1), "both"))
    assert sampler.size == len(domain) == 12
    p, runs = 0.3, 3000
    hits = {g: 0 for g in domain}
    sizes = np.zeros(len(domain) + 1, dtype=np.int64)
    both = 0  # draws holding the first two k-grams at once (pairwise independence)
    for seed in range(runs):
        drawn = dpne_kernels.spurious_subset(sampler, p, round_id(3, 2), seed, None)
        assert drawn == sorted(set(drawn)) and set(drawn) <= set(domain)
        for g in drawn:
            hits[g] += 1
        sizes[len(drawn)] += 1
        both += domain[0] in drawn and domain[1] in drawn
    alpha = 1e-6 / (len(domain) + 2)
    lo, hi = stats.binom.ppf(alpha / 2, runs, p), stats.binom.ppf(1 - alpha / 2, runs, p)
    assert all(lo <= h <= hi for h in hits.values()), hits
    lo2, hi2 = stats.binom.ppf(alpha / 2, runs, p * p), stats.binom.ppf(1 - alpha / 2, runs, p * p)
    assert lo2 <= both <= hi2, both
    expected = stats.binom.pmf(np.arange(len(domain) + 1), len(domain), p) * runs
    bins = expected >= 5  # chi-square on the sizes, the rare tails pooled
    observed = np.append(sizes[bins], sizes[~bins].sum())
    expect = np.append(expected[bins], expected[~bins].sum())
    assert stats.chisquare(observed, expect, ddof=0).pvalue > alpha


def test_spurious_subset_is_keyed_by_seed_and_round_and_uses_the_generator_unseeded():
    sampler = dpne_kernels.ValidSampler(V3_PREV, V3_S1, "both")
    a = dpne_kernels.spurious_subset(sampler, 0.5, 103, 7, None)
    assert a == dpne_kernels.spurious_subset(sampler, 0.5, 103, 7, None)
    assert {tuple(dpne_kernels.spurious_subset(sampler, 0.5, r, 7, None)) for r in range(3, 23)} != {tuple(a)}
    assert dpne_kernels.spurious_subset(sampler, 0.0, 103, 7, None) == []
    assert dpne_kernels.spurious_subset(dpne_kernels.ValidSampler([], V3_S1, "both"), 0.5, 103, 7, None) == []
    with pytest.raises(ValueError, match="worker generator"):
        dpne_kernels.spurious_subset(sampler, 0.5, 103, None, None)
    drawn = {tuple(dpne_kernels.spurious_subset(sampler, 0.5, 103, None, np.random.default_rng(s))) for s in range(20)}
    assert len(drawn) > 1  # unseeded: the worker's generator, not a fixed subset


def test_a_rounds_spurious_release_is_the_subset_outside_its_support(monkeypatch):
    """level_mad_sips at k >= 2: every drawn k-gram outside round r's support is in S_k (released in round r, or
    earlier), S_k holds nothing but the rounds' supports and draws, and no k-gram is released twice."""
    recs = markov_corpus(400, vocab=30, branching=3, seed=5)
    params = DPNEParams(epsilon=4, delta=1e-5, max_n=3, max_contributions=15, eta=0.3, **MS)
    seen = []
    original_subset, original_weights = dpne_kernels.spurious_subset, ref.mad_weights

    def recording_subset(sampler, p, round_, seed, rng):
        drawn = original_subset(sampler, p, round_, seed, rng)
        seen.append(("drawn", round_, set(drawn)))
        return drawn

    def recording_weights(capped, *a, **kw):
        w = original_weights(capped, *a, **kw)
        seen.append(("support", None, set(w)))
        return w

    monkeypatch.setattr(dpne_kernels, "spurious_subset", recording_subset)
    monkeypatch.setattr(ref, "mad_weights", recording_weights)
    got = dpne_reference(recs, "dpne", params, seed=3)
    n_rounds = len(params.budget_split)
    calls = iter(seen)
    outside = 0
    for k, level in zip(range(1, 4), got.levels):
        assert level["released"] == sum(rd["released"] for rd in level["rounds"]) == len(got.ngrams[k])
        covered = set()
        for r in range(1, n_rounds + 1):
            kind, _, support = next(calls)
            assert kind == "support"
            covered |= support
            if k >= 2:
                kind, round_, drawn = next(calls)
                assert kind == "drawn" and round_ == round_id(k, r)
                assert drawn - support <= got.ngrams[k]
                outside += len(drawn - support)
                covered |= drawn
        assert got.ngrams[k] <= covered
    assert outside > 0  # the check is not vacuous
