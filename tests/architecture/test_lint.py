"""ruff (lint + format, pyproject.toml) is part of the test suite: the tree must stay clean."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ruff(*args):
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    r = _ruff("check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_clean():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
