"""DPSU paper Table 2 layout: items released by the baselines, MAD/MAD2R and the sequential policies.

    .venv/bin/python -m benchmarks.bench_policy                     # everything (about 15 min, 2 cores)
    .venv/bin/python -m benchmarks.bench_policy --skip_beam --repeats 1 --zipf_users 5000   # quick

Part 1 (utility): released counts at epsilon = 3, delta = exp(-10) (the paper's setting), for
max_contributions (Delta_0) in {1, 10, 50, 100, 300}, on the bundled real sample
(data/debian_words.tsv.gz) and on synthetic Zipf data (transforms/synthetic.py), with the in-memory
reference in production mode (OS entropy), mean +- std over ``--repeats`` runs (the paper: 5 user
orders). Every row runs its paper's rule (``threshold`` 'laplace' or 'gaussian'); the last rows add the l1 keep
curve, the default of the Laplace algorithms since issue 30 (docs/thresholding.md). Part 2 (speed): wall time
of ``SelectPartitions('policy_gaussian')`` (and of 'basic' for comparison, same conditions) on the DirectRunner
(in_memory), synthetic pairs generated inside the pipeline, per million input pairs, and the time of the
histogram kernel alone.
Part 3 (memory): peak Python-allocated bytes (tracemalloc) per gathered (user, item) pair of
the single worker (user sets as they arrive from the GroupByKey plus the histogram), measured in a
fresh subprocess; this sizes ``DEFAULT_MAX_SEQUENTIAL_PAIRS`` (privacy/selection.py).
"""

import argparse
import gzip
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.privacy.selection import ALGORITHMS as ALGORITHM_SPECS
from dp_partition_beam.privacy.selection import SelectionParams, noise_rule, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.selection import policy_kernels
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing.synthetic import zipf_pairs, zipf_pairs_of_chunk

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = [
    "count_laplace",
    "count_gaussian",
    "weighted_laplace",
    "basic",
    "policy_laplace",
    "policy_gaussian",
    "mad",
    "mad2r",
]
LABELS = {"basic": "weighted_gaussian (basic)"}
D0S = [1, 10, 50, 100, 300]
EPS, DELTA = 3.0, math.exp(-10)


def sample_sets():
    with gzip.open(os.path.join(REPO, "data", "debian_words.tsv.gz"), "rt", encoding="utf-8") as f:
        next(f)
        pairs = [line.rstrip("\n").split("\t") for line in f]
    return reference.user_sets_from_pairs(pairs)


def zipf_sets(n_users):
    chunk = 10_000
    return reference.user_sets_from_pairs(zipf_pairs(max(1, n_users // chunk), min(chunk, n_users)))


def utility_table(name, sets, repeats, alpha):
    n_pairs = sum(len(v) for v in sets.values())
    print(
        f"\n{name}: {len(sets):,d} users, {n_pairs:,d} distinct pairs; epsilon=3, delta=exp(-10), "
        f"alpha={alpha:g}; mean +- std of {repeats} unseeded runs",
        flush=True,
    )
    header = f"{'Delta_0':28s}" + "".join(f"{d:>14d}" for d in D0S)
    print(header)
    means = {}
    # the papers' rules (each algorithm's own noise + rho: the layout of the paper's Table 2), then section 6.2.1's
    # two passes (paper's Table 4), then the l1 keep curve, the Laplace algorithms' default (docs/thresholding.md)
    rows = [(alg, 1, None) for alg in ALGORITHMS] + [("policy_laplace", 2, None), ("policy_gaussian", 2, None)]
    rows += [(alg, 1, "optimal") for alg in ("count_gaussian", "weighted_laplace", "policy_laplace")]
    for alg, passes, threshold in rows:
        cells = []
        rule = threshold or noise_rule(ALGORITHM_SPECS[alg])
        for d0 in D0S:
            params = SelectionParams(EPS, DELTA, max_contributions=d0, alpha=alpha, passes=passes, threshold=rule)
            counts = [len(reference.select(sets, alg, params)) for _ in range(repeats)]
            m = statistics.mean(counts)
            s = statistics.stdev(counts) if len(counts) > 1 else 0.0
            means[alg, d0, passes, threshold] = m
            cells.append(f"{m:8.0f} +-{s:4.0f}")
        label = LABELS.get(alg, alg) + (f" ({passes} passes)" if passes > 1 else "")
        label += (" (keep table)" if alg == "count_gaussian" else " (l1 curve)") if threshold else ""
        print(f"{label:28s}" + "".join(f"{c:>14s}" for c in cells), flush=True)
    best = {a: max(means[a, d, 1, None] for d in D0S) for a in ALGORITHMS}
    print("best over Delta_0: " + ", ".join(f"{a} {best[a]:.0f}" for a in ALGORITHMS))
    return best


def beam_time(n_users, d0, algorithm="policy_gaussian", mode="in_memory"):
    args = ["--runner=DirectRunner", f"--direct_running_mode={mode}"]
    chunk = 10_000
    n_chunks = max(1, n_users // chunk)
    n_pairs = sum(1 for c in range(n_chunks) for _ in zipf_pairs_of_chunk(c, chunk))
    params = SelectionParams(EPS, DELTA, max_contributions=d0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with beam.Pipeline(options=PipelineOptions(args)) as p:
            _ = (
                p
                | beam.Create(list(range(n_chunks)))
                | beam.Reshuffle()
                | beam.FlatMap(zipf_pairs_of_chunk, chunk)  # (user, item)
                | SelectPartitions(algorithm, params)  # item
                | beam.io.WriteToText(os.path.join(tmp, "items"))
            )
        elapsed = time.perf_counter() - t0
    return n_pairs, elapsed


def kernel_time(n_users, d0):
    sets = zipf_sets(n_users)
    capped = reference.bound_contributions(sets, d0)
    n = sum(len(v) for v in capped.values())
    gamma = plan_rounds("policy_gaussian", SelectionParams(EPS, DELTA, max_contributions=d0))[0].cutoff
    t0 = time.perf_counter()
    policy_kernels.policy_histogram(capped.items(), "l2_descent", gamma)
    return n, time.perf_counter() - t0


MEMORY_CHILD = r"""
import sys, pickle, tracemalloc
from dp_partition_beam.transforms.selection import policy_kernels
from dp_partition_beam.transforms.testing.synthetic import zipf_pairs_of_chunk
n_users, d0 = int(sys.argv[1]), int(sys.argv[2])
# bounded user sets as the single worker receives them (decoded from the shuffle: fresh objects)
sets = {}
for c in range(max(1, n_users // 10000)):
    for u, i in zipf_pairs_of_chunk(c, 10000):
        s = sets.setdefault(u, {})
        if len(s) < d0:
            s[i] = None
blob = pickle.dumps([(u, list(s)) for u, s in sets.items()])
n_pairs = sum(len(s) for s in sets.values())
del sets
tracemalloc.start()  # Python allocations from here on: decoded user sets, order keys, histogram
user_sets = pickle.loads(blob)
hist = policy_kernels.policy_histogram(user_sets, "l2_descent", 10.0)
print(n_pairs, tracemalloc.get_traced_memory()[1])
"""


def memory_per_pair(n_users, d0):
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(n_users), str(d0)], capture_output=True, text=True, check=True
    ).stdout.split()
    n_pairs, extra = int(out[0]), int(out[1])
    return n_pairs, extra / n_pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--zipf_users", type=int, default=20_000, help="users of the synthetic utility table")
    ap.add_argument("--alpha", type=float, default=5.0)
    ap.add_argument("--beam_users", type=int, default=100_000, help="users (x ~10 pairs) of the speed test")
    ap.add_argument("--skip_beam", action="store_true")
    ap.add_argument("--skip_utility", action="store_true")
    ap.add_argument(
        "--datasets",
        nargs="+",
        choices=["sample", "zipf"],
        default=["sample", "zipf"],
        help="utility tables to print (sample: data/debian_words.tsv.gz; zipf: synthetic)",
    )
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at start")
    if not args.skip_utility:
        datasets = {
            "sample": lambda: ("debian_words.tsv.gz (real)", sample_sets()),
            "zipf": lambda: ("synthetic Zipf(1.1), mean degree 10", zipf_sets(args.zipf_users)),
        }
        for name, sets in (datasets[d]() for d in args.datasets):
            best = utility_table(name, sets, args.repeats, args.alpha)
            for pol, base in (("policy_laplace", "weighted_laplace"), ("policy_gaussian", "basic")):
                verdict = "holds" if best[pol] > best[base] else "does NOT hold"
                print(f"  paper's claim {pol} > {base} (best Delta_0): {verdict} ({best[pol]:.0f} vs {best[base]:.0f})")
    if not args.skip_beam:
        print("\nSequential transform speed (policy_gaussian, Delta_0=100, unseeded, DirectRunner in_memory)")
        for alg in ("policy_gaussian", "basic"):
            n, t = beam_time(args.beam_users, 100, alg)
            print(
                f"  Beam end to end, {alg}: {n:,d} input pairs in {t:.1f}s = {t / n * 1e6:.1f} s per million pairs",
                flush=True,
            )
        n, t = kernel_time(args.beam_users, 100)
        print(f"  histogram kernel alone: {n:,d} bounded pairs in {t:.2f}s = {t / n * 1e6:.2f} s per million pairs")
        for users in (50_000, 200_000):
            n, b = memory_per_pair(users, 100)
            print(f"  single-worker peak memory: {n:,d} pairs, {b:.0f} bytes per pair")
    print(f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
