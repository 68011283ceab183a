"""The clusters' SDK worker pool (tests/support/worker_pool.py): two runner JVMs number their workers alike,
and one's StopWorker must not kill the other's worker of the same id (as Beam's own pool does)."""

import subprocess
import sys

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import worker_pool_main

from tests.support.worker_pool import WorkerPoolServicer


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_stop_worker_kills_no_worker_that_shares_its_id():
    pool = WorkerPoolServicer(use_process=True)
    first, second = sleeper(), sleeper()  # "1-1" of executor 0 and "1-1" of executor 1
    try:
        pool._worker_processes["1-1"] = first
        pool._worker_processes["1-1"] = second
        pool.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="1-1"), None)
        assert first.poll() is None and second.poll() is None, "StopWorker killed a worker by a shared id"
        assert set(pool._worker_processes.values()) == {first, second}  # both kept (killed at the pool's exit)
        first.kill()
        first.wait()
        assert pool._worker_processes.running() == 1  # the exited one is reaped
        assert pool._worker_processes.values() == [second]
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()


def test_beams_own_pool_loses_a_worker_that_shares_its_id():
    """Why the pool above exists: Beam's keeps one process per id, and StopWorker kills whichever was
    registered last (here the other JVM's live worker)."""
    pool = worker_pool_main.BeamFnExternalWorkerPoolServicer(use_process=True)
    first, second = sleeper(), sleeper()
    try:
        pool._worker_processes["1-1"] = first
        pool._worker_processes["1-1"] = second
        pool.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="1-1"), None)
        assert second.wait(timeout=30) is not None  # the second JVM's worker, killed by the first's stop
        assert first.poll() is None
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
