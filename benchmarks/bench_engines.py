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
  flink_cluster / spark_cluster   the standalone clusters of `.ci/engines.sh cluster up` (a JobManager
            and 2 TaskManagers / a master and 2 workers, each its own JVM; SDK workers of the cluster's
            worker pool, kept for the whole job); started here if they are not running (and stopped after)

For flink_cluster the engine's own metrics of each job are read from Flink's REST API: bytes and records
written by every task (all exchanges between operator chains), the bytes read through hash-partitioned
exchanges (the shuffles proper), the number of such shuffles and of broadcast edges (side inputs), the
largest mean record size of an exchange, and the job's own run time (wall time minus submission). Every
run also records the machine's busy CPU seconds (/proc/stat; run it on a quiet machine): every process of
the engine counts; before each run the bench waits (at most 2 minutes) until the CPUs were less than 15% busy
over 2 s, so that the SDK workers a cluster job leaves behind for up to a minute do not share the next run's
CPUs. The tables end with fits wall = fixed + marginal x millions of pairs, and the same for
CPU seconds, per algorithm and engine (docs/engines.md, "Measured here"; docs/scaling.md).

    .ci/engines.sh python -m benchmarks.bench_engines --engines direct flink_cluster \
        --algorithms basic mad2r mad_sips --sizes 4e6 16e6 64e6 --reps 1

Each job server is started once; every repetition is a fresh pipeline run. Prints a table of medians.
"""

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing.synthetic import (
    skew_chunks,
    skew_table_of_chunk,
    zipf_pair_count,
    zipf_table_of_chunk,
)

from tests.support import engines  # starts the job servers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USERS_PER_CHUNK = 10_000  # ~100k pairs per chunk, as bench_select.py


def run_once(algorithm, n_chunks, options, params, seed, table_of_chunk=None):
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "items")
        t0 = time.perf_counter()
        with beam.Pipeline(options=PipelineOptions(options)) as p:
            _ = (
                p
                | beam.Create(list(range(n_chunks)))
                | beam.Reshuffle()
                | beam.Map(table_of_chunk or functools.partial(zipf_table_of_chunk, users_per_chunk=USERS_PER_CHUNK))
                # Table(user, item), as the batched readers give
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


def cluster_for(engine, state):
    """The standalone cluster of ``engine``, started through .ci/engines.sh unless it runs already."""
    c = engines.Cluster(engine, state)
    if not c.alive():
        c.restore()
    return c


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq, steal); the difference over a run on a quiet machine is what the run cost in CPU, every
    process of the engine included (JVMs, SDK workers, the submitting client). 0 off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(busy_fraction: float = 0.15, window: float = 2.0, timeout: float = 120.0) -> float:
    """Waits until the machine's CPUs were busy less than ``busy_fraction`` of a ``window`` (seconds), at most
    ``timeout`` seconds; returns the seconds waited. A cluster's SDK worker processes outlive a job by up to
    a minute (engines.md): without this the run after a cluster job (the DirectRunner's, usually) shared the
    CPUs with their shutdown. Returns at once off Linux."""
    start = time.monotonic()
    cores = os.cpu_count() or 1
    while time.monotonic() - start < timeout:
        before = busy_cpu_seconds()
        if before == 0.0:
            break
        time.sleep(window)
        if (busy_cpu_seconds() - before) / (window * cores) < busy_fraction:
            break
    return time.monotonic() - start


def fit(points):
    """Least squares wall = fixed + marginal * x over (x, wall) points: (fixed, marginal); None below two sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    marginal, fixed = np.polyfit([x for x, _ in points], [y for _, y in points], 1)
    return float(fixed), float(marginal)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=["basic", "mad2r"])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 4e6], help="approximate numbers of pairs")
    ap.add_argument("--engines", nargs="+", default=["direct", "flink", "spark"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--skew",
        nargs=2,
        type=float,
        metavar=("HOT_USERS", "WHALE_ITEMS"),
        help="instead of Zipf --sizes: HOT_USERS users holding one item and one user with WHALE_ITEMS distinct items",
    )
    args = ap.parse_args()
    params = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    log_dir = tempfile.mkdtemp(prefix="bench-engines-")
    servers, pool, clusters = {}, None, {}
    state = engines.cluster_dir() or os.path.join(REPO, ".engines-cluster")
    started = []  # clusters this run started (stopped again at the end)
    try:
        for name in args.engines:
            engine = name.split("_")[0]
            if name.endswith("_cluster"):
                if not (os.path.exists(os.path.join(state, "ports.env")) and engines.Cluster(engine, state).alive()):
                    started.append(engine)
                clusters[engine] = cluster_for(engine, state)
                continue
            if engine != "direct" and engine not in servers:
                servers[engine] = engines.JobServer(engine, log_dir, max_failures=1).start()
            if name in ("flink", "spark") and pool is None:
                pool = WorkerPool(log_dir)

        def options(name):
            if name == "direct":
                return ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
            if name.endswith("_cluster"):
                return clusters[name.split("_")[0]].pipeline_args()
            server = servers[name.split("_")[0]]
            if name.endswith("_lb"):
                return server.pipeline_args("LOOPBACK")
            return server.pipeline_args("EXTERNAL", f"localhost:{pool.port}") + ["--sdk_worker_parallelism", "2"]

        rows, metrics, cpu_rows = [], [], []
        for size in [None] if args.skew else args.sizes:
            if args.skew:
                hot, whale = (int(x) for x in args.skew)
                n_chunks, n_pairs = skew_chunks(hot, whale), hot + whale
                table_of_chunk = functools.partial(skew_table_of_chunk, hot_users=hot, whale_items=whale)
            else:
                n_chunks = max(1, int(round(size / (USERS_PER_CHUNK * 10))))
                n_pairs, table_of_chunk = zipf_pair_count(n_chunks, USERS_PER_CHUNK), None
            for algorithm in args.algorithms:
                want = None
                for name in args.engines:
                    times, cpus = [], []
                    for rep in range(args.reps):
                        wait_for_quiet()
                        load = os.getloadavg()[0]
                        cpu0 = busy_cpu_seconds()
                        t, items = run_once(algorithm, n_chunks, options(name), params, args.seed, table_of_chunk)
                        cpus.append(busy_cpu_seconds() - cpu0)
                        if name == "flink_cluster":
                            metrics.append((algorithm, n_pairs, t, engines.flink_job_metrics(clusters["flink"])))
                        if want is None:
                            want = items
                        same = items == want
                        times.append(t)
                        print(
                            f"  {algorithm:6s} {n_pairs:>10,d} {name:9s} rep {rep + 1}: {t:7.1f}s  "
                            f"cpu {cpus[-1]:.0f}s  released {len(items)} "
                            f"{'' if same else 'DIFFERENT ITEMS'}  load {load:.1f}",
                            file=sys.stderr,
                            flush=True,
                        )
                        assert same, f"{name} released other items than the first engine"
                    rows.append((algorithm, n_pairs, name, statistics.median(times), times, len(want)))
                    cpu_rows.append((algorithm, n_pairs, name, statistics.median(cpus)))
    finally:
        for server in servers.values():
            server.stop()
        if pool:
            pool.stop()
        if started:
            subprocess.run(
                ["bash", engines.SCRIPT, "cluster", "down"], env=dict(os.environ, DP_ENGINES_CLUSTER_DIR=state)
            )
    print(
        f"\n{os.cpu_count()} cores; apache-beam {beam.__version__}; epsilon=1, delta=1e-5, Delta_0=100, "
        f"seed={args.seed}; median of {args.reps}; load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(
        "| algorithm | pairs | engine | median wall s | runs (s) | pairs/s | x DirectRunner | machine CPU s "
        "| CPU us / pair | released |"
    )
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    base = {(a, n): t for a, n, e, t, _, _ in rows if e == "direct"}
    cpu_of = {(a, n, e): c for a, n, e, c in cpu_rows}
    for a, n, e, t, times, k in rows:
        ratio = f"{t / base[(a, n)]:.1f}" if (a, n) in base else ""
        c = cpu_of[(a, n, e)]
        print(
            f"| {a} | {n:,} | {e} | {t:.1f} | {', '.join(f'{x:.1f}' for x in times)} | {n / t:,.0f} | {ratio} "
            f"| {c:.0f} | {c / n * 1e6:.1f} | {k} |"
        )
    print("\nFixed and marginal cost: least-squares fit = fixed + marginal x (millions of pairs), medians")
    print(
        "| algorithm | engine | fixed wall s | marginal wall s per 1M pairs "
        "| fixed CPU s | marginal CPU s per 1M pairs |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for a in args.algorithms:
        for e in args.engines:
            f = fit([(n / 1e6, t) for a2, n, e2, t, _, _ in rows if a2 == a and e2 == e])
            g = fit([(n / 1e6, c) for a2, n, e2, c in cpu_rows if a2 == a and e2 == e])
            if f and g:
                print(f"| {a} | {e} | {f[0]:.1f} | {f[1]:.2f} | {g[0]:.1f} | {g[1]:.2f} |")
    if metrics:
        print("\nFlink cluster, the engine's metrics per run (REST API of the JobManager)")
        print(
            "| algorithm | pairs | wall s | job s | vertices | shuffles (hash) | broadcasts | bytes written / pair "
            "| records written / 1M pairs | bytes shuffled / pair | records shuffled / 1M pairs "
            "| largest mean record B |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for a, n, t, m in metrics:
            print(
                f"| {a} | {n:,} | {t:.1f} | {m['job_seconds']:.1f} | {m['vertices']} | {m['shuffles']} | "
                f"{m['broadcasts']} | {m['written_bytes'] / n:.1f} | {m['written_records'] / n * 1e6:,.0f} | "
                f"{m['shuffled_bytes'] / n:.1f} | {m['shuffled_records'] / n * 1e6:,.0f} | "
                f"{m['largest_mean_record']:,.0f} |"
            )


if __name__ == "__main__":
    main()
