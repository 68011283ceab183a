"""The engine suite in two streams (``.ci/engines.sh test`` runs pytest ``-n 2 --dist loadgroup``).

An engine test mostly waits (job submission, JVM start-up, heartbeats, plan compilation in one JVM thread):
one stream of them keeps about 1.2 of the 2 cores busy. So the tests on the standalone clusters (those that
use the ``clusters`` fixture: the cluster cases, worker loss, skew) are one xdist group and the tests on the
local job servers (everything else) the other: two test processes, each with its own session fixtures (a
cluster's job server is used by one process only, the local job servers by the other), run side by side.
Without xdist (``-p no:xdist`` or ``-n 0``) the marks are inert and the tests run in one process as before.
"""

import pytest

STREAMS = ("clusters", "local-job-servers")


def stream_of(item) -> str:
    """The xdist group of an engine test: ``clusters`` when it uses the standalone clusters, otherwise
    ``local-job-servers``."""
    return STREAMS[0] if "clusters" in getattr(item, "fixturenames", ()) else STREAMS[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("engines") is not None:
            item.add_marker(pytest.mark.xdist_group(stream_of(item)))
