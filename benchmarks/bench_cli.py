"""Whole commands on one TSV: our CLI (basic, MAD-SIPS) against PipelineDP and OpenDP, wall time and peak RSS.

    .venv/bin/python -m benchmarks.bench_cli --zipf 4e6 --reps 3          # writes a 4M-pair Zipf TSV first
    .venv/bin/python -m benchmarks.bench_cli --tsv pairs.tsv --tools basic mad_sips

What a user pays (issue 31's table): each tool runs as its own process on the same headerless
``user<TAB>item`` file at the same (epsilon, delta, Delta_0), timed from outside (wall clock around the
process; peak RSS from the kernel's accounting of that process, ``os.wait4``), imports and start-up included:

  basic, mad_sips   ``dp-select-partitions --algorithm A --direct_running_mode in_memory --seed 1``
  pdp_gaussian      PipelineDP's Gaussian-thresholding ``select_partitions`` (benchmarks/peers.py) in a
                    Beam pipeline that reads the same file with ``ReadFromText`` on the same pinned
                    in-memory DirectRunner (``--pdp``, below)
  opendp_gaussian   ``python -m benchmarks.peer_opendp`` (OpenDP's Polars key release, one process)

``--zipf N`` writes N pairs (200,000 users per 4M pairs: degrees 1 + Geometric with mean 20, Zipf(1.1)
items, transforms/testing/synthetic.py) to a temporary file that is removed afterwards. The table gives
the median over ``--reps`` runs of each tool (one after the other, round robin) and ratios to basic.
Needs the bench extra for the peers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TOOLS = ("basic", "mad_sips", "pdp_gaussian", "opendp_gaussian")
USERS_PER_CHUNK = 10_000
MEAN_DEGREE = 20.0


def write_zipf_tsv(pairs: float, path: str) -> int:
    """``pairs`` Zipf (user, item) rows (chunks of 10,000 users of mean degree 20) as a headerless TSV."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from dp_partition_beam.transforms.testing.synthetic import zipf_table_of_chunk

    n_chunks = max(1, int(round(pairs / (USERS_PER_CHUNK * MEAN_DEGREE))))
    table = pa.concat_tables(
        [zipf_table_of_chunk(c, USERS_PER_CHUNK, mean_degree=MEAN_DEGREE) for c in range(n_chunks)]
    )
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    pcsv.write_csv(table, path, write_options=options)
    return table.num_rows


def command(tool: str, tsv: str, out: str, epsilon: float, delta: float, k: int):
    common = ["--epsilon", str(epsilon), "--delta", str(delta), "--max_contributions", str(k)]
    bindir = os.path.dirname(sys.executable)
    if tool in ("basic", "mad_sips"):
        return [
            os.path.join(bindir, "dp-select-partitions"),
            *("--input", tsv, "--input_format", "tsv", "--algorithm", tool, "--seed", "1"),
            *("--output", os.path.join(out, "items"), "--report", os.path.join(out, "report.json")),
            *("--direct_running_mode", "in_memory", "--progress_interval", "0", "--overwrite", *common),
        ]
    if tool == "pdp_gaussian":
        return [sys.executable, "-m", "benchmarks.bench_cli", "--pdp", tsv, "--out", out, *common]
    if tool == "opendp_gaussian":
        return [sys.executable, "-m", "benchmarks.peer_opendp", tsv, "--output", os.path.join(out, "items"), *common]
    raise ValueError(f"tool must be one of {', '.join(TOOLS)}, got {tool!r}")


def released(out: str) -> int:
    names = [n for n in os.listdir(out) if n.startswith("items")]
    return sum(sum(1 for _ in open(os.path.join(out, n))) for n in names)


def timed(argv, env=None) -> tuple:
    """(wall seconds, peak RSS MB of the process, exit code) of one run of ``argv`` (environment ``env``, by
    default this process's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.stderr.write(stderr.decode(errors="replace")[-2000:])
    return wall, usage.ru_maxrss / 1024.0, code


def pdp_main(tsv: str, out: str, epsilon: float, delta: float, k: int) -> int:
    """PipelineDP's Gaussian thresholding on the TSV, on the pinned in-memory DirectRunner."""
    import apache_beam as beam

    from benchmarks.peers import PipelineDPSelect
    from dp_partition_beam.pipelines import runner

    p = runner.make_pipeline(runner.pipeline_options(["--direct_running_mode", "in_memory"]))
    _ = (
        p
        | "Read" >> beam.io.ReadFromText(tsv)
        | "Split" >> beam.Map(lambda line: tuple(line.split("\t", 1)))  # (user, item)
        | "Select" >> PipelineDPSelect("pdp_gaussian", epsilon, delta, k)  # item
        | "Write" >> beam.io.WriteToText(os.path.join(out, "items"))
    )
    runner.run(p).wait_until_finish()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--tsv", help="headerless user<TAB>item file")
    src.add_argument("--zipf", type=float, help="write this many Zipf pairs to a temporary TSV first")
    src.add_argument("--pdp", help=argparse.SUPPRESS)  # one PipelineDP run on this TSV (a subprocess of ours)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--max_contributions", type=int, default=100)
    args = ap.parse_args(argv)
    if args.pdp:
        return pdp_main(args.pdp, args.out, args.epsilon, args.delta, args.max_contributions)
    if not (args.tsv or args.zipf):
        ap.error("give --tsv PATH or --zipf N")
    with tempfile.TemporaryDirectory() as tmp:
        tsv = args.tsv
        if args.zipf:
            tsv = os.path.join(tmp, "pairs.tsv")
            n = write_zipf_tsv(args.zipf, tsv)
            print(f"wrote {n:,} Zipf pairs to {tsv} ({os.path.getsize(tsv) / 1e6:.0f} MB)", flush=True)
        runs = {t: [] for t in args.tools}
        items = {}
        for rep in range(args.reps):
            for tool in args.tools:
                out = os.path.join(tmp, f"{tool}-{rep}")
                os.makedirs(out)
                wall, rss, code = timed(command(tool, tsv, out, args.epsilon, args.delta, args.max_contributions))
                if code != 0:
                    print(f"{tool}: exit {code}", flush=True)
                    return 1
                runs[tool].append((wall, rss))
                items[tool] = released(out)
                print(f"  {tool:16s} rep {rep + 1}: {wall:7.2f} s  {rss:6.0f} MB  {items[tool]:,} items", flush=True)
        med = {t: (statistics.median(w for w, _ in r), statistics.median(m for _, m in r)) for t, r in runs.items()}
        base = med.get("basic", (None,))[0]
        print(
            f"\n{os.path.basename(tsv)}, epsilon {args.epsilon:g}, delta {args.delta:g}, Delta_0 "
            f"{args.max_contributions}, median of {args.reps} run(s) per tool, {os.cpu_count()} cores\n"
        )
        print("| tool | wall (s) | peak RSS (MB) | released | wall / basic |")
        print("|---|---:|---:|---:|---:|")
        for t, (wall, rss) in med.items():
            ratio = f"{wall / base:.2f}" if base else ""
            print(f"| {t} | {wall:.1f} | {rss:,.0f} | {items[t]:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
