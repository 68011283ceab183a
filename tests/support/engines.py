"""Beam's Flink and Spark job servers for tests/engines/test_engines.py, started through ``.ci/engines.sh``.

``.ci/engines.sh setup`` fetches the job servers (Maven Central) and creates ``.venv-engines`` with the
apache-beam version of the job servers; ``.ci/engines.sh flink|spark FLAGS`` runs one in the foreground.
This module starts them on free ports, waits until their job service accepts connections, keeps their
log in a file (its tail goes into failure messages) and stops them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import apache_beam as beam

from tests.support.ports import free_port

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, ".ci", "engines.sh")
ENGINES = ("flink", "spark")
PARALLELISM = 2
SPARK_ENVIRONMENT_CACHE_MILLIS = 3_600_000


def script_setting(name: str) -> str:
    """A ``NAME=value`` setting of .ci/engines.sh (the one place that pins the versions)."""
    with open(SCRIPT, encoding="utf-8") as f:
        m = re.search(rf"^{name}=(\S+)", f.read(), re.M)
    assert m, f"{SCRIPT} sets no {name}"
    return m.group(1)


BEAM_VERSION = script_setting("BEAM_VERSION")


def java_missing() -> str | None:
    """Why the engine tests cannot run here, or None. Only a missing Java is a reason to skip."""
    if shutil.which("java") is None:
        return (
            "Java is not installed (no `java` on PATH): Beam's Flink and Spark job servers are Java "
            "programs. Install Java 17 and run `.ci/engines.sh test`."
        )
    return None


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when the test process dies (Linux), so a killed test
    run leaves no job server or worker pool behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def flink_config(restart_attempts: int, tmp_dir: str) -> str:
    """A Flink ``config.yaml``: on a task failure restart its failover region (Flink's default,
    spelled out: the tasks connected to it by pipelined exchanges, in a batch job in Flink's default
    pipelined mode usually the whole job), up to ``restart_attempts`` times per job, 100 ms apart.

    Flink's scratch (``io.tmp.dirs``: the embedded TaskManager's ``tm_*`` directory with every job's
    blobs, ~150 MB a job here, and the shuffles' files) goes to ``tmp_dir``, which ``JobServer.stop``
    removes; in the default /tmp each job server left ~1 GB behind."""
    return (
        "jobmanager.execution.failover-strategy: region\n"
        "restart-strategy.type: fixed-delay\n"
        f"restart-strategy.fixed-delay.attempts: {restart_attempts}\n"
        "restart-strategy.fixed-delay.delay: 100 ms\n"
        f"io.tmp.dirs: {tmp_dir}\n"
    )


class JobServer:
    """One Beam job server (``engine`` is flink or spark) with a local engine of 2 slots/cores.

    Both retry failed tasks, as a cluster does; neither does by default in local mode:
    * Flink: ``--flink-master=[local]`` (an embedded Flink cluster per job, parallelism 2 from the
      pipeline option) with ``--flink-conf-dir`` holding a ``config.yaml`` that sets a fixed-delay
      restart strategy of ``max_failures`` attempts per job (region failover). Beam 2.62 applies its
      ``--number_of_execution_retries`` to streaming jobs only; a batch job's restarts come from the
      Flink configuration, and without one it fails on the first task failure.
    * Spark: ``--spark-master-url=local[2,max_failures]``: 2 cores; in local mode Spark retries a
      failed task only when the master URL says so (``local[2]`` fails the job on the first one).
    """

    def __init__(self, engine: str, log_dir: str, max_failures: int = 4):
        assert engine in ENGINES, engine
        self.engine = engine
        self.port = free_port()
        self.max_failures = max_failures
        self.log_path = os.path.join(log_dir, f"{engine}-job-server.log")
        self.tmp_dir = None
        if engine == "flink":
            conf_dir = os.path.join(log_dir, "flink-conf")
            self.tmp_dir = os.path.join(log_dir, "flink-tmp")
            os.makedirs(conf_dir, exist_ok=True)
            os.makedirs(self.tmp_dir, exist_ok=True)
            with open(os.path.join(conf_dir, "config.yaml"), "w", encoding="utf-8") as f:
                f.write(flink_config(max_failures, self.tmp_dir))
            master = ["--flink-master=[local]", f"--flink-conf-dir={conf_dir}"]
        else:
            master = [f"--spark-master-url=local[{PARALLELISM},{max_failures}]"]
        self.argv = [
            "bash",
            SCRIPT,
            engine,
            *master,
            f"--job-port={self.port}",
            "--artifact-port=0",
            "--expansion-port=0",
        ]
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"localhost:{self.port}"

    def pipeline_args(self, environment: str = "LOOPBACK", environment_config: str | None = None) -> list:
        """Beam options that submit a pipeline to this job server."""
        args = ["--runner", "PortableRunner", "--job_endpoint", self.endpoint, "--environment_type", environment]
        if environment_config:
            args += ["--environment_config", environment_config]
        if self.engine == "flink":
            args += ["--parallelism", str(PARALLELISM)]
        return args

    def start(self, timeout: float = 240.0) -> "JobServer":
        log = open(self.log_path, "w", encoding="utf-8")
        # Own session: stop() signals the JVM (engines.sh execs java) and nothing else.
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"the {self.engine} job server exited with {code} before it listened on "
                    f"{self.endpoint}:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("localhost", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"the {self.engine} job server did not listen on {self.endpoint} within {timeout:.0f}s:\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = f.readlines()[-lines:]
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "".join(tail)

    def stop(self) -> None:
        """Stops the job server (TERM, KILL after 30 s) and removes Flink's scratch directory."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


# --- the standalone clusters of `.ci/engines.sh cluster` (issue 29) ------------------------------------------


class Cluster:
    """A standalone cluster started by ``.ci/engines.sh cluster up`` (state in ``state_dir``: ports.env,
    pids/, logs/), seen from the tests: where to submit, which processes are its workers, their logs.

    * flink: a JobManager and 2 TaskManagers (own JVMs, 2 slots and a 1.1 GB heap each) with Beam's
      Flink job server submitting to the JobManager's REST endpoint;
    * spark: a master and 2 workers (own JVMs; each starts an executor JVM) with Beam's Spark job server
      as the driver (client mode);
    * the SDK harnesses are processes of one worker pool (``--environment_type EXTERNAL``), one or more
      per TaskManager / executor, kept for the whole job (``--environment_cache_millis``).
    """

    WORKERS = {"flink": ("flink-taskmanager-1", "flink-taskmanager-2"), "spark": ("spark-worker-1", "spark-worker-2")}

    def __init__(self, engine: str, state_dir: str):
        assert engine in ENGINES, engine
        self.engine = engine
        self.state_dir = state_dir
        with open(os.path.join(state_dir, "ports.env"), encoding="utf-8") as f:
            self.ports = {k: int(v) for k, v in (line.strip().split("=", 1) for line in f if "=" in line)}

    @property
    def endpoint(self) -> str:
        return f"localhost:{self.ports[self.engine.upper() + '_JOB_PORT']}"

    @property
    def rest(self) -> str:
        """Flink's REST API (jobs, their exceptions and vertex metrics)."""
        return f"http://localhost:{self.ports['FLINK_REST_PORT']}"

    def pipeline_args(self) -> list:
        args = [
            "--runner",
            "PortableRunner",
            "--job_endpoint",
            self.endpoint,
            "--environment_type",
            "EXTERNAL",
            "--environment_config",
            f"localhost:{self.ports['POOL_PORT']}",
        ]
        if self.engine == "flink":
            # SDK workers kept between a job's stages, released a minute after it (Flink releases a stage's
            # environment at once otherwise; its TaskManagers outlive the job).
            args += ["--parallelism", str(PARALLELISM), "--environment_cache_millis", "60000"]
        else:
            # Spark releases a task's SDK environment when the task ends: a new worker process per task
            # (~70 for one extract_ngrams job, each start and stop a round trip to the shared pool, see
            # tests/support/worker_pool.py). Kept for longer than any job instead: an application's
            # executors exit with it, and their SDK workers with them.
            args += ["--environment_cache_millis", str(SPARK_ENVIRONMENT_CACHE_MILLIS)]
        return args

    def pid(self, component: str) -> int | None:
        try:
            with open(os.path.join(self.state_dir, "pids", f"{component}.pid"), encoding="utf-8") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def components(self) -> tuple:
        master = "flink-jobmanager" if self.engine == "flink" else "spark-master"
        return (f"{self.engine}-job-server", *self.WORKERS[self.engine], master)

    def alive(self) -> bool:
        return all(self.pid(c) for c in (*self.components(), "sdk-worker-pool"))

    def kill_worker(self, index: int = 0) -> int:
        """SIGKILL one worker's process group (a TaskManager JVM; a Spark worker JVM with its executor),
        as a machine that dies would; returns the pid."""
        pid = self.pid(self.WORKERS[self.engine][index])
        assert pid, f"{self.WORKERS[self.engine][index]} is not running"
        os.killpg(pid, signal.SIGKILL)
        return pid

    def restore(self, timeout: float = 300, env: dict | None = None) -> None:
        """Start what is missing (a killed worker) and wait until the cluster is whole again."""
        subprocess.run(
            ["bash", SCRIPT, "cluster", "up", self.engine],
            cwd=REPO,
            env=dict(os.environ, DP_ENGINES_CLUSTER_DIR=self.state_dir, **(env or {})),
            check=True,
            timeout=timeout,
            capture_output=True,
            text=True,
        )

    def restart_workers(self, env: dict | None = None, timeout: float = 300) -> None:
        """Replaces every worker (SIGKILL, then ``cluster up`` with ``env`` added to the script's
        environment, e.g. ``{"FLINK_TASK_HEAP": "384m"}`` for TaskManagers with a smaller heap)."""
        for component in self.WORKERS[self.engine]:
            pid = self.pid(component)
            if pid:
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(self.pid(c) for c in self.WORKERS[self.engine]) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.restore(timeout, env)

    def after_failed_run(self) -> str:
        """After a job that failed or hung: a thread dump of the job server (saved in logs/, its path
        returned for the failure message), then a new job server. Beam's Spark job server keeps the
        SparkContext of a job whose client went away, and every later job then fails with "Only one
        SparkContext should be running in this JVM"; one bad run must not take the cases after it down."""
        component = f"{self.engine}-job-server"
        pid = self.pid(component)
        dump = ""
        if pid and shutil.which("jstack"):
            dump = os.path.join(self.state_dir, "logs", f"{component}-{pid}-{int(time.time())}.jstack")
            with open(dump, "w", encoding="utf-8") as f:
                subprocess.run(["jstack", str(pid)], stdout=f, stderr=subprocess.STDOUT, timeout=60, check=False)
        if pid:
            os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.pid(component) and time.monotonic() < deadline:
                time.sleep(0.2)
        self.restore()
        return dump

    def log_path(self, component: str) -> str:
        return os.path.join(self.state_dir, "logs", f"{component}.log")

    def log_tail(self, lines: int = 60) -> str:
        out = []
        for component in (*self.components(), "sdk-worker-pool"):
            path = self.log_path(component)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- last {len(tail)} lines of {path} ---\n" + "".join(tail))
        return "\n".join(out)


def flink_job_metrics(cluster):
    """Metrics of the newest Flink job on the cluster (the run that just ended), from its REST API: the
    job's run time, its vertices, the bytes and records written by every task (all exchanges between
    operator chains), those read through hash-partitioned exchanges (the shuffles proper), the numbers
    of such shuffles and of broadcast edges (side inputs), and the largest mean record of a vertex's
    output (bytes / records: for a GroupByKey's vertex, its mean group)."""
    import json
    import urllib.request

    def get(path):
        with urllib.request.urlopen(cluster.rest + path, timeout=10) as r:
            return json.load(r)

    jobs = get("/jobs/overview")["jobs"]
    jid = max(jobs, key=lambda j: j["start-time"])["jid"]
    job = get(f"/jobs/{jid}")
    plan = get(f"/jobs/{jid}/plan")["plan"]
    hashed = {n["id"] for n in plan["nodes"] for i in n.get("inputs", []) if i["ship_strategy"].startswith("Hash")}
    edges = [i["ship_strategy"] for n in plan["nodes"] for i in n.get("inputs", [])]
    vertices = job["vertices"]
    m = {v["id"]: v["metrics"] for v in vertices}
    written = [(m[v]["write-bytes"], m[v]["write-records"]) for v in m]
    return {
        "job_seconds": job["duration"] / 1000,
        "vertices": len(vertices),
        "written_bytes": sum(b for b, _ in written),
        "written_records": sum(r for _, r in written),
        "shuffled_bytes": sum(m[v]["read-bytes"] for v in hashed),
        "shuffled_records": sum(m[v]["read-records"] for v in hashed),
        "shuffles": sum(e.startswith("Hash") for e in edges),
        "broadcasts": sum(e == "Broadcast" for e in edges),
        "largest_mean_record": max((b / r for b, r in written if r), default=0),
    }


def cluster_dir() -> str | None:
    """The state directory of running clusters (``.ci/engines.sh test`` exports it), or None."""
    return os.environ.get("DP_ENGINES_CLUSTER_DIR")


# --- a DoFn for the SDK worker processes (they import this module: the repo root is on their PYTHONPATH) --


class RecordDrawsFn(beam.DoFn):
    """(item, noise) -> nothing; writes each bundle's draws to ``<out_dir>/<pid>-*.tsv`` as
    ``item<TAB>repr(noise)`` lines, so the test sees which worker process drew what.

    No sink transform on purpose: a sink (WriteToText) adds stages that open SDK environments while
    this one does, and Beam's job servers hand environments to stages round-robin, so the 2 parallel
    tasks of this stage would then land on the same worker about half of the time (measured on Flink)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def start_bundle(self):
        self.lines = []

    def process(self, element):
        item, noise = element
        self.lines.append(f"{item}\t{noise!r}\n")

    def finish_bundle(self):
        fd, path = tempfile.mkstemp(prefix=f"{os.getpid()}-", suffix=".tsv", dir=self.out_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(self.lines)
