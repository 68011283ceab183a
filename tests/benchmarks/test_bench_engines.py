"""benchmarks/bench_engines.py without a cluster: the --distinct_per_pair input (distinct items per pair,
determinism, chunking, shape) and the peak-RSS sampler (/proc parsing, classification, a child's peak)."""

import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from benchmarks import bench_engines as be


def _tables(n_pairs, f, seed=1):
    assert n_pairs % be.PAIRS_PER_CHUNK == 0
    return pa.concat_tables([be.distinct_table_of_chunk(c, f, seed=seed) for c in range(n_pairs // be.PAIRS_PER_CHUNK)])


@pytest.mark.parametrize("f", [0.2, 0.0275])
@pytest.mark.parametrize("n_pairs", [200_000, 1_000_000])
def test_distinct_items_per_pair_is_f(f, n_pairs):
    table = _tables(n_pairs, f)
    assert table.num_rows == n_pairs
    distinct = pc.count_distinct(table.column("item")).as_py()
    assert abs(distinct / n_pairs - f) <= 0.03 * f, (distinct, n_pairs, f)
    assert distinct == be.distinct_item_count(n_pairs, f)
    # users as the Zipf input's: ~10 pairs each, ids unique across chunks
    users = pc.count_distinct(table.column("user")).as_py()
    assert 8.5 < n_pairs / users < 11.5


@pytest.mark.parametrize("f", [0.2, 0.0275])
def test_distinct_input_has_a_zipf_head_and_a_long_tail(f):
    items = be.distinct_items(0, 1_000_000, f, seed=3)
    _, counts = np.unique(items, return_counts=True)
    counts = np.sort(counts)[::-1]
    assert 0.03 < counts[0] / len(items) < 0.2  # a stop word, not half of the pairs
    assert counts[9] < counts[0] / 5  # falls off as a power law does
    assert (counts >= 100).sum() > 300  # a head of items many users hold (the releasable ones)
    assert 0.1 < (counts == 1).mean() < 0.9  # and a tail of items held once


def test_repeats_only_items_born_before():
    f = 0.0275
    t = np.arange(0, 300_000)
    items = be.distinct_items(0, len(t), f, seed=5)
    born = np.floor(f * t).astype(np.int64)
    assert (items <= born).all()
    birth = np.r_[True, born[1:] > born[:-1]]
    assert birth.sum() == be.distinct_item_count(len(t), f)
    assert (items[birth] == born[birth]).all()  # a birth is the new item
    assert (items[~birth] <= np.floor(f * (t[~birth] - 1))).all()  # a repeat: an item born before t
    assert len(np.unique(items[~birth])) > 1_000  # repeats of many items, not of the first few


def test_same_seed_same_chunks_other_seed_other_chunks():
    a = be.distinct_table_of_chunk(7, 0.2, seed=11)
    assert a.equals(be.distinct_table_of_chunk(7, 0.2, seed=11))
    other = be.distinct_table_of_chunk(7, 0.2, seed=12)
    assert not a.column("item").equals(other.column("item"))
    assert not a.column("user").equals(other.column("user"))
    # the births do not depend on the seed, the repeats do (most of them)
    x, y = be.distinct_items(0, 50_000, 0.2, seed=11), be.distinct_items(0, 50_000, 0.2, seed=12)
    birth = np.r_[True, np.diff(np.floor(0.2 * np.arange(50_000))) > 0]
    assert np.array_equal(x[birth], y[birth])
    assert (x != y)[~birth].mean() > 0.9
    assert not a.column("item").equals(be.distinct_table_of_chunk(8, 0.2, seed=11).column("item"))


def test_chunking_does_not_change_the_items():
    f, n = 0.05, 20_000
    whole = be.distinct_items(0, n, f, seed=2)
    cuts = [0, 1, 999, 7_321, 7_322, 15_000, n]
    assert np.array_equal(np.concatenate([be.distinct_items(a, b, f, seed=2) for a, b in zip(cuts, cuts[1:])]), whole)
    # the tables' chunks are the same positions
    tables = pa.concat_tables([be.distinct_table_of_chunk(c, f, pairs_per_chunk=1_000, seed=2) for c in range(20)])
    assert tables.column("item").to_pylist() == [f"w{i}" for i in whole]


def test_fraction_outside_zero_one_is_refused():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            be.distinct_items(0, 10, bad)
    assert be.distinct_item_count(1_000, 1.0) == 1_000  # F = 1: every pair its own item


def test_input_plan_keeps_the_zipf_input_without_the_option():
    n_chunks, n_pairs, table_of_chunk, distinct = be.input_plan(4e5)
    assert (n_chunks, table_of_chunk, distinct) == (4, None, None)
    assert n_pairs == be.zipf_pair_count(4, be.USERS_PER_CHUNK)
    n_chunks, n_pairs, table_of_chunk, distinct = be.input_plan(2.3e5, 0.2, seed=4)
    assert (n_chunks, n_pairs, distinct) == (2, 200_000, 40_000)
    assert table_of_chunk.func.__module__ == "benchmarks.bench_engines"  # pickled by reference
    assert table_of_chunk(1).equals(be.distinct_table_of_chunk(1, 0.2, seed=4))


# --- the peak-RSS sampler ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cmdline, kind",
    [
        (["python", "-c", "from apache_beam.runners.worker.sdk_worker import SdkHarness; ..."], "sdk_worker"),
        (["/v/bin/python3.11", "-m", "apache_beam.runners.worker.sdk_worker_main"], "sdk_worker"),
        (["/v/bin/python", "-m", "apache_beam.runners.worker.worker_pool_main", "--service_port=1"], "worker_pool"),
        (["/v/bin/python", "-m", "tests.support.worker_pool", "--service_port=1"], "worker_pool"),
        (["/usr/lib/jvm/java-17/bin/java", "-Xmx1g", "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"], "jvm"),
        (["java", "-cp", "s.jar", "org.apache.beam.runners.spark.SparkJobServerDriver"], "jvm"),
        (["bash", ".ci/engines.sh", "python", "-m", "apache_beam.runners.worker.sdk_worker_main"], "other"),
        (["/v/bin/python", "-m", "benchmarks.bench_engines", "--engines", "flink"], "other"),
        (["/usr/bin/javac", "X.java"], "other"),
        ([], "other"),
    ],
)
def test_classify(cmdline, kind):
    assert be.classify(cmdline) == kind


def test_jvm_role():
    assert be.jvm_role(["java", "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"]) == "flink-taskmanager"
    assert be.jvm_role(["java", "org.apache.spark.executor.CoarseGrainedExecutorBackend"]) == "spark-executor"
    assert be.jvm_role(["java", "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"]) == (
        "flink-jobmanager"
    )
    assert be.jvm_role(["java", "-jar", "app.jar"]) == "jvm"


def test_parse_status_text():
    text = "Name:\tjava\nState:\tS (sleeping)\nPPid:\t42\nVmPeak:\t 9 kB\nVmHWM:\t  812344 kB\nVmRSS:\t  500000 kB\n"
    assert be.parse_status(text) == {"name": "java", "ppid": 42, "vmhwm_kb": 812344, "vmrss_kb": 500000}
    kernel_thread = "Name:\tkthreadd\nPPid:\t0\nThreads:\t1\n"
    assert be.parse_status(kernel_thread)["vmrss_kb"] is None


def test_descendants():
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20, 30: 10}
    assert be.descendants(parents, [10]) == {10, 11, 12, 30}
    assert be.descendants(parents, [20, 99]) == {20, 21}


def test_status_and_stat_of_this_process():
    status = be.read_status(os.getpid())
    assert status["ppid"] == os.getppid()
    assert 10_000 < status["vmrss_kb"] <= status["vmhwm_kb"]
    ppid, started = be.read_stat(os.getpid())
    assert ppid == os.getppid() and started > 0
    assert os.path.basename(be.read_cmdline(os.getpid())[0]).startswith("python")
    assert be.read_status(2**22 + 12345) is None  # above pid_max's default: no such process


def test_reset_peak_forgets_an_earlier_peak():
    block = b"\x01" * (150 << 20)  # written, so resident
    del block
    before = be.read_status(os.getpid())
    assert before["vmhwm_kb"] - before["vmrss_kb"] > 100 << 10
    # the bench runs on Linux (it reads /proc); a process may reset its own peak (clear_refs, owner-writable)
    assert be.reset_peak(os.getpid())
    after = be.read_status(os.getpid())
    assert after["vmhwm_kb"] < before["vmhwm_kb"] - (100 << 10)


CHILD = """
import sys, time
block = b"\\x01" * (200 << 20)  # 200 MB, written
del block                      # gone before the sampler's last look: only VmHWM holds it
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_sampler_keeps_a_childs_peak_after_it_freed_and_exited():
    sampler = be.RssSampler(interval=0.1).start()
    # "sdk_worker_main" in its arguments: the child is classified as an SDK worker
    child = subprocess.Popen([sys.executable, "-c", CHILD, "0.6", "sdk_worker_main"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.35)  # sampled (every 0.1 s) after the free: VmRSS small, VmHWM >= 200 MB
    finally:
        child.wait(timeout=30)
    time.sleep(0.2)
    summary = sampler.stop()
    (rec,) = [p for p in summary["processes"] if p["pid"] == child.pid]
    assert rec["kind"] == "sdk_worker" and rec["hwm_valid"]
    assert rec["peak_mb"] >= 200
    assert summary["sdk_worker_mb"] >= 200 and summary["counts"]["sdk_worker"] >= 1
    assert summary["jvm_mb"] is None
    assert summary["launcher_mb"] > 10
    assert "sdk_worker_main" in rec["cmd"]


def test_sampler_counts_this_run_not_the_launchers_earlier_peak():
    block = b"\x01" * (150 << 20)
    del block
    assert be.read_status(os.getpid())["vmhwm_kb"] > 150 << 10
    sampler = be.RssSampler(interval=0.1).start()
    assert sampler.processes[(os.getpid(), be.read_stat(os.getpid())[1])]["hwm_valid"]  # its peak was reset
    summary = sampler.stop()
    assert summary["launcher_mb"] < be.read_status(os.getpid())["vmrss_kb"] / 1024 + 50
