"""Kernels of DPNE: tokenizer, k-grams, valid k-grams (|V_k|), uniform spurious sampling."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.dpne.reference import sample_spurious

# ------------------------------------------------------------------------------------------------
# Tokenizer and k-grams
# ------------------------------------------------------------------------------------------------


def test_tokenizer_unicode_lowercase_punctuation_apostrophes():
    t = tx.default_tokenize
    assert t("Hello, World!") == ["hello", "world"]
    assert t("Don't stop") == ["don't", "stop"]
    assert t("it\u2019s ok") == ["it\u2019s", "ok"]  # typographic apostrophe kept (as in the data)
    assert t("'quoted' rock'n'roll") == ["quoted", "rock'n'roll"]  # only internal apostrophes
    assert t("snake_case x-y a.b") == ["snake_case", "x", "y", "a", "b"]
    assert t("Straße ÉCOLE 東京 ２０２４") == ["straße", "école", "東京", "2024"]  # NFKC: fullwidth digits
    assert t("ﬁle") == ["file"]  # NFKC ligature
    assert t("   ") == []


def test_kgrams_never_cross_line_breaks():
    text = "a b c\nd e\r\nf"
    assert tx.text_kgrams(text, 1) == {"a", "b", "c", "d", "e", "f"}
    assert tx.text_kgrams(text, 2) == {"a b", "b c", "d e"}
    assert tx.text_kgrams(text, 3) == {"a b c"}
    allk = tx.text_all_kgrams(text, 4)
    assert allk[2] == {"a b", "b c", "d e"} and allk[4] == set()


def test_replaceable_tokenizer():
    chars = lambda s: [c for c in s if not c.isspace()]  # noqa: E731
    assert tx.text_kgrams("ab c", 2, chars) == {"a b", "b c"}


def test_head_tail_words():
    assert tx.head("a b c") == "a b" and tx.tail("a b c") == "b c"
    assert tx.head("a") == "" and tx.tail("a") == ""
    assert tx.first_word("a b c") == "a" and tx.last_word("a b c") == "c"
    assert tx.join("a", "", "c") == "a c"


# ------------------------------------------------------------------------------------------------
# |V_k|
# ------------------------------------------------------------------------------------------------


def random_closed_levels(rng: random.Random, vocab: int, keep: float, T: int):
    """Random downward-closed S_1..S_T (each S_k a random subset of V_k)."""
    s1 = {f"w{i}" for i in range(vocab) if rng.random() < 0.8} or {"w0"}
    levels = [s1]
    for _ in range(2, T + 1):
        v = dpne_kernels.brute_force_valid(levels[-1], s1, "both")
        levels.append({g for g in v if rng.random() < keep})
    return levels


@pytest.mark.parametrize("trial", range(6))
def test_exact_valid_count_equals_brute_force(trial):
    rng = random.Random(trial)
    levels = random_closed_levels(rng, rng.randint(2, 7), rng.uniform(0.2, 0.7), 4)
    s1 = levels[0]
    for k in range(2, 5):
        s_prev = levels[k - 2]
        for pruning in ("both", "single"):
            brute = dpne_kernels.brute_force_valid(s_prev, s1, pruning)
            assert dpne_kernels.valid_count_exact(s_prev, s1, pruning) == len(brute)
            assert dpne_kernels.ValidSampler(s_prev, s1, pruning).size == len(brute)
            assert all(dpne_kernels.is_valid(g, s_prev, s1, pruning) for g in brute)
    assert dpne_kernels.valid_count_exact(s1, s1) == len(s1) ** 2  # k = 2: |S_1|^2


def test_sampling_estimator_is_unbiased():
    rng = random.Random(3)
    levels = random_closed_levels(rng, 6, 0.5, 3)
    s1, s2 = sorted(levels[0]), sorted(levels[1])
    exact = dpne_kernels.valid_count_exact(s2, s1)
    gen = np.random.default_rng(0)
    est = np.array([dpne_kernels.valid_count_sample(s2, s1, 0.05, gen) for _ in range(2000)])
    se = est.std(ddof=1) / math.sqrt(len(est))
    assert abs(est.mean() - exact) < 4 * se + 1e-9
    assert est.std() > 0  # it is a real estimator, not the exact count


# ------------------------------------------------------------------------------------------------
# Uniform sampling from V_k and spurious k-grams
# ------------------------------------------------------------------------------------------------


def small_level():
    s1 = {"a", "b", "c", "d"}
    s2 = {"a b", "b c", "c d", "a c", "b b", "d a", "c a"}
    return s1, s2


def test_valid_sampler_uniform_chi_square():
    s1, s2 = small_level()
    for pruning in ("both", "single"):
        v = sorted(dpne_kernels.brute_force_valid(s2, s1, pruning))
        sampler = dpne_kernels.ValidSampler(s2, s1, pruning)
        draws = sampler.draw(np.random.default_rng(1), 40 * len(v) * 10)
        assert set(draws) <= set(v)
        counts = np.array([draws.count(g) for g in v])
        assert stats.chisquare(counts).pvalue > 1e-3


def test_spurious_uniform_outside_support_and_binomial_count():
    s1, s2 = small_level()
    v = sorted(dpne_kernels.brute_force_valid(s2, s1, "both"))
    supp = set(v[::3])  # pretend these have weight
    outside = [g for g in v if g not in supp]
    sampler = dpne_kernels.ValidSampler(s2, s1, "both")
    q = 0.3
    rng = np.random.default_rng(5)
    hits = {g: 0 for g in outside}
    sizes = []
    reps = 3000
    for _ in range(reps):
        got = sample_spurious(sampler, supp, q, 3, None, rng)
        assert len(set(got)) == len(got)
        assert not set(got) & supp
        sizes.append(len(got))
        for g in got:
            hits[g] += 1
    # Each k-gram outside supp(H_k) is released independently with probability q (Prop. 2.2):
    # the count is Binomial(|V_k| - |supp|, q) and every outside k-gram is equally likely.
    n = len(outside)
    assert abs(np.mean(sizes) - n * q) < 4 * math.sqrt(n * q * (1 - q) / reps)
    counts = np.array(list(hits.values()))
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(counts.mean() / reps - q) < 0.02


def test_spurious_seeded_is_deterministic():
    s1, s2 = small_level()
    sampler = dpne_kernels.ValidSampler(s2, s1, "both")
    a = sample_spurious(sampler, set(), 0.5, 3, 42, None)
    b = sample_spurious(sampler, set(), 0.5, 3, 42, None)
    c = sample_spurious(sampler, set(), 0.5, 3, 43, None)
    assert a == b and a != c


def test_oversample_size_makes_failure_negligible():
    # Probability that M draws give fewer than N distinct k-grams of V_k is <= 1e-12 by construction; check
    # empirically that it never fails and that M is not absurd. Both arguments are public (issue 59).
    for n, v in [(5, 100), (100, 120_000), (1, 1000), (50, 60), (60, 60)]:
        m = dpne_kernels.spurious_oversample(n, v)
        assert m >= n
        p = (v - n + 1) / v
        assert stats.binom.cdf(n - 1, m, p) <= dpne_kernels.OVERSAMPLE_FAILURE_PROB
    with pytest.raises(RuntimeError, match="too few distinct k-grams of V_k"):
        dpne_kernels.select_spurious([(0.1, "a")], 2, 3)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    q=st.sampled_from([0.05, 0.3, 0.7, 1.0]),
    a=st.sets(st.integers(0, 10_000)),
    b=st.sets(st.integers(0, 10_000)),
)
def test_spurious_draws_read_the_support_only_to_drop_what_it_holds(seed, q, a, b):
    """Issue 59, point 3: the spurious step of a paper level (--selection single) is a Bernoulli(q) subset of
    V_k drawn from the public plan, so under one seed two supports A, B release the same spurious k-grams
    outside both, and nothing the support holds. The previous step drew Bin(|V_k| - |supp|, q) k-grams of V_k
    minus the support: its draws (and its failure event) changed with the private support size, and this
    property failed at the first pair of supports of different sizes."""
    s1, s2 = small_level()
    v = sorted(dpne_kernels.brute_force_valid(s2, s1, "both"))
    sampler = dpne_kernels.ValidSampler(s2, s1, "both")
    supp_a = {v[i % len(v)] for i in a}
    supp_b = {v[i % len(v)] for i in b}
    got_a = sample_spurious(sampler, supp_a, q, 3, seed, None)
    got_b = sample_spurious(sampler, supp_b, q, 3, seed, None)
    assert not set(got_a) & supp_a and not set(got_b) & supp_b
    assert set(got_a) - supp_b == set(got_b) - supp_a
    # and both are the one subset of V_k the seed draws, minus each support
    subset = set(dpne_kernels.spurious_subset(sampler, q, 3, seed, None))
    assert set(got_a) == subset - supp_a and set(got_b) == subset - supp_b
    if q == 1.0:
        assert subset == set(v)


def test_cli_tokenizer_option_loads_module_function():
    from dp_partition_beam.pipelines.cli import load_tokenizer

    assert load_tokenizer(None) is tx.default_tokenize
    assert load_tokenizer("dp_partition_beam.transforms.core.text:default_tokenize") is tx.default_tokenize
    with pytest.raises(ValueError, match="module:function"):
        load_tokenizer("nocolon")
    with pytest.raises(ValueError, match="cannot be imported"):
        load_tokenizer("dp_partition_beam.transforms.core.text:nope")
