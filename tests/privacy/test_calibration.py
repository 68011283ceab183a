"""Tests for privacy/calibration.py.

Independent oracles: 60-digit mpmath evaluation of the closed forms, dp-accounting's exact
Gaussian calibration and its privacy-loss-distribution (PLD) accountant, and the failure-probability
statements the thresholds are derived from (MAD Theorem 3.3, DPSU Theorem 4.1 eq. (2)).
"""

import math
import warnings

import mpmath  # test extra
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from dp_partition_beam.privacy import calibration
from dp_partition_beam.privacy.calibration import (
    Calibration,
    analytic_gaussian_sigma,
    calibrate_count_gaussian,
    calibrate_count_laplace,
    calibrate_weighted_gaussian,
    calibrate_weighted_laplace,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_log_delta,
    gaussian_threshold,
    gaussian_threshold_with_argmax,
    laplace_scale,
    laplace_threshold,
    laplace_threshold_with_argmax,
)

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

EPS_GRID = [0.001, 0.01, 0.1, 1.0, 5.0, 20.0, 50.0, 100.0]
DELTA_GRID = [0.5, 0.1, 1e-5, 1e-10, 1e-15, 1e-30]


# ------------------------------------------------------------------------------------------------
# mpmath oracles
# ------------------------------------------------------------------------------------------------


def mp_delta(sigma, eps, sens=1.0, dps=60):
    with mpmath.workdps(dps):
        s = mpmath.mpf(sigma) / mpmath.mpf(sens)
        e = mpmath.mpf(eps)
        return mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s)


def mp_phi_inv(p):
    return mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1)


def mp_gaussian_threshold(sigma, delta, d0, h, dps=80):
    with mpmath.workdps(dps):
        best = None
        for t in range(1, d0 + 1):
            p = (1 - mpmath.mpf(delta) / 2) ** (mpmath.mpf(1) / t)
            v = h(mpmath.mpf(t)) + mpmath.mpf(sigma) * mp_phi_inv(p)
            best = v if best is None or v > best else best
        return best


def mp_laplace_threshold(eps, delta, d0, h, sens=1.0, dps=80):
    with mpmath.workdps(dps):
        best = None
        for t in range(1, d0 + 1):
            q = 1 - (1 - mpmath.mpf(delta)) ** (mpmath.mpf(1) / t)
            v = h(mpmath.mpf(t)) + mpmath.mpf(sens) / mpmath.mpf(eps) * mpmath.log(1 / (2 * q))
            best = v if best is None or v > best else best
        return best


# ------------------------------------------------------------------------------------------------
# analytic_gaussian_sigma / gaussian_delta / gaussian_epsilon
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", EPS_GRID)
@pytest.mark.parametrize("delta", DELTA_GRID)
def test_sigma_satisfies_and_is_minimal_closed_form(eps, delta):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sigma = analytic_gaussian_sigma(eps, delta)
        assert math.isfinite(sigma) and sigma > 0
        d = gaussian_delta(sigma, eps)
        assert d <= delta
        assert d == pytest.approx(delta, rel=1e-6)
        assert gaussian_delta(sigma * (1 - 1e-6), eps) > delta


@pytest.mark.parametrize("eps", EPS_GRID)
@pytest.mark.parametrize("delta", DELTA_GRID + [1e-100, 1e-300])
def test_sigma_against_mpmath(eps, delta):
    """Never below the true minimum, and within a relative 1e-9 of it (60-digit arithmetic)."""
    sigma = analytic_gaussian_sigma(eps, delta)
    true_delta = mp_delta(sigma, eps)
    assert true_delta <= delta
    assert mp_delta(sigma * (1 - 1e-9), eps) > delta
    # The log-space float64 evaluation agrees with mpmath.
    assert gaussian_log_delta(sigma, eps) == pytest.approx(float(mpmath.log(true_delta)), rel=1e-9)


def test_sigma_against_dp_accounting_exact():
    from dp_accounting import gaussian_mechanism as gm

    for eps in [0.01, 0.1, 1.0, 5.0, 50.0]:
        for delta in [0.1, 1e-5, 1e-10, 1e-15]:
            ours = analytic_gaussian_sigma(eps, delta)
            theirs = gm.get_sigma_gaussian(eps, delta)
            assert ours == pytest.approx(theirs, rel=1e-9)
            assert gm.get_epsilon_gaussian(ours, delta) <= eps * (1 + 1e-9)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-3), (1.0, 1e-5), (1.0, 1e-10), (3.0, 1e-8)])
def test_sigma_against_dp_accounting_pld(eps, delta):
    """The PLD accountant (an independent numerical method) agrees on the privacy profile."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    sigma = analytic_gaussian_sigma(eps, delta)
    # Connect-the-dots PLD (pessimistic): an upper bound on delta, tight to discretisation.
    d_at = pld.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4).get_delta_for_epsilon(eps)
    assert d_at == pytest.approx(delta, rel=1e-3)
    d_below = pld.from_gaussian_mechanism(sigma * (1 - 1e-2), value_discretization_interval=1e-4).get_delta_for_epsilon(
        eps
    )
    assert d_below > delta


def test_sigma_sensitivity_scaling():
    for sens in [0.5, 3.0, math.sqrt(100)]:
        s1 = analytic_gaussian_sigma(1.0, 1e-6)
        s = analytic_gaussian_sigma(1.0, 1e-6, sensitivity=sens)
        assert s == pytest.approx(sens * s1, rel=1e-9)
        assert gaussian_delta(s, 1.0, sensitivity=sens) <= 1e-6
        assert gaussian_delta(s, 1.0, sens) == pytest.approx(gaussian_delta(s / sens, 1.0), rel=1e-12)


def test_sigma_monotone_and_below_classical_bound():
    # Decreasing in eps and in delta.
    sig_e = [analytic_gaussian_sigma(e, 1e-6) for e in [0.05, 0.1, 0.5, 1, 2, 10]]
    assert all(a > b for a, b in zip(sig_e, sig_e[1:]))
    sig_d = [analytic_gaussian_sigma(1.0, d) for d in [1e-20, 1e-10, 1e-5, 1e-2, 0.3]]
    assert all(a > b for a, b in zip(sig_d, sig_d[1:]))
    # The classical Gaussian mechanism (Dwork & Roth, Thm A.1) is valid for eps < 1, so the
    # optimal sigma is below it.
    for eps in [0.1, 0.5, 0.9]:
        for delta in [1e-3, 1e-8]:
            assert analytic_gaussian_sigma(eps, delta) < math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_gaussian_delta_no_overflow_large_eps():
    # e^eps * Phi(...) would overflow / lose everything for eps = 100..1000 in the naive form.
    for eps, sigma in [(100.0, 0.05), (100.0, 0.2), (500.0, 0.03), (1000.0, 0.025)]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            d = gaussian_delta(sigma, eps)
        assert math.isfinite(d) and 0 < d < 1
        assert d == pytest.approx(float(mp_delta(sigma, eps)), rel=1e-9)


def test_gaussian_delta_decreasing_in_sigma_and_eps():
    sig = np.geomspace(0.1, 50, 40)
    # In log space: delta itself underflows float64 (to 0.0) beyond sigma ~ 38 at eps = 1.
    ds = [gaussian_log_delta(s, 1.0) for s in sig]
    assert all(a > b for a, b in zip(ds, ds[1:]))
    assert all(math.isfinite(d) for d in ds)
    assert gaussian_log_delta(50.0, 1.0) == pytest.approx(float(mpmath.log(mp_delta(50.0, 1.0))), rel=1e-12)
    es = [gaussian_delta(2.0, e) for e in np.linspace(0, 10, 30)]
    assert all(a > b for a, b in zip(es, es[1:]))
    # eps = 0: total variation between N(0, s^2) and N(1, s^2) is 2 Phi(1/(2 s)) - 1.
    assert gaussian_delta(2.0, 0.0) == pytest.approx(2 * stats.norm.cdf(0.25) - 1, rel=1e-12)


@pytest.mark.parametrize("eps", [0.01, 0.3, 1.0, 8.0, 60.0])
@pytest.mark.parametrize("delta", [0.2, 1e-6, 1e-20])
def test_gaussian_epsilon_inverts_sigma(eps, delta):
    sigma = analytic_gaussian_sigma(eps, delta)
    e = gaussian_epsilon(sigma, delta)
    assert e == pytest.approx(eps, rel=1e-8)
    assert gaussian_delta(sigma, e) <= delta
    assert gaussian_delta(sigma, e * (1 - 1e-6)) > delta


def test_gaussian_epsilon_against_dp_accounting_and_zero_case():
    from dp_accounting import gaussian_mechanism as gm

    for sigma, delta in [(0.5, 1e-5), (3.0, 1e-6), (40.0, 1e-12)]:
        assert gaussian_epsilon(sigma, delta) == pytest.approx(gm.get_epsilon_gaussian(sigma, delta), rel=1e-8)
    # Huge noise: already (0, delta)-DP since 2 Phi(1/(2 sigma)) - 1 <= delta.
    assert gaussian_delta(1e6, 0.0) <= 0.1
    assert gaussian_epsilon(1e6, 0.1) == 0.0


@settings(max_examples=150, deadline=None)
@given(
    log_eps=st.floats(math.log(0.001), math.log(100.0)),
    log_delta=st.floats(math.log(1e-30), math.log(0.5)),
)
def test_property_sigma_delta_roundtrip(log_eps, log_delta):
    eps, delta = math.exp(log_eps), math.exp(log_delta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sigma = analytic_gaussian_sigma(eps, delta)
        d = gaussian_delta(sigma, eps)
    assert math.isfinite(sigma)
    assert d <= delta * (1 + 1e-9)
    assert d >= delta * (1 - 1e-6)
    # sigma carries a 1e-10 relative safety margin, so the exact epsilon at sigma is at most
    # eps; for tiny eps with large delta, eps is ill-conditioned in sigma (hence rel 1e-5).
    e = gaussian_epsilon(sigma, delta)
    assert e <= eps * (1 + 1e-9)  # gaussian_epsilon itself rounds up by 1e-10
    assert e == pytest.approx(eps, rel=1e-5)
    assert gaussian_delta(sigma, e) <= delta


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(epsilon=0.0, delta=1e-5), "epsilon"),
        (dict(epsilon=-1.0, delta=1e-5), "epsilon"),
        (dict(epsilon=float("nan"), delta=1e-5), "epsilon"),
        (dict(epsilon=float("inf"), delta=1e-5), "epsilon"),
        (dict(epsilon=2000.0, delta=1e-5), "epsilon"),
        (dict(epsilon="1", delta=1e-5), None),  # numeric strings are accepted by check_range
        (dict(epsilon=True, delta=1e-5), "epsilon"),
        (dict(epsilon=1.0, delta=0.0), "delta"),
        (dict(epsilon=1.0, delta=1.0), "delta"),
        (dict(epsilon=1.0, delta=-1e-5), "delta"),
        (dict(epsilon=1.0, delta=1e-5, sensitivity=0.0), "sensitivity"),
    ],
)
def test_sigma_validation(kwargs, name):
    if name is None:
        assert analytic_gaussian_sigma(**kwargs) > 0
        return
    with pytest.raises(ValueError, match=name) as info:
        analytic_gaussian_sigma(**kwargs)
    # The message says what was given and what is allowed.
    assert "got" in str(info.value) and ("(" in str(info.value) or "[" in str(info.value))


def test_validation_messages_are_specific():
    with pytest.raises(ValueError, match=r"epsilon must be in \(0, 1000\], got -1"):
        analytic_gaussian_sigma(-1, 1e-5)
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\), got 0"):
        analytic_gaussian_sigma(1.0, 0)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_delta(0.0, 1.0)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_epsilon(-1.0, 1e-5)
    with pytest.raises(ValueError, match="max_contributions"):
        gaussian_threshold(1.0, 1e-5, 0)
    with pytest.raises(ValueError, match="max_contributions"):
        laplace_threshold(1.0, 1e-5, 2.5)
    with pytest.raises(ValueError, match="delta"):
        gaussian_threshold(1.0, 1.5, 10)
    with pytest.raises(ValueError, match="epsilon"):
        laplace_scale(0.0)


# ------------------------------------------------------------------------------------------------
# gaussian_threshold
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d0", [1, 10, 100])
@pytest.mark.parametrize("delta", [0.3, 1e-5, 1e-15, 1e-30])
def test_gaussian_threshold_matches_mpmath_loop(d0, delta):
    sigma = analytic_gaussian_sigma(1.0, delta / 2)
    rho = gaussian_threshold(sigma, delta, d0)
    expected = mp_gaussian_threshold(sigma, delta, d0, lambda t: 1 / mpmath.sqrt(t))
    assert rho == pytest.approx(float(expected), rel=1e-12)
    rho_c = gaussian_threshold(sigma, delta, d0, h=np.ones_like)
    expected_c = mp_gaussian_threshold(sigma, delta, d0, lambda t: mpmath.mpf(1))
    assert rho_c == pytest.approx(float(expected_c), rel=1e-12)


def test_gaussian_threshold_matches_naive_float_where_well_conditioned():
    sigma, delta, d0 = 3.0, 1e-3, 50
    naive = max(1 / math.sqrt(t) + sigma * stats.norm.ppf((1 - delta / 2) ** (1 / t)) for t in range(1, d0 + 1))
    assert gaussian_threshold(sigma, delta, d0) == pytest.approx(naive, rel=1e-9)
    # ... and the naive formula breaks down where ours does not: (1 - 5e-31) == 1.0 in float64.
    assert stats.norm.ppf((1 - 1e-30 / 2) ** (1 / 7)) == np.inf
    assert math.isfinite(gaussian_threshold(sigma, 1e-30, d0))


def test_gaussian_threshold_failure_probability():
    """MAD Theorem 3.3: P[some of t novel items of weight h(t) passes rho] <= delta/2 for all t."""
    for sigma, delta, d0 in [(4.0, 1e-5, 100), (0.7, 1e-12, 1000), (25.0, 0.1, 30)]:
        rho, t_star = gaussian_threshold_with_argmax(sigma, delta, d0)
        t = np.arange(1, d0 + 1, dtype=float)
        # 1 - Phi((rho - h(t))/sigma)^t, computed stably.
        fail = -np.expm1(t * special.log_ndtr((rho - 1 / np.sqrt(t)) / sigma))
        assert np.all(fail <= delta / 2 * (1 + 1e-9))
        assert fail[t_star - 1] == pytest.approx(delta / 2, rel=1e-8)


def test_gaussian_threshold_monotone():
    d0 = 100
    by_delta = [gaussian_threshold(2.0, d, d0) for d in [0.3, 1e-3, 1e-8, 1e-15, 1e-30, 1e-100]]
    assert all(a < b for a, b in zip(by_delta, by_delta[1:]))
    by_sigma = [gaussian_threshold(s, 1e-6, d0) for s in [0.1, 0.5, 1, 5, 50]]
    assert all(a < b for a, b in zip(by_sigma, by_sigma[1:]))
    by_d0 = [gaussian_threshold(2.0, 1e-6, n) for n in [1, 2, 10, 100, 1000]]
    assert all(a <= b for a, b in zip(by_d0, by_d0[1:]))
    # A larger sensitivity bound h gives a larger threshold (MAD2R's b_max / sqrt(t)).
    assert gaussian_threshold(2.0, 1e-6, d0, h=lambda t: 2.0 / np.sqrt(t)) > by_d0[3]


def test_gaussian_threshold_argmax():
    # Constant h: the noise term increases with t, so the max is at t = Delta_0.
    rho, t_star = gaussian_threshold_with_argmax(2.0, 1e-6, 77, h=np.ones_like)
    assert t_star == 77
    assert rho == pytest.approx(1 + 2.0 * -special.ndtri(-math.expm1(math.log1p(-5e-7) / 77)), rel=1e-14)
    # Tiny noise: h(t) = 1/sqrt(t) dominates and the max is at t = 1.
    _, t_star = gaussian_threshold_with_argmax(1e-4, 1e-6, 100)
    assert t_star == 1
    # The reported argmax attains the reported value.
    rho, t_star = gaussian_threshold_with_argmax(3.0, 1e-9, 500)
    assert rho == pytest.approx(gaussian_threshold(3.0, 1e-9, t_star), rel=1e-14)


def test_gaussian_threshold_vectorised_and_chunked(monkeypatch):
    calls = []

    def h(t):
        calls.append(np.shape(t))
        return 1 / np.sqrt(t)

    rho_big = gaussian_threshold(5.0, 1e-10, 100_000, h=h)
    assert len(calls) == 1 and calls[0] == (100_000,)  # one vectorised call, no Python loop
    assert math.isfinite(rho_big)
    # Chunked evaluation (used for huge Delta_0) gives the same answer.
    monkeypatch.setattr(calibration, "_CHUNK", 997)
    assert gaussian_threshold(5.0, 1e-10, 100_000) == rho_big
    assert gaussian_threshold_with_argmax(5.0, 1e-10, 100_000, h=np.ones_like)[1] == 100_000


def test_h_validation_and_broadcast():
    assert gaussian_threshold(1.0, 1e-5, 10, h=lambda t: 1.0) == gaussian_threshold(1.0, 1e-5, 10, h=np.ones_like)
    with pytest.raises(ValueError, match="h must"):
        gaussian_threshold(1.0, 1e-5, 10, h=lambda t: np.ones(3))
    with pytest.raises(ValueError, match="h must"):
        laplace_threshold(1.0, 1e-5, 10, h=lambda t: np.where(t > 5, np.inf, 1.0))


# ------------------------------------------------------------------------------------------------
# Laplace
# ------------------------------------------------------------------------------------------------


def test_laplace_scale():
    assert laplace_scale(2.0) == 0.5
    assert laplace_scale(0.5, sensitivity=100) == 200.0


@pytest.mark.parametrize("d0", [1, 10, 100])
@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (0.1, 0.4), (5.0, 1e-30), (0.01, 1e-12)])
def test_laplace_threshold_matches_mpmath_loop(d0, eps, delta):
    rho = laplace_threshold(eps, delta, d0)
    expected = mp_laplace_threshold(eps, delta, d0, lambda t: 1 / t)
    assert rho == pytest.approx(float(expected), rel=1e-12)


def test_laplace_threshold_uses_full_delta():
    # Delta_0 = 1: rho = 1 + (1/eps) log(1/(2 delta)) (DPSU Theorem B.1 with the full delta).
    for eps, delta in [(1.0, 1e-5), (0.3, 1e-20)]:
        assert laplace_threshold(eps, delta, 1) == pytest.approx(1 + math.log(1 / (2 * delta)) / eps, rel=1e-13)


def test_laplace_threshold_failure_probability():
    """DPSU eq. (2): 1 - (1 - exp(-eps (rho - h(t)))/2)^t <= delta for all t (with equality at t*)."""
    for eps, delta, d0 in [(1.0, 1e-5, 100), (0.2, 1e-10, 1000), (3.0, 0.05, 20)]:
        rho, t_star = laplace_threshold_with_argmax(eps, delta, d0)
        t = np.arange(1, d0 + 1, dtype=float)
        tail = 0.5 * np.exp(-eps * (rho - 1 / t))
        fail = -np.expm1(t * np.log1p(-tail))
        assert np.all(fail <= delta * (1 + 1e-9))
        assert fail[t_star - 1] == pytest.approx(delta, rel=1e-8)


def test_laplace_threshold_monotone():
    by_delta = [laplace_threshold(1.0, d, 100) for d in [0.3, 1e-3, 1e-10, 1e-30]]
    assert all(a < b for a, b in zip(by_delta, by_delta[1:]))
    by_eps = [laplace_threshold(e, 1e-6, 100) for e in [0.1, 0.5, 1, 10]]
    assert all(a > b for a, b in zip(by_eps, by_eps[1:]))


# ------------------------------------------------------------------------------------------------
# Convenience calibrations (four single-round baselines)
# ------------------------------------------------------------------------------------------------


def test_calibrate_weighted_gaussian():
    cal = calibrate_weighted_gaussian(1.0, 1e-5, 100)
    assert isinstance(cal, Calibration) and cal.noise == "gaussian"
    assert (cal.epsilon, cal.delta) == (1.0, 1e-5)
    assert cal.noise_scale == analytic_gaussian_sigma(1.0, 0.5e-5)
    assert gaussian_delta(cal.noise_scale, 1.0) <= 0.5e-5
    assert cal.threshold == gaussian_threshold(cal.noise_scale, 1e-5, 100)
    assert cal.threshold == pytest.approx(
        float(mp_gaussian_threshold(cal.noise_scale, 1e-5, 100, lambda t: 1 / mpmath.sqrt(t))), rel=1e-12
    )
    with pytest.raises(Exception):
        cal.threshold = 0.0  # frozen


def test_calibrate_count_gaussian():
    eps, delta, d0 = 1.0, 1e-6, 64
    cal = calibrate_count_gaussian(eps, delta, d0)
    assert cal.noise == "gaussian"
    # l2 sensitivity sqrt(Delta_0): sigma = sqrt(D0) * AGM(eps, delta/2, 1).
    assert cal.noise_scale == pytest.approx(8.0 * analytic_gaussian_sigma(eps, delta / 2), rel=1e-9)
    assert gaussian_delta(cal.noise_scale, eps, sensitivity=8.0) <= delta / 2
    assert cal.threshold == gaussian_threshold(cal.noise_scale, delta, d0, h=lambda t: np.ones_like(t))
    # Constant h: the max is at t = Delta_0.
    with mpmath.workdps(60):
        expected = 1 + cal.noise_scale * mp_phi_inv((1 - mpmath.mpf(delta) / 2) ** (mpmath.mpf(1) / d0))
    assert cal.threshold == pytest.approx(float(expected), rel=1e-12)


def test_calibrate_weighted_laplace():
    cal = calibrate_weighted_laplace(0.5, 1e-7, 100)
    assert cal.noise == "laplace" and cal.noise_scale == 2.0
    assert cal.threshold == pytest.approx(float(mp_laplace_threshold(0.5, 1e-7, 100, lambda t: 1 / t)), rel=1e-12)


def test_calibrate_count_laplace():
    eps, delta, d0 = 2.0, 1e-8, 50
    cal = calibrate_count_laplace(eps, delta, d0)
    assert cal.noise == "laplace" and cal.noise_scale == d0 / eps
    assert cal.threshold == laplace_threshold(eps, delta, d0, h=lambda t: np.ones_like(t), sensitivity=d0)
    # Max at t = Delta_0: rho = 1 + (D0/eps) log(1/(2 (1 - (1-delta)^(1/D0)))).
    assert cal.threshold == pytest.approx(
        float(mp_laplace_threshold(eps, delta, d0, lambda t: mpmath.mpf(1), sens=d0)), rel=1e-12
    )
    _, t_star = laplace_threshold_with_argmax(eps, delta, d0, h=np.ones_like, sensitivity=d0)
    assert t_star == d0


def test_weighted_beats_count_thresholds_in_noise_units():
    # Sanity of the baselines' relative order (DPSU section 1.1): the weighted variants need a
    # threshold of fewer noise standard deviations / scales than the count variants' ratio to 1.
    wg, cg = calibrate_weighted_gaussian(1.0, 1e-5, 100), calibrate_count_gaussian(1.0, 1e-5, 100)
    assert cg.noise_scale == pytest.approx(10 * wg.noise_scale, rel=1e-9)
    assert cg.threshold > wg.threshold
    wl, cl = calibrate_weighted_laplace(1.0, 1e-5, 100), calibrate_count_laplace(1.0, 1e-5, 100)
    assert cl.threshold > wl.threshold
