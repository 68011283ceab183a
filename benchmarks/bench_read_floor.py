"""The floor of reading: a pipeline that only reads a TSV with the CLIs' reader and counts its rows.

    .venv/bin/python -m benchmarks.bench_read_floor --tsv pairs.tsv
    .venv/bin/python -m benchmarks.bench_read_floor --zipf 4e6 --vector_mb 16 4 --pools mimalloc system

Every run is a fresh process (the CLI's imports, then ``ReadRecordBatches`` -> row count on the in-memory
DirectRunner), timed from outside: wall and peak RSS (``os.wait4``). Two settings are varied: the size of
the blocks the reader checks with numpy (``pipelines.io._VECTOR_BYTES``) and Arrow's allocator
(``ARROW_DEFAULT_MEMORY_POOL``). No algorithm can go below this line on the same runner
(docs/columnar.md, "Memory").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

_CHILD = """
import sys
from dp_partition_beam.pipelines import select_partitions  # noqa: F401  the CLI's imports (and allocator)
import apache_beam as beam
from dp_partition_beam.pipelines import io
from dp_partition_beam.pipelines.runner import LocalDirectRunner
from apache_beam.options.pipeline_options import PipelineOptions

io._VECTOR_BYTES = int(sys.argv[2]) << 20
options = PipelineOptions(["--direct_running_mode", "in_memory", "--direct_num_workers", "1"])
with beam.Pipeline(runner=LocalDirectRunner(), options=options) as p:
    read = p | "Read" >> io.ReadRecordBatches(sys.argv[1], "tsv")
    rows = read.records | "Rows" >> beam.Map(lambda b: b.num_rows) | "Sum" >> beam.CombineGlobally(sum)
    rows | "Print" >> beam.Map(lambda n: print("rows", n, flush=True))  # the in-memory runner's stdout
"""


def run_once(tsv: str, vector_mb: int, pool: str):
    env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL=pool)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, tsv, str(vector_mb)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    if status != 0:
        raise RuntimeError(f"read floor run failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024.0, int(out.split("rows ")[-1].split()[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tsv", help="a headerless user<TAB>item file")
    src.add_argument("--zipf", type=float, help="write this many Zipf pairs to a temporary TSV first")
    ap.add_argument("--vector_mb", type=int, nargs="+", default=[16, 8, 4, 2])
    ap.add_argument("--pools", nargs="+", default=["mimalloc", "system"])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = None
    tsv = args.tsv
    if tsv is None:
        from benchmarks.bench_cli import write_zipf_tsv

        tmp = tempfile.NamedTemporaryFile(suffix=".tsv", delete=False)
        tmp.close()
        write_zipf_tsv(args.zipf, tmp.name)
        tsv = tmp.name
    try:
        print(f"{os.path.basename(tsv)}, median of {args.reps} run(s), {os.cpu_count()} cores\n")
        print("| allocator | check block | wall (s) | peak RSS (MB) | rows |")
        print("|---|---:|---:|---:|---:|")
        for pool in args.pools:
            for mb in args.vector_mb:
                runs = [run_once(tsv, mb, pool) for _ in range(args.reps)]
                wall = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                print(f"| {pool} | {mb} MB | {wall:.2f} | {rss:,.0f} | {runs[0][2]:,} |", flush=True)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)


if __name__ == "__main__":
    main()
