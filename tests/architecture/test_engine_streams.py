"""The engine suite's three streams (tests/engines/conftest.py, .ci/engines.sh test) split it as documented.

The streams run as pytest processes side by side, each with its own session fixtures; a test on the Flink
cluster in another stream would drive that cluster from two processes at once (the skew tests restart its
TaskManagers, worker loss kills one), which is how the CI run of cafb608 failed when pytest-xdist's groups
were silently ignored. Collected here in subprocesses of the main suite's Python (collecting starts no
engine)."""

import subprocess
import sys

import pytest

from tests.architecture.test_dependency_bounds import ROOT

STREAMS = ("engines_flink_cluster", "engines_flink_local", "engines_spark")


def collect(markexpr: str) -> set:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/engines",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            markexpr,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line for line in proc.stdout.splitlines() if line.startswith("tests/engines/")}


@pytest.fixture(scope="module")
def streams():
    return {s: collect(f"engines and {s}") for s in STREAMS} | {"all": collect("engines")}


def name(nodeid: str) -> str:
    return nodeid.split("::")[1]


def on_a_cluster(nodeid: str) -> bool:
    """The tests that use a standalone cluster, by their names (test_engines.py)."""
    return name(nodeid).startswith(
        ("test_seeded_output_on_a_cluster_", "test_a_job_survives_the_loss_of_a_worker", "test_skew_")
    )


def test_the_streams_partition_the_engine_suite(streams):
    parts = [streams[s] for s in STREAMS]
    assert all(parts)
    assert sum(len(p) for p in parts) == len(set().union(*parts))  # disjoint
    assert set().union(*parts) == streams["all"]


def test_each_deployment_is_driven_by_one_stream(streams):
    fc, fl, sp = (streams[s] for s in STREAMS)
    # the Flink cluster: its cluster cases, worker loss and the skew tests (small-heap TaskManagers), only there
    assert fc == {n for n in streams["all"] if on_a_cluster(n) and "[spark" not in n}
    assert {
        "test_skew_completes_on_small_taskmanagers_with_bounded_records",
        "test_a_job_survives_the_loss_of_a_worker",
    } <= {name(n).split("[")[0] for n in fc}
    # the local Flink job server: Flink tests on no cluster
    assert fl and all("[flink" in n and not on_a_cluster(n) for n in fl)
    # Spark (cluster and local job server) and nothing of Flink
    assert not any("flink" in n for n in sp)
    assert any(on_a_cluster(n) for n in sp) and any("[spark" in n and not on_a_cluster(n) for n in sp)
