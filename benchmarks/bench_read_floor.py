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
import sys
import tempfile

from benchmarks.bench_cli import timed, write_zipf_tsv

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
    rows | "Write" >> beam.Map(lambda n: open(sys.argv[3], "w").write(str(n)))  # in_memory: this process
"""


def run_once(tsv: str, vector_mb: int, pool: str, count_path: str):
    """(wall s, peak RSS MB, rows read) of one reading run in a fresh process (bench_cli.timed)."""
    argv = [sys.executable, "-c", _CHILD, tsv, str(vector_mb), count_path]
    if os.path.exists(count_path):
        os.unlink(count_path)  # an earlier run's count must not stand in for this one's
    wall, rss, code = timed(argv, env=dict(os.environ, ARROW_DEFAULT_MEMORY_POOL=pool))
    if code != 0:
        raise RuntimeError(f"the read floor run ({pool}, {vector_mb} MB blocks) exited with {code}")
    with open(count_path, encoding="utf-8") as f:
        return wall, rss, int(f.read())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tsv", help="a headerless user<TAB>item file")
    src.add_argument("--zipf", type=float, help="write this many Zipf pairs to a temporary TSV first")
    ap.add_argument("--vector_mb", type=int, nargs="+", default=[16, 8, 4, 2])
    ap.add_argument("--pools", nargs="+", default=["mimalloc", "system"])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tsv = args.tsv
        if tsv is None:
            tsv = os.path.join(tmp, "pairs.tsv")
            write_zipf_tsv(args.zipf, tsv)
        print(f"{os.path.basename(tsv)}, median of {args.reps} run(s), {os.cpu_count()} cores\n")
        print("| allocator | check block | wall (s) | peak RSS (MB) | rows |")
        print("|---|---:|---:|---:|---:|")
        count_path = os.path.join(tmp, "rows")
        for pool in args.pools:
            for mb in args.vector_mb:
                runs = [run_once(tsv, mb, pool, count_path) for _ in range(args.reps)]
                wall = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                print(f"| {pool} | {mb} MB | {wall:.2f} | {rss:,.0f} | {runs[0][2]:,} |", flush=True)


if __name__ == "__main__":
    main()
