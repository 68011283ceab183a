"""The SDK worker pool of the standalone clusters (``.ci/engines.sh cluster up``): Beam's
``apache_beam.runners.worker.worker_pool_main`` with one change, StopWorker kills no worker by its id.

Beam's pool keeps its worker processes in a dict keyed by the StartWorkerRequest's ``worker_id`` and
StopWorker kills the process under that id. Every runner JVM (a Flink TaskManager, a Spark executor)
numbers its workers from 1 ("1-1", "2-1", ...), so where several JVMs share one pool, as on the clusters of
one machine, one JVM's StopWorker kills the other JVM's worker of the same number. Measured on the Spark
cluster (which starts a worker per task): tasks failed with "CANCELLED: client cancelled" (a worker
killed mid-bundle), and a job hung until the test's timeout, an executor waiting for a worker that was
killed before it connected (thread dump: ``ExternalEnvironmentFactory.createEnvironment`` parked in
``MapControlClientPool.getClient``). A production cluster runs one pool per TaskManager (docs/engines.md).

Here StopWorker only logs: a worker exits by itself when its runner closes the control stream
(``SdkHarness.run`` returns after "No more requests from control plane") or its runner dies. Exited
workers are reaped; the pool kills those still running when it exits (as Beam's does).

    python -m tests.support.worker_pool --service_port=PORT
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

from apache_beam.runners.worker import worker_pool_main

_LOGGER = logging.getLogger(__name__)

REAP_SECONDS = 10


class Workers(dict):
    """Stands in for Beam's ``worker_id -> Popen`` dict: keeps every process (ids repeat across runner
    JVMs), and ``pop`` (StopWorker) finds none, so nothing is killed by id."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._procs = []  # (worker_id, Popen)

    def __setitem__(self, worker_id, proc):
        with self._lock:
            self._procs.append((worker_id, proc))

    def pop(self, worker_id, default=None):
        _LOGGER.info("StopWorker %s: not killed by id (it exits when its runner closes the control stream)", worker_id)
        return default

    def values(self):
        with self._lock:
            return [proc for _, proc in self._procs]

    def running(self) -> int:
        """Reaps exited workers; returns how many still run."""
        with self._lock:
            self._procs = [(w, p) for w, p in self._procs if p.poll() is None]
            return len(self._procs)


class WorkerPoolServicer(worker_pool_main.BeamFnExternalWorkerPoolServicer):
    """Beam's worker pool with :class:`Workers` in place of its dict."""

    instances: list = []  # the one ``start`` creates, for main's reaper

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._worker_processes = Workers()
        WorkerPoolServicer.instances.append(self)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service_port", type=int, required=True, dest="port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    address, server = WorkerPoolServicer.start(use_process=True, port=args.port)
    _LOGGER.info("worker pool listening at %s", address)
    (pool,) = WorkerPoolServicer.instances
    try:
        while True:
            time.sleep(REAP_SECONDS)
            pool._worker_processes.running()
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    main()
