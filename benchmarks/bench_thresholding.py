"""Expected items of one Basic round: Gaussian noise + threshold against a keep-probability table (issue 30).

For each corpus and epsilon (delta 1e-5, Delta_0 100, the MAD paper's Table 2 setting): users are capped
to Delta_0 items (uniform subsample, seed 0, the reference's bound_contributions), every item gets its
Basic weight W = sum over its holders of 1/sqrt(d_u), and the EXPECTED number of released items is
computed exactly under both rules on that one capped dataset:

* weighted Gaussian (DPSU / MAD paper Alg. 1): sum_i P[W_i + N(0, sigma^2) >= rho];
* keep table (privacy/thresholding.py, docs/thresholding.md): sum_i F(W_i).

No noise is drawn, so the comparison has no sampling error. Also printed: W50, the weight kept with
probability 1/2 (rho for the Gaussian). The shared corpora are read from ../shared/data (never copied).

``--rule l1``: the Laplace algorithms' round instead (docs/thresholding.md, "The l1 curve"): weighted Laplace
(W = sum of 1/d_u) and count Laplace (W = number of holders), each with its DPSU Laplace noise + threshold,
sum_i P[W_i + Lap(b) >= rho], against the l1 keep curve, sum_i f(W_i / unit).

    python -m benchmarks.bench_thresholding [--data imdb,higgs] [--epsilons 0.5,1,2,4] [--rule basic|l1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import special

from benchmarks.shared_data import read_user_sets, shared_data_path
from dp_partition_beam.privacy import calibration
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.transforms.selection.reference import basic_weights, bound_contributions

DATASETS = ("imdb", "higgs", "retail", "commits", "debian_b")  # msnbc: 17 items, all released by both
DELTA, DELTA_0 = 1e-5, 100


def capped_basic_weights(user_sets, max_contributions: int) -> np.ndarray:
    """Basic's item weights (the reference's exact sums) of the users capped to Delta_0 (seed 0)."""
    totals = basic_weights(bound_contributions(user_sets, max_contributions, 0, 0, None))
    return np.fromiter(totals.values(), dtype=np.float64, count=len(totals))


def capped_weights(user_sets, max_contributions: int, weighting: str) -> np.ndarray:
    """The item weights of ``weighting`` ('weighted_laplace': 1/d, 'count': 1) of the capped users (seed 0)."""
    totals = basic_weights(bound_contributions(user_sets, max_contributions, 0, 0, None), weighting)
    return np.fromiter(totals.values(), dtype=np.float64, count=len(totals))


def laplace_kept(weights: np.ndarray, b: float, rho: float) -> float:
    """sum_i P[W_i + Lap(b) >= rho], exactly."""
    z = (weights - rho) / b
    return float(np.sum(np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))))


def main_l1(names, epsilons):
    print(f"\ndelta {DELTA:g}, Delta_0 {DELTA_0}; expected released items of one Laplace-weighting round (exact)\n")
    print("| data | algorithm | epsilon | items | Laplace rho | curve W50 | Laplace E[released] ", end="")
    print("| curve E[released] | gain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        user_sets = read_user_sets(shared_data_path(f"{name}.user_words.tsv.gz"))
        for algorithm, weighting, unit in (
            ("weighted_laplace", "weighted_laplace", 1.0),
            ("count_laplace", "count", DELTA_0),
        ):
            weights = capped_weights(user_sets, DELTA_0, weighting)
            for eps in epsilons:
                c = getattr(calibration, f"calibrate_{algorithm}")(eps, DELTA, DELTA_0)
                curve = T.calibrate_l1_curve(eps, DELTA, float(unit), DELTA_0)
                lap = laplace_kept(weights, c.noise_scale, c.threshold)
                kept = float(np.sum(curve.keep_probability(weights)))
                print(
                    f"| {name} | {algorithm} | {eps:g} | {weights.size:,} | {c.threshold:.2f} | "
                    f"{curve.weight_for(0.5):.2f} | {lap:,.1f} | {kept:,.1f} | {kept / lap - 1:+.1%} |"
                )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=",".join(DATASETS))
    ap.add_argument("--epsilons", default="0.5,1,2,4")
    ap.add_argument("--rule", choices=("basic", "l1"), default="basic")
    args = ap.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    if args.rule == "l1":
        return main_l1(args.data.split(","), epsilons)
    contributions = T.basic_contributions(DELTA_0)
    tables = {}
    for eps in epsilons:
        t0 = time.time()
        tables[eps] = T.calibrate_keep_table(eps, DELTA, contributions)[0]
        print(f"# table at epsilon {eps:g}: alpha {tables[eps].alpha:.1f}, {time.time() - t0:.1f} s to calibrate")
    print(f"\ndelta {DELTA:g}, Delta_0 {DELTA_0}; expected released items of one Basic round (exact expectations)\n")
    print("| data | epsilon | items | Gaussian W50 (rho) | table W50 | Gaussian E[released] ", end="")
    print("| table E[released] | gain |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.data.split(","):
        weights = capped_basic_weights(read_user_sets(shared_data_path(f"{name}.user_words.tsv.gz")), DELTA_0)
        for eps in epsilons:
            c = calibration.calibrate_weighted_gaussian(eps, DELTA, DELTA_0)
            gauss = float(np.sum(special.ndtr((weights - c.threshold) / c.noise_scale)))
            table = tables[eps]
            kept = float(np.sum(table.keep_probability(weights)))
            print(
                f"| {name} | {eps:g} | {weights.size:,} | {c.threshold:.2f} | {table.weight_for(0.5):.2f} | "
                f"{gauss:,.1f} | {kept:,.1f} | {kept / gauss - 1:+.1%} |"
            )


if __name__ == "__main__":
    main()
