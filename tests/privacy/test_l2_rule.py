"""The l2 keep rule for real-valued shifts (privacy/l2_rule.py, docs/thresholding.md "Policy Gaussian"): every pair
(f(W), f(W + t)), t real in (0, 1], is (delta t^2)-approximately (alpha, eps t^2)-RDP, checked independently of the
builder (the cores of Lemma 1 and the Bernoulli Renyi divergences in 60-digit arithmetic), over random W and t in
every part of the rule (the quadratic start, the junction, the knots, the tail), over random neighbouring Policy
Gaussian histograms (their sum of t_i^2 <= 1 and the composed budget), the certificate's own check, that both
have teeth (a rule built with 1.3x the budget fails them), random neighbouring MAD histograms (Lemma 5.6's l2 <= 1),
the 128-bit realisation of MAD's rule, the shape and the gain over the Gaussian rule."""

from __future__ import annotations

import dataclasses
import math
import random
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import l2_rule as L
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms.selection import mad_kernels as MK

from tests.support.policy_neighbours import neighbouring_histograms

PROPS = settings(max_examples=300, deadline=None, derandomize=True)
mp.mp.dps = 60


@pytest.fixture(scope="module")
def rule():
    """Policy Gaussian's rule at epsilon 1, delta 1e-5 on a coarse grid (2^-5: the same conditions, faster)."""
    alpha, f, _ = L._search(1.0, 1e-5, 0.0)
    eps_r = 1.0 - T.rdp_to_dp_epsilon(0.0, alpha, 1e-5 * (1 - f))
    return L.l2_keep_rule(alpha, eps_r, 1e-5 * f, 5)


def renyi(alpha, a, b) -> mp.mpf:
    """D_alpha(Bern a || Bern b), 60 digits."""
    a, b, al = mp.mpf(a), mp.mpf(b), mp.mpf(alpha)
    if a == b:
        return mp.mpf(0)
    if (b == 0 and a > 0) or (b == 1 and a < 1):
        return mp.inf
    terms = []
    if a > 0:
        terms.append(a**al * b ** (1 - al))
    if a < 1:
        terms.append((1 - a) ** al * (1 - b) ** (1 - al))
    return mp.log(sum(terms)) / (al - 1)


def pair_excess(alpha, eps, delta, p: float, r: float, t: float) -> mp.mpf:
    """How far (Bern p, Bern r), p <= r, is from (delta t^2)-approximately (alpha, eps t^2)-RDP under Lemma 1's
    cores (the top of p's interval, the bottom of r's; the best decomposition for a Bernoulli pair): the larger
    divergence less eps t^2 (<= 0: within)."""
    dp = mp.mpf(delta) * mp.mpf(t) ** 2
    u = min(mp.mpf(1), mp.mpf(p) / (1 - dp))
    w = max(u, (mp.mpf(r) - dp) / (1 - dp))
    return max(renyi(alpha, w, u), renyi(alpha, u, w)) - mp.mpf(eps) * mp.mpf(t) ** 2


def excess(rule: L.L2KeepRule, w: float, t: float) -> mp.mpf:
    p, r = (float(x) for x in rule.keep_probability(np.array([w, w + t])))
    assert p <= r
    return pair_excess(rule.alpha, rule.epsilon_rdp, rule.delta_rdp, p, r, t)


@PROPS
@given(
    where=st.floats(0.0, 1.0),
    region=st.sampled_from(["start", "junction", "knots", "tail", "anywhere"]),
    log_t=st.floats(-7.0, 0.0),
)
def test_every_pair_is_within_its_budget(rule, where, region, log_t):
    """f(W) and f(W + t) for t = 10^log_t (1e-7 to 1): below 1e-7 the float evaluation of f (2^-51) is the size of
    the budget's room, the float regime of docs/security.md."""
    end = len(rule.probs) * rule.grid
    w = {
        "start": where * rule.start,
        "junction": rule.start + (where - 0.5) * 0.2,
        "knots": rule.start + where * (end - rule.start),
        "tail": end - 3.0 + where * 4.0,
        "anywhere": where * (end + 1.0),
    }[region]
    w, t = max(w, 0.0), 10.0**log_t
    assert excess(rule, w, t) <= 0, (region, w, t)


def test_pairs_on_a_grid_of_knots_and_sub_cells(rule):
    """Every pair whose ends are knots or sub-cell points (eighths of a cell) with shifts of 1/8 .. 8 cells and
    1 unit: the places where a wrong piece of the proof would show first."""
    h = rule.grid
    worst, rng = mp.mpf(-1), random.Random(7)
    starts = [k * h / 8 for k in range(0, int(len(rule.probs) * 8), 37)] + [rule.start - h / 8, rule.start]
    for w in starts:
        for t in (h / 8, h / 2, h, 3 * h, 5 * h, 8 * h, rng.uniform(8 * h, 1.0), 1.0):
            worst = max(worst, excess(rule, w, t))
    assert worst <= 0


def test_the_certificate_holds_and_has_teeth(rule):
    assert L.rule_violations(rule) == {"decreasing": 0, "start": 0, "far": 0, "local": 0}
    loose = L.l2_keep_rule(rule.alpha, 1.3 * rule.epsilon_rdp, rule.delta_rdp, rule.grid_bits)
    checked = dataclasses.replace(loose, epsilon_rdp=rule.epsilon_rdp)
    bad = L.rule_violations(checked)
    assert bad["far"] + bad["local"] + bad["start"] > 0, bad
    # and the independent pair check finds an excess on the same knots and sub-cells
    worst = max(
        excess(checked, w, t)
        for w in np.arange(checked.start, len(checked.probs) * checked.grid, 0.37)
        for t in (checked.grid / 4, 5 * checked.grid, 0.5, 1.0)
    )
    assert worst > 0


def test_neighbouring_policy_gaussian_histograms_compose_within_the_budget(rule):
    """200 random neighbouring datasets under Policy Gaussian (the extra user anywhere in the order, novel and
    shared items, the rule's cutoff): the l2 change is <= 1, every item's pair is within its own (eps t_i^2,
    delta t_i^2) (Lemma 1's cores), and the sums over the items stay within (eps, delta)."""
    gamma = rule.weight_for(0.9999)
    checked = 0
    for case, h, h2, change in neighbouring_histograms(20261201, "l2_descent", gamma, 200, 12, 6, 90, 4):
        checked += check_change_within_budget(rule, h, h2, change, case)
    assert checked > 300


def check_change_within_budget(rule, h, h2, change, case=None) -> int:
    """The l2 rule's theorem on one neighbouring pair of histograms: the change's l2 norm <= 1, every item's pair
    (Lemma 1's cores, 60 digits) within its own (eps t_i^2, delta t_i^2), the sum within eps. Returns the pairs
    checked (shifts below 1e-7 are the float regime of the histograms' own sums: not claimed)."""
    assert sum(t * t for t in change.values()) <= 1.0 + 1e-9, case
    total, checked = mp.mpf(0), 0
    for i, t in change.items():
        if t < 1e-7:
            continue
        lo, hi = sorted([h.get(i, 0.0), h2.get(i, 0.0)])
        p, r = (float(x) for x in rule.keep_probability(np.array([lo, hi])))
        e = pair_excess(rule.alpha, rule.epsilon_rdp, rule.delta_rdp, p, r, t)
        assert e <= 0, (case, i, lo, hi, t)
        total += e + mp.mpf(rule.epsilon_rdp) * mp.mpf(t) ** 2
        checked += 1
    assert total <= rule.epsilon_rdp * (1 + 1e-9), case
    return checked


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    sets=st.lists(st.sets(st.integers(0, 9), min_size=1, max_size=6), min_size=1, max_size=40),
    extra=st.sets(st.one_of(st.integers(0, 9), st.sampled_from(["new0", "new1", "new2"])), min_size=1, max_size=6),
    tau=st.sampled_from([1.0, 1.5, 3.0, "rule"]),
    d_max=st.sampled_from([4, 5, 50]),
)
def test_neighbouring_mad_histograms_compose_within_the_budget(rule, sets, extra, tau, d_max):
    """MAD (Alg. 3) on random D and D + one user (shared and novel items, tau from 1 to the rule's, d_max 4-50):
    the change has l2 norm <= 1 with real coordinates (MAD paper Lemma 5.6, the premise of the l2 rule's theorem),
    every item's pair is within its own (eps t_i^2, delta t_i^2) and the sums stay within (eps, delta)."""
    tau = max(1.0, rule.weight_for(0.977)) if tau == "rule" else tau
    users = {f"u{k}": sorted(s_) for k, s_ in enumerate(sets)}
    h = MK.mad_weights(users, tau, d_max)
    h2 = MK.mad_weights({**users, "v": sorted(extra, key=str)}, tau, d_max)
    change = {i: abs(h2.get(i, 0.0) - h.get(i, 0.0)) for i in set(h) | set(h2)}
    check_change_within_budget(rule, h, h2, change)


def test_shape_and_the_quadratic_start(rule):
    w = np.linspace(0.0, len(rule.probs) * rule.grid + 2.0, 5001)
    f = rule.keep_probability(w)
    assert f[0] == 0.0 and np.all(np.diff(f) >= 0) and rule.complete
    below = w[w < rule.start]
    assert np.allclose(rule.keep_probability(below), rule.coefficient * below**2, rtol=1e-15, atol=0)
    assert rule.probs[rule.start_cells] == rule.coefficient * rule.start**2  # continuous at the junction
    assert L.start_ok(rule.coefficient, rule.alpha, rule.epsilon_rdp, rule.delta_rdp, rule.start)
    assert not L.start_ok(4 * rule.coefficient, rule.alpha, rule.epsilon_rdp, rule.delta_rdp, rule.start)
    assert all(float(x) == int(x * 2.0**64) / 2.0**64 for x in rule.probs)  # multiples of 2^-64
    for q in (0.1, 0.5, 0.9):
        wq = rule.weight_for(q)
        assert rule.keep_probability(np.array([wq]))[0] == pytest.approx(q, abs=1e-12)


def exact_f(rule: L.L2KeepRule, w: float) -> Fraction:
    """f(W) in exact rational arithmetic at the float W (the quadratic start, or the knots interpolated)."""
    w = Fraction(w)
    if w < Fraction(rule.start):
        return Fraction(rule.coefficient) * w * w
    x = w / Fraction(rule.grid)
    j = min(math.floor(x), len(rule.probs) - 1)
    if j >= len(rule.probs) - 1:
        return Fraction(rule.probs[-1])
    lo, hi = Fraction(rule.probs[j]), Fraction(rule.probs[j + 1])
    return lo + (x - j) * (hi - lo)


@PROPS
@given(w=st.floats(0.0, 100.0))
def test_keep_realises_the_exact_probability_rounded_down(rule, w):
    """keep(W, bits) keeps iff bits < floor(f(W) 2^64) with f(W) exact at the float W (the realisation reserve's
    premise: at most 2^-64 below f), at the boundary bit patterns exactly; the float keep_probability is within
    2^-50 of it."""
    limit = math.floor(exact_f(rule, w) * 2**64)
    assert rule.limit(w) == limit
    if limit > 0:
        assert rule.keep(np.array([w, w]), np.array([limit - 1, limit], dtype=np.uint64)).tolist() == [True, False]
    assert abs(float(rule.keep_probability(np.array([w]))[0]) - float(exact_f(rule, w))) <= 2.0**-50


@PROPS
@given(w=st.floats(0.0, 100.0), low=st.integers(0, 2**64 - 1))
def test_a_128_bit_rule_decides_on_128_bits(rule, w, low):
    """realisation_bits 128 (MAD): keep iff ``bits 2^64 + low < floor(f(W) 2^128)``, f exact at the float W; the
    second 64 bits are read only for an item whose first 64 equal its 64-bit limit; a 64-bit rule never reads
    them."""
    wide = dataclasses.replace(rule, realisation_bits=128)
    limit128 = math.floor(exact_f(rule, w) * 2**128)
    assert wide.limit_bits(w, 128) == limit128 and limit128 >> 64 == rule.limit(w)
    top, asked = limit128 >> 64, []

    def low_bits(idx):
        asked.extend(idx.tolist())
        return np.full(len(idx), low, dtype=np.uint64)

    patterns = [x for x in (top - 1, top, top + 1) if 0 <= x < 2**64]
    got = wide.keep(np.full(len(patterns), w), np.array(patterns, dtype=np.uint64), low_bits).tolist()
    assert got == [(x << 64) + low < limit128 for x in patterns]
    assert asked == [patterns.index(top)]  # only the tie reads more bits

    def refuse(idx):
        raise AssertionError("a 64-bit rule read low bits")

    assert rule.keep(np.full(len(patterns), w), np.array(patterns, dtype=np.uint64), refuse).tolist() == [
        x < top for x in patterns
    ]
    if any(x == top for x in patterns):
        with pytest.raises(ValueError, match="low_bits"):
            wide.keep(np.array([w]), np.array([top], dtype=np.uint64))


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_it_keeps_with_less_weight_than_the_gaussian_rule(epsilon):
    """The calibrated rule's W50 is below Policy Gaussian's rho at the same (epsilon, delta) (measured: -18.5%,
    -15.0%, -4.6%; docs/thresholding.md), and its conversion adds up to the budget."""
    rule, delta_conv = L.calibrate_l2_keep_rule(epsilon, 1e-5, 20_000_000)
    (gauss,) = plan_rounds("policy_gaussian", SelectionParams(epsilon=epsilon, delta=1e-5, threshold="gaussian"))
    assert rule.weight_for(0.5) < gauss.threshold * (0.9 if epsilon < 4 else 0.99)
    eps, delta = T.rdp_to_dp_epsilon(rule.epsilon_rdp, rule.alpha, delta_conv), rule.delta_rdp + delta_conv
    reserve = L.realisation_reserve(epsilon, 20_000_000)
    assert eps == pytest.approx(epsilon, rel=1e-9) and delta + reserve == pytest.approx(1e-5, rel=1e-12)


def test_the_realisation_reserve():
    assert L.realisation_reserve(1.0, 0) == 0.0
    assert L.realisation_reserve(1.0, 20_000_000) == pytest.approx((1 + math.e) * 2e7 * 2.0**-64)
    # MAD: any item a run can hold, at 128 bits: (1 + e) 2^-64
    assert L.realisation_reserve(1.0, L.ANY_RUN_ITEMS, 128) == pytest.approx((1 + math.e) * 2.0**-64)
    rule, _ = L.calibrate_l2_keep_rule(1.0, 1e-5, L.ANY_RUN_ITEMS, realisation_bits=128)
    assert rule.realisation_bits == 128
    with pytest.raises(ValueError, match="too small"):  # 2^64 items at 64 bits: a reserve above any delta
        L.calibrate_l2_keep_rule(1.0, 1e-5, L.ANY_RUN_ITEMS)
    with pytest.raises(ValueError, match="realisation_bits"):
        L.calibrate_l2_keep_rule(1.0, 1e-5, 0, realisation_bits=96)
    with pytest.raises(ValueError, match="too small"):
        L.calibrate_l2_keep_rule(1.0, 1e-14, 20_000_000)


def test_bad_parameters():
    with pytest.raises(ValueError, match="alpha"):
        L.l2_keep_rule(1.5, 0.5, 1e-6)
    with pytest.raises(ValueError, match="power of two"):
        L.l2_keep_rule(10.0, 0.5, 1e-6, start=0.75)
    with pytest.raises(ValueError, match="span"):
        L.l2_keep_rule(10.0, 0.5, 1e-6, grid_bits=2, start=1.0)
    with pytest.raises(ValueError):
        L.l2_keep_rule(10.0, -1.0, 1e-6)
