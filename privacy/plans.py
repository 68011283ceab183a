"""Per-round calibration plans of the partition-selection algorithms (pure math, no data).

A plan fixes, before any data is read, every noisy round's (epsilon_r, delta_r), noise kind and scale,
threshold rho_r and, for MAD, the adaptive threshold tau_r = rho_r + beta * sigma_r. The Beam
transforms and the in-memory reference both execute the same plan, and the report prints it.

Rounds per algorithm:
  basic            weighted Gaussian (1/sqrt(d)), 1 round   (MAD paper Alg. 1; DPSU paper B.2)
  weighted_laplace 1/d weights, Laplace, 1 round            (DPSU paper B.1, Theorem B.1)
  count_gaussian   +1 per item, l2 sensitivity sqrt(Delta_0) (DPSU paper section 1.1)
  count_laplace    +1 per item, l1 sensitivity Delta_0       (DPSU paper section 1.1, [KKMN09])
  mad              MAD weights, 1 round, tau = rho + beta*sigma (MAD paper Alg. 3, Cor. 5.2)
  mad2r            2 rounds (MAD paper Alg. 4); round 2 uses h(t) = b_max/sqrt(t)
  dp_sips          len(budget_split) rounds of Basic (DP-SIPS, MAD paper sec. 1.3)
  policy_laplace   l1-descent histogram, Laplace, 1 round  (DPSU paper Alg. 3-4, Theorem 4.1)
  policy_gaussian  l2-descent histogram, Gaussian, 1 round (DPSU paper Alg. 5-6, Theorem 5.1)

Multi-round accounting (``params.accounting``) is implemented in
:func:`privacy.accounting.multi_round_calibration`; see its module docstring for the proof.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

from privacy import accounting, calibration
from privacy.params import ALGORITHMS, SelectionParams, check_choice

#: per-user weighting of each single-round algorithm: d -> weight of each of the user's d items
WEIGHTING_OF = {
    "basic": "weighted_gaussian",
    "weighted_laplace": "weighted_laplace",
    "count_gaussian": "count",
    "count_laplace": "count",
    "mad": "mad",
    "mad2r": "mad",
    "dp_sips": "weighted_gaussian",
    "policy_gaussian": "l2_descent",
    "policy_laplace": "l1_descent",
}


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """One noisy round: what the report's ``rounds`` list shows, plus MAD's tau."""

    index: int  # 1-based round number; also the ``round`` of the randomness contract
    epsilon: float
    delta: float
    noise: str  # 'gaussian' | 'laplace'
    noise_scale: float  # sigma or the Laplace scale b
    threshold: float  # rho
    weighting: str  # weighted_gaussian | weighted_laplace | count | mad
    tau: Optional[float] = None  # MAD adaptive threshold (rho + beta * sigma)
    h: str = "1/sqrt(t)"  # novel-item sensitivity bound used for the threshold
    cutoff: Optional[float] = None  # policy algorithms' Gamma = rho + alpha * noise_scale

    def as_report(self) -> dict:
        d = {
            "round": self.index,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise": self.noise,
            "noise_scale": self.noise_scale,
            "threshold": self.threshold,
            "weighting": self.weighting,
            "h": self.h,
        }
        if self.tau is not None:
            d["tau"] = self.tau
        if self.cutoff is not None:
            d["cutoff"] = self.cutoff
        return d


def _tau(rho: float, sigma: float, beta: float) -> float:
    tau = rho + beta * sigma
    if tau < 1.0:  # MAD paper Lemma 5.3 assumes tau >= 1
        raise ValueError(
            f"MAD's adaptive threshold tau = rho + beta*sigma = {tau:g} must be >= 1 "
            f"(rho={rho:g}, sigma={sigma:g}, beta={beta:g}); increase beta"
        )
    return tau


def plan_rounds(algorithm: str, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    """The calibrated rounds of ``algorithm`` under ``params`` (see module docstring)."""
    check_choice("algorithm", algorithm, ALGORITHMS)
    eps, delta, d0 = params.epsilon, params.delta, params.max_contributions
    if algorithm in ("basic", "weighted_laplace", "count_gaussian", "count_laplace", "mad"):
        if algorithm in ("basic", "mad"):
            c = calibration.calibrate_weighted_gaussian(eps, delta, d0)
        elif algorithm == "weighted_laplace":
            c = calibration.calibrate_weighted_laplace(eps, delta, d0)
        elif algorithm == "count_gaussian":
            c = calibration.calibrate_count_gaussian(eps, delta, d0)
        else:
            c = calibration.calibrate_count_laplace(eps, delta, d0)
        h = {"weighted_laplace": "1/t", "count_gaussian": "1", "count_laplace": "1"}.get(algorithm, "1/sqrt(t)")
        tau = _tau(c.threshold, c.noise_scale, params.beta) if algorithm == "mad" else None
        return (
            RoundPlan(1, eps, delta, c.noise, c.noise_scale, c.threshold, WEIGHTING_OF[algorithm], tau, h),
        )
    if algorithm in ("policy_gaussian", "policy_laplace"):
        # Theorem 5.1's sigma and rho_Gauss (h(t) = 1/sqrt(t)) are those of weighted Gaussian (Theorem
        # B.2); Theorem 4.1's Lap(1/eps) and rho_Lap (h(t) = 1/t) those of weighted Laplace (Theorem
        # B.1): an item held only by a new user with t such items gets at most 1/sqrt(t) (l2-descent)
        # or 1/t (l1-descent), since those items all start at 0 and are raised equally.
        if algorithm == "policy_gaussian":
            c, h = calibration.calibrate_weighted_gaussian(eps, delta, d0), "1/sqrt(t)"
        else:
            c, h = calibration.calibrate_weighted_laplace(eps, delta, d0), "1/t"
        gamma = c.threshold + params.alpha * c.noise_scale  # Alg. 4 / Alg. 6 (erratum: rho_Gauss)
        return (
            RoundPlan(1, eps, delta, c.noise, c.noise_scale, c.threshold, WEIGHTING_OF[algorithm], None, h, gamma),
        )
    fractions = params.budget_split
    if algorithm == "mad2r":
        if len(fractions) != 2:
            raise ValueError(f"budget_split for mad2r must have exactly 2 fractions, got {list(fractions)!r}")
        b_max = params.b_max
        hs = [None, lambda t: b_max / np.sqrt(t)]  # Alg. 4 lines 4 and 9
        hnames = ["1/sqrt(t)", f"{b_max:g}/sqrt(t)"]
    else:  # dp_sips
        hs = [None] * len(fractions)
        hnames = ["1/sqrt(t)"] * len(fractions)
    cals = accounting.multi_round_calibration(eps, delta, fractions, params.accounting, d0, h_per_round=hs)
    rounds = []
    for r, c in enumerate(cals, start=1):
        tau = _tau(c.threshold, c.noise_scale, params.beta) if algorithm == "mad2r" else None
        rounds.append(
            RoundPlan(r, c.epsilon, c.delta, c.noise, c.noise_scale, c.threshold, WEIGHTING_OF[algorithm], tau, hnames[r - 1])
        )
    return tuple(rounds)
