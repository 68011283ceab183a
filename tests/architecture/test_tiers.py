"""The tier lists of tests/conftest.py name files and tests that exist (a rename would silently move a
slow test into the quick lane, or drop a long file from the front of the xdist queue)."""

import ast
import pathlib

from tests import conftest

TESTS = pathlib.Path(conftest.__file__).resolve().parent


def _test_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_listed_file_and_test_exists():
    files = set(conftest.SLOW_FILES) | set(conftest.LONGEST_FIRST)
    missing = sorted(f for f in files if not (TESTS / f).is_file())
    for node in sorted(conftest.QUICK_TESTS | conftest.SLOW_TESTS):
        rel, name = node.split("::")
        if not (TESTS / rel).is_file() or name not in _test_names(TESTS / rel):
            missing.append(node)
    assert not missing, missing
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
