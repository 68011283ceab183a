"""Wall time of partition selection on embedded Flink and Spark (parallelism 2) next to the DirectRunner.

    .ci/engines.sh setup
    .ci/engines.sh python -m benchmarks.bench_engines                       # basic, mad2r; 1M, 4M pairs; 3 reps
    .ci/engines.sh python -m benchmarks.bench_engines --sizes 1e6 --reps 1 --engines direct flink

Same pipeline as benchmarks/bench_select.py: Zipf(1.1) pairs generated inside the pipeline from chunk
ids (10 pairs per user on average), epsilon = 1, delta = 1e-5, Delta_0 = 100, seed fixed, so every
engine must release the same items (checked against the DirectRunner's). Runs in .venv-engines
(apache-beam of the job servers). Engines:

  direct    DirectRunner, in_memory (one process)
  flink     Flink job server, embedded cluster, --parallelism 2; SDK workers: an EXTERNAL worker pool
            with --sdk_worker_parallelism 2 (2 Python processes, as 2 task slots of a cluster have)
  spark     Spark job server, local[2]; same SDK workers
  flink_lb / spark_lb   the same with --environment_type LOOPBACK (the SDK worker is a thread pool in
            the submitting process: one Python interpreter, GIL-bound)

Each job server is started once; every repetition is a fresh pipeline run. Prints a table of medians.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing.synthetic import zipf_pair_count, zipf_table_of_chunk

from tests.support import engines  # starts the job servers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USERS_PER_CHUNK = 10_000  # ~100k pairs per chunk, as bench_select.py


def run_once(algorithm, n_chunks, options, params, seed):
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "items")
        t0 = time.perf_counter()
        with beam.Pipeline(options=PipelineOptions(options)) as p:
            _ = (
                p
                | beam.Create(list(range(n_chunks)))
                | beam.Reshuffle()
                | beam.Map(zipf_table_of_chunk, USERS_PER_CHUNK)  # Table(user, item), as the batched readers give
                | SelectPartitions(algorithm, params, seed=seed)  # item
                | beam.io.WriteToText(prefix)
            )
        elapsed = time.perf_counter() - t0
        items = set()
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                items.update(line.rstrip("\n") for line in f)
    return elapsed, items


class WorkerPool:
    """Beam's SDK worker pool: each SDK worker a separate Python process (EXTERNAL environment)."""

    def __init__(self, log_dir):
        self.port = engines.free_port()
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        self.log = open(os.path.join(log_dir, "worker-pool.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={self.port}"],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=engines.die_with_parent,
        )
        time.sleep(3)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=["basic", "mad2r"])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 4e6], help="approximate numbers of pairs")
    ap.add_argument("--engines", nargs="+", default=["direct", "flink", "spark"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    params = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    log_dir = tempfile.mkdtemp(prefix="bench-engines-")
    servers, pool = {}, None
    try:
        for name in args.engines:
            engine = name.split("_")[0]
            if engine != "direct" and engine not in servers:
                servers[engine] = engines.JobServer(engine, log_dir, max_failures=1).start()
            if name in ("flink", "spark") and pool is None:
                pool = WorkerPool(log_dir)

        def options(name):
            if name == "direct":
                return ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
            server = servers[name.split("_")[0]]
            if name.endswith("_lb"):
                return server.pipeline_args("LOOPBACK")
            return server.pipeline_args("EXTERNAL", f"localhost:{pool.port}") + ["--sdk_worker_parallelism", "2"]

        rows = []
        for size in args.sizes:
            n_chunks = max(1, int(round(size / (USERS_PER_CHUNK * 10))))
            n_pairs = zipf_pair_count(n_chunks, USERS_PER_CHUNK)
            for algorithm in args.algorithms:
                want = None
                for name in args.engines:
                    times = []
                    for rep in range(args.reps):
                        load = os.getloadavg()[0]
                        t, items = run_once(algorithm, n_chunks, options(name), params, args.seed)
                        if want is None:
                            want = items
                        same = items == want
                        times.append(t)
                        print(
                            f"  {algorithm:6s} {n_pairs:>10,d} {name:9s} rep {rep + 1}: {t:7.1f}s  "
                            f"released {len(items)} {'' if same else 'DIFFERENT ITEMS'}  load {load:.1f}",
                            file=sys.stderr,
                            flush=True,
                        )
                        assert same, f"{name} released other items than the first engine"
                    rows.append((algorithm, n_pairs, name, statistics.median(times), times, len(want)))
    finally:
        for server in servers.values():
            server.stop()
        if pool:
            pool.stop()
    print(
        f"\n{os.cpu_count()} cores; apache-beam {beam.__version__}; epsilon=1, delta=1e-5, Delta_0=100, "
        f"seed={args.seed}; median of {args.reps}; load average at the end {os.getloadavg()[0]:.1f}"
    )
    print("| algorithm | pairs | engine | median wall s | runs (s) | pairs/s | x DirectRunner | released |")
    print("|---|---:|---|---:|---|---:|---:|---:|")
    base = {(a, n): t for a, n, e, t, _, _ in rows if e == "direct"}
    for a, n, e, t, times, k in rows:
        ratio = f"{t / base[(a, n)]:.1f}" if (a, n) in base else ""
        print(
            f"| {a} | {n:,} | {e} | {t:.1f} | {', '.join(f'{x:.1f}' for x in times)} | {n / t:,.0f} | {ratio} | {k} |"
        )


if __name__ == "__main__":
    main()
