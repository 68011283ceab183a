"""The exact discrete Gaussian sampler (transforms/core/discrete_gaussian.py; CKS 2020 Alg. 1-3).

False-failure rates: every statistical test below rejects at p < ALPHA = 1e-7, and there are fewer
than 20 of them, so a correct sampler fails this file with probability < 2e-6. The power checks
show that the same tests reject a sampler with a 10% wrong variance.
"""

import ast
import inspect
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_partition_beam.transforms.core import discrete_gaussian as dg

ALPHA = 1e-7


def exact_pmf(sigma2: Fraction, xs):
    """N_Z(0, sigma^2) pmf on ``xs`` (normalised over |x| <= 60 sigma: the rest is < 1e-700)."""
    s2 = float(sigma2)
    support = np.arange(-int(60 * math.sqrt(s2)) - 2, int(60 * math.sqrt(s2)) + 3)
    logw = -(support.astype(float) ** 2) / (2 * s2)
    z = np.exp(logw - logw.max()).sum()
    return np.exp(-(np.asarray(xs, float) ** 2) / (2 * s2) - logw.max()) / z


def chi_square_p(samples, sigma2: Fraction) -> float:
    """Chi-square goodness of fit against the exact pmf, bins with expected count >= 20 (tails pooled)."""
    n = len(samples)
    s = math.sqrt(float(sigma2))
    lo, hi = -int(6 * s) - 1, int(6 * s) + 1
    xs = np.arange(lo, hi + 1)
    expected = exact_pmf(sigma2, xs) * n
    counts = np.array([np.sum(samples == x) for x in xs], dtype=float)
    # pool the two tails (|x| beyond the range) into the end bins
    counts[0] += np.sum(samples < lo)
    counts[-1] += np.sum(samples > hi)
    expected[0] += n * exact_pmf(sigma2, np.arange(lo - 2000, lo)).sum()
    expected[-1] += n * exact_pmf(sigma2, np.arange(hi + 1, hi + 2000)).sum()
    # merge bins from the outside in until each expected count is >= 20
    obs_b, exp_b, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(counts, expected):
        acc_o += o
        acc_e += e
        if acc_e >= 20:
            obs_b.append(acc_o)
            exp_b.append(acc_e)
            acc_o = acc_e = 0.0
    obs_b[-1] += acc_o
    exp_b[-1] += acc_e
    exp_b = np.array(exp_b) * (n / np.sum(exp_b))
    return float(stats.chisquare(obs_b, exp_b).pvalue)


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(2), Fraction(100, 3), Fraction(0.7) ** 2 * 400])
def test_system_source_matches_the_exact_pmf(sigma2):
    src = dg.SystemSource()
    samples = np.array([dg.sample_discrete_gaussian(src, sigma2) for _ in range(12_000)])
    assert chi_square_p(samples, sigma2) > ALPHA


def test_seeded_draws_match_the_exact_pmf():
    sigma2 = Fraction(49, 4)
    noise = dg.DiscreteGaussian(sigma2, seed=2026, purpose="test", round_=3)
    samples = np.array(noise.draw_many(range(12_000)))
    assert chi_square_p(samples, sigma2) > ALPHA


def test_chi_square_detects_a_ten_percent_wrong_variance():
    # Power check: draws with sigma^2 = 11 tested against sigma^2 = 10 must be rejected. With 12,000
    # draws the p-value was ~1e-6..1e-8 (the test failed now and then at ALPHA = 1e-7); 60,000 draws
    # multiply the chi-square's non-centrality by 5: measured p-values 1e-50 to 1e-62 (false failure ~0).
    src = dg.SystemSource()
    samples = np.array([dg.sample_discrete_gaussian(src, Fraction(11)) for _ in range(60_000)])
    assert chi_square_p(samples, Fraction(10)) < ALPHA


@pytest.mark.parametrize("num,den", [(0, 1), (1, 3), (1, 1), (5, 2), (7, 3)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(num, den):
    n = 40_000
    src = dg.SystemSource()
    hits = sum(dg.bernoulli_exp(src, num, den) for _ in range(n))
    p = math.exp(-num / den)
    assert stats.binomtest(hits, n, p).pvalue > ALPHA, (hits / n, p)


def test_discrete_laplace_matches_its_pmf():
    t, n = 3, 30_000
    src = dg.SystemSource()
    samples = np.array([dg.sample_discrete_laplace(src, t) for _ in range(n)])
    xs = np.arange(-15, 16)
    w = np.exp(-np.abs(xs) / t)
    z = (1 + math.exp(-1 / t)) / (1 - math.exp(-1 / t))  # sum over all integers
    expected = w / z * n
    observed = np.array([np.sum(samples == x) for x in xs], dtype=float)
    tail_obs, tail_exp = n - observed.sum(), n - expected.sum()
    p = stats.chisquare(np.append(observed, tail_obs), np.append(expected, tail_exp)).pvalue
    assert p > ALPHA


def test_seeded_draw_is_a_function_of_seed_purpose_round_key():
    a = dg.DiscreteGaussian(Fraction(400), seed=7, purpose="count_noise", round_=0)
    b = dg.DiscreteGaussian(Fraction(400), seed=7, purpose="count_noise", round_=0)
    keys = ["x", "y", ("k", 2), 17, b"z"]
    first = [a.draw(k) for k in keys]
    assert [b.draw(k) for k in reversed(keys)] == first[::-1]  # order of draws does not matter
    assert a.draw_many(keys) == first  # nor repetition
    others = [
        dg.DiscreteGaussian(Fraction(400), seed=8).draw_many(keys),
        dg.DiscreteGaussian(Fraction(400), seed=7, round_=1).draw_many(keys),
        dg.DiscreteGaussian(Fraction(400), seed=7, purpose="other").draw_many(keys),
    ]
    for other in others:
        assert other != first  # P[equal] < 1e-9 for sigma = 20 and 5 keys
    assert all(type(x) is int for x in first)


def test_unseeded_draws_differ_between_instances():
    a = dg.DiscreteGaussian(Fraction(10**6)).draw_many(range(20))
    b = dg.DiscreteGaussian(Fraction(10**6)).draw_many(range(20))
    assert a != b


def test_philox_randbelow_is_uniform_and_in_range():
    src = dg.keyed_source(1, "t", 0, "k")
    n, k = 30_000, 7
    draws = [src.randbelow(k) for _ in range(n)]
    assert min(draws) == 0 and max(draws) == k - 1
    assert stats.chisquare(np.bincount(draws, minlength=k)).pvalue > ALPHA
    big = (1 << 130) + 12345
    assert all(0 <= src.randbelow(big) < big for _ in range(200))
    assert src.randbelow(1) == 0
    with pytest.raises(ValueError, match="n >= 1"):
        src.randbelow(0)


@pytest.mark.parametrize("bad", [0, -1, Fraction(-1, 2), float("nan"), float("inf"), "2", True, None])
def test_bad_sigma2_is_rejected(bad):
    with pytest.raises(ValueError, match="sigma2"):
        dg.DiscreteGaussian(bad)


def test_the_sampler_never_touches_floating_point():
    """No float literal, no float(), no math function other than isqrt in the sampling path: the output
    is decided by integer comparisons only (docs/security.md, "Released counts")."""
    fns = [
        dg._bernoulli,
        dg._bernoulli_exp_at_most_one,
        dg.bernoulli_exp,
        dg.sample_discrete_laplace,
        dg.sample_discrete_gaussian,
        dg.PhiloxSource.randbelow,
        dg.PhiloxSource._word,
        dg.SystemSource.randbelow,
    ]
    for fn in fns:
        tree = ast.parse(_dedent(fn))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant):
                assert not isinstance(node.value, float), f"{fn.__qualname__}: float literal {node.value}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "float", fn.__qualname__
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
                assert node.attr == "isqrt", f"{fn.__qualname__}: math.{node.attr}"
            assert not isinstance(node, ast.Div), f"{fn.__qualname__}: true division"


def _dedent(fn):
    import textwrap

    return textwrap.dedent(inspect.getsource(fn))


def test_system_source_drops_its_buffer_in_a_forked_process(monkeypatch):
    """A process forked after the buffer was filled must not replay the parent's bytes."""
    import os

    src = dg.SystemSource()
    src.randbelow(1 << 64)
    parent_buf, parent_pos = src._buf, src._pos
    parent_next = parent_buf[parent_pos : parent_pos + 8]
    real_pid = os.getpid()
    monkeypatch.setattr(dg.os, "getpid", lambda: real_pid + 1)
    child_next = src._bytes(8)
    assert src._buf is not parent_buf and src._pos == 8
    assert child_next != parent_next  # P[equal] = 2^-64
