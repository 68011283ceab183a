"""Wall time and throughput of partition selection on synthetic Zipf data (DirectRunner vs reference).

    .venv/bin/python -m benchmarks.bench_select                      # basic, 1M and 4M pairs
    .venv/bin/python -m benchmarks.bench_select --algorithms basic mad mad2r dp_sips --sizes 1000000

Pairs are generated inside the pipeline from chunk ids (transforms/synthetic.py), 10 pairs per user
on average, items Zipf(1.1) over 1M ranks; epsilon = 1, delta = 1e-5, Delta_0 = 100, seed fixed, so
every mode releases the same items (checked). Prints a table.
"""

import argparse
import os
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing.synthetic import (
    zipf_pair_count,
    zipf_pairs,
    zipf_pairs_of_chunk,
    zipf_table_of_chunk,
)

USERS_PER_CHUNK = 10_000  # ~100k pairs per chunk


def _nothing(_):
    return []


class ReadInputOnly(beam.PTransform):
    """(user, item) -> nothing: generates and counts the pairs only, the floor every tool pays.

    The time of a pipeline that only produces and counts the input (one Beam element per pair)
    is what no algorithm on the same runner can go below; run_all.py reports it as ``read_input``.
    """

    def expand(self, pairs):
        return (
            pairs
            | "CountPairs" >> beam.combiners.Count.Globally()  # n
            | "Nothing" >> beam.FlatMap(_nothing)  # no output
        )


def run_beam(algorithm, n_chunks, mode, params, seed):
    return run_beam_transform(SelectPartitions(algorithm, params, seed=seed), n_chunks, mode)


def run_beam_transform(select, n_chunks, mode, users_per_chunk=USERS_PER_CHUNK, batched=False):
    """Wall time and released items of ``select`` ((user, item) -> item) on Zipf chunks 0..n_chunks-1.

    ``batched``: each chunk arrives as one Arrow Table(user, item) (what the batched readers give)
    instead of one element per pair; the same rows either way.
    """
    expand = (
        beam.Map(zipf_table_of_chunk, users_per_chunk)
        if batched
        else beam.FlatMap(zipf_pairs_of_chunk, users_per_chunk)
    )
    args = ["--runner=DirectRunner", f"--direct_running_mode={mode}"]
    if mode == "multi_processing":
        args.append("--direct_num_workers=2")
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "items")
        t0 = time.perf_counter()
        with beam.Pipeline(options=PipelineOptions(args)) as p:
            _ = (
                p
                | beam.Create(list(range(n_chunks)))
                | beam.Reshuffle()
                | expand  # (user, item) or Table(user, item)
                | select  # item
                | beam.io.WriteToText(prefix)
            )
        elapsed = time.perf_counter() - t0
        items = set()
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                items.update(l.rstrip("\n") for l in f)
    return elapsed, items


def run_reference(algorithm, n_chunks, params, seed):
    t0 = time.perf_counter()
    pairs = zipf_pairs(n_chunks, USERS_PER_CHUNK)
    sets = reference.user_sets_from_pairs(pairs)
    items = reference.select(sets, algorithm, params, seed=seed)
    return time.perf_counter() - t0, items, len(pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=["basic"])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 4e6], help="approximate numbers of pairs")
    ap.add_argument("--modes", nargs="+", default=["reference", "in_memory", "multi_processing"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    params = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    rows = []
    for size in args.sizes:
        n_chunks = max(1, int(round(size / (USERS_PER_CHUNK * 10))))
        for algorithm in args.algorithms:
            ref_items, n_pairs = None, None
            for mode in args.modes:
                if mode == "reference":
                    t, items, n_pairs = run_reference(algorithm, n_chunks, params, args.seed)
                    ref_items = items
                else:
                    t, items = run_beam(algorithm, n_chunks, mode, params, args.seed)
                if n_pairs is None:
                    n_pairs = zipf_pair_count(n_chunks, USERS_PER_CHUNK)
                same = "" if ref_items is None else ("yes" if items == ref_items else "NO")
                rows.append((algorithm, n_pairs, mode, t, n_pairs / t, len(items), same))
                print(f"  {algorithm:8s} {n_pairs:>9,d} {mode:17s} {t:8.1f}s", file=sys.stderr, flush=True)
    print(f"\n{os.cpu_count()} cores; epsilon=1, delta=1e-5, Delta_0=100, seed={args.seed}")
    print(
        f"{'algorithm':10s} {'pairs':>10s} {'mode':17s} {'wall s':>8s} {'pairs/s':>10s} {'released':>9s} {'== ref':>7s}"
    )
    for a, n, m, t, r, k, same in rows:
        print(f"{a:10s} {n:>10,d} {m:17s} {t:8.1f} {r:>10,.0f} {k:>9d} {same:>7s}")


if __name__ == "__main__":
    main()
