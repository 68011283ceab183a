"""Parameter sweeps behind docs/tuning.md; prints tables (mean +- std of released items over seeds).

    .venv/bin/python -m benchmarks.bench_tuning                      # everything, 5 seeds
    .venv/bin/python -m benchmarks.bench_tuning --only select --seeds 3
    .venv/bin/python -m benchmarks.bench_tuning --only dpne --max_n 6

select: the bundled sample data/debian_words.tsv.gz (1,754 users), epsilon = 1, delta = 1e-5: user degree quantiles,
then one parameter at a time from the defaults (Delta_0 = 100, beta = 2, d_max = 50, split 0.1,0.9):
Delta_0 for basic/mad/mad2r, beta and d_max for mad, budget splits for mad2r and dp_sips (and two
splits under the MAD paper's basic accounting).
dpne: the bundled DPNE sample data/debian_text.jsonl.gz (1,000 users), epsilon = 4, delta = 1e-7: eta,
sigma_decay and Delta_k.
Runs the in-memory references (equal to the Beam transforms under a seed; tests/transforms/selection/test_mad_beam.py,
tests/transforms/dpne/test_dpne_beam.py) with numpy generators seeded 0..seeds-1.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.bench_dpne import read_jsonl
from benchmarks.bench_mad import load_dataset
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.dpne.reference import dpne_reference, user_kgrams

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cell(values) -> str:
    return f"{np.mean(values):8.1f} +- {np.std(values):5.1f}"


def select_counts(sets, algorithm, params, seeds):
    return [len(reference.select(sets, algorithm, params, seed=s)) for s in range(seeds)]


def bench_select(seeds: int):
    sets = load_dataset("debian_words")
    degrees = np.array([len(v) for v in sets.values()])
    q = np.percentile(degrees, [25, 50, 75, 90, 99])
    print(
        f"\n## select_partitions on data/debian_words.tsv.gz: {len(sets):,} users, {degrees.sum():,} pairs; "
        f"epsilon=1, delta=1e-5, {seeds} seeds"
    )
    print(
        f"user degree quantiles: p25={q[0]:.0f} median={q[1]:.0f} p75={q[2]:.0f} p90={q[3]:.0f} p99={q[4]:.0f} "
        f"max={degrees.max()}"
    )
    # the Gaussian rounds of the papers (docs/tuning.md's tables; mad2r's and dp_sips's default last round is a
    # keep table since issue 30: docs/thresholding.md, "Defaults")
    base = SelectionParams(epsilon=1.0, delta=1e-5, threshold="gaussian")
    print("\n### Delta_0 (max_contributions), Gaussian thresholds")
    print(f"{'Delta_0':>8s} {'basic':>16s} {'mad':>16s} {'mad2r':>16s}")
    for d0 in (5, 10, 25, 50, 100, 200, 400):
        p = base.replace(max_contributions=d0)
        print(
            f"{d0:8d} " + " ".join(f"{cell(select_counts(sets, a, p, seeds)):>16s}" for a in ("basic", "mad", "mad2r")),
            flush=True,
        )
    print("\n### MAD beta (tau = rho + beta*sigma) and d_max, Delta_0=100")
    print(f"{'beta':>6s} {'d_max=4':>16s} {'d_max=20':>16s} {'d_max=50':>16s} {'d_max=200':>16s}")
    for beta in (0.5, 1.0, 2.0, 4.0):
        row = [cell(select_counts(sets, "mad", base.replace(beta=beta, d_max=d), seeds)) for d in (4, 20, 50, 200)]
        print(f"{beta:6.1f} " + " ".join(f"{c:>16s}" for c in row), flush=True)
    print("\n### budget split (gdp accounting unless marked), Delta_0=100")
    print(f"{'split':>26s} {'mad2r':>16s} {'dp_sips':>16s}")
    splits = [
        (s, "gdp")
        for s in (
            (0.05, 0.95),
            (0.1, 0.9),
            (0.2, 0.8),
            (0.3, 0.7),
            (0.5, 0.5),
            (0.6, 0.4),
            (0.7, 0.3),
            (0.8, 0.2),
            (0.05, 0.15, 0.8),
        )
    ]
    for split, accounting in splits + [((0.1, 0.9), "basic"), ((0.5, 0.5), "basic")]:
        p = base.replace(budget_split=split, accounting=accounting)
        row = [
            cell(select_counts(sets, a, p, seeds)) if (a == "dp_sips" or len(split) == 2) else "-"
            for a in ("mad2r", "dp_sips")
        ]
        label = ",".join(f"{x:g}" for x in split) + (f" ({accounting} accounting)" if accounting != "gdp" else "")
        print(f"{label:>26s} " + " ".join(f"{c:>16s}" for c in row), flush=True)


def bench_dpne(seeds: int, max_n: int):
    records = list(read_jsonl(os.path.join(REPO, "data", "debian_text.jsonl.gz")))
    t0 = time.time()
    ug = user_kgrams(records, max_n)
    # the paper's levels (docs/tuning.md measured them before the keep tables became the default)
    base = DPNEParams(epsilon=4.0, delta=1e-7, max_n=max_n, selection="single", threshold="gaussian")
    print(
        f"\n## extract_ngrams (DPNE) on data/debian_text.jsonl.gz: {len({u for u, _ in records}):,} users; "
        f"epsilon=4, delta=1e-7, T={max_n}, {seeds} seeds (n-gram extraction {time.time() - t0:.0f}s)"
    )
    deg = np.array([len(v) for v in ug[1].values()])
    print(f"distinct 1-grams per user: median={np.median(deg):.0f} p90={np.percentile(deg, 90):.0f}")

    present = {k: set().union(*ug[k].values()) if ug[k] else set() for k in ug}  # n-grams in the data

    def run(p):
        rows, spurious = [], []
        for s in range(seeds):
            r = dpne_reference(None, "dpne", p, rng=np.random.default_rng(s), user_grams=ug)
            rows.append([len(r.ngrams.get(k, ())) for k in range(1, max_n + 1)])
            spurious.append(sum(len(r.ngrams.get(k, set()) - present[k]) for k in range(1, max_n + 1)))
        rows = np.array(rows, dtype=float)
        return rows.sum(axis=1), rows.mean(axis=0), spurious

    header = f"{'':>22s} {'total':>16s} {'not in data':>16s}  per k (mean)"
    for title, key, values in (
        ("eta", "eta", (0.001, 0.01, 0.05, 0.1)),
        ("sigma_decay", "sigma_decay", (0.8, 0.9, 1.0, 1.1)),
        ("Delta_k (max_contributions)", "max_contributions", (30, 100, 300, 1000)),
    ):
        print(f"\n### {title}")
        print(header)
        for v in values:
            total, per_k, spurious = run(base.replace(**{key: v}))
            print(
                f"{key + '=' + str(v):>22s} {cell(total):>16s} {cell(spurious):>16s}  "
                + " ".join(f"{x:.0f}" for x in per_k),
                flush=True,
            )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["select", "dpne"], default=None)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max_n", type=int, default=6)
    a = ap.parse_args(argv)
    import logging

    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(
        logging.ERROR
    )  # seeded-run warnings (as bench_mad)
    if a.only in (None, "select"):
        bench_select(a.seeds)
    if a.only in (None, "dpne"):
        bench_dpne(a.seeds, a.max_n)


if __name__ == "__main__":
    main()
