"""Tests for privacy/accounting.py (budget splits, Gaussian-DP composition, multi-round calibration)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy.accounting import (
    gdp_compose,
    gdp_round_sigmas,
    geometric_sigma_schedule,
    multi_round_calibration,
    split_budget,
)
from dp_partition_beam.privacy.calibration import (
    Calibration,
    analytic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_threshold,
)

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

fractions_st = st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6).map(lambda xs: [x / sum(xs) for x in xs])


# ------------------------------------------------------------------------------------------------
# split_budget
# ------------------------------------------------------------------------------------------------


def test_split_budget_values_and_sums():
    out = split_budget(2.0, 1e-6, [0.1, 0.9])
    assert out[0] == pytest.approx((0.2, 1e-7), rel=1e-15)
    assert out[1] == pytest.approx((1.8, 9e-7), rel=1e-15)
    assert sum(e for e, _ in out) == pytest.approx(2.0, rel=1e-12)
    assert sum(d for _, d in out) == pytest.approx(1e-6, rel=1e-12)
    assert split_budget(1.0, 1e-5, [1.0]) == [(1.0, 1e-5)]


@settings(max_examples=100, deadline=None)
@given(fr=fractions_st, eps=st.floats(0.01, 50), delta=st.floats(1e-20, 0.5))
def test_split_budget_property(fr, eps, delta):
    out = split_budget(eps, delta, fr)
    assert len(out) == len(fr)
    assert all(e > 0 and d > 0 for e, d in out)
    assert math.fsum(e for e, _ in out) == pytest.approx(eps, rel=1e-9)
    assert math.fsum(d for _, d in out) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("fractions", [[0.5, 0.6], [0.0, 1.0], [-0.1, 1.1], [], ["a", 1.0], None, [float("nan"), 1.0]])
def test_split_budget_rejects_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions"):
        split_budget(1.0, 1e-5, fractions)


def test_split_budget_rejects_bad_budget():
    with pytest.raises(ValueError, match="epsilon"):
        split_budget(0.0, 1e-5, [1.0])
    with pytest.raises(ValueError, match="delta"):
        split_budget(1.0, 0.0, [1.0])


# ------------------------------------------------------------------------------------------------
# Gaussian-DP composition
# ------------------------------------------------------------------------------------------------


def test_gdp_compose_known_values():
    assert gdp_compose([3.0]) == 3.0
    assert gdp_compose([2.0, 2.0]) == pytest.approx(2.0 / math.sqrt(2), rel=1e-15)
    assert gdp_compose([3.0, 4.0]) == pytest.approx(1 / math.sqrt(1 / 9 + 1 / 16), rel=1e-15)
    # Extreme scales: no overflow / underflow of 1/sigma^2.
    assert gdp_compose([1e-200, 1e-200]) == pytest.approx(1e-200 / math.sqrt(2), rel=1e-14)
    assert gdp_compose([1e200, 1e200, 1e200, 1e200]) == pytest.approx(0.5e200, rel=1e-14)
    # Composition only adds privacy loss: the result is below every component.
    assert gdp_compose([1.0, 100.0]) < 1.0


def test_gdp_compose_validation():
    with pytest.raises(ValueError, match="sigmas"):
        gdp_compose([])
    with pytest.raises(ValueError, match=r"sigmas\[1\]"):
        gdp_compose([1.0, 0.0])
    with pytest.raises(ValueError, match="sigmas"):
        gdp_compose(None)


@settings(max_examples=100, deadline=None)
@given(fr=fractions_st, sigma=st.floats(1e-3, 1e4))
def test_gdp_round_sigmas_compose_back(fr, sigma):
    sig_r = gdp_round_sigmas(sigma, fr)
    assert len(sig_r) == len(fr)
    assert all(s >= sigma * (1 - 1e-15) for s in sig_r)
    assert gdp_compose(sig_r) == pytest.approx(sigma, rel=1e-12)
    for s, f in zip(sig_r, fr):
        assert s == pytest.approx(sigma / math.sqrt(f), rel=1e-15)


def test_gdp_round_sigmas_validation():
    with pytest.raises(ValueError, match="fractions"):
        gdp_round_sigmas(1.0, [0.3, 0.3])
    with pytest.raises(ValueError, match="sigma"):
        gdp_round_sigmas(-1.0, [1.0])


def test_geometric_sigma_schedule_examples():
    assert geometric_sigma_schedule(2.0, 1) == pytest.approx([2.0], rel=1e-15)
    # decay = 1: equal split of the GDP budget, sigma_k = sigma* sqrt(T).
    assert geometric_sigma_schedule(2.0, 4) == pytest.approx([4.0] * 4, rel=1e-14)
    sched = geometric_sigma_schedule(2.0, 3, decay=0.5)
    assert sched[1] / sched[0] == pytest.approx(0.5, rel=1e-14)
    assert sched[2] / sched[1] == pytest.approx(0.5, rel=1e-14)
    assert sched[0] == pytest.approx(2.0 * math.sqrt(1 + 4 + 16), rel=1e-14)
    with pytest.raises(ValueError, match="num_levels"):
        geometric_sigma_schedule(1.0, 0)
    with pytest.raises(ValueError, match="decay"):
        geometric_sigma_schedule(1.0, 3, decay=0.0)
    with pytest.raises(ValueError, match="sigma_star"):
        geometric_sigma_schedule(0.0, 3)


@settings(max_examples=100, deadline=None)
@given(sigma=st.floats(1e-2, 1e3), levels=st.integers(1, 40), decay=st.floats(0.05, 5.0))
def test_geometric_sigma_schedule_property(sigma, levels, decay):
    sched = geometric_sigma_schedule(sigma, levels, decay)
    assert len(sched) == levels
    assert all(math.isfinite(s) and s > 0 for s in sched)
    for a, b in zip(sched, sched[1:]):
        assert b / a == pytest.approx(decay, rel=1e-12)
    assert gdp_compose(sched) == pytest.approx(sigma, rel=1e-12)  # DPNE Theorem 2.1


# ------------------------------------------------------------------------------------------------
# multi_round_calibration
# ------------------------------------------------------------------------------------------------


def test_multi_round_basic_matches_paper_split():
    eps, delta, fr, d0 = 1.0, 1e-5, [0.1, 0.9], 100
    cals = multi_round_calibration(eps, delta, fr, "basic", d0)
    assert len(cals) == 2 and all(isinstance(c, Calibration) and c.noise == "gaussian" for c in cals)
    for c, f in zip(cals, fr):
        assert c.epsilon == pytest.approx(f * eps, rel=1e-15)
        assert c.delta == pytest.approx(f * delta, rel=1e-15)
        assert c.noise_scale == analytic_gaussian_sigma(f * eps, f * delta / 2)
        assert gaussian_delta(c.noise_scale, f * eps) <= f * delta / 2
        assert c.threshold == gaussian_threshold(c.noise_scale, c.delta, d0)
    assert sum(c.epsilon for c in cals) == pytest.approx(eps, rel=1e-12)
    assert sum(c.delta for c in cals) == pytest.approx(delta, rel=1e-12)


def test_multi_round_gdp_composes_to_single_agm():
    eps, delta, fr, d0 = 1.0, 1e-5, [0.1, 0.9], 100
    cals = multi_round_calibration(eps, delta, fr, "gdp", d0)
    sigma = analytic_gaussian_sigma(eps, delta / 2)
    sig_r = [c.noise_scale for c in cals]
    assert sig_r == pytest.approx([sigma / math.sqrt(f) for f in fr], rel=1e-15)
    # The composed Gaussian part is (eps, delta/2)-DP.
    assert gdp_compose(sig_r) == pytest.approx(sigma, rel=1e-12)
    assert gaussian_delta(gdp_compose(sig_r) * (1 + 1e-12), eps) <= delta / 2
    for c, f in zip(cals, fr):
        assert c.delta == pytest.approx(f * delta, rel=1e-15)
        assert c.threshold == gaussian_threshold(c.noise_scale, c.delta, d0)
        # Reported per-round epsilon: what round r alone satisfies with delta_r / 2 for its noise.
        assert c.epsilon == gaussian_epsilon(c.noise_scale, f * delta / 2)
        assert gaussian_delta(c.noise_scale, c.epsilon) <= f * delta / 2
    # Informational epsilons over-count: their sum exceeds the true total epsilon.
    assert sum(c.epsilon for c in cals) > eps
    assert math.fsum(c.delta for c in cals) == pytest.approx(delta, rel=1e-12)


@pytest.mark.parametrize("fr", [[0.1, 0.9], [0.5, 0.5], [0.2, 0.3, 0.5]])
def test_gdp_noise_is_smaller_than_basic(fr):
    gdp = multi_round_calibration(1.0, 1e-6, fr, "gdp", 100)
    basic = multi_round_calibration(1.0, 1e-6, fr, "basic", 100)
    for g, b in zip(gdp, basic):
        assert g.noise_scale < b.noise_scale
        assert g.threshold < b.threshold


def test_gdp_composition_against_pld_accountant():
    """dp-accounting's PLD composition of the per-round Gaussians gives delta(eps) ~ delta/2 for
    'gdp' (exact), and strictly less for 'basic' (basic composition is loose)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    eps, delta = 1.0, 1e-5

    def composed_delta(sigmas):
        dist = pld.from_gaussian_mechanism(sigmas[0], value_discretization_interval=1e-4)
        for s in sigmas[1:]:
            dist = dist.compose(pld.from_gaussian_mechanism(s, value_discretization_interval=1e-4))
        return dist.get_delta_for_epsilon(eps)

    gdp = [c.noise_scale for c in multi_round_calibration(eps, delta, [0.3, 0.7], "gdp", 10)]
    assert composed_delta(gdp) == pytest.approx(delta / 2, rel=2e-3)
    basic = [c.noise_scale for c in multi_round_calibration(eps, delta, [0.3, 0.7], "basic", 10)]
    assert composed_delta(basic) < 0.5 * delta / 2


def test_multi_round_h_per_round():
    b_max = 2.0
    cals = multi_round_calibration(1.0, 1e-5, [0.1, 0.9], "gdp", 100, h_per_round=[None, lambda t: b_max / np.sqrt(t)])
    default = multi_round_calibration(1.0, 1e-5, [0.1, 0.9], "gdp", 100)
    assert cals[0] == default[0]
    assert cals[1].noise_scale == default[1].noise_scale
    assert cals[1].threshold == gaussian_threshold(
        cals[1].noise_scale, cals[1].delta, 100, h=lambda t: b_max / np.sqrt(t)
    )
    assert cals[1].threshold > default[1].threshold
    with pytest.raises(ValueError, match="h_per_round"):
        multi_round_calibration(1.0, 1e-5, [0.1, 0.9], "gdp", 100, h_per_round=[None])


def test_multi_round_single_round_equals_single_calibration():
    from dp_partition_beam.privacy.calibration import calibrate_weighted_gaussian

    single = calibrate_weighted_gaussian(1.0, 1e-5, 100)
    for acc in ("gdp", "basic"):
        (c,) = multi_round_calibration(1.0, 1e-5, [1.0], acc, 100)
        assert c.noise_scale == single.noise_scale
        assert c.threshold == single.threshold
        assert c.delta == single.delta
        assert c.epsilon == pytest.approx(1.0, rel=1e-8)


def test_multi_round_validation():
    with pytest.raises(ValueError, match="accounting"):
        multi_round_calibration(1.0, 1e-5, [0.5, 0.5], "advanced", 100)
    with pytest.raises(ValueError, match="fractions"):
        multi_round_calibration(1.0, 1e-5, [0.5, 0.6], "gdp", 100)
    with pytest.raises(ValueError, match="max_contributions"):
        multi_round_calibration(1.0, 1e-5, [0.5, 0.5], "gdp", 0)
    with pytest.raises(ValueError, match="epsilon"):
        multi_round_calibration(-1.0, 1e-5, [0.5, 0.5], "basic", 10)


@pytest.mark.parametrize("algorithm", ["mad2r", "mad_sips"])
def test_biased_rounds_bound_a_novel_item_by_one(algorithm):
    """Privacy review L3: a biased round's novel item is <= min(b_max/sqrt(t), 1) (Lemma 5.3, and a coordinate
    of a change of l2 norm <= 1, Lemma 5.6). The threshold keeps P[one of t novel items passes] <= delta_r/2
    for every t under that bound, and the last round's is lower where small t decide it (epsilon 4) and the
    same where t = Delta_0 does (the MAD paper's epsilon 1, Delta_0 100)."""
    from scipy import stats

    from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds

    for eps, d0, lower in [(4.0, 4, True), (4.0, 100, True), (1.0, 100, False)]:
        params = SelectionParams(eps, 1e-6, max_contributions=d0, cap_quantile=1.0, threshold="gaussian")
        rounds = plan_rounds(algorithm, params)
        assert [r.h for r in rounds[1:]] == ["min(2/sqrt(t), 1)"] * (len(rounds) - 1)
        for r in rounds[1:]:
            t = np.arange(1, d0 + 1, dtype=float)
            h = np.minimum(2.0 / np.sqrt(t), 1.0)
            tail = stats.norm.sf((r.threshold - h) / r.noise_scale)
            p_pass = -np.expm1(t * np.log1p(-tail))  # one of t novel items of weight h passes
            assert p_pass.max() <= r.delta / 2 * (1 + 1e-9)
            loose = gaussian_threshold(r.noise_scale, r.delta, d0, h=lambda t: 2.0 / np.sqrt(t))
            assert r.threshold <= loose
        last = rounds[-1]  # most of the budget: sigma small enough that t = 1 decides
        loose = gaussian_threshold(last.noise_scale, last.delta, d0, h=lambda t: 2.0 / np.sqrt(t))
        if lower:
            assert last.threshold < 0.93 * loose, (eps, d0, last.threshold, loose)
        else:
            assert last.threshold == loose
