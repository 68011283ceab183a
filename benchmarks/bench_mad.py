"""Released items of Basic, MAD, MAD2R and DP-SIPS (issue 3 benchmark); prints tables.

    .venv/bin/python -m benchmarks.bench_mad                 # all three datasets, 20 trials
    .venv/bin/python -m benchmarks.bench_mad --datasets section62 --trials 50

Datasets:
  section62  the MAD paper's section 6.2 instance: n = 15,000 users, each with the heavy item and 2 of
             m = 1,000 light items; epsilon = 1, delta = 1e-5, Delta_0 = 100.
  zipf       synthetic Zipf(1.1) data, 20,000 users, ~200k pairs (transforms/synthetic.py).
  debian_words  the bundled real sample (data/debian_words.tsv.gz: Debian changelogs, 1,754 users,
             200k pairs; data/README.md).

Each configuration runs ``--trials`` times with seeds 0..trials-1 on the in-memory reference
(transforms/reference.py), which releases exactly what the Beam transforms release under the same
seed (tests/transforms/selection/test_mad_beam.py). Single-round algorithms do not depend on the accounting; they are
listed once. ``expected`` for Basic is the analytic mean sum_i Phi((w_i - rho) / sigma).
"""

import argparse
import gzip
import os
import time

import numpy as np
from scipy.stats import norm

from dp_partition_beam.privacy.selection import (
    SelectionParams,
    plan_rounds,
)
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.testing.synthetic import heavy_light_sets, zipf_pairs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_62 = {"basic": 519, "mad": 610, "dp_sips [0.05,0.15,0.8]": 332, "dp_sips [0.1,0.9]": 514}

CONFIGS = [
    ("basic", "basic", {}),
    # the papers' Gaussian rounds (keep rules are the default of mad, mad2r and dp_sips since issue 30)
    ("mad (d_max 50)", "mad", {"d_max": 50, "threshold": "gaussian"}),
    ("mad (d_max 4)", "mad", {"d_max": 4, "threshold": "gaussian"}),
    ("mad2r", "mad2r", {"threshold": "gaussian"}),
    ("dp_sips [0.05,0.15,0.8]", "dp_sips", {"budget_split": (0.05, 0.15, 0.8), "threshold": "gaussian"}),
    ("dp_sips [0.1,0.9]", "dp_sips", {"budget_split": (0.1, 0.9), "threshold": "gaussian"}),
]


def load_dataset(name):
    if name == "section62":
        return heavy_light_sets(15_000, 1_000, 2, seed=0)
    if name == "zipf":
        return reference.user_sets_from_pairs(zipf_pairs(2, 10_000))
    if name == "debian_words":
        with gzip.open(os.path.join(REPO, "data", "debian_words.tsv.gz"), "rt", encoding="utf-8") as f:
            next(f)
            return reference.user_sets_from_pairs(tuple(l.rstrip("\n").split("\t", 1)) for l in f)
    raise ValueError(name)


def expected_basic(sets, params):
    (plan,) = plan_rounds("basic", params)
    capped = reference.bound_contributions(sets, params.max_contributions, seed=0)
    w = np.array(list(reference.basic_weights(capped).values()))
    return float(norm.cdf((w - plan.threshold) / plan.noise_scale).sum())


def run_dataset(name, trials):
    sets = load_dataset(name)
    n_pairs = sum(len(v) for v in sets.values())
    base = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    print(
        f"\n## {name}: {len(sets):,} users, {n_pairs:,} pairs; epsilon=1, delta=1e-5, Delta_0=100, "
        f"{trials} trials (mean +- std of released items)"
    )
    print(f"analytic expected released items of basic: {expected_basic(sets, base):.1f}")
    header = f"{'algorithm':26s} {'gdp':>16s} {'basic accounting':>18s}"
    if name == "section62":
        header += f" {'paper':>7s}"
    print(header)
    for label, algorithm, extra in CONFIGS:
        cells = []
        for accounting in ("gdp", "basic"):
            if algorithm in ("basic", "mad") and accounting == "basic":
                cells.append(cells[0])  # single round: the accounting does not apply
                continue
            params = base.replace(accounting=accounting, **extra)
            counts = [len(reference.select(sets, algorithm, params, seed=s)) for s in range(trials)]
            cells.append(f"{np.mean(counts):8.1f} +- {np.std(counts):5.1f}")
        line = f"{label:26s} {cells[0]:>16s} {cells[1]:>18s}"
        if name == "section62":
            line += f" {PAPER_62.get(label, PAPER_62.get(label.split(' (')[0], '')):>7}"
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["section62", "zipf", "debian_words"])
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    import logging

    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(logging.ERROR)  # seeded-run warnings
    t0 = time.perf_counter()
    for name in args.datasets:
        run_dataset(name, args.trials)
    print(f"\n({time.perf_counter() - t0:.0f} s on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
