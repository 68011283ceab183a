"""The tiers come from measured durations (tests/durations.json, read by tests/conftest.py): the file names
tests that exist, the quick tier stays within its budget, and the parser reads pytest's --durations lines."""

import ast
import pathlib

from tests import conftest
from tests.support import durations

TESTS = pathlib.Path(conftest.__file__).resolve().parent


def _test_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_durations_file_names_tests_that_exist():
    """A renamed test would lose its measurement (and a slow one would drift into the quick tier): every
    entry must name a file and a test function that exist; the file must measure most of the suite."""
    assert len(conftest.DURATIONS) > 1000, "tests/durations.json is missing or nearly empty"
    missing, names = [], {}
    for nodeid in conftest.DURATIONS:
        path, _, rest = nodeid.partition("::")
        name = rest.split("[", 1)[0].split("::")[-1]
        file = TESTS.parent / path
        if file not in names:
            names[file] = _test_names(file) if file.is_file() else set()
        if name not in names[file]:
            missing.append(nodeid)
    assert not missing, f"stale entries (refresh with ./run_local.sh durations): {missing[:20]}"
    assert all((TESTS / f).is_file() for f in conftest.FULL_INSTALL_FILES)


def test_the_quick_tier_fits_its_budget():
    """What `./run_local.sh test --quick` runs, by the measured seconds: under QUICK_BUDGET_SECONDS (about
    3 minutes with three processes on 2 cores). A test past QUICK_MAX_SECONDS is slow by definition; many
    short ones can still add up: then the threshold or the tests must change."""
    quick = {k: v for k, v in conftest.DURATIONS.items() if not conftest.is_slow(k)}
    assert all(v <= conftest.QUICK_MAX_SECONDS for v in quick.values())
    total = sum(quick.values())
    assert total <= conftest.QUICK_BUDGET_SECONDS, f"quick tier {total:.0f} s > {conftest.QUICK_BUDGET_SECONDS} s"


def test_slow_is_decided_by_the_measured_seconds():
    some = next(iter(conftest.DURATIONS))
    file = some.split("::", 1)[0]
    assert conftest.is_slow(f"{file}::x") is (file.removeprefix("tests/") in conftest.FULL_INSTALL_FILES)
    long = [k for k, v in conftest.DURATIONS.items() if v > conftest.QUICK_MAX_SECONDS]
    assert long and all(conftest.is_slow(k) for k in long)


def test_the_parser_sums_the_phases_and_an_update_replaces_whole_files():
    log = [
        "============================= slowest durations =============================",
        "12.34s call     tests/a/test_x.py::test_one[p-1.5]",
        "0.50s setup    tests/a/test_x.py::test_one[p-1.5]",
        "3.00s call     tests/b/test_y.py::test_two",
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)",
        "1 passed in 3.2s",
    ]
    got = durations.parse(log)
    assert got == {"tests/a/test_x.py::test_one[p-1.5]": 12.84, "tests/b/test_y.py::test_two": 3.0}
    old = {"tests/a/test_x.py::test_gone": 9.0, "tests/c/test_z.py::test_kept": 1.0}
    merged = durations.merge(old, {"tests/a/test_x.py::test_one": 1.0})
    assert merged == {"tests/c/test_z.py::test_kept": 1.0, "tests/a/test_x.py::test_one": 1.0}
