"""The l1 keep curve (privacy/thresholding.py ``L1KeepCurve``, docs/thresholding.md "The l1 curve"): the
per-item (eps t, delta t) condition of the proof on the *realised* keep probabilities (multiples of 2^-64) in
60-digit arithmetic, the shape (f(0) = 0, monotone, the mirror f(2x* - x) = 1 - f(x), W50), the composition over
random neighbouring Policy Laplace histograms, the gain over the Laplace threshold, and bad parameters."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import calibration
from dp_partition_beam.privacy import thresholding as T

from tests.support.policy_neighbours import neighbouring_histograms

PROPS = settings(max_examples=150, deadline=None, derandomize=True)
mp.mp.dps = 60
TWO64 = mp.mpf(2) ** 64


def realised(curve: T.L1KeepCurve, weight: float) -> mp.mpf:
    """The exact keep probability :meth:`L1KeepCurve.keep` realises at ``weight``: the number of 64-bit patterns
    kept, over 2^64 (below x*: floor(u 2^64) kept; above: ceil(v 2^64) dropped)."""
    lower, value = curve._pieces(np.array([weight]))
    scaled = np.ldexp(value[0], 64)
    if lower[0]:
        return mp.mpf(int(math.floor(scaled))) / TWO64
    return 1 - mp.mpf(int(math.ceil(scaled))) / TWO64


def pair_excess(curve: T.L1KeepCurve, low: float, high: float, t: float) -> mp.mpf:
    """How far the realised pair at weights ``low <= high`` is from (eps t, delta t)-DP: the largest of
    ``r - e^{eps t} p - delta t`` and ``(1 - p) - e^{eps t} (1 - r) - delta t`` (<= 0: within; the other two
    inequalities hold because f is nondecreasing)."""
    p, r = realised(curve, low), realised(curve, high)
    et, dt = mp.e ** (mp.mpf(curve.epsilon) * mp.mpf(t)), mp.mpf(curve.delta) * mp.mpf(t)
    return max(r - et * p - dt, (1 - p) - et * (1 - r) - dt)


def excess(curve: T.L1KeepCurve, x: float, t: float) -> mp.mpf:
    """:func:`pair_excess` of (f(x), f(x + t)), x and t in l1 units."""
    return pair_excess(curve, x * curve.unit, (x + t) * curve.unit, t)


def rounding_slack(curve: T.L1KeepCurve, t: float) -> mp.mpf:
    """``e^{eps t} 2^-64``: the most the 2^-64 rounding of a pair's probabilities can add (rounding_reserve)."""
    return mp.e ** (mp.mpf(curve.epsilon) * mp.mpf(t)) / TWO64


@st.composite
def curves(draw):
    eps = draw(st.floats(0.01, 10.0))
    delta = draw(st.floats(1e-12, 1e-3))
    if delta >= -math.expm1(-eps):
        delta = -math.expm1(-eps) / 2
    return T.calibrate_l1_curve(eps, delta, draw(st.sampled_from([1.0, 20.0, 100.0])))


@PROPS
@given(curves(), st.floats(0.0, 1.05), st.floats(1e-6, 1.0))
def test_every_realised_pair_is_within_its_budget(curve, where, t):
    """Theorem (per item): for every x >= 0 and shift t in [1e-6, 1] (l1 units) the realised pair is
    (eps t, delta t)-DP but for the 2^-64 rounding of its probabilities: ``e^{eps t} 2^-64`` at most, the
    per-item share of :func:`rounding_reserve`. Below 1e-6 see the next test."""
    x = where * 2.0 * curve.midpoint
    assert excess(curve, x, t) <= rounding_slack(curve, t)


@PROPS
@given(curves(), st.floats(0.0, 1.05), st.floats(1e-15, 1e-6))
def test_tiny_shifts_exceed_by_at_most_float_error(curve, where, t):
    """Shifts below 1e-6 of an l1 unit (only the policies' rerouting makes them) can exceed the condition by
    the evaluation's float error: at most 2^-48 per item (docs/thresholding.md, docs/security.md)."""
    assert excess(curve, where * 2.0 * curve.midpoint, t) <= mp.mpf(2) ** -48


def test_the_bound_is_tight_somewhere():
    """At t = 1 the lower piece meets the bound up to the 1e-6 build margin: the test above is not vacuous."""
    curve = T.calibrate_l1_curve(1.0, 1e-5)
    worst = max(excess(curve, x, 1.0) for x in np.linspace(0.0, 2 * curve.midpoint, 400))
    assert -1e-6 < worst <= 0


@PROPS
@given(curves())
def test_shape(curve):
    m = curve.midpoint
    xs = np.linspace(0.0, 2.2 * m, 2001) * curve.unit
    f = curve.keep_probability(xs)
    assert f[0] == 0.0 and f[-1] == 1.0 and np.all(np.diff(f) >= 0)
    assert float(curve.keep_probability(m * curve.unit)) == pytest.approx(0.5, abs=1e-6)
    assert curve.weight_for(0.5) == pytest.approx(m * curve.unit)
    mirrored = curve.keep_probability(2.0 * m * curve.unit - xs[xs <= 2 * m * curve.unit])
    assert np.allclose(mirrored, 1.0 - f[xs <= 2 * m * curve.unit], atol=1e-12)
    for p in (0.01, 0.3, 0.5, 0.8, 0.999):
        w = curve.weight_for(p)
        assert float(curve.keep_probability(w)) == pytest.approx(p, rel=1e-7, abs=1e-12)
    # the continuous truncated geometric: x* = log(1 + (e^eps - 1) / (2 delta)) / eps
    want = math.log1p(math.expm1(curve.epsilon) / (2 * curve.delta)) / curve.epsilon
    assert m == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("d0", [1, 10, 100])
@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_it_keeps_more_than_laplace_from_one_unit_on(eps, d0):
    """From one l1 unit on the curve keeps every weight with at least the probability of the DPSU weighted
    Laplace threshold (P[W + Lap(1/eps) >= rho]); below one unit (an item that no single user could create) the
    Laplace rule keeps it with at most delta e^{-eps(1 - W)}."""
    curve = T.calibrate_l1_curve(eps, 1e-5)
    rho = calibration.calibrate_weighted_laplace(eps, 1e-5, d0).threshold
    w = np.linspace(1.0, rho + 30.0 / eps, 4000)
    laplace = np.where(w < rho, 0.5 * np.exp(-eps * (rho - w)), 1 - 0.5 * np.exp(-eps * (w - rho)))
    assert np.all(curve.keep_probability(w) >= laplace * (1 - 1e-5))
    assert curve.weight_for(0.5) < rho


def test_neighbouring_policy_laplace_histograms_compose_within_the_budget():
    """200 random neighbouring datasets under Policy Laplace (the extra user anywhere in the order, novel and
    shared items, the curve's cutoff): the l1 change is <= 1, and every item's realised pair is within
    (eps t_i, delta t_i) for its own change t_i (to the 2^-64 rounding for t_i >= 1e-6, else within 2^-48), so
    the release's (sum eps t_i, sum delta t_i) <= (eps, delta) (basic composition over independent items)."""
    curve = T.calibrate_l1_curve(1.0, 1e-3)  # a large delta: a short curve that small datasets reach
    gamma = curve.weight_for(1 - 0.5 * math.exp(-5.0))
    checked = 0
    for case, h, h2, change in neighbouring_histograms(20261129, "l1_descent", gamma, 200, 30, 8, 80, 5):
        assert sum(change.values()) <= 1.0 + 1e-9, case
        for i, t in change.items():
            if t == 0.0:
                continue
            lo, hi = sorted([h.get(i, 0.0), h2.get(i, 0.0)])
            bound = rounding_slack(curve, t) if t >= 1e-6 else mp.mpf(2) ** -48
            assert pair_excess(curve, lo, hi, t) <= bound, (case, i, lo, hi)
            checked += 1
    assert checked > 500


def test_the_rounding_reserve():
    """The plan takes e^eps 2^-64 per item a user may change off delta: Delta_0 items (weighted and count
    Laplace), max_sequential_pairs under a policy's rerouting."""
    from dp_partition_beam.privacy.selection import SelectionParams, plan

    p = SelectionParams(1.0, 1e-5, max_contributions=50, threshold="optimal", max_sequential_pairs=10**6)
    assert plan("weighted_laplace", p).rounds[0].keep_table.delta == 1e-5 - 50 * math.e * 2.0**-64
    assert plan("policy_laplace", p).rounds[0].keep_table.delta == 1e-5 - 10**6 * math.e * 2.0**-64
    with pytest.raises(ValueError, match="too small for the 2\\^-64 rounding"):
        T.calibrate_l1_curve(1.0, 1e-15, changed_items=10**6)
    # unset, a policy whose reserve does not fit falls back to its Laplace rule; asked for, the curve is an error
    tiny = SelectionParams(1.0, 1e-12, max_contributions=50)
    assert plan("policy_laplace", tiny).rounds[0].noise == "laplace"
    assert plan("weighted_laplace", tiny).rounds[0].noise == "keep_curve"  # 50 items fit
    with pytest.raises(ValueError, match="too small"):
        plan("policy_laplace", tiny.replace(threshold="optimal"))


def test_bad_parameters():
    with pytest.raises(ValueError, match="at most 1/2"):  # x* >= 1, which the drop side of the proof needs
        T.L1KeepCurve(10.0, 0.6)
    with pytest.raises(ValueError, match="1 - e\\^-epsilon"):
        T.calibrate_l1_curve(0.001, 0.01)
    with pytest.raises(ValueError):
        T.calibrate_l1_curve(1.0, 0.0)
    with pytest.raises(ValueError):
        T.L1KeepCurve(1.0, 1e-5, unit=0.0)
    with pytest.raises(ValueError):
        T.calibrate_l1_curve(1.0, 1e-5).weight_for(0.0)
