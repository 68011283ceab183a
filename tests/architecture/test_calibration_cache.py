"""The test suite's calibration cache (tests/support/calibration_cache.py) gives what the product computes:
exact keys, the same values from disk in another process, every caller reached, the calibration's own tests
bypassing it."""

import ast
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

from dp_partition_beam.privacy import dpne, l2_rule, thresholding

from tests import conftest
from tests.support import calibration_cache as cc

REPO = cc.REPO


def test_keys_are_exact_and_refuse_what_has_no_exact_text():
    x = 0.1
    assert cc.key_text(x) != cc.key_text(np.nextafter(x, 1.0))  # one ulp apart: two keys
    assert cc.key_text((1, 1.0, "1", None, True)) == "(int:1,float:0x1.0000000000000p+0,'1',None,True)"
    assert cc.key_text(dpne.DPNEParams(4.0, 1e-7, max_n=3)) != cc.key_text(dpne.DPNEParams(4.0, 1e-7, max_n=4))
    for bad in (np.array([1.0]), [1.0], {"a": 1}, lambda: 0):
        with pytest.raises(cc.Uncacheable):
            cc.key_text(bad)


def _calls(tmp_path):
    calls = []

    def square(x, *, k=1):
        calls.append((x, k))
        return {"value": x * x * k}

    return calls, square


def test_a_value_is_built_once_and_read_back_equal_in_another_cache(tmp_path):
    calls, square = _calls(tmp_path)
    first = cc.CalibrationCache(tmp_path, "v1").wrap("square", square)
    assert first(3.0, k=2) == {"value": 18.0} and first(3.0, k=2) is first(3.0, k=2)
    assert calls == [(3.0, 2)]
    second = cc.CalibrationCache(tmp_path, "v1").wrap("square", square)  # another process: from disk
    assert second(3.0, k=2) == {"value": 18.0} and calls == [(3.0, 2)]
    assert second(3.0, k=3) == {"value": 27.0} and calls == [(3.0, 2), (3.0, 3)]  # other arguments: built
    other_code = cc.CalibrationCache(tmp_path, "v2").wrap("square", square)  # other code: built anew
    assert other_code(3.0, k=2) == {"value": 18.0} and len(calls) == 3
    arrays = cc.CalibrationCache(tmp_path, "v1").wrap("square", square)
    arrays(np.float64(2.0))
    arrays(np.array(2.0))  # no exact key: runs uncached, twice
    arrays(np.array(2.0))
    assert len(calls) == 6


def test_bypass_and_cache_clear_build_anew(tmp_path):
    calls, square = _calls(tmp_path)
    cache = cc.CalibrationCache(tmp_path, "v1")
    f = cache.wrap("square", square)
    f(2.0)
    cache.new_test(bypass=True)
    f(2.0)
    cache.new_test(bypass=False)
    f(2.0)
    assert len(calls) == 2  # the bypassed call ran; the next read the cache
    g = cache.wrap("other", square)
    g(5.0)
    f.cache_clear()
    f(2.0)
    g(5.0)
    assert len(calls) == 5  # after a cache_clear the rest of the test builds, every function
    cache.new_test(bypass=False)
    f(2.0)
    g(5.0)
    assert len(calls) == 5


def test_a_cached_table_is_the_uncached_table_bit_for_bit(tmp_path):
    """The real functions through a fresh cache, in a subprocess that reads what this process wrote."""
    cache = cc.CalibrationCache(tmp_path, cc.code_hash())
    args = (1.0, 1e-5, (0.25, 0.5, 1.0))
    cached = cache.wrap("t", thresholding.calibrate_keep_table.__wrapped__)
    want = thresholding.calibrate_keep_table.__wrapped__(*args)
    assert cached(*args) == want and cache.misses == 1
    script = (
        "import pickle, sys; from tests.support import calibration_cache as cc; "
        "from dp_partition_beam.privacy import thresholding as T; "
        f"c = cc.CalibrationCache({str(tmp_path)!r}, cc.code_hash()); "
        f"v = c.wrap('t', T.calibrate_keep_table.__wrapped__)(*{args!r}); "
        "sys.stdout.buffer.write(pickle.dumps((v, c.hits, c.misses)))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, check=True).stdout
    value, hits, misses = pickle.loads(out)
    assert (hits, misses) == (1, 0) and value == want
    assert pickle.dumps(value) == pickle.dumps(want)


def test_the_suite_installs_it_on_every_target_and_no_caller_imports_one_by_name():
    """Replacing a module attribute reaches a caller only if it looks the name up in that module: no product
    module may ``from <module> import <target>`` (it would keep the uncached function)."""
    if conftest.CALIBRATION_CACHE is not None:
        for module_name, attr in cc.TARGETS:
            module = {"thresholding": thresholding, "l2_rule": l2_rule, "dpne": dpne}[module_name.rsplit(".", 1)[1]]
            assert hasattr(getattr(module, attr), "__wrapped_by_calibration_cache__"), attr
    targets = {(m, a) for m, a in cc.TARGETS}
    offenders = []
    for top in ("privacy", "transforms", "pipelines"):
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    module = node.module if node.module.startswith("dp_partition_beam") else None
                    for alias in node.names:
                        if module and (module, alias.name) in targets:
                            offenders.append(f"{path.relative_to(REPO)}: {alias.name}")
    assert not offenders, offenders


def test_the_bypass_files_exist():
    assert all((pathlib.Path(conftest.TESTS_DIR) / f).is_file() for f in cc.BYPASS_FILES)
