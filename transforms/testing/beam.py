"""Small DoFns used by the test-suite to observe where work ran (multi-process checks).

They live in the package because DirectRunner's multi_processing workers import DoFns by module
name and cannot import test modules.
"""

from __future__ import annotations

import os

import apache_beam as beam


class TagWithPidFn(beam.DoFn):
    """x -> (os.getpid(), x): which worker process handled each element."""

    def process(self, element):
        yield os.getpid(), element


def format_tsv(element) -> str:
    """(a, b) -> 'a<TAB>b' with repr-free formatting for floats (17 significant digits)."""
    a, b = element
    if isinstance(b, float):
        b = repr(b)
    return f"{a}\t{b}"


def zero_weight(item):
    return item, 0.0


# --------------------------------------------------------------------------------------------------
# Fault injection (tests/guarantees/test_fault_tolerance.py)
# --------------------------------------------------------------------------------------------------


class InjectedFailure(RuntimeError):
    """Raised by :func:`inject_bundle_failures` on the first attempt of a bundle."""


def _element_marker(marker_dir: str, label: str, element) -> str:
    import hashlib

    from dp_partition_beam.transforms.core.randomness import encode_key

    digest = hashlib.blake2b(encode_key((label, element)), digest_size=16).hexdigest()
    return os.path.join(marker_dir, f"{label}-{digest}")


def inject_bundle_failures(dofn_class, marker_dir: str, max_failures: int | None = None):
    """Patches ``dofn_class`` so that every bundle fails on its first attempt and succeeds on retry.

    The bundle is identified by its first element: the first ``process`` call after
    ``start_bundle`` looks for a marker file named by (class, hash of (class, element)) in
    ``marker_dir``; if there is none it creates it and raises :class:`InjectedFailure` (after the
    wrapped DoFn has already done its work for that element, so state like drawn noise is thrown away
    with the attempt). A retry of the same bundle finds the marker and runs normally. Returns a
    function that undoes the patch. Markers left in ``marker_dir`` count the injected failures; their
    names start with the class's ``module.qualname`` and a ``-``.

    ``max_failures``: inject at most this many failures into this class (later new bundles run
    normally). A runner whose retry feeds a bundle its elements in another order (Flink and Spark
    restart a task whose input comes from a shuffle, and the order in which the upstream tasks'
    outputs arrive varies) starts it with another first element, which is a new bundle to the
    markers: without a cap such a task can fail on every attempt until the engine gives up.

    For in-process runners only (the patch lives on the class in this interpreter; the cap is counted
    in it, under a lock, so concurrent bundles cannot overshoot it).
    """
    import functools
    import threading

    lock = threading.Lock()
    injected = [0]  # failures injected into this class so far

    orig_start = dofn_class.__dict__.get("start_bundle")
    own_process = dofn_class.__dict__.get("process")  # None: inherited (a PerUserFn's)
    orig_process = dofn_class.process
    label = f"{dofn_class.__module__}.{dofn_class.__qualname__}"

    def start_bundle(self, *args, **kwargs):
        self._inject_armed = True
        if orig_start is not None:
            return orig_start(self, *args, **kwargs)
        return super(dofn_class, self).start_bundle(*args, **kwargs)

    @functools.wraps(orig_process)
    def process(self, element, *args, **kwargs):
        outputs = orig_process(self, element, *args, **kwargs)
        outputs = list(outputs) if outputs is not None else []
        if getattr(self, "_inject_armed", False):
            self._inject_armed = False
            marker = _element_marker(marker_dir, label, element)
            with lock:
                fail = not os.path.exists(marker) and (max_failures is None or injected[0] < max_failures)
                if fail:
                    injected[0] += 1
                    with open(marker, "w"):
                        pass
            if fail:
                raise InjectedFailure(f"injected failure in {label} (first attempt of a bundle)")
        return outputs

    dofn_class.start_bundle = start_bundle
    dofn_class.process = process

    def undo():
        if own_process is None:
            del dofn_class.process
        else:
            dofn_class.process = own_process
        if orig_start is None:
            del dofn_class.start_bundle
        else:
            dofn_class.start_bundle = orig_start

    return undo
