"""Property tests of the MAD kernels (transforms/mad_kernels.py) against the MAD paper.

Properties (the MAD paper; docs/design.md):
  1. l2 sensitivity <= 1 for S vs S + one user (Definition 3.1, Lemma 5.6 / Theorem 5.1),
     unbiased and biased.
  2. novel l_inf sensitivity <= min(b_max / sqrt(|T|), 1) (Definition 3.2, Lemmas 5.3 and 5.6).
  3. monotonicity of w_init, w_trunc, w_reroute (Proposition 5.5) - exactly, in floating point.
  4. UserWeights invariants (Lemma 5.4), termination on adversarial inputs.
  5. tau huge, no biases: MAD == Basic (Algorithm 5).
  6. hand-computed examples (MAD, UserWeights) and the section 6.2 example.
Plus: a literal pure-Python transliteration of Algorithms 2-3 as an oracle, the Beam-style
per-user decomposition w = w_trunc + sum_u mad_user_contributions, Theorem 6.1's deterministic
part, determinism, and parameter validation.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings, target
from hypothesis import strategies as st

from dp_partition_beam.transforms.core.fixed64 import exact_sum64, fixed64_of
from dp_partition_beam.transforms.selection.mad_kernels import (
    adaptive_degree_range,
    excess_fraction,
    initial_weight,
    is_adaptive,
    mad_user_contributions,
    mad_weight_components,
    mad_weights,
    reroute_discount,
    reroute_weight,
    truncate,
    user_excess,
    user_weights,
    user_weights_many,
)

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNIVERSE = [f"i{k}" for k in range(15)]
EXTRA = [f"n{k}" for k in range(4)]  # only the new user v can hold these (always novel)
MAX_DEGREE = 12  # > d_max for d_max < 12: non-adaptive high-degree users occur


# --------------------------------------------------------------------------------------------------
# Oracles: literal transliterations of the paper's pseudo-code (pure Python, no shared code)
# --------------------------------------------------------------------------------------------------


def literal_user_weights(b, b_min, b_max):
    """Algorithm 2, line by line. Two floating-point concessions, both exact in real arithmetic:
    when C is the cap term the largest small items land exactly on the cap, and the loop stops
    once sum w^2 is within 1e-13 of 1. Line 4 uses the same float expression as the kernel
    because S_small membership (line 7) is discontinuous at w = 1/sqrt(d)."""
    d = len(b)
    if d == 0:
        return []
    sd = math.sqrt(d)
    cap = b_max * (1 / sd)
    w = [0.0] * d
    biased = [i for i in range(d) if b[i] < 1]
    unbiased = [i for i in range(d) if not b[i] < 1]
    for i in biased:
        w[i] = max(b_min, b[i]) * (1 / sd)
    if unbiased:
        k = sum(w[i] ** 2 for i in biased)
        for i in unbiased:
            w[i] = min(cap, math.sqrt((1 - k) / len(unbiased)))
    for _ in range(d + 2):
        total = sum(x * x for x in w)
        if total >= 1 - 1e-13:
            break
        small = [i for i in range(d) if w[i] < 1 / sd]
        if not small:
            break
        top = max(w[i] for i in small)
        c_cap = cap / top
        c_norm = math.sqrt(1 + (1 - total) / sum(w[i] ** 2 for i in small))
        c = min(c_cap, c_norm)
        for i in small:
            w[i] = cap if (c_cap < c_norm and w[i] == top) else c * w[i]
    else:
        raise AssertionError("literal UserWeights did not terminate")
    return w


def literal_mad(user_sets, tau, d_max, biases=None, b_min=1.0, b_max=1.0):
    """Algorithm 3, line by line. Returns (w_init, w_trunc, w_reroute, w) dicts over the union."""
    biases = biases or {}
    union = set().union(*[set(s) for s in user_sets.values()]) if user_sets else set()
    alpha = b_min - 1 / (2 * math.sqrt(d_max))
    lo = math.ceil(1 / b_min**2 - 1e-9)
    adapt = [u for u, s in user_sets.items() if lo <= len(s) <= d_max]
    w_init = {i: 0.0 for i in union}
    for u in adapt:
        for i in user_sets[u]:
            w_init[i] += 1 / len(user_sets[u])
    r = {i: (max(0.0, (w_init[i] - tau) / w_init[i]) if w_init[i] > 0 else 0.0) for i in union}
    w_trunc = {i: min(w_init[i], tau) for i in union}
    w_reroute = {i: 0.0 for i in union}
    for u in adapt:
        s = user_sets[u]
        e_u = sum(r[i] for i in s) / len(s)
        for i in s:
            w_reroute[i] += alpha * e_u / d_max
    w = {i: w_trunc[i] + w_reroute[i] for i in union}
    for u, s in user_sets.items():
        s = list(s)
        wb = literal_user_weights([biases.get(i, 1.0) for i in s], b_min, b_max)
        for i, x in zip(s, wb):
            w[i] += x - (1 / len(s) if u in adapt else 0.0)
    return w_init, w_trunc, w_reroute, w


def basic_weights(user_sets):
    """Algorithm 5 (Basic): w(i) = sum over holders of 1/sqrt(|S_u|)."""
    w = {}
    for s in user_sets.values():
        for i in s:
            w[i] = w.get(i, 0.0) + 1 / math.sqrt(len(s))
    return w


def l2_sensitivity(w, w_new):
    """Definition 3.1: sqrt(sum_{U} (w' - w)^2 + sum_{U' \\ U} w'^2)."""
    assert set(w) <= set(w_new)
    return math.sqrt(sum((w_new[i] - w.get(i, 0.0)) ** 2 for i in w_new))


# --------------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------------


@st.composite
def neighbours(draw, biased):
    """A dataset S (1-12 users), a new user v and MAD parameters; with ``biased``, biases on a
    random subset of U (v's novel items stay unbiased). Small universes make hot items (truncation),
    degrees up to 12 > d_max make non-adaptive users; degrees are drawn half of the time from the
    adaptive range so that adaptive users (and truncation) are common."""
    tau = draw(st.floats(1.0, 3.0))
    d_max = draw(st.integers(4, 10))
    b_min = b_max = 1.0
    if biased:
        b_min = draw(st.one_of(st.just(0.5), st.just(1.0), st.floats(0.5, 1.0)))
        b_max = draw(st.one_of(st.just(1.0), st.floats(1.0, 3.0)))
    lo, hi = adaptive_degree_range(b_min, d_max)

    def degree(max_degree):
        if lo <= min(hi, max_degree):
            return draw(st.one_of(st.integers(1, max_degree), st.integers(lo, min(hi, max_degree))))
        return draw(st.integers(1, max_degree))

    n_items = draw(st.one_of(st.integers(1, 6), st.integers(1, len(UNIVERSE))))
    universe = UNIVERSE[:n_items]
    n_users = draw(st.integers(1, 12))
    sets = {}
    for u in range(n_users):
        d = degree(min(MAX_DEGREE, n_items))
        sets[2 * u] = draw(st.lists(st.sampled_from(universe), min_size=d, max_size=d, unique=True))
    d_v = degree(MAX_DEGREE)
    v_items = draw(st.lists(st.sampled_from(UNIVERSE + EXTRA), min_size=d_v, max_size=d_v, unique=True))
    v_key = 2 * draw(st.integers(-1, n_users)) + 1  # odd: new, at any position of the sort order
    biases = None
    if biased:
        union = sorted(set().union(*map(set, sets.values())))
        chosen = draw(st.lists(st.sampled_from(union), unique=True, max_size=len(union)))
        biases = {i: draw(st.floats(0.0, 1.0)) for i in chosen}
    return dict(S=sets, v=v_key, Sv=v_items, tau=tau, d_max=d_max, biases=biases, b_min=b_min, b_max=b_max)


def _run(case, with_v):
    sets = dict(case["S"])
    if with_v:
        sets[case["v"]] = case["Sv"]
    return mad_weight_components(sets, case["tau"], case["d_max"], case["biases"], case["b_min"], case["b_max"])


def _describe(case):
    """Labels the interesting regimes so that the run shows they are exercised."""
    d_v = len(case["Sv"])
    adaptive = is_adaptive(d_v, case["b_min"], case["d_max"])
    event(f"v adaptive={adaptive}")
    return adaptive


# --------------------------------------------------------------------------------------------------
# 1. l2 sensitivity <= 1 (Definition 3.1; Lemma 5.6; Theorem 5.1 / Corollary 5.2)
# --------------------------------------------------------------------------------------------------


def _check_l2(case):
    adaptive = _describe(case)
    before, after = _run(case, False), _run(case, True)
    excess_before = {i: before.w_init[i] - before.w_trunc[i] for i in before.w_init}
    gamma = sum(after.w_init[i] - after.w_trunc[i] - excess_before.get(i, 0.0) for i in after.w_init)
    if adaptive:
        event("gamma > 0 (v creates excess)" if gamma > 1e-12 else "gamma = 0")
        target(gamma, label="gamma (excess created by v)")
    sens = l2_sensitivity(before.w, after.w)
    target(sens, label="l2 sensitivity")
    assert sens <= 1.0 + 1e-9, (sens, case)


@PROPS
@given(neighbours(biased=False))
def test_l2_sensitivity_unbiased(case):
    _check_l2(case)


@PROPS
@given(neighbours(biased=True))
def test_l2_sensitivity_biased(case):
    _check_l2(case)


def test_l2_sensitivity_tight_cases():
    """Hand-picked near-worst cases: v of every adaptive degree with n_hot of its items far above
    tau (all of v's initial weight there becomes excess), n_edge items at w_init = 1, just below
    tau (v pushes them over: partly truncated), the rest novel; with and without biases."""
    # Every (d_max, tau, b_min, d_v, n_hot, n_edge, bias) of the grid, as before; S (and its weights) does not
    # depend on d_v, so each S is weighed once for all the degrees of v that hold its n_hot + n_edge items.
    for d_max in (4, 6, 9):
        for tau in (1.0, 1.0 + 1.0 / (2 * d_max), 1.0 + 1.0 / d_max - 1e-9):
            for b_min in (0.5, 0.75, 1.0):
                lo, _ = adaptive_degree_range(b_min, d_max)
                for n_hot in range(d_max + 1):
                    for n_edge in range(d_max - n_hot + 1):
                        sets = {}
                        for k in range(n_hot):  # w_init(h_k) = 4 > tau
                            sets.update({("h", k, u): [f"h{k}"] for u in range(4)})
                        for k in range(n_edge):  # w_init(e_k) = d_max * 1/d_max = 1
                            for u in range(d_max):
                                pad = [f"p{k}_{u}_{j}" for j in range(d_max - 1)]
                                sets[("e", k, u)] = [f"e{k}"] + pad
                        for bias in (None, {f"h{k}": 0.0 for k in range(n_hot)}):
                            w = mad_weights(sets, tau, d_max, bias, b_min, 2.0)
                            for d_v in range(max(lo, n_hot + n_edge), d_max + 1):
                                sv = (
                                    [f"h{k}" for k in range(n_hot)]
                                    + [f"e{k}" for k in range(n_edge)]
                                    + [f"x{k}" for k in range(d_v - n_hot - n_edge)]
                                )
                                w2 = mad_weights({**sets, "v": sv}, tau, d_max, bias, b_min, 2.0)
                                sens = l2_sensitivity(w, w2)
                                assert sens <= 1 + 1e-9, (d_max, tau, b_min, d_v, n_hot, n_edge, bias)


# --------------------------------------------------------------------------------------------------
# 2. novel l_inf sensitivity (Definition 3.2, Lemma 5.3)
# --------------------------------------------------------------------------------------------------


def _check_linf(case):
    _describe(case)
    union = set().union(*map(set, case["S"].values()))
    novel = [i for i in case["Sv"] if i not in union]
    assume(novel)
    after = _run(case, True)
    worst = max(after.w[i] for i in novel)
    # min(b_max/sqrt(t), 1): Lemma 5.3, and a novel item is a coordinate of a change of l2 norm <= 1
    # (Lemma 5.6): the bound the biased rounds' thresholds use (privacy/selection.py, _biased_h)
    bound = min(case["b_max"] / math.sqrt(len(novel)), 1.0)
    target(worst / bound, label="novel l_inf / bound")
    assert worst <= bound + 1e-12, (worst, bound, case)


@PROPS
@given(neighbours(biased=False))
def test_novel_linf_unbiased(case):
    _check_linf(case)


@PROPS
@given(neighbours(biased=True))
def test_novel_linf_biased(case):
    _check_linf(case)


# --------------------------------------------------------------------------------------------------
# 3. Monotonicity (Proposition 5.5): w'_init >= w_init, w'_trunc >= w_trunc, w'_reroute >= w_reroute
#    for every item of U' (w = 0 outside U). Holds bitwise: users are summed in canonical order and
#    r is computed as 1 - tau/w_init, which is monotone in floating point.
# --------------------------------------------------------------------------------------------------


@PROPS
@given(neighbours(biased=True))
def test_monotonicity_proposition_5_5(case):
    _describe(case)
    before, after = _run(case, False), _run(case, True)
    assert set(before.w) <= set(after.w)
    for i in after.w:
        assert after.w_init[i] >= before.w_init.get(i, 0.0)
        assert after.w_trunc[i] >= before.w_trunc.get(i, 0.0)
        assert after.w_reroute[i] >= before.w_reroute.get(i, 0.0)
        assert after.r[i] >= before.r.get(i, 0.0)  # used in the proof of Lemma 5.6 (e_u monotone)


@PROPS
@given(neighbours(biased=True))
def test_final_weights_monotone(case):
    """Not stated in the paper, but follows from Prop. 5.5 and w_b >= b_min/sqrt(d) >= 1/d for
    adaptive users (d >= 1/b_min^2): adding a user never decreases any final weight."""
    before, after = _run(case, False), _run(case, True)
    for i in before.w:
        assert after.w[i] >= before.w[i] - 1e-12


# --------------------------------------------------------------------------------------------------
# 4. UserWeights (Algorithm 2, Lemma 5.4)
# --------------------------------------------------------------------------------------------------

bias_values = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 1.0, 1e-300, 5e-324, 0.5, 0.999999999999, 1 - 2**-53]),
)


def _check_norm_at_most_one(w):
    """sum w^2 <= 1 exactly: the fixed-point sum of the float squares (each rounded to 2^-64) is <= 2^64,
    and where every square is >= 2^-11 (no rounding) also the exact float sum (math.fsum) is <= 1.
    (numpy's pairwise np.sum(w * w) may round a few ulps above 1.)"""
    sq = (w * w).tolist()
    assert sum(fixed64_of(x) for x in sq) <= 2**64
    if min(sq) >= 2.0**-11:
        assert math.fsum(sq) <= 1.0


def _check_lemma_5_4(b, b_min, b_max, w):
    d = len(b)
    assert w.shape == (d,) and w.dtype == np.float64
    if d == 0:
        return
    if all(x >= 1.0 for x in b):  # unbiased: exactly Basic's 1/sqrt(d) (float sum of squares may
        assert np.all(w == 1 / math.sqrt(d))  # exceed 1 by a few ulps, e.g. d = 3)
        assert float(np.sum(w * w)) <= 1.0 + 1e-15
    else:
        _check_norm_at_most_one(w)  # ||w_b||_2 <= 1, exactly
    assert np.all(w <= b_max / math.sqrt(d))  # upper bound, exactly in float
    assert np.all(w >= (b_min / math.sqrt(d)) * (1 - 1e-12))  # lower bound (to rounding)
    # The loop always fills the l2 budget (S_small is never empty while the norm is < 1).
    assert float(np.sum(w * w)) >= 1 - 1e-9


@PROPS
@given(
    b=st.lists(bias_values, min_size=0, max_size=40),
    b_min=st.floats(0.5, 1.0),
    b_max=st.one_of(st.floats(1.0, 10.0), st.floats(1.0, 1e300), st.just(math.inf), st.just(1.0)),
)
def test_user_weights_lemma_5_4(b, b_min, b_max):
    w = user_weights(np.array(b, dtype=np.float64), b_min, b_max)
    _check_lemma_5_4(b, b_min, b_max, w)
    lit = literal_user_weights(b, b_min, b_max)
    np.testing.assert_allclose(w, lit, rtol=1e-9, atol=1e-12)
    # Unbiased items: weight in [1/sqrt(d), b_max/sqrt(d)] (Lemma 5.4 proof); biased ones never
    # exceed that either.
    d = len(b)
    for bi, wi in zip(b, w):
        if bi >= 1.0:
            assert wi >= (1 / math.sqrt(d)) * (1 - 1e-12)


@PROPS
@given(d=st.integers(0, 200), b_max=st.floats(1.0, 5.0), b_min=st.floats(0.5, 1.0))
def test_user_weights_unbiased_is_basic(d, b_min, b_max):
    expected = np.full(d, 1 / math.sqrt(d)) if d else np.zeros(0)
    assert np.array_equal(user_weights(d, b_min, b_max), expected)
    assert np.array_equal(user_weights(np.ones(d), b_min, b_max), expected)
    assert np.array_equal(user_weights(d), expected)


@PROPS
@given(b=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), b_min=st.floats(0.5, 1.0))
def test_user_weights_b_max_one_undoes_biases(b, b_min):
    """An observation about Alg. 2: with b_max = 1 the loop lifts every biased item back to
    1/sqrt(d), so biases only matter when b_max > 1 (the paper's experiments use b_max = 2)."""
    w = user_weights(np.array(b), b_min, 1.0)
    np.testing.assert_allclose(w, 1 / math.sqrt(len(b)), rtol=1e-9)


ADVERSARIAL = [
    ([0.0], 0.5, 1.0),
    ([0.0], 0.5, 1e300),
    ([0.0], 0.5, math.inf),
    ([1e-300], 0.5, math.inf),
    ([5e-324], 1e-300, math.inf),  # subnormal everything (user_weights allows b_min in (0, 1])
    (np.zeros(2000), 0.5, math.inf),
    (np.full(2000, 1e-300), 0.5, 1e300),
    (np.full(2000, 1e-300), 1e-300, 1e300),
    (np.r_[np.zeros(1999), 1.0], 0.5, 1e300),
    (np.r_[np.zeros(1999), 1.0], 0.5, 1.0),
    (np.linspace(0.5, 0.999, 500), 0.5, 1.0 + 1e-9),  # many passes of the cap branch
    (np.r_[np.linspace(0.5, 0.999, 500), np.ones(3)], 0.5, 1.001),
    (np.geomspace(1e-3, 0.999, 300), 0.5, 1.0 + 2**-52),
]


@pytest.mark.parametrize("b, b_min, b_max", ADVERSARIAL)
def test_user_weights_terminates_on_adversarial_inputs(b, b_min, b_max):
    b = np.asarray(b, dtype=np.float64)
    w = user_weights(b, b_min, b_max)
    d = len(b)
    assert w.shape == (d,)
    _check_norm_at_most_one(w)  # every case here has a biased item
    assert np.all(w <= b_max / math.sqrt(d))
    assert np.all(w >= (b_min / math.sqrt(d)) * (1 - 1e-12))
    if b_min / math.sqrt(d) > 1e-150:  # squares representable: the budget is filled
        assert float(np.sum(w * w)) >= 1 - 1e-9


def test_user_weights_edge_cases_and_validation():
    assert user_weights(0).shape == (0,)
    assert user_weights(np.zeros(0)).shape == (0,)
    assert user_weights(1).tolist() == [1.0]
    # S_unbiased empty (line 5 would divide by |S_unbiased| = 0): all-biased user.
    np.testing.assert_allclose(user_weights([0.2, 0.3], 0.5, 2.0), [math.sqrt(0.5)] * 2)
    with pytest.raises(ValueError, match="biases"):
        user_weights([1.5])
    with pytest.raises(ValueError, match="biases"):
        user_weights([float("nan")])
    with pytest.raises(ValueError, match="b_min"):
        user_weights([0.5], b_min=0.0)
    with pytest.raises(ValueError, match="b_max"):
        user_weights([0.5], b_max=0.9)
    with pytest.raises(ValueError, match="degree"):
        user_weights(-1)


def test_user_weights_hand_examples():
    # d = 4, sqrt(d) = 2, b_min = 0.5, b_max = 1.2 -> cap b_max/sqrt(d) = 0.6, 1/sqrt(d) = 0.5.
    # Line 4: biased [0, 0, 0.95] -> max(0.5, b)/2 = 0.25, 0.25, 0.475.
    # Line 5: k = 0.0625 + 0.0625 + 0.225625 = 0.350625; sqrt((1 - k)/1) = 0.806 > 0.6 -> w3 = 0.6.
    # Pass 1: sum w^2 = 0.350625 + 0.36 = 0.710625, deficit 0.289375, S_small = {0, 1, 2},
    #   C = min(0.6/0.475 = 1.263, sqrt(1 + 0.289375/0.350625) = 1.351) = 1.263 (cap branch):
    #   w = [0.3158, 0.3158, 0.6, 0.6], sum w^2 = 2 * 0.09972 + 0.72 = 0.9194.
    # Pass 2: S_small = {0, 1}; C = min(0.6/0.3158 = 1.9, sqrt(1 + 0.0806/0.1994) = 1.185): l2 branch
    #   -> w0 = w1 = sqrt((1 - 0.72)/2) = sqrt(0.14). Result [sqrt(.14), sqrt(.14), 0.6, 0.6], norm 1.
    w = user_weights([0.0, 0.0, 0.95, 1.0], 0.5, 1.2)
    np.testing.assert_allclose(w, [math.sqrt(0.14), math.sqrt(0.14), 0.6, 0.6], rtol=1e-14)
    # d = 4, biases [0, 0, 0, 1], b_min = 0.5, b_max = 1.5 (cap 0.75): line 4 -> 0.25 x 3;
    # line 5: sqrt(1 - 0.1875) = 0.901 > 0.75 -> 0.75; deficit 1 - 0.75 = 0.25; C = min(3,
    # sqrt(1 + 0.25/0.1875) = sqrt(7/3)) -> small items 0.25 sqrt(7/3); sum = 0.4375 + 0.5625 = 1.
    w = user_weights([0.0, 0.0, 0.0, 1.0], 0.5, 1.5)
    np.testing.assert_allclose(w, [0.25 * math.sqrt(7 / 3)] * 3 + [0.75], rtol=1e-14)
    # No loop: d = 4, biases [0.25, 1, 1, 1], b_min 0.5, b_max 1.2: 0.25, then sqrt(0.9375/3).
    w = user_weights([0.25, 1.0, 1.0, 1.0], 0.5, 1.2)
    np.testing.assert_allclose(w, [0.25] + [math.sqrt(0.3125)] * 3, rtol=1e-14)


# --------------------------------------------------------------------------------------------------
# 4b. UserWeights for many users at once (user_weights_many, the columnar path) == per-user user_weights
# --------------------------------------------------------------------------------------------------

# Biases with many ties and unbiased items (b = 1), plus the awkward values of bias_values.
tied_biases = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 0.7, 0.9, 1.0, 1.0, 1.0, 1 - 2**-53, 1e-300]),
    st.floats(0.0, 1.0),
)
b_max_values = st.one_of(st.floats(1.0, 10.0), st.floats(1.0, 1e300), st.just(math.inf), st.just(1.0))


def _bits(x):
    return np.asarray(x, dtype=np.float64).view(np.int64)


def _many_vs_scalar(users, b_min, b_max, rng):
    """user_weights_many on the users' rows, shuffled, against user_weights per user (bitwise)."""
    codes = np.concatenate([np.full(len(b), 7 * u + 3, dtype=np.int64) for u, b in enumerate(users)])
    biases = np.concatenate([np.asarray(b, dtype=np.float64) for b in users])
    perm = rng.permutation(len(codes))
    got = user_weights_many(codes[perm], biases[perm], b_min, b_max)
    out = np.empty_like(got)
    out[perm] = got
    offset = 0
    for b in users:
        expected = user_weights(np.asarray(b, dtype=np.float64), b_min, b_max)
        assert np.array_equal(_bits(out[offset : offset + len(b)]), _bits(expected))
        offset += len(b)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    users=st.lists(
        st.one_of(
            st.lists(tied_biases, min_size=1, max_size=12),
            st.lists(tied_biases, min_size=1, max_size=200),
            st.lists(st.just(1.0), min_size=1, max_size=30),  # unbiased users
        ),
        min_size=1,
        max_size=6,
    ),
    b_min=st.floats(0.5, 1.0),
    b_max=b_max_values,
    seed=st.integers(0, 2**32 - 1),
)
def test_user_weights_many_is_bitwise_user_weights(users, b_min, b_max, seed):
    rng = np.random.default_rng(seed)
    out = _many_vs_scalar(users, b_min, b_max, rng)
    offset = 0
    for b in users:  # Lemma 5.4 on the vectorised result directly
        _check_lemma_5_4(b, b_min, b_max, out[offset : offset + len(b)])
        offset += len(b)


@PROPS
@given(b=st.lists(tied_biases, min_size=1, max_size=60), b_min=st.floats(0.5, 1.0), b_max=b_max_values)
def test_user_weights_does_not_depend_on_item_order(b, b_min, b_max):
    """Exact sums: permuting a user's items permutes its weights, bit for bit (what lets the columnar
    path process a user's rows in any order, not the reference's canonical item order)."""
    b = np.asarray(b, dtype=np.float64)
    perm = np.random.default_rng(len(b)).permutation(len(b))
    assert np.array_equal(_bits(user_weights(b, b_min, b_max)[perm]), _bits(user_weights(b[perm], b_min, b_max)))


def test_user_weights_many_on_adversarial_inputs_and_edge_cases():
    """All adversarial users of one (b_min, b_max) in one call (many passes, subnormals, d = 2000)."""
    rng = np.random.default_rng(0)
    groups = {}
    for b, b_min, b_max in ADVERSARIAL:
        groups.setdefault((b_min, b_max), []).append(list(np.asarray(b, dtype=np.float64)))
    for (b_min, b_max), users in groups.items():
        _many_vs_scalar(users + [[1.0] * 5, [0.3, 1.0]], b_min, b_max, rng)
    assert user_weights_many(np.zeros(0, np.int64), np.zeros(0)).shape == (0,)
    assert np.array_equal(user_weights_many(np.array([5, 5, 5]), np.ones(3)), np.full(3, 1 / math.sqrt(3)))
    with pytest.raises(ValueError, match="biases"):
        user_weights_many(np.array([0, 0]), np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="biases"):
        user_weights_many(np.array([0]), np.array([float("nan")]))
    with pytest.raises(ValueError, match="equal length"):
        user_weights_many(np.array([0, 1]), np.array([0.5]))
    with pytest.raises(ValueError, match="integers"):
        user_weights_many(np.array([0.0]), np.array([0.5]))
    with pytest.raises(ValueError, match="b_max"):
        user_weights_many(np.array([0]), np.array([0.5]), b_max=0.9)


@PROPS
@given(st.lists(st.floats(0.0, 2.0), max_size=60))
def test_user_weights_sums_are_exact_sum64(values):
    """The sums of UserWeights are exact_sum64 (order-independent), in the scalar and segment versions."""
    from dp_partition_beam.transforms.selection.mad_kernels import (
        _exact_sum,
        _segment_exact_sums,
        _segment_sums_exceed_one,
    )

    v = np.asarray(values, dtype=np.float64)
    assert _exact_sum(v) == exact_sum64(values)
    if values:
        starts = np.array([0, len(v) // 2]) if len(v) > 1 else np.array([0])
        parts = [values[: starts[1]], values[starts[1] :]] if len(starts) == 2 else [values]
        assert _segment_exact_sums(v, starts).tolist() == [exact_sum64(p) for p in parts]
        exceeds = [sum(fixed64_of(x) for x in p) > 2**64 for p in parts]
        assert _segment_sums_exceed_one(v, starts).tolist() == exceeds


# --------------------------------------------------------------------------------------------------
# 5. tau huge, no biases: MAD == Basic
# --------------------------------------------------------------------------------------------------


@PROPS
@given(neighbours(biased=False))
def test_no_truncation_is_basic(case):
    sets = {**case["S"], case["v"]: case["Sv"]}
    w = mad_weights(sets, 1e12, case["d_max"])
    basic = basic_weights(sets)
    assert set(w) == set(basic)
    for i in w:
        assert w[i] == pytest.approx(basic[i], rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------------------------------
# 6. Hand-computed examples
# --------------------------------------------------------------------------------------------------


def test_mad_hand_example():
    # tau = 1, d_max = 4, unbiased (b_min = b_max = 1): alpha = 1 - 1/(2*2) = 0.75,
    # adaptive degrees ceil(1/1) = 1 .. 4.
    #   u1 = {a, b}, u2 = {a, b}, u3 = {a, c}, u5 = {a}: adaptive; u4 = {a, b, c, d, e}: degree 5 > 4.
    # Line 5:  w_init(a) = 1/2 + 1/2 + 1/2 + 1 = 2.5, w_init(b) = 1, w_init(c) = 1/2, d = e = 0.
    # Line 6:  r(a) = (2.5 - 1)/2.5 = 0.6; r(b) = 0 (w_init = tau exactly is not excess); r(c) = 0.
    # Line 8:  w_trunc = a: 1, b: 1, c: 0.5, d: 0, e: 0.
    # Line 10: e_u1 = e_u2 = e_u3 = (0.6 + 0)/2 = 0.3; e_u5 = 0.6.
    # Line 11: per item 0.75 * 0.3 / 4 = 0.05625 (u1, u2, u3), 0.75 * 0.6 / 4 = 0.1125 (u5):
    #          w_reroute(a) = 3 * 0.05625 + 0.1125 = 0.28125, w_reroute(b) = 2 * 0.05625 = 0.1125,
    #          w_reroute(c) = 0.05625.
    # Line 15: degree-2 users add 1/sqrt(2) - 1/2 per item, u5 adds 1 - 1 = 0.
    # Line 17: u4 adds 1/sqrt(5) to each of its items.
    #   w(a) = 1 + 0.28125 + 3 (1/sqrt2 - 1/2) + 1/sqrt5 = 3/sqrt2 + 1/sqrt5 - 0.21875
    #   w(b) = 1 + 0.1125 + 2 (1/sqrt2 - 1/2) + 1/sqrt5 = sqrt2 + 1/sqrt5 + 0.1125
    #   w(c) = 0.5 + 0.05625 + (1/sqrt2 - 1/2) + 1/sqrt5 = 1/sqrt2 + 1/sqrt5 + 0.05625
    #   w(d) = w(e) = 1/sqrt5.
    # Compared with Basic (a: 3/sqrt2 + 1 + 1/sqrt5, b: sqrt2 + 1/sqrt5, c: 1/sqrt2 + 1/sqrt5): the
    # hot item a loses 1.21875 but stays >= tau, b and c gain the rerouted weight.
    sets = {"u1": ["a", "b"], "u2": ["b", "a"], "u3": ["a", "c"], "u4": list("abcde"), "u5": ["a"]}
    parts = mad_weight_components(sets, tau=1.0, d_max=4)
    s2, s5 = math.sqrt(2), math.sqrt(5)
    assert parts.w_init == {"a": 2.5, "b": 1.0, "c": 0.5, "d": 0.0, "e": 0.0}
    assert parts.r == pytest.approx({"a": 0.6, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0}, abs=1e-15)
    assert parts.w_trunc == {"a": 1.0, "b": 1.0, "c": 0.5, "d": 0.0, "e": 0.0}
    assert parts.w_reroute == pytest.approx({"a": 0.28125, "b": 0.1125, "c": 0.05625, "d": 0.0, "e": 0.0}, abs=1e-15)
    expected = {
        "a": 3 / s2 + 1 / s5 - 0.21875,
        "b": s2 + 1 / s5 + 0.1125,
        "c": 1 / s2 + 1 / s5 + 0.05625,
        "d": 1 / s5,
        "e": 1 / s5,
    }
    assert parts.w == pytest.approx(expected, abs=1e-14)
    assert mad_weights(sets, 1.0, 4) == parts.w
    # Adding v = {c, f} (degree 2, adaptive): no new excess (w_init(c) = 1 <= tau), so
    # w' - w = w_b^v = 1/sqrt2 on c and f only: l2 sensitivity exactly 1.
    w2 = mad_weights({**sets, "v": ["c", "f"]}, 1.0, 4)
    assert w2["c"] - parts.w["c"] == pytest.approx(1 / s2, abs=1e-14)
    assert w2["f"] == pytest.approx(1 / s2, abs=1e-15)
    assert l2_sensitivity(parts.w, w2) == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("n, m", [(90, 20), (600, 100)])
def test_section_6_2_example(n, m):
    """Section 6.2: n users of degree 3 = the heavy item i* + two light items; d_max = 3 (below the
    proof's d_max >= 4, hence require_proof_conditions=False). Light item j held by k_j users gets
    k_j (1/sqrt3 + alpha e / d_max) with e = r(i*)/3 and r(i*) = 1 - tau/(n/3); i* gets
    tau + n alpha e / d_max + n (1/sqrt3 - 1/3)."""
    rng = random.Random(n)
    sets = {u: ["star"] + rng.sample([f"l{j}" for j in range(m)], 2) for u in range(n)}
    tau, d_max = 10.0, 3
    alpha = 1 - 1 / (2 * math.sqrt(3))
    assert alpha > 0.5
    w = mad_weights(sets, tau, d_max, require_proof_conditions=False)
    counts = {}
    for s in sets.values():
        for i in s[1:]:
            counts[i] = counts.get(i, 0) + 1
    assert max(counts.values()) / 3 <= tau  # light items are not truncated
    e = (1 - tau / (n / 3)) / 3
    assert w["star"] == pytest.approx(tau + n * alpha * e / d_max + n * (1 / math.sqrt(3) - 1 / 3), rel=1e-12)
    for j, k in counts.items():
        assert w[j] == pytest.approx(k * (1 / math.sqrt(3) + alpha * e / d_max), rel=1e-12)
        # ... which is the paper's "close to 10% more" than Basic's k/sqrt3 (each user sends > 1/18).
        assert w[j] >= k * (1 / math.sqrt(3) + (1 - 3 * tau / n) / 18)


# --------------------------------------------------------------------------------------------------
# Oracle comparison, Beam-style decomposition, Theorem 6.1, determinism
# --------------------------------------------------------------------------------------------------


@PROPS
@given(neighbours(biased=True))
def test_matches_literal_transliteration(case):
    sets = {**case["S"], case["v"]: case["Sv"]}
    args = (sets, case["tau"], case["d_max"], case["biases"], case["b_min"], case["b_max"])
    parts = mad_weight_components(*args)
    w_init, w_trunc, w_reroute, w = literal_mad(*args)
    for name, mine, lit in [
        ("w_init", parts.w_init, w_init),
        ("w_trunc", parts.w_trunc, w_trunc),
        ("w_reroute", parts.w_reroute, w_reroute),
        ("w", parts.w, w),
    ]:
        assert set(mine) == set(lit), name
        for i in lit:
            assert mine[i] == pytest.approx(lit[i], abs=1e-9), (name, i)


@PROPS
@given(neighbours(biased=True), st.randoms(use_true_random=False))
def test_beam_style_decomposition(case, rnd):
    """w(i) = w_trunc(i) + sum_u mad_user_contributions(u)[i], summed in arbitrary order."""
    sets = {**case["S"], case["v"]: case["Sv"]}
    tau, d_max, b_min, b_max = case["tau"], case["d_max"], case["b_min"], case["b_max"]
    biases = case["biases"] or {}
    users = list(sets)
    rnd.shuffle(users)
    w_init = {}
    for u in users:  # adaptive users emit (item, 1/d); CombinePerKey(sum)
        items = list(sets[u])
        rnd.shuffle(items)
        if is_adaptive(len(items), b_min, d_max):
            for i in items:
                w_init[i] = w_init.get(i, 0.0) + initial_weight(len(items))
    w = {}
    for u in users:
        items = list(sets[u])
        rnd.shuffle(items)
        r_vals = [excess_fraction(w_init.get(i, 0.0), tau) for i in items]
        b_vals = [biases.get(i, 1.0) for i in items] if case["biases"] is not None else None
        contrib = mad_user_contributions(items, r_vals, b_vals, tau, d_max, b_min, b_max)
        assert [i for i, _ in contrib] == items
        for i, c in contrib:
            w[i] = w.get(i, 0.0) + c
    for i in list(w):
        w[i] += truncate(w_init.get(i, 0.0), tau)
    ref = mad_weights(sets, tau, d_max, case["biases"], b_min, b_max)
    assert set(w) == set(ref)
    for i in ref:
        assert w[i] == pytest.approx(ref[i], abs=1e-9)


@PROPS
@given(neighbours(biased=False))
def test_theorem_6_1_deterministic_part(case):
    """Unbiased MAD vs Basic before noise: w*(i) >= w(i) if w*_init(i) <= tau, else w*(i) >= tau."""
    sets = {**case["S"], case["v"]: case["Sv"]}
    parts = mad_weight_components(sets, case["tau"], case["d_max"])
    basic = basic_weights(sets)
    for i, wi in parts.w.items():
        if parts.w_init[i] <= case["tau"]:
            assert wi >= basic[i] - 1e-12
        else:
            assert wi >= case["tau"] - 1e-12


def test_deterministic_regardless_of_input_order():
    rng = random.Random(7)
    sets = {f"u{k}": rng.sample(UNIVERSE, rng.randint(1, 9)) for k in range(40)}
    biases = {i: rng.random() for i in UNIVERSE[:6]}
    w1 = mad_weights(sets, 1.3, 6, biases, 0.6, 2.0)
    shuffled = {u: list(reversed(s)) for u, s in reversed(list(sets.items()))}
    w2 = mad_weights(shuffled, 1.3, 6, biases, 0.6, 2.0)
    assert w1 == w2  # bitwise
    assert list(w1) == list(w2)


# --------------------------------------------------------------------------------------------------
# Small kernels and validation
# --------------------------------------------------------------------------------------------------


def test_small_kernels():
    assert reroute_discount(1.0, 4) == 0.75
    assert reroute_discount(0.5, 100) == pytest.approx(0.45)
    assert adaptive_degree_range(0.5, 10) == (4, 10)
    assert adaptive_degree_range(1.0, 10) == (1, 10)
    assert adaptive_degree_range(1 / math.sqrt(2), 10) == (2, 10)
    assert adaptive_degree_range(1 / math.sqrt(3), 10) == (3, 10)
    assert adaptive_degree_range(0.7, 50) == (3, 50)  # 1/0.49 = 2.04 -> 3
    assert not is_adaptive(3, 0.5, 10) and is_adaptive(4, 0.5, 10) and is_adaptive(10, 0.5, 10)
    assert not is_adaptive(11, 0.5, 10) and not is_adaptive(0, 1.0, 10)
    r = excess_fraction(np.array([0.0, 0.5, 1.0, 2.0, 4.0]), 1.0)
    np.testing.assert_array_equal(r, [0.0, 0.0, 0.0, 0.5, 0.75])
    assert excess_fraction(0.0, 1.0) == 0.0 and isinstance(excess_fraction(3.0, 1.0), float)
    assert excess_fraction(0.0, 0.0) == 0.0  # w_init = 0 never divides
    np.testing.assert_array_equal(truncate(np.array([0.0, 0.5, 2.0]), 1.0), [0.0, 0.5, 1.0])
    assert truncate(2.5, 1.0) == 1.0
    assert user_excess([]) == 0.0
    assert user_excess([0.6, 0.0]) == 0.3
    assert reroute_weight(0.3, 0.75, 4) == pytest.approx(0.05625)
    assert initial_weight(4) == 0.25
    assert mad_user_contributions([], [], None, 1.0, 4) == []
    # Non-adaptive user (degree 5 > d_max 4): plain w_b.
    out = mad_user_contributions(list("abcde"), [0.9] * 5, None, 1.0, 4)
    assert [c for _, c in out] == [1 / math.sqrt(5)] * 5
    # Adaptive user: alpha e_u/d_max + 1/sqrt(d) - 1/d.
    out = mad_user_contributions(["a", "b"], [0.6, 0.0], None, 1.0, 4)
    assert [c for _, c in out] == pytest.approx([0.05625 + 1 / math.sqrt(2) - 0.5] * 2)


@PROPS
@given(w=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=20), tau=st.floats(0.0, 5.0))
def test_excess_fraction_and_truncate_properties(w, tau):
    w = np.array(w)
    r = excess_fraction(w, tau)
    t = truncate(w, tau)
    assert np.all((r >= 0) & (r <= 1))  # r = 1 only when tau is negligible against w_init
    assert np.all(r[w <= tau] == 0)
    np.testing.assert_allclose(w - t, r * w, atol=1e-12)  # excess = r * w_init (Lemma 5.6 proof)
    order = np.argsort(w, kind="stable")
    assert np.all(np.diff(r[order]) >= 0)  # monotone in w_init, bitwise


def test_validation_errors():
    sets = {1: ["a"]}
    with pytest.raises(ValueError, match="tau"):
        mad_weights(sets, 0.5, 4)
    with pytest.raises(ValueError, match="d_max"):
        mad_weights(sets, 1.0, 3)
    with pytest.raises(ValueError, match="b_min"):
        mad_weights(sets, 1.0, 4, b_min=0.4)
    with pytest.raises(ValueError, match="b_max"):
        mad_weights(sets, 1.0, 4, b_max=0.5)
    with pytest.raises(ValueError, match="biases"):
        mad_weights(sets, 1.0, 4, {"a": 2.0}, 0.5, 2.0)
    with pytest.raises(ValueError, match="duplicates"):
        mad_weights({1: ["a", "a"]}, 1.0, 4)
    with pytest.raises(ValueError, match="d_max"):
        mad_weights(sets, 1.0, 1.0, require_proof_conditions=False)
    with pytest.raises(ValueError, match="excess fractions"):
        mad_user_contributions(["a", "b"], [0.0], None, 1.0, 4)
    with pytest.raises(ValueError, match="biases"):
        mad_user_contributions(["a", "b"], [0.0, 0.0], [1.0], 1.0, 4)
    assert mad_weights({}, 1.0, 4) == {}
    assert mad_weights({1: []}, 1.0, 4) == {}
