"""Soak benchmark: MAD2R on millions of synthetic pairs in DirectRunner multi_processing mode.

    .venv/bin/python -m benchmarks.explore.soak_mad2r --pairs 1000000,10000000 [--workers 2]

For each size, runs the pipeline in a child process under ``/usr/bin/time -v`` (GNU time; Debian
package ``time``) and prints a table: pairs, wall time, throughput, GNU time's maximum resident set
size (the largest single process of the job: the runner or one worker) and the peak of the summed
RSS of the whole process tree (runner + SDK workers), sampled every 0.5 s from /proc.

The pairs are generated inside the pipeline (a few chunk ids are created, each expanded on a worker
by :func:`transforms.testing.synthetic.zipf_pairs_of_chunk`: Zipf(1.1) items over 1M ranks, mean degree 10),
never materialised by ``beam.Create``.

What bounds memory: our transforms hold O(Delta_0) per user (bottom-k subsample) and O(1) per item
(combiner-lifted sums); no stage holds the dataset. The DirectRunner, however, is a local test
runner: its FnApiRunner keeps every shuffled PCollection of a stage in the runner process' memory,
so on the DirectRunner peak memory grows with the data (the table shows by how much). On
Dataflow/Flink the shuffle is external and per-worker memory is bounded by the bundle size.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEAN_DEGREE = 10
USERS_PER_CHUNK = 20_000


def run_child(pairs: int, workers: int, out_dir: str) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dp_partition_beam.privacy.selection import SelectionParams
    from dp_partition_beam.transforms.selection.select import SelectPartitions
    from dp_partition_beam.transforms.testing.synthetic import zipf_pairs_of_chunk

    n_users = max(1, pairs // MEAN_DEGREE)
    chunks = max(1, n_users // USERS_PER_CHUNK)
    per_chunk = n_users // chunks
    options = PipelineOptions(
        ["--runner=DirectRunner", "--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    )
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | "Chunks" >> beam.Create(list(range(chunks)))  # chunk id
            | "Spread" >> beam.Reshuffle()  # chunk id, spread over workers
            | "Generate" >> beam.FlatMap(zipf_pairs_of_chunk, per_chunk, MEAN_DEGREE)  # (user, item)
            | "MAD2R" >> SelectPartitions("mad2r", SelectionParams(1.0, 1e-5, max_contributions=100))  # item
            | "Count" >> beam.combiners.Count.Globally()  # released (a DP count)
            | "Write" >> beam.io.WriteToText(os.path.join(out_dir, "released_count"))
        )


def _tree_rss_kb(root: int) -> int:
    """Sum of VmRSS (kB) over ``root`` and its descendants, from /proc."""
    parent = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = {root}, [root]
    while frontier:
        nxt = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update(nxt)
        frontier = nxt
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as f:
                m = re.search(r"VmRSS:\s+(\d+)", f.read())
                total += int(m.group(1)) if m else 0
        except OSError:
            pass
    return total


def measure(pairs: int, workers: int) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as out_dir:
        cmd = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            "-m",
            "benchmarks.explore.soak_mad2r",
            "--child",
            str(pairs),
            "--workers",
            str(workers),
            "--out",
            out_dir,
        ]
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
                done.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        done.set()
        sampler.join()
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({proc.returncode}):\n{err[-3000:]}")
        maxrss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
        elapsed = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err).group(1)
        released = open(os.path.join(out_dir, "released_count-00000-of-00001")).read().strip()
    return {
        "pairs": pairs,
        "wall_s": wall,
        "time_elapsed": elapsed,
        "maxrss_mb": maxrss / 1024,
        "tree_peak_mb": peak[0] / 1024,
        "released": released,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="1000000,10000000", help="comma-separated sizes (approximate pairs)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        run_child(args.child, args.workers, args.out)
        return 0
    if not os.path.exists("/usr/bin/time"):
        sys.exit("needs GNU time at /usr/bin/time (Debian/Ubuntu: apt-get install time)")
    print(f"mad2r, DirectRunner multi_processing, {args.workers} workers, epsilon 1, delta 1e-5, Delta_0 100")
    print("| pairs | wall s | pairs/s | max RSS one process (MB, time -v) | peak RSS process tree (MB) | released |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.pairs.split(",")):
        r = measure(n, args.workers)
        print(
            f"| {n:,} | {r['wall_s']:.0f} | {n / r['wall_s']:,.0f} | {r['maxrss_mb']:.0f} | "
            f"{r['tree_peak_mb']:.0f} | {r['released']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
