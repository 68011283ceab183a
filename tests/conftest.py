import json
import logging
import os
import pathlib
import random

import pytest

# benchmarks.shared_data: the one place that says where the large real corpora are read from
# (DP_SHARED_DATA, else ../shared/data); never copied into the repository.
from benchmarks.shared_data import shared_data_path

from tests.support.user_sets import random_user_sets

# Beam prints an apitools warning on import in environments without the gcp extra.
logging.getLogger("root").setLevel(logging.ERROR)


@pytest.fixture
def small_sets():
    return random_user_sets(random.Random(7), 400, 120, 12)


@pytest.fixture(scope="session")
def shared_data():
    """``shared_data(name)``: path of a file of the shared data folder; fails (naming the file and
    DP_SHARED_DATA) if it is absent, never skips."""
    return shared_data_path


# --- the calibration cache ----------------------------------------------------------------------------
# Keep tables, l2 rules and DPNE level tables are memoised on disk across the pytest-xdist workers and files
# (tests/support/calibration_cache.py: keyed by the arguments, the calibration code's sha256 and the library
# versions; the calibration's own tests bypass it). DP_TEST_CALIBRATION_CACHE=off runs without it.
CALIBRATION_CACHE = None
if os.environ.get("DP_TEST_CALIBRATION_CACHE", "").lower() != "off":
    from tests.support import calibration_cache

    CALIBRATION_CACHE = calibration_cache.install()


# --- tiers --------------------------------------------------------------------------------------------
# `./run_local.sh test --quick` runs -m "not slow and not engines": what a developer runs between commits
# (under 3 minutes on 2 cores). The full suite (`./run_local.sh test`, what CI runs) keeps every test.
# `slow` is decided by measured durations, not by hand: tests/durations.json holds each test's seconds
# (setup + call + teardown) from `pytest --durations=0` of the main suite with -n 3 on the 2-core machine,
# written by `./run_local.sh durations` (tests/support/durations.py). A test is slow when it took more than
# QUICK_MAX_SECONDS; a test the file does not list yet (new) is quick until the next refresh.
TESTS_DIR = pathlib.Path(__file__).resolve().parent
DURATIONS_FILE = TESTS_DIR / "durations.json"
DURATIONS = json.loads(DURATIONS_FILE.read_text(encoding="utf-8")) if DURATIONS_FILE.exists() else {}
QUICK_MAX_SECONDS = 2.0
# The quick tier's measured total must stay under this (tests/architecture/test_tiers.py checks it). The
# main suite's 2,829 measured seconds ran in 984 s of wall time with -n 3 on 2 cores (2026-12-02), a ratio
# of 2.9; the quick tier ran 1.5-2x its share of that (module fixtures of deselected tests fall on quick ones),
# so 450 s stays under 3 minutes with collection and start-up (2 s and this tree: 1,539 tests in 106 s).
QUICK_BUDGET_SECONDS = 450.0
# Slow whatever their durations: files that need the gcp or bench extras (the Dataflow client, PipelineDP,
# OpenDP), which the minimum-versions lane (the quick tier in .venv-min, only the test extra) does not install.
FULL_INSTALL_FILES = frozenset(
    [
        "pipelines/test_cli_common.py",
        "pipelines/test_submission.py",
        "pipelines/test_templates.py",
        "benchmarks/test_bench_cli.py",
        "benchmarks/test_benchmarks_quick.py",
        "benchmarks/test_peer_opendp.py",
    ]
)


def measured_seconds(nodeid: str) -> float:
    """The measured seconds of a test (its pytest node id, ``tests/...``); 0 for a test not measured yet."""
    return float(DURATIONS.get(nodeid, 0.0))


def is_slow(nodeid: str) -> bool:
    rel = nodeid.split("::", 1)[0].removeprefix("tests/")
    return rel in FULL_INSTALL_FILES or measured_seconds(nodeid) > QUICK_MAX_SECONDS


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    file_seconds, first_user = {}, {}
    for item in items:
        nodeid = _nodeid(item)
        slow = is_slow(nodeid)
        # A module fixture is set up by the first test of the file that uses it, and its seconds are measured
        # there (a merged pipeline's whole run, say): when that test is slow, every test of the fixture is, or
        # the quick tier would run the fixture through the next one.
        for name in _module_fixtures(item):
            key = (str(item.path), name)
            first_user.setdefault(key, slow)
            slow = slow or first_user[key]
        if slow:
            item.add_marker(pytest.mark.slow)
        path = nodeid.split("::", 1)[0]
        file_seconds[path] = file_seconds.get(path, 0.0) + measured_seconds(nodeid)
    # The longest files first: pytest-xdist's --dist loadfile hands out files in collection order, so
    # starting the long ones first keeps one long file from running alone at the end
    # (longest-processing-time-first). Order within a file is unchanged; files are independent.
    items.sort(key=lambda item: -file_seconds[_nodeid(item).split("::", 1)[0]])  # stable sort


def _module_fixtures(item):
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return ()
    return sorted(n for n, defs in info.name2fixturedefs.items() if defs and defs[-1].scope in ("module", "class"))


def _nodeid(item) -> str:
    """``tests/<path>::<name>``, whatever directory pytest was started from (the durations file's key)."""
    rel = os.path.relpath(str(item.path), TESTS_DIR).replace(os.sep, "/")
    return "tests/" + rel + item.nodeid[item.nodeid.index("::") :] if "::" in item.nodeid else "tests/" + rel


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if CALIBRATION_CACHE is not None:
        rel = _nodeid(item).split("::", 1)[0].removeprefix("tests/")
        CALIBRATION_CACHE.new_test(bypass=rel in calibration_cache.BYPASS_FILES)


# DP_TEST_CPU_LOG=FILE: each test's CPU seconds (this process and the subprocesses it waited for, setup to
# teardown) appended to FILE as "seconds<TAB>nodeid": what a test costs the machine, where --durations gives
# its wall time (on a busy machine a test that waits for a thread or a subprocess shows a wall time far
# above its cost). Read by hand (sort -rn FILE) when deciding what to make cheaper.
CPU_LOG = os.environ.get("DP_TEST_CPU_LOG")


if CPU_LOG:
    import resource

    def _cpu_seconds():
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        started = _cpu_seconds()
        yield
        with open(CPU_LOG, "a", encoding="utf-8") as f:
            f.write(f"{_cpu_seconds() - started:.2f}\t{_nodeid(item)}\n")
