"""Exploration (docs/thresholding.md, "Policy Gaussian"): can a keep rule beat Policy Gaussian's Gaussian threshold?

Policy Gaussian's neighbouring histograms differ by a vector of l2 norm <= 1 whose coordinates take ANY real
value (the l2-descent reroutes other users' weight; DPSU paper, Lemma 5.2), so a sound keep rule f must make
every pair (Bern f(W), Bern f(W + t)), t in (0, 1] real, (delta t^2)-approximately (alpha, eps t^2)-RDP. In
particular, for every grid step H = 2^-b and every m, an EXACT shift t = m H moves W from knot jH to knot
(j + m)H, so the values F[j] = f(jH) must satisfy

    F[j + m] <= g_{eps (mH)^2, delta (mH)^2}(F[j])        for all j >= 0, m >= 1, F[0] = 0,

a necessary condition (every sound f meets it; the real-shift conditions between knots and at f's zero only add
constraints). The pointwise-largest F meeting it is the table recursion with contribution set {H, 2H, ..., 1}
and index shift m (not ceil(c/H) + 1: no float slack), so its W50 is a LOWER bound on the W50 of every sound
keep rule at that order alpha and split of delta, and the bound rises as H shrinks (more shifts constrained).
The script prints it, with alpha and the split searched as for every table (``calibrate_keep_table``), next to
Policy Gaussian's Gaussian rule (rho = W50, sigma), the simplest SUFFICIENT table for shifts of at least one cell
(one cell of slack per shift) and Basic's table (finite contributions 1/sqrt(d)).

    .venv/bin/python -m benchmarks.explore.explore_policy_gaussian_table [--epsilons 0.5,1,2,4] [--bits 5,6,7,8]
"""

from __future__ import annotations

import argparse
import math
import time

from scipy.stats import norm

from dp_partition_beam.privacy import l2_rule as L
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds


def necessary_table(epsilon: float, delta: float, bits: int) -> T.KeepTable:
    """The pointwise-largest knot values at grid 2^-bits that every sound real-shift keep rule stays below
    (:func:`privacy.l2_rule.necessary_table`, at the order and split the rule's calibration uses)."""
    return L.necessary_table(epsilon, delta, bits)


def one_cell_slack_table(epsilon: float, delta: float, bits: int) -> T.KeepTable:
    """The table whose piecewise-linear interpolation covers every real shift t >= H: a shift in ((m-1)H, mH] moves
    W at most m cells and has at least the budget of (m-1)H, so the contribution (m-1)H gets m cells (the table
    recursion as built, ceil(c/H) + 1). Shifts below H and the rule's start at 0 need more (docs)."""
    grid = math.ldexp(1.0, -bits)
    shifts = tuple(m * grid for m in range(1, (1 << bits) + 1))
    table, _ = T.calibrate_keep_table.__wrapped__(epsilon, delta, shifts, grid_bits=bits)
    return table


def policy_gaussian_rule(epsilon: float, delta: float, max_contributions: int):
    """(rho, sigma) of Policy Gaussian's Gaussian threshold at (epsilon, delta, Delta_0)."""
    params = SelectionParams(epsilon=epsilon, delta=delta, max_contributions=max_contributions, threshold="gaussian")
    (r,) = plan_rounds("policy_gaussian", params)
    return r.threshold, r.noise_scale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="0.5,1,2,4")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max_contributions", type=int, default=100)
    ap.add_argument("--bits", default="5,6,7,8", help="grid steps 2^-b of the necessary condition")
    args = ap.parse_args(argv)
    bits = [int(b) for b in args.bits.split(",")]
    print(
        "| epsilon | Policy Gaussian: rho (W50) | sigma | W90 | "
        + " | ".join(f"lower bound on a keep rule's W50, H = 2^-{b}" for b in bits)
        + " | at the finest H: W90 | sufficient for shifts >= H (one cell of slack), finest H: W50 |"
        + " Basic's table W50 (finite C) |"
    )
    print("|---" * (5 + len(bits) + 2) + "|")
    for eps in (float(e) for e in args.epsilons.split(",")):
        t0 = time.time()
        rho, sigma = policy_gaussian_rule(eps, args.delta, args.max_contributions)
        tables = [necessary_table(eps, args.delta, b) for b in bits]
        slack = one_cell_slack_table(eps, args.delta, bits[-1])
        basic, _ = T.calibrate_keep_table(eps, args.delta, T.basic_contributions(args.max_contributions))
        cells = " | ".join(f"{t.weight_for(0.5):.2f} (alpha {t.alpha:.1f})" for t in tables)
        print(
            f"| {eps:g} | {rho:.2f} | {sigma:.2f} | {rho + norm.ppf(0.9) * sigma:.2f} | {cells} | "
            f"{tables[-1].weight_for(0.9):.2f} | {slack.weight_for(0.5):.2f} | {basic.weight_for(0.5):.2f} |"
            f"  ({time.time() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
