"""The engine suite in three streams (``.ci/engines.sh test`` without arguments runs one pytest process each).

An engine test mostly waits (job submission, JVM start-up, heartbeats, plan compilation in one JVM thread):
one stream of them kept about 1.2 of the 2 cores busy. So the suite runs as three pytest processes side by
side, one per deployment whose state its tests change, each selected by a mark set here from the test's
fixtures and parameters:

* ``engines_flink_cluster``: the tests on the standalone Flink cluster (its cluster cases, worker loss, which
  kills a TaskManager, and the skew tests, which restart the TaskManagers on a small heap);
* ``engines_flink_local``: the tests on the local Flink job server;
* ``engines_spark``: the tests on the standalone Spark cluster and on the local Spark job server (and the
  one test that starts no job).

Each process has its own session fixtures, so a cluster or job server is driven by one process only: no
process restarts or kills workers under another's job. Separate pytest processes rather than pytest-xdist's
``--dist loadgroup``: with pytest 9.2 and pytest-xdist 3.8 xdist's groups are silently ignored (it renames
``item._nodeid``, which pytest 9.2's ``Node.nodeid`` no longer reads), and the CI run of cafb608 failed when
both xdist workers drove the Flink cluster at once. tests/architecture/test_engine_streams.py checks the
split.
"""

import pytest

#: stream -> its mark (``.ci/engines.sh test`` runs ``-m "engines and <mark>"`` for each, side by side)
STREAMS = {
    "flink_cluster": "engines_flink_cluster",
    "flink_local": "engines_flink_local",
    "spark": "engines_spark",
}


def engine_of(item) -> str:
    """The engine a test runs on: its ``cluster`` or ``engine`` parameter; the skew tests' small-heap
    cluster is Flink's; "spark" for a test that starts no job (it has to go in some stream)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name in ("cluster", "engine"):
        if name in params:
            return params[name]
    return "flink" if "small_heap_flink" in getattr(item, "fixturenames", ()) else "spark"


def stream_of(item) -> str:
    """The stream of an engine test (:data:`STREAMS`)."""
    engine = engine_of(item)
    if engine == "spark":
        return "spark"
    return "flink_cluster" if "clusters" in getattr(item, "fixturenames", ()) else "flink_local"


# tryfirst: before pytest's own -m deselection (the "mark" plugin's hook of the same name) reads the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("engines") is not None:
            item.add_marker(getattr(pytest.mark, STREAMS[stream_of(item)]))
