"""Released items and count error with and without --release_counts at the same total budget (issue 19).

    .venv/bin/python -m benchmarks.explore.bench_counts                               # bundled sample + imdb
    .venv/bin/python -m benchmarks.explore.bench_counts --datasets sample --seeds 10 --budgets 0 0.1 0.25 0.5
    .venv/bin/python -m benchmarks.explore.bench_counts --sampler                     # discrete Gaussian draws/s

For each dataset and count_budget f (0 = no counts) it runs the in-memory reference (the same output
as SelectPartitions under the same seed; tests/transforms/selection/test_counts_beam.py checks equality) with seeds
0..seeds-1 and prints: released items (mean over seeds), the RMSE of the noisy counts against the
true counts of the capped data (what the noise is calibrated for) next to the reported noise std,
the fraction within the reported 95% bound, and the RMSE against the raw (uncapped) distinct-user
counts (contribution bounding makes the counts of heavy users' items low).

Data: ``data/debian_words.tsv.gz`` (bundled) and ``../shared/data/imdb.user_words.tsv.gz`` (read
at run time, never copied; skipped with a note if absent).
"""

import argparse
import gzip
import logging
import math
import os
import statistics
import time
from fractions import Fraction

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core import discrete_gaussian as dg
from dp_partition_beam.transforms.selection import counts_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATASETS = {
    "sample": os.path.join(ROOT, "data", "debian_words.tsv.gz"),
    "imdb": os.path.join(ROOT, "..", "shared", "data", "imdb.user_words.tsv.gz"),
}


def load_user_sets(path):
    """dict user -> list of distinct items from a ``user<TAB>item`` file with a header (``\\n`` newlines only)."""
    sets = {}
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        next(f)
        for line in f:
            user, item = line.rstrip("\n").split("\t", 1)
            sets.setdefault(user, {})[item] = None
    return {u: list(items) for u, items in sets.items()}


def run_one(sets, algorithm, params, seed):
    t0 = time.perf_counter()
    result = reference.release(sets, algorithm, params, seed=seed)
    wall = time.perf_counter() - t0
    row = {"items": len(result.items), "wall": wall}
    if result.counts:
        capped = reference.bound_contributions(sets, params.max_contributions, seed, 0)  # the same subsample
        true = counts_kernels.holder_counts(capped, result.counts)
        raw = counts_kernels.holder_counts(sets, result.counts)
        plan = result.count_plan
        errs = [result.counts[i] - true[i] for i in result.counts]
        row.update(
            sq=sum(e * e for e in errs),
            n=len(errs),
            inside=sum(abs(e) <= plan.error_bound_95 for e in errs),
            sq_raw=sum((result.counts[i] - raw[i]) ** 2 for i in result.counts),
            bias=sum(errs),
            median_count=statistics.median(true.values()),
            rel=statistics.median(abs(e) / max(1, true[i]) for e, i in zip(errs, result.counts)),
            std=plan.std,
            bound=plan.error_bound_95,
        )
    return row


def bench(name, sets, algorithm, budgets, seeds, epsilon, delta, d0):
    pairs = sum(len(s) for s in sets.values())
    print(
        f"\n{name}: {len(sets):,} users, {pairs:,} (user, item) pairs; {algorithm}, eps={epsilon:g}, "
        f"delta={delta:g}, Delta_0={d0}, seeds 0..{seeds - 1}"
    )
    header = (
        "f",
        "items",
        "vs f=0",
        "count RMSE",
        "reported std",
        "RMSE/std",
        "mean err",
        "in 95% bound",
        "bound",
        "RMSE vs raw",
        "median true",
        "median rel err",
        "s/run",
    )
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    base_items = None
    for f in budgets:
        kw = dict(release_counts=True, count_budget=f) if f > 0 else {}
        params = SelectionParams(epsilon=epsilon, delta=delta, max_contributions=d0, **kw)
        rows = [run_one(sets, algorithm, params, s) for s in range(seeds)]
        items = statistics.mean(r["items"] for r in rows)
        base_items = items if f == 0 else base_items
        vs = f"{items / base_items:.3f}" if base_items else "-"
        wall = statistics.median(r["wall"] for r in rows)
        if f == 0:
            print(f"0 | {items:,.1f} | 1 | - | - | - | - | - | - | - | - | - | {wall:.1f}")
            continue
        n = sum(r["n"] for r in rows)
        rmse = math.sqrt(sum(r["sq"] for r in rows) / n)
        rmse_raw = math.sqrt(sum(r["sq_raw"] for r in rows) / n)
        std = rows[0]["std"]
        print(
            f"{f:g} | {items:,.1f} | {vs} | {rmse:.2f} | {std:.2f} | {rmse / std:.3f} | "
            f"{sum(r['bias'] for r in rows) / n:+.2f} | {sum(r['inside'] for r in rows) / n:.4f} | "
            f"{rows[0]['bound']} | {rmse_raw:.1f} | {statistics.median(r['median_count'] for r in rows):g} | "
            f"{statistics.median(r['rel'] for r in rows):.3f} | {wall:.1f}"
        )


def bench_sampler(repeats=5, n=3000):
    print("\nExact discrete Gaussian sampler (pure Python), draws/s, median of", repeats, "runs of", n, "draws")
    print("sigma | secrets (production) | seeded (Philox per key)")
    print("--- | --- | ---")
    for sigma in (3, 30, 300, 3000, 30000):
        s2 = Fraction(sigma) ** 2
        rates = {}
        for mode in ("system", "seeded"):
            runs = []
            for r in range(repeats):
                noise = dg.DiscreteGaussian(s2, seed=None if mode == "system" else r)
                t0 = time.perf_counter()
                noise.draw_many(range(n))
                runs.append(n / (time.perf_counter() - t0))
            rates[mode] = statistics.median(runs)
        print(f"{sigma} | {rates['system']:,.0f} | {rates['seeded']:,.0f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["sample", "imdb"], choices=sorted(DATASETS))
    ap.add_argument("--algorithm", default="mad2r")
    ap.add_argument("--budgets", nargs="+", type=float, default=[0, 0.1, 0.25, 0.5])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max_contributions", type=int, default=100)
    ap.add_argument("--sampler", action="store_true", help="only measure the sampler's draws/s")
    args = ap.parse_args(argv)
    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(
        logging.ERROR
    )  # seeded on purpose (benchmark)
    print(f"machine: {os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.2f}")
    if args.sampler:
        bench_sampler()
        return
    for name in args.datasets:
        path = DATASETS[name]
        if not os.path.exists(path):
            print(f"\n{name}: {path} not found, skipped")
            continue
        t0 = time.perf_counter()
        sets = load_user_sets(path)
        print(f"\n(loaded {name} in {time.perf_counter() - t0:.1f} s)")
        bench(name, sets, args.algorithm, args.budgets, args.seeds, args.epsilon, args.delta, args.max_contributions)


if __name__ == "__main__":
    main()
