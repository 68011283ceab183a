"""Exploration (docs/thresholding.md, "MAD-SIPS's last round"): what a keep table could bring to the default.

Runs MAD-SIPS's rounds 1..R-1 with the in-memory reference (epsilon 1, delta 1e-5, Delta_0 100, cap fixed at
Delta_0, one seed), then computes the EXPECTED number of items released by the last round (exact sums of
probabilities on that round's data, no sampling error) under:

* MAD + Gaussian threshold (today's last round);
* biased Basic + Gaussian (Algorithm 2's user weights from the public biases, without MAD's truncation and
  rerouting: a user's weights then depend on its own items only);
* biased Basic + keep table: every weight rounded down to the geometric grid 2^(-k/16) (a finite contribution
  set C, as the table's proof needs), accounted in RDP at one order alpha: rounds 1..R-1 as Gaussian
  mechanisms (alpha / (2 sigma_r^2) each, their threshold deltas as today), the table with the rest of
  epsilon and delta (searched over a few alpha and delta splits).

    .venv/bin/python -m benchmarks.explore.explore_table_last_round --data higgs --seed 0
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import special

from benchmarks.shared_data import read_user_sets, shared_data_path
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.privacy.selection import SelectionParams, plan
from dp_partition_beam.transforms.selection import mad_kernels as K
from dp_partition_beam.transforms.selection import reference as R

GRID_STEPS = 16  # contributions rounded down to 2^(-k/16): at most 4.2% below the weight
GRID = tuple(float(2 ** (-k / GRID_STEPS)) for k in range(0, GRID_STEPS * 6))  # down to 2^-6 < b_min/sqrt(100)


def rounded_down(w: np.ndarray) -> np.ndarray:
    k = np.ceil(-GRID_STEPS * np.log2(w) - 1e-12)
    return np.minimum(np.exp2(-k / GRID_STEPS), w)


def rounds_to_last(user_sets, seed: int, epsilon: float = 1.0):
    """MAD-SIPS's rounds 1..R-1 by the reference (delta 1e-5, Delta_0 100, cap fixed at Delta_0), then the last
    round's sets: ``(params, plans, |U_<R|, capped sets, biases, MAD weights)``."""
    params = SelectionParams(epsilon, 1e-5, max_contributions=100, cap_quantile=1.0)
    p = plan("mad_sips", params)
    prm, plans = p.params, p.rounds
    full = {u: R._unique(items) for u, items in user_sets.items()}
    released, prev = set(), None
    for k, rp in enumerate(plans[:-1]):
        rho_drop = min(q.threshold for q in plans[k:])
        _, _, w = R.mad_sips_round(full, released, prev, rp, prm, seed, None, rho_drop)
        noisy = R.add_noise(w, rp.noise, rp.noise_scale, seed, rp.index, None)
        released |= {i for i, x in noisy.items() if passes_threshold(x, rp.threshold)}
        prev = (rp, noisy)
    last = plans[-1]
    capped, biases, w_mad = R.mad_sips_round(full, released, prev, last, prm, seed, None, last.threshold)
    return prm, plans, len(released), capped, biases, w_mad


def last_round(user_sets, seed: int):
    prm, plans, earlier, capped, biases, w_mad = rounds_to_last(user_sets, seed)
    items = list(w_mad)
    biased, rounded = {}, {}
    for its in capped.values():
        ws = K.user_weights(np.array([biases.get(i, 1.0) for i in its]), prm.b_min, prm.b_max)
        for i, x, y in zip(its, ws, rounded_down(ws)):
            biased[i] = biased.get(i, 0.0) + float(x)
            rounded[i] = rounded.get(i, 0.0) + float(y)
    as_array = lambda d: np.array([d.get(i, 0.0) for i in items])  # noqa: E731
    return plans, earlier, as_array(w_mad), as_array(biased), as_array(rounded)


def table_for_last_round(plans, delta: float = 1e-5):
    d_thresholds = sum(q.delta for q in plans[:-1]) / 2  # rounds 1..R-1 keep their threshold deltas
    best = None
    for alpha in (4, 6, 8, 10, 12, 16, 20, 24, 32):
        for f in (0.3, 0.5, 0.7):
            rest = delta - d_thresholds
            d_mix, d_conv = rest * f, rest * (1 - f)
            eps = (
                1.0 - T.rdp_to_dp_epsilon(0.0, alpha, d_conv) - sum(alpha / (2 * q.noise_scale**2) for q in plans[:-1])
            )
            if eps <= 0:
                continue
            w50 = T.keep_table(alpha, eps, d_mix, GRID[::4], 6).weight_for(0.5)
            if best is None or w50 < best[0]:
                best = (w50, alpha, eps, d_mix)
    _, alpha, eps, d_mix = best
    return T.keep_table(alpha, eps, d_mix, GRID, 9)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="higgs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    sets = read_user_sets(shared_data_path(f"{args.data}.user_words.tsv.gz"))
    plans, earlier, w_mad, w_biased, w_rounded = last_round(sets, args.seed)
    last = plans[-1]
    gauss = lambda w: float(np.sum(special.ndtr((w - last.threshold) / last.noise_scale)))  # noqa: E731
    table = table_for_last_round(plans)
    kept = float(np.sum(table.keep_probability(w_rounded)))
    print("| data | seed | rounds 1..R-1 | last: MAD + Gaussian | biased Basic + Gaussian ", end="")
    print("| biased Basic + table | alpha |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.data} | {args.seed} | {earlier} | {gauss(w_mad):,.1f} (rho {last.threshold:.2f}) | "
        f"{gauss(w_biased):,.1f} | {kept:,.1f} (W50 {table.weight_for(0.5):.2f}) | {table.alpha:g} |"
    )
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
