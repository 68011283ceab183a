"""The dependency bounds are what is tested (issue 32): setup.py's lower bounds are the pins of
constraints/minimum.txt (which ./run_local.sh test --minimum installs and runs), the Python range and
ruff's target are the tested Python, and README names the Beam versions that are tested."""

import ast
import pathlib
import re
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _setup_kwargs():
    """The keyword arguments of setup.py's setuptools.setup(...) call that are literals (no import, no run)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "setup"]
    assert len(calls) == 1
    kwargs = {}
    for kw in calls[0].keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:  # packages=, package_dir=, long_description=: computed
            pass
    return kwargs


def parse_constraints(text):
    """{name: version} of a constraints file's exact pins; anything but `name==version` is an error."""
    pins = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.]*)", line)
        assert m, f"constraints/minimum.txt line {n}: {line!r} is not an exact pin name==version"
        assert m.group(1).lower() not in pins, f"constraints/minimum.txt pins {m.group(1)} twice"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def _pins():
    return parse_constraints((ROOT / "constraints" / "minimum.txt").read_text(encoding="utf-8"))


def lower_bound(requirement: Requirement) -> str:
    """The X of a requirement that is exactly `name>=X` (a lower bound, nothing else)."""
    specs = list(requirement.specifier)
    assert len(specs) == 1 and specs[0].operator == ">=", f"{requirement}: a lower bound `>=` alone"
    return specs[0].version


def bound_mismatches(install_requires, pins):
    """Each install_requires entry whose lower bound is not its pin (or that has no pin)."""
    wrong = []
    for entry in install_requires:
        req = Requirement(entry)
        pin = pins.get(req.name.lower())
        if pin is None:
            wrong.append(f"{req.name}: no pin in constraints/minimum.txt")
        elif Version(lower_bound(req)) != Version(pin) or lower_bound(req) != pin:
            wrong.append(f"{req.name}: setup.py >={lower_bound(req)}, constraints/minimum.txt =={pin}")
    return wrong


def test_every_runtime_dependency_has_a_pin_equal_to_its_lower_bound():
    kwargs = _setup_kwargs()
    install_requires = kwargs["install_requires"]
    assert {Requirement(r).name for r in install_requires} == {"apache-beam", "numpy", "scipy", "pyarrow"}
    assert bound_mismatches(install_requires, _pins()) == []


def test_the_check_catches_a_bound_that_moved_or_a_missing_pin():
    pins = {"apache-beam": "2.51.0", "numpy": "1.23.2"}
    assert bound_mismatches(["apache-beam>=2.51.0", "numpy>=1.23.2"], pins) == []
    assert bound_mismatches(["apache-beam>=2.52.0", "numpy>=1.23.2"], pins) == [
        "apache-beam: setup.py >=2.52.0, constraints/minimum.txt ==2.51.0"
    ]
    assert bound_mismatches(["numpy>=1.23", "scipy>=1.9.2"], pins) == [
        "numpy: setup.py >=1.23, constraints/minimum.txt ==1.23.2",
        "scipy: no pin in constraints/minimum.txt",
    ]
    assert parse_constraints("numpy==1.23.2  # a comment\n\n") == {"numpy": "1.23.2"}
    for bad in ("numpy>=1.23.2", "numpy", "numpy==1.23.2\nnumpy==1.24.0"):
        try:
            parse_constraints(bad)
        except AssertionError:
            continue
        raise AssertionError(f"{bad!r} passed as exact pins")


def test_the_extras_agree_with_the_pins():
    """apache-beam[gcp] has Beam's lower bound; the test extra's bounds admit the versions the lane pins."""
    kwargs = _setup_kwargs()
    pins = _pins()
    beam = next(Requirement(r) for r in kwargs["install_requires"] if Requirement(r).name == "apache-beam")
    gcp = [Requirement(r) for r in kwargs["extras_require"]["gcp"]]
    assert [(r.name, lower_bound(r)) for r in gcp] == [("apache-beam", lower_bound(beam))]
    for entry in kwargs["extras_require"]["test"]:
        req = Requirement(entry)
        assert req.name.lower() in pins, f"the test extra's {req.name} has no pin in constraints/minimum.txt"
        assert req.specifier.contains(pins[req.name.lower()]), f"{req} does not admit =={pins[req.name.lower()]}"


def test_python_range_classifiers_and_ruff_target_are_the_tested_python():
    kwargs = _setup_kwargs()
    assert kwargs["python_requires"] == ">=3.11"
    versions = [c.rsplit(" :: ", 1)[1] for c in kwargs["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)]
    assert versions == ["3.11"]
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert ruff["target-version"] == "py311"


def test_readme_states_the_tested_versions():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pins = _pins()
    engines_beam = re.search(r"^BEAM_VERSION=(\S+)", (ROOT / ".ci" / "engines.sh").read_text(), re.M).group(1)
    assert "tested on Python 3.11" in readme
    assert not re.search(r"Python >= ?3\.(?!11\b)\d+", readme)  # no range beyond what is tested (it said >= 3.9)
    assert f"apache-beam >= {pins['apache-beam']}" in readme
    assert f"apache-beam {engines_beam}" in readme
    for name in ("pyarrow", "numpy", "scipy"):
        assert f"{name} >= {pins[name]}" in readme


def test_run_local_runs_the_main_suite_first_then_the_engine_suite_beside_the_minimum_lane():
    script = (ROOT / "run_local.sh").read_text(encoding="utf-8")
    body = script[script.index("status=0 lanes=()") :]
    setups = body.index('(.ci/engines.sh setup; minimum_setup) > "$logs/setups" 2>&1 &')
    main = body.index('.venv/bin/python -m pytest tests -q "${workers[@]}" -m "not engines"\n')
    setups_waited = body.index('wait "$prep_pid" || prep_rc=$?')
    engines = body.index('lane "engine suite (Flink, Spark; beside)" .ci/engines.sh test')
    lane = body.index("env PYTEST_WORKERS=1 ./run_local.sh test --minimum")
    engines_waited = body.index('wait "$engines_pid" || engines_rc=$?')
    # the other lanes' setups run in the background during the main suite, which runs alone; after it the
    # engine lane starts in the background and the minimum-versions lane beside it; the engine lane is
    # waited for last
    assert setups < main < setups_waited < engines < lane < engines_waited
    assert body[engines : body.index("\n", body.index("exit $status", engines))].endswith(") &")
    # the engine suite's three streams (tests/engines/conftest.py), pytest processes side by side whose
    # statuses all count (tests/architecture/test_engine_streams.py checks what each selects)
    engines_sh = (ROOT / ".ci" / "engines.sh").read_text(encoding="utf-8")
    streams = engines_sh[engines_sh.index("# Three test processes side by side") :]
    streams = streams[: streams.index("exit $status")]
    assert streams.count("for stream in engines_flink_cluster engines_flink_local engines_spark; do") == 2
    assert '-m "engines and $stream" --durations=10 > "$logs/${#pids[@]}.log" 2>&1 &' in streams
    assert 'wait "${pids[$i]}" || rc=$?' in streams and "[ $rc -eq 0 ] || status=$rc" in streams
    # the engine lane's status counts
    assert "[ $engines_rc -eq 0 ] || status=$engines_rc" in body
    # each lane's status is kept (a failing lane fails the command, after the others ran)
    assert '"$@" || rc=$?' in body and "[ $rc -eq 0 ] || status=$rc" in body and "exit $status" in body
    assert "constraints/minimum.txt" in script and '-c "$pins"' in script
    # the minimum lane's CLIs run beside its quick tier, and both their statuses count
    lane_fn = script[script.index("minimum_lane() {") : script.index("\n}\n", script.index("minimum_lane() {"))]
    clis = lane_fn.index('minimum_clis "$venv/bin" "$out") > "$lane_out/clis.log" 2>&1 &')
    tests = lane_fn.index('-m "not slow and not engines" -p no:cacheprovider || tests_rc=$?')
    assert clis < tests < lane_fn.index('wait "$clis_pid" || clis_rc=$?')
    assert "exit $tests_rc" in lane_fn and "exit $clis_rc" in lane_fn
