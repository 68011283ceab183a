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

``--distinct_per_pair F`` (0 < F <= 1, e.g. 0.0275 as Common Crawl in the MAD paper, or 0.2) replaces the
Zipf input by one with F x pairs distinct items at every size (the Zipf input's fixed vocabulary of 10^6
items gives fewer and fewer per pair: 0.043 at 16M pairs). :func:`distinct_items`: the pair at position t of
one global sequence is a new item every 1/F positions (exactly floor(F (N - 1)) + 1 distinct items in N
pairs); every other pair repeats an item born before it, the r-th born with probability ~ r^-1.1 (a
discretised power law over the items born so far): a Zipf head whose top item is in 7-12% of the pairs and
a long tail that grows with the pairs (at 16M pairs 34% of the items are in one pair only for F = 0.0275,
76% for F = 0.2). Chunks of exactly 100,000 pairs (so ``--sizes`` is rounded to a multiple of it), users of
1 + Geometric degrees (mean 10) as the Zipf input's; deterministic in ``--seed`` (which also seeds the
selection), the same rows however the positions are cut into chunks. Without the option the input is the
Zipf one of earlier tables.

Peak memory: while each run lasts, a thread samples every 0.5 s the processes of the run (the launcher, i.e.
the bench's own process, and every process below it or below the cluster's components: job servers, the
worker pool, SDK workers, JVMs), classified by command line (:func:`classify`), and keeps per process the
largest VmHWM / VmRSS of /proc/PID/status (VmHWM reset at the start of the run through
/proc/PID/clear_refs, so a long-lived TaskManager's peak is this run's; VmRSS for what exits between
samples). The table shows the launcher's, the largest SDK worker's and the largest JVM's peak (MB = 2^20
bytes; median of the reps, each run's in parentheses; "-" where the engine has none: the DirectRunner and
LOOPBACK run the SDK in the launcher). ``--json PATH`` writes every run (times, CPU, released, the peaks
of every process) to PATH, rewritten after each run.

    python -m benchmarks.bench_engines --engines direct --sizes 2e5 --reps 1 --distinct_per_pair 0.2 \
        --algorithms mad_sips --json /tmp/engines.json
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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
PAIRS_PER_CHUNK = 100_000  # pairs per chunk of the --distinct_per_pair input (exactly)
MEAN_DEGREE = 10.0
REPEAT_EXPONENT = 1.1  # the power law of the repeated items' birth ranks (as the Zipf input's exponent)


# --- the --distinct_per_pair input: pure functions of (positions, F, seed) -----------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise on a uint64 array (wraps around, as it should)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def position_uniforms(seed: int, positions: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per position, a hash of (seed, position): the same for a position whichever
    chunk draws it (a counter-based generator, unlike numpy's sequential ones)."""
    key = _splitmix64(np.array([seed % 2**64], dtype=np.uint64))
    h = _splitmix64(np.asarray(positions).astype(np.uint64) ^ key)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _check_fraction(distinct_per_pair: float) -> float:
    f = float(distinct_per_pair)
    if not 0.0 < f <= 1.0:
        raise ValueError(f"distinct_per_pair must be in (0, 1], not {distinct_per_pair}")
    return f


def distinct_items(
    start: int, stop: int, distinct_per_pair: float, seed: int = 0, exponent: float = REPEAT_EXPONENT
) -> np.ndarray:
    """Item ids (int64) of the pairs at positions ``start..stop-1`` of the --distinct_per_pair sequence.

    Position t is the birth of item floor(F t) when that is larger than floor(F (t - 1)) (and t = 0 is
    item 0's): every 1/F positions a new item, exactly :func:`distinct_item_count` of them in the first
    N positions. Any other position repeats one of the K = floor(F (t - 1)) + 1 items born before it, the
    r-th born (r = 1..K) with probability ~ r^-exponent (the inverse CDF of a power law on [1, K + 1),
    floored, of one uniform of :func:`position_uniforms`). Position t needs nothing but t: any cut of the
    positions into chunks gives the same items, and no chunk holds more than its own positions.
    """
    f = _check_fraction(distinct_per_pair)
    t = np.arange(start, stop, dtype=np.int64)
    born = np.floor(f * t).astype(np.int64)
    before = np.floor(f * (t - 1)).astype(np.int64)  # id of the last item born before t (-1 at t = 0)
    birth = (t == 0) | (born > before)
    k = np.maximum(before + 1, 1)  # items born before t
    a = 1.0 - exponent
    u = position_uniforms(seed, t)
    if abs(a) < 1e-12:  # exponent 1: density 1/x, CDF log x / log(K + 1)
        x = np.exp(u * np.log(k + 1.0))
    else:
        x = (1.0 - u * (1.0 - (k + 1.0) ** a)) ** (1.0 / a)
    rank = np.clip(np.floor(x).astype(np.int64), 1, k)
    return np.where(birth, born, rank - 1)


def distinct_item_count(n_pairs: int, distinct_per_pair: float) -> int:
    """Distinct items of the first ``n_pairs`` positions of :func:`distinct_items` (the same arithmetic)."""
    f = _check_fraction(distinct_per_pair)
    if n_pairs <= 0:
        return 0
    return int(np.floor(f * np.array([n_pairs - 1], dtype=np.int64))[0]) + 1


def distinct_users_of_chunk(
    chunk: int, pairs_per_chunk: int = PAIRS_PER_CHUNK, mean_degree: float = MEAN_DEGREE, seed: int = 0
) -> np.ndarray:
    """User id (int64) of each of the chunk's ``pairs_per_chunk`` pairs: users of 1 + Geometric degrees
    (mean ``mean_degree``), ids ``chunk * pairs_per_chunk + j`` (unique across chunks), the last user's
    degree cut where the chunk ends."""
    rng = np.random.default_rng([seed % 2**63, chunk])
    degrees = np.zeros(0, dtype=np.int64)
    while degrees.sum() < pairs_per_chunk:
        more = int((pairs_per_chunk - degrees.sum()) / mean_degree * 1.1) + 16
        degrees = np.concatenate([degrees, np.maximum(rng.geometric(1.0 / mean_degree, size=more), 1)])
    users = np.repeat(np.arange(len(degrees), dtype=np.int64), degrees)[:pairs_per_chunk]
    return users + chunk * pairs_per_chunk


def distinct_table_of_chunk(
    chunk: int,
    distinct_per_pair: float,
    pairs_per_chunk: int = PAIRS_PER_CHUNK,
    mean_degree: float = MEAN_DEGREE,
    seed: int = 0,
):
    """Table(user, item) of the chunk's pairs (positions ``chunk * pairs_per_chunk`` onwards): users
    ``u<id>`` of :func:`distinct_users_of_chunk`, items ``w<id>`` of :func:`distinct_items`. A user's
    repeated items are kept (BoundContributions removes them), as the Zipf input's."""
    import pyarrow as pa
    import pyarrow.compute as pc

    start = chunk * pairs_per_chunk
    users = distinct_users_of_chunk(chunk, pairs_per_chunk, mean_degree, seed)
    items = distinct_items(start, start + pairs_per_chunk, distinct_per_pair, seed)
    return pa.table(
        {
            "user": pc.binary_join_element_wise("u", pc.cast(pa.array(users), pa.string()), ""),
            "item": pc.binary_join_element_wise("w", pc.cast(pa.array(items), pa.string()), ""),
        }
    )


def input_plan(size=None, distinct_per_pair=None, skew=None, seed=0):
    """(chunks, pairs, table_of_chunk, distinct items or None) of one input: the skew instance, the
    --distinct_per_pair input of about ``size`` pairs, or (neither given) the Zipf input of about ``size``
    pairs of earlier tables (``table_of_chunk`` None: :func:`run_once`'s default)."""
    if skew:
        hot, whale = (int(x) for x in skew)
        table_of_chunk = functools.partial(skew_table_of_chunk, hot_users=hot, whale_items=whale)
        return skew_chunks(hot, whale), hot + whale, table_of_chunk, None
    if distinct_per_pair is not None:
        # By its module's name, not __main__'s: the pipeline pickles the function by reference, and the SDK
        # workers import it (the repository is on their path, as tests.support is).
        from benchmarks.bench_engines import distinct_table_of_chunk as table_of_distinct_chunk

        n_chunks = max(1, int(round(size / PAIRS_PER_CHUNK)))
        n_pairs = n_chunks * PAIRS_PER_CHUNK
        table_of_chunk = functools.partial(
            table_of_distinct_chunk, distinct_per_pair=_check_fraction(distinct_per_pair), seed=seed
        )
        return n_chunks, n_pairs, table_of_chunk, distinct_item_count(n_pairs, distinct_per_pair)
    n_chunks = max(1, int(round(size / (USERS_PER_CHUNK * MEAN_DEGREE))))
    return n_chunks, zipf_pair_count(n_chunks, USERS_PER_CHUNK), None, None


# --- peak RSS per process: /proc/PID/status, sampled in a thread while a run lasts ---------------------

PROC = "/proc"
SDK_WORKER_MARKERS = ("sdk_worker_main", "apache_beam.runners.worker.sdk_worker", "SdkHarness(")
WORKER_POOL_MARKERS = ("worker_pool_main", "tests.support.worker_pool")
JVM_ROLES = (  # (main class or jar of the command line, role)
    ("TaskManagerRunner", "flink-taskmanager"),
    ("StandaloneSessionClusterEntrypoint", "flink-jobmanager"),
    ("FlinkJobServerDriver", "flink-job-server"),
    ("SparkJobServerDriver", "spark-job-server"),
    ("org.apache.spark.deploy.master.Master", "spark-master"),
    ("org.apache.spark.deploy.worker.Worker", "spark-worker"),
    ("CoarseGrainedExecutorBackend", "spark-executor"),
)


def classify(cmdline) -> str:
    """What a process is, from its command line (the list of its arguments): ``"sdk_worker"`` (a Python
    SDK harness: ``sdk_worker_main``, or the ``python -c "...sdk_worker import SdkHarness; ..."`` a worker
    pool starts), ``"worker_pool"`` (Beam's pool or tests/support/worker_pool.py), ``"jvm"`` (``java``:
    job servers, Flink's JobManager and TaskManagers, Spark's master, workers and executors) or
    ``"other"`` (a shell, the bench itself, a kernel thread's empty command line)."""
    args = [str(a) for a in (cmdline or [])]
    if not args:
        return "other"
    exe = os.path.basename(args[0])
    text = " ".join(args)
    if exe == "java":
        return "jvm"
    if exe.startswith("python"):
        if any(m in text for m in SDK_WORKER_MARKERS):
            return "sdk_worker"
        if any(m in text for m in WORKER_POOL_MARKERS):
            return "worker_pool"
    return "other"


def jvm_role(cmdline) -> str:
    """The component a JVM's command line runs (``"flink-taskmanager"``, ...; ``"jvm"`` if none known)."""
    text = " ".join(str(a) for a in (cmdline or []))
    return next((role for marker, role in JVM_ROLES if marker in text), "jvm")


def parse_status(text: str) -> dict:
    """Name, PPid, VmHWM and VmRSS (kB, None where absent: kernel threads, zombies) of /proc/PID/status."""
    out = {"name": None, "ppid": None, "vmhwm_kb": None, "vmrss_kb": None}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Name":
            out["name"] = value.strip()
        elif key == "PPid":
            out["ppid"] = int(value)
        elif key in ("VmHWM", "VmRSS"):
            out[key.lower() + "_kb"] = int(value.split()[0])
    return out


def read_status(pid: int, proc: str = PROC):
    """:func:`parse_status` of a process; None if it is gone (or unreadable)."""
    try:
        with open(os.path.join(proc, str(pid), "status"), encoding="utf-8", errors="replace") as f:
            return parse_status(f.read())
    except OSError:
        return None


def read_cmdline(pid: int, proc: str = PROC) -> list:
    """The process's arguments ([] if it is gone, or a kernel thread)."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def read_stat(pid: int, proc: str = PROC):
    """(ppid, start time in clock ticks since boot) from /proc/PID/stat; None if the process is gone."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces and parentheses
    return int(fields[1]), int(fields[19])


def descendants(parents: dict, roots) -> set:
    """The roots that exist in ``parents`` (pid -> ppid) and every process below them."""
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    seen = set()
    todo = [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return seen


def reset_peak(pid: int, proc: str = PROC) -> bool:
    """Resets the process's VmHWM to its current VmRSS (writes 5 to /proc/PID/clear_refs, Linux 4.0+);
    whether it could."""
    try:
        with open(os.path.join(proc, str(pid), "clear_refs"), "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _mb(kb):
    return None if kb is None else kb / 1024.0


class RssSampler:
    """Peak RSS of every process of a run, by kind (:func:`classify`): the launcher (this process), the
    processes below it (job servers, the worker pool and its SDK workers) and below ``roots`` (a standalone
    cluster's components, which .ci/engines.sh starts outside this process's tree).

    :meth:`start` resets the VmHWM of the processes present (their peak from now on), then a thread reads
    /proc/PID/status of every one of them every ``interval`` seconds and keeps max(VmHWM, VmRSS) per
    process (VmHWM covers the peaks between samples; a process that exits between two samples keeps the
    last seen). A process whose VmHWM could not be reset counts its VmRSS samples only. Processes are told
    apart by (pid, start time); one that execs anew (a forked child becoming a JVM) starts again from 0.
    """

    def __init__(self, roots=(), interval: float = 0.5, proc: str = PROC, launcher: int | None = None):
        self.launcher = os.getpid() if launcher is None else launcher
        self.roots = {self.launcher, *(int(r) for r in roots if r)}
        self.interval = interval
        self.proc = proc
        self.processes = {}  # (pid, start time) -> record
        self._stat = {}  # pid -> (ppid, start time), read when the pid first appears
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> "RssSampler":
        self.scan(initial=True)
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.scan()
        return self.summary()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.scan()

    def scan(self, initial: bool = False) -> None:
        """One pass: finds the run's processes (new pids' /proc/PID/stat only) and samples each."""
        try:
            pids = {int(d) for d in os.listdir(self.proc) if d.isdigit()}
        except OSError:
            return
        for pid in list(self._stat):
            if pid not in pids:
                del self._stat[pid]
        for pid in pids - self._stat.keys():
            stat = read_stat(pid, self.proc)
            if stat:
                self._stat[pid] = stat
        parents = {pid: ppid for pid, (ppid, _) in self._stat.items()}
        for pid in descendants(parents, self.roots):
            self._sample(pid, self._stat[pid][1], initial)

    def _sample(self, pid: int, started: int, initial: bool) -> None:
        key = (pid, started)
        rec = self.processes.get(key)
        cmdline = None
        if rec is None or rec["kind"] == "other":  # a forked child may exec later: read it until it is known
            cmdline = read_cmdline(pid, self.proc)
        if rec is None or (cmdline is not None and cmdline != rec["cmdline"]):
            kind = "launcher" if pid == self.launcher else classify(cmdline)
            rec = self.processes[key] = {
                "pid": pid,
                "kind": kind,
                "role": jvm_role(cmdline) if kind == "jvm" else kind,
                "cmdline": cmdline,
                "peak_kb": 0,
                "hwm_valid": reset_peak(pid, self.proc) if initial else True,
                "samples": 0,
            }
        status = read_status(pid, self.proc)
        if not status or status["vmrss_kb"] is None:
            return
        seen = [status["vmrss_kb"]]
        if rec["hwm_valid"] and status["vmhwm_kb"] is not None:
            seen.append(status["vmhwm_kb"])
        rec["peak_kb"] = max(rec["peak_kb"], *seen)
        rec["samples"] += 1

    def summary(self) -> dict:
        """Peaks in MB (2^20 bytes): the launcher's, the largest per kind (None: no such process), how many
        processes of each kind, and every process (largest first)."""
        recs = [r for r in self.processes.values() if r["samples"]]

        def largest(kind):
            return _mb(max((r["peak_kb"] for r in recs if r["kind"] == kind), default=None))

        return {
            "launcher_mb": largest("launcher"),
            "sdk_worker_mb": largest("sdk_worker"),
            "jvm_mb": largest("jvm"),
            "worker_pool_mb": largest("worker_pool"),
            "counts": {k: sum(r["kind"] == k for r in recs) for k in ("sdk_worker", "jvm", "worker_pool", "other")},
            "processes": [
                {
                    "pid": r["pid"],
                    "kind": r["kind"],
                    "role": r["role"],
                    "peak_mb": round(_mb(r["peak_kb"]), 1),
                    "hwm_valid": r["hwm_valid"],
                    "cmd": " ".join(r["cmdline"] or [])[:300],
                }
                for r in sorted(recs, key=lambda r: -r["peak_kb"])
            ],
        }


def cluster_roots(cluster) -> list:
    """Pids of a standalone cluster's components and its worker pool (the roots of its process trees)."""
    return [p for p in (cluster.pid(c) for c in (*cluster.components(), "sdk-worker-pool")) if p]


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


def _peak_cell(values) -> str:
    """Median of the runs' peaks (MB), each run's in parentheses when there are several; "-" if none."""
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    cell = f"{statistics.median(got):,.0f}"
    return cell + (f" ({', '.join(f'{v:,.0f}' for v in values if v is not None)})" if len(values) > 1 else "")


def _mb_text(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


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
    ap.add_argument(
        "--distinct_per_pair",
        type=float,
        metavar="F",
        help="instead of the Zipf input: F x pairs distinct items (0 < F <= 1; e.g. 0.0275, Common Crawl's), "
        f"a power-law head and a tail growing with the pairs, chunks of {PAIRS_PER_CHUNK:,} pairs, data seeded "
        "by --seed",
    )
    ap.add_argument("--rss_interval", type=float, default=0.5, help="seconds between two samples of /proc")
    ap.add_argument("--json", metavar="PATH", help="write every run (times, CPU, peak RSS per process) to PATH")
    args = ap.parse_args()
    if args.skew and args.distinct_per_pair is not None:
        ap.error("--skew and --distinct_per_pair are two different inputs: give one")
    if args.distinct_per_pair is not None:
        _check_fraction(args.distinct_per_pair)
    params = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    log_dir = tempfile.mkdtemp(prefix="bench-engines-")
    servers, pool, clusters = {}, None, {}
    state = engines.cluster_dir() or os.path.join(REPO, ".engines-cluster")
    started = []  # clusters this run started (stopped again at the end)
    runs = []  # one dict per run (--json)

    def write_json():
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"argv": sys.argv[1:], "cores": os.cpu_count(), "beam": beam.__version__, "runs": runs}, f)

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

        def roots(name):  # a cluster's processes are not below this one
            return cluster_roots(clusters[name.split("_")[0]]) if name.endswith("_cluster") else []

        rows, metrics, cpu_rows, rss_rows, distinct_of = [], [], [], {}, {}
        for size in [None] if args.skew else args.sizes:
            plan = input_plan(size, args.distinct_per_pair, args.skew, args.seed)
            n_chunks, n_pairs, table_of_chunk, n_distinct = plan
            distinct_of[n_pairs] = n_distinct
            for algorithm in args.algorithms:
                want = None
                for name in args.engines:
                    times, cpus, peaks = [], [], []
                    for rep in range(args.reps):
                        wait_for_quiet()
                        load = os.getloadavg()[0]
                        cpu0 = busy_cpu_seconds()
                        sampler = RssSampler(roots(name), args.rss_interval).start()
                        try:
                            t, items = run_once(algorithm, n_chunks, options(name), params, args.seed, table_of_chunk)
                        finally:
                            rss = sampler.stop()
                        cpus.append(busy_cpu_seconds() - cpu0)
                        peaks.append(rss)
                        m = None
                        if name == "flink_cluster":
                            m = engines.flink_job_metrics(clusters["flink"])
                            metrics.append((algorithm, n_pairs, t, m))
                        if want is None:
                            want = items
                        same = items == want
                        times.append(t)
                        print(
                            f"  {algorithm:6s} {n_pairs:>10,d} {name:9s} rep {rep + 1}: {t:7.1f}s  "
                            f"cpu {cpus[-1]:.0f}s  released {len(items)} "
                            f"{'' if same else 'DIFFERENT ITEMS'}  load {load:.1f}  peak RSS MB: launcher "
                            f"{_mb_text(rss['launcher_mb'])}, SDK worker {_mb_text(rss['sdk_worker_mb'])} "
                            f"(of {rss['counts']['sdk_worker']}), JVM {_mb_text(rss['jvm_mb'])} "
                            f"(of {rss['counts']['jvm']})",
                            file=sys.stderr,
                            flush=True,
                        )
                        runs.append(
                            {
                                "algorithm": algorithm,
                                "pairs": n_pairs,
                                "distinct_per_pair": args.distinct_per_pair,
                                "distinct_items": n_distinct,
                                "skew": args.skew,
                                "engine": name,
                                "rep": rep + 1,
                                "wall_s": t,
                                "machine_cpu_s": cpus[-1],
                                "released": len(items),
                                "same_items": same,
                                "load": load,
                                "rss": rss,
                                "flink_metrics": m,
                            }
                        )
                        write_json()
                        assert same, f"{name} released other items than the first engine"
                    rows.append((algorithm, n_pairs, name, statistics.median(times), times, len(want)))
                    cpu_rows.append((algorithm, n_pairs, name, statistics.median(cpus)))
                    rss_rows[(algorithm, n_pairs, name)] = peaks
    finally:
        for server in servers.values():
            server.stop()
        if pool:
            pool.stop()
        if started:
            subprocess.run(
                ["bash", engines.SCRIPT, "cluster", "down"], env=dict(os.environ, DP_ENGINES_CLUSTER_DIR=state)
            )
    if args.skew:
        source = f"skew input (--skew {args.skew[0]:.0f} {args.skew[1]:.0f})"
    elif args.distinct_per_pair is not None:
        source = f"--distinct_per_pair {args.distinct_per_pair:g} input (seed {args.seed}): " + ", ".join(
            f"{d:,} distinct items in {n:,} pairs" for n, d in distinct_of.items()
        )
    else:
        source = "Zipf(1.1) input over 10^6 items"
    print(
        f"\n{os.cpu_count()} cores; apache-beam {beam.__version__}; epsilon=1, delta=1e-5, Delta_0=100, "
        f"seed={args.seed}; median of {args.reps}; load average at the end {os.getloadavg()[0]:.1f}; {source}"
    )
    print(
        "| algorithm | pairs | engine | median wall s | runs (s) | pairs/s | x DirectRunner | machine CPU s "
        "| CPU us / pair | released | launcher peak MB | SDK worker peak MB | JVM peak MB |"
    )
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = {(a, n): t for a, n, e, t, _, _ in rows if e == "direct"}
    cpu_of = {(a, n, e): c for a, n, e, c in cpu_rows}
    for a, n, e, t, times, k in rows:
        ratio = f"{t / base[(a, n)]:.1f}" if (a, n) in base else ""
        c = cpu_of[(a, n, e)]
        peaks = rss_rows[(a, n, e)]
        print(
            f"| {a} | {n:,} | {e} | {t:.1f} | {', '.join(f'{x:.1f}' for x in times)} | {n / t:,.0f} | {ratio} "
            f"| {c:.0f} | {c / n * 1e6:.1f} | {k} | {_peak_cell([p['launcher_mb'] for p in peaks])} "
            f"| {_peak_cell([p['sdk_worker_mb'] for p in peaks])} | {_peak_cell([p['jvm_mb'] for p in peaks])} |"
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
