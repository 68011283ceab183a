"""Properties of the optimised hot paths (issue 8): fixed-point exact sums, duplicate-tolerant subsample.

The Beam == reference tests (test_foundation_beam.py, test_select.py, ...) check the end result;
these check the kernels directly on random inputs.
"""

import collections
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.fixed64 import exact_sum64, fixed64_of, limbs_of, value_of_limbs

# inside the domain of the exact sums (finite, |w| < 2^40, transforms/core/fixed64.py), and small
# enough that 40 of them keep every int64 limb sum exact
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e10, max_value=1e10)
# multiples of 2^-64 (e.g. every double of magnitude >= 2^-11): summed without any quantisation
dyadic = st.integers(-(2**50), 2**50).map(lambda k: k / 2.0**20)


def _limb_sum(parts):
    """The float of the exact sum of several partial limb sums (how the Beam path merges partials)."""
    limbs = [limbs_of(np.array(p, dtype=np.float64)) for p in parts]
    return float(value_of_limbs(*(sum(int(limb[j].sum()) for limb in limbs) for j in range(3)))[0])


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, max_size=40), st.randoms(use_true_random=False))
def test_limb_partial_sums_are_exact_sum64_in_any_order_and_split(xs, rnd):
    shuffled = list(xs)
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))
    assert _limb_sum([shuffled[:cut], shuffled[cut:]]) == exact_sum64(xs) == exact_sum64(shuffled)


@settings(max_examples=300, deadline=None)
@given(st.lists(dyadic, max_size=40), st.randoms(use_true_random=False))
def test_exact_sums_equal_fsum_in_any_order_and_split(xs, rnd):
    shuffled = list(xs)
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))
    assert _limb_sum([shuffled[:cut], shuffled[cut:]]) == exact_sum64(shuffled) == math.fsum(xs)


@given(dyadic)
def test_fixed_point_round_trips(x):
    assert fixed64_of(x) / 2**64 == x


def test_fixed_point_rejects_non_finite():
    for bad in (float("inf"), float("nan"), 2.0**41):
        with pytest.raises(ValueError, match="finite with \\|w\\| < 2\\^40"):
            fixed64_of(bad)
        with pytest.raises(ValueError, match="finite with \\|w\\| < 2\\^40"):
            limbs_of(np.array([1.0, bad]))


items_st = st.lists(st.one_of(st.text(max_size=4), st.integers(-5, 5)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(items_st, st.integers(1, 12), st.integers(0, 50), st.randoms(use_true_random=False))
def test_seeded_subsample_ignores_repeats_and_order(items, k, seed, rnd):
    distinct = list(dict.fromkeys(items))
    noisy = items + [rnd.choice(items) for _ in range(len(items))] if items else []
    rnd.shuffle(noisy)
    got = randomness.subsample(noisy, k, "u", 0, seed, None)
    assert got == randomness.subsample(distinct, k, "u", 0, seed, None)
    assert len(got) == min(k, len(distinct)) and len(set(map(randomness.sort_key, got))) == len(got)
    assert set(map(randomness.sort_key, got)) <= set(map(randomness.sort_key, distinct))


def test_unseeded_subsample_with_repeats_is_uniform():
    # 10 distinct items, item 'a0' repeated 20 times; k = 3: each item kept with probability 0.3.
    # 20,000 draws: counts ~ Binomial(20000, 0.3), sd ~ 65; |z| > 6 has probability < 2e-8 per item.
    items = [f"a{j}" for j in range(10)] + ["a0"] * 20
    rng = np.random.default_rng(12345)
    counts = collections.Counter()
    for _ in range(20_000):
        sample = randomness.subsample(items, 3, "u", 0, None, rng)
        assert len(sample) == 3 and len(set(sample)) == 3
        counts.update(sample)
    sd = math.sqrt(20_000 * 0.3 * 0.7)
    for j in range(10):
        assert abs(counts[f"a{j}"] - 6000) < 6 * sd, counts
