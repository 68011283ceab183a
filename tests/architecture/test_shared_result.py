"""tests/support/shared_result.py: the engine suite's processes share each case's DirectRunner output."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.shared_result import shared_json

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_processes_racing_for_one_key_build_it_once_and_read_the_same_value(tmp_path):
    """Four processes start together on one key: one build (each build appends to a log), four equal values."""
    log = tmp_path / "builds.log"
    script = textwrap.dedent(
        f"""
        import json, os, time
        from tests.support.shared_result import shared_json
        def build():
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(0.5)  # the others reach the lock meanwhile
            return {{"lines": ["a", "b"], "pid": os.getpid()}}
        print(json.dumps(shared_json({str(tmp_path)!r}, "case/x", build)))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    values = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(log.read_text().split()) == 1  # built once
    assert values == [values[0]] * 4 and values[0]["lines"] == ["a", "b"]


def test_keys_are_apart_a_failed_build_writes_nothing_and_no_directory_always_builds(tmp_path):
    calls = []

    def build(v):
        calls.append(v)
        return {"v": v}

    assert shared_json(str(tmp_path), "k1", lambda: build(1)) == {"v": 1}
    assert shared_json(str(tmp_path), "k2", lambda: build(2)) == {"v": 2}
    assert shared_json(str(tmp_path), "k1", lambda: build(3)) == {"v": 1}  # read back, not built
    assert calls == [1, 2]

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        shared_json(str(tmp_path), "k3", fails)
    assert shared_json(str(tmp_path), "k3", lambda: build(4)) == {"v": 4}  # the failure left no value
    assert shared_json(None, "k1", lambda: build(5)) == {"v": 5} and calls == [1, 2, 4, 5]


def test_a_file_of_another_key_is_refused(tmp_path):
    shared_json(str(tmp_path), "k1", lambda: {"v": 1})
    (path,) = tmp_path.glob("*.json")
    path.write_text(json.dumps({"key": "other", "value": {"v": 9}}))
    with pytest.raises(RuntimeError, match="another key"):
        shared_json(str(tmp_path), "k1", lambda: {"v": 1})
