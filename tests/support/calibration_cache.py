"""A cross-process cache of the calibrations for the test suite (tests/conftest.py installs it).

Building keep tables, l2 rules and DPNE level tables is most of the cost of many tests whose subject is not
calibration (plans, payloads, Beam == reference, CLIs in process), and every pytest-xdist worker and every
file rebuilt the same ones. This module memoises those pure functions on disk, so each table is built once per
suite run (and kept for the next run of the same code):

- the key is the function's name, its arguments (exactly: floats by ``float.hex``), the sha256 of the
  calibration code (every ``privacy/*.py``) and the versions of Python, numpy and scipy (the minimum-versions
  lane computes its own); an argument of any other type (an array, a callable) is not cached: the call runs;
- the value is the function's own return value, pickled: the same object bits as the uncached call (the
  functions are deterministic given their arguments), so a test sees what the product computes;
- writers take a per-key file lock (``fcntl.flock``), so two workers asking for one table build it once, and
  write by rename, so a reader never sees half a file;
- the calibration's own tests (:data:`BYPASS_FILES`, checked by tests/conftest.py per test) call the functions
  directly: every table is still built and checked by the tests whose subject it is.

The cache lives in ``$DP_TEST_CALIBRATION_CACHE``, else ``.calibration-cache/`` at the repository root
(ignored by git). It only ever holds values that the code hashed into its key computes, so it never needs to be
cleared; deleting it is always safe. ``DP_TEST_CALIBRATION_LOG=FILE`` appends a line per build to FILE (CPU
seconds, the test, the call): what the suite still spends on calibration.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import os
import pathlib
import pickle
import platform
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]

# The calibration's own tests: they build and check the tables, so they never read them from the cache.
BYPASS_FILES = frozenset(
    [
        "privacy/test_thresholding.py",
        "privacy/test_l2_rule.py",
        "privacy/test_l1_curve.py",
        "privacy/test_dpne_tables.py",
        "privacy/test_mad_sips_table.py",
    ]
)

# (module, attribute) of the pure calibration functions that are memoised. Product code calls each through
# its module's namespace (``thresholding.calibrate_keep_table(...)``, a module-global lookup inside the
# module), so replacing the attribute reaches every caller; tests/support/test_calibration_cache checks both.
TARGETS = (
    ("dp_partition_beam.privacy.thresholding", "keep_table"),
    ("dp_partition_beam.privacy.thresholding", "calibrate_keep_table"),
    ("dp_partition_beam.privacy.thresholding", "_keep_table_at"),
    ("dp_partition_beam.privacy.l2_rule", "l2_keep_rule"),
    ("dp_partition_beam.privacy.l2_rule", "calibrate_l2_keep_rule"),
    ("dp_partition_beam.privacy.dpne", "_keep_table"),
    ("dp_partition_beam.privacy.dpne", "plan_tables"),
)


class Uncacheable(TypeError):
    """An argument whose text is not an exact, stable key (an array, an object without a value repr)."""


def key_text(value) -> str:
    """An exact text of a call argument: ints, floats (by ``float.hex``), strings, bools, None, tuples and
    frozen dataclasses of those; anything else raises :class:`Uncacheable`."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return f"int:{int(value)}"
    if isinstance(value, float):
        return f"float:{float(value).hex()}"
    if isinstance(value, tuple):
        return "(" + ",".join(key_text(v) for v in value) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:
        fields = ",".join(f"{f.name}={key_text(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__module__}.{type(value).__qualname__}({fields})"
    raise Uncacheable(type(value).__name__)


def code_hash() -> str:
    """sha256 of the calibration code (every privacy/*.py) and of the library versions it computes with."""
    import numpy
    import scipy

    h = hashlib.sha256()
    for path in sorted((REPO / "privacy").glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"{platform.python_version()} numpy {numpy.__version__} scipy {scipy.__version__}".encode())
    return h.hexdigest()


class CalibrationCache:
    """Memoises functions on disk (see the module docstring); ``bypass`` makes every wrapper call through."""

    def __init__(self, directory: os.PathLike, version: str):
        self.directory = pathlib.Path(directory)
        self.version = version
        self.bypass = False
        self.hits = self.misses = 0
        self._memory = {}  # in-process: the same object for the same key, as the functions' lru_caches give
        self._lock = threading.Lock()
        self._fresh = False  # a cache_clear() was called in the current test: everything is built anew

    def new_test(self, bypass: bool) -> None:
        """Called before each test: whether it bypasses the cache; a cache_clear() of the last test lapses."""
        self.bypass = bypass
        self._fresh = False

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def cached(*args, **kwargs):
            if self.bypass or self._fresh:
                return fn(*args, **kwargs)
            try:
                text = key_text(args) + key_text(tuple(sorted(kwargs.items())))
            except Uncacheable:
                return fn(*args, **kwargs)
            key = hashlib.sha256(f"{self.version}\0{name}\0{text}".encode()).hexdigest()
            with self._lock:
                if (name, key) in self._memory:
                    self.hits += 1
                    return self._memory[name, key]
            value = self._load_or_build(key, fn, args, kwargs, text)
            with self._lock:
                return self._memory.setdefault((name, key), value)

        def cache_clear():
            """As the function's own lru_cache's, and the rest of this test builds every value of every target
            anew: a test that clears a cache wants a fresh build (what a new worker process computes), also of
            the functions the cleared one calls."""
            with self._lock:
                for k in [k for k in self._memory if k[0] == name]:
                    del self._memory[k]
                self._fresh = True
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()

        cached.cache_clear = cache_clear
        cached.__wrapped__ = getattr(fn, "__wrapped__", fn)  # the uncached function, as for an lru_cache
        cached.__wrapped_by_calibration_cache__ = fn
        return cached

    def _load_or_build(self, key, fn, args, kwargs, text):
        path = self.directory / key[:2] / f"{key}.pickle"
        value = self._read(path)
        if value is not None:
            self.hits += 1
            return value[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait, then read its file
            try:
                value = self._read(path)
                if value is not None:
                    self.hits += 1
                    return value[0]
                self.misses += 1
                started = time.process_time()
                result = fn(*args, **kwargs)  # an error is raised as the uncached call raises it (not cached)
                log = os.environ.get("DP_TEST_CALIBRATION_LOG")
                if log:  # the build's CPU s (a nested target's build counts in its caller's too), test, call
                    test = os.environ.get("PYTEST_CURRENT_TEST", "")
                    with open(log, "a", encoding="utf-8") as f:
                        f.write(f"{time.process_time() - started:.2f}\t{test}\t{fn.__name__}{text}\n")
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    pickle.dump((result,), f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
                return result
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _read(path):
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None


def install(directory=None) -> CalibrationCache:
    """Replaces each of :data:`TARGETS` by its memoised wrapper (once per process); returns the cache."""
    import importlib

    directory = directory or os.environ.get("DP_TEST_CALIBRATION_CACHE") or REPO / ".calibration-cache"
    cache = CalibrationCache(directory, code_hash())
    for module_name, attr in TARGETS:
        module = importlib.import_module(module_name)
        fn = getattr(module, attr)
        fn = getattr(fn, "__wrapped_by_calibration_cache__", fn)
        setattr(module, attr, cache.wrap(f"{module_name}.{attr}", fn))
    return cache
