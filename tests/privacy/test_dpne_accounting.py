"""DPNE accounting (Theorem 2.1, Prop. 2.2) and parameter validation."""

import math

import numpy as np
import pytest
from scipy import special, stats

from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma, mad_tau
from dp_partition_beam.privacy.dpne import (
    DPNEParams,
    dpne_composed_privacy,
    dpne_level_sigmas,
    dpne_rho_1,
    dpne_rho_k,
    plan_runs,
    spurious_probability,
)


@pytest.mark.parametrize(
    "eps,delta,T,decay", [(4, 1e-7, 9, 1.0), (1, 1e-7, 6, 1.0), (1, 1e-5, 5, 0.7), (8, 1e-10, 3, 1.3)]
)
def test_composed_sigmas_give_exactly_epsilon_delta(eps, delta, T, decay):
    prm = DPNEParams(epsilon=eps, delta=delta, max_n=T, sigma_decay=decay)
    sigma_star, sigmas = dpne_level_sigmas(prm)
    assert len(sigmas) == T
    for a, b in zip(sigmas, sigmas[1:]):
        assert b / a == pytest.approx(decay, rel=1e-12)  # sigma_k = c sigma_{k-1}
    # 1/sigma*^2 = sum 1/sigma_k^2
    assert 1 / sigma_star**2 == pytest.approx(sum(1 / s**2 for s in sigmas), rel=1e-12)
    # sigma* solves Eq. (1) at delta/2 (Prop. 2.4): the Gaussian part is (eps, delta/2)-DP, tight.
    comp = dpne_composed_privacy(sigmas, eps, delta)
    assert comp["gaussian_delta"] <= delta / 2 * (1 + 1e-9)
    assert comp["gaussian_delta"] == pytest.approx(delta / 2, rel=1e-6)
    assert comp["total_delta"] == pytest.approx(delta, rel=1e-6)
    assert comp["epsilon_at_delta"] == pytest.approx(eps, rel=1e-6)


def test_rho_1_is_theorem_2_1_formula():
    sigma, delta, d1 = 7.3, 1e-7, 50
    t = np.arange(1, d1 + 1)
    brute = np.max(1 / np.sqrt(t) + sigma * special.ndtri((1 - delta / 2) ** (1 / t)))
    assert dpne_rho_1(sigma, delta, d1) == pytest.approx(brute, rel=1e-7)  # brute force loses ~1e-9 to cancellation


def test_rho_k_controls_spurious_probability():
    sigma = 5.0
    for s_prev, v in [(10, 1000), (500, 200), (1, 1)]:
        rho = dpne_rho_k(sigma, 0.01, s_prev, v)
        q = spurious_probability(0.01, s_prev, v)
        assert stats.norm.sf(rho / sigma) == pytest.approx(q, rel=1e-9)
        assert v * q <= 0.01 * min(s_prev, v) + 1e-12  # Prop. 2.2 bound
    assert dpne_rho_k(sigma, 0.01, 0, 0) == math.inf


def test_mad_tau_at_least_one():
    assert mad_tau(0.2, 0.1, 2.0) == 1.0
    assert mad_tau(10.0, 2.0, 2.0) == 14.0


def test_baseline_plans_compose_to_budget():
    prm = DPNEParams(epsilon=1, delta=1e-7, max_n=6, max_contributions=10)
    sigma_star = analytic_gaussian_sigma(1, 0.5e-7)
    s, runs = plan_runs("dpsu_all", prm)
    assert s == sigma_star and len(runs) == 1 and runs[0].max_contributions == 60
    assert runs[0].lengths == (1, 2, 3, 4, 5, 6)
    _, runs = plan_runs("dpsu_even", prm)
    assert len(runs) == 6
    comp = dpne_composed_privacy([r.sigma for r in runs], 1, 1e-7)
    assert comp["sigma_composed"] == pytest.approx(sigma_star, rel=1e-12)
    assert sum(r.delta_threshold for r in runs) == pytest.approx(1e-7)
    _, runs = plan_runs("dpsu_single", prm.replace(dpsu_single_length=3))
    assert runs[0].lengths == (3,) and runs[0].sigma == sigma_star
    _, runs = plan_runs("dpne", prm)
    assert [r.lengths for r in runs] == [(k,) for k in range(1, 7)] and runs[1].rho is None


def test_params_validation_messages():
    with pytest.raises(ValueError, match="epsilon"):
        DPNEParams(epsilon=0)
    with pytest.raises(ValueError, match="max_contributions must be one integer or a list of max_n=3"):
        DPNEParams(max_n=3, max_contributions=(1, 2))
    with pytest.raises(ValueError, match="eta"):
        DPNEParams(eta=1.5)
    with pytest.raises(ValueError, match="pruning"):
        DPNEParams(pruning="left")
    with pytest.raises(ValueError, match="d_max"):
        DPNEParams(d_max=3)
    with pytest.raises(ValueError, match="dpsu_single_length"):
        DPNEParams(max_n=3, dpsu_single_length=4)
    with pytest.raises(ValueError, match="algorithm must be one of 'dpne', 'dpsu_all'"):
        plan_runs("dpsu", DPNEParams())
    with pytest.raises(TypeError, match="DPNEParams"):
        plan_runs("dpne", {"epsilon": 1})
    p = DPNEParams(max_n=3, max_contributions=(5, 6, 7))
    assert p.deltas == (5, 6, 7)
    assert DPNEParams(max_n=2, max_contributions=[9]).deltas == (9, 9)
    assert DPNEParams().deltas == (300,) * 9 and DPNEParams().epsilon == 4 and DPNEParams().delta == 1e-7
