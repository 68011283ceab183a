"""The selection plan computed once per (algorithm, params) for tests that run the reference many times.

``privacy.selection.plan`` is what a run fixes before it reads any data (its docstring: "computed once,
before any data is read"): ``SelectPartitions`` computes it once per pipeline, but the in-memory reference
(:func:`transforms.selection.reference.release`) recomputes it on every call. An audit calls the reference
thousands of times with the same parameters (one copy per call for the sequential algorithms and MAD-SIPS's
adaptive cap), so most of its CPU went into rebuilding the same deterministic plan (calibrating the rounds of
every cap of the grid, the keep tables' thresholds). :func:`memoised_plans` makes the reference reuse the plan
of the first call with the same ``(algorithm, params)``; the run itself (histograms, subsampling, noise, the
keep draws) still reads fresh randomness on every call, so every trial is the same random experiment as before.

Only the reference's own lookup (``transforms.selection.reference.selection_plan``, a module global it reads
on every call) is replaced, for the duration of the context; the plan function itself is untouched and still
runs once per distinct parameters.
"""

from __future__ import annotations

import contextlib

from dp_partition_beam.transforms.selection import reference as selection_reference


@contextlib.contextmanager
def memoised_plans():
    """Within the context, the reference computes ``plan(algorithm, params)`` once per distinct arguments."""
    original = selection_reference.selection_plan
    plans = {}

    def plan(algorithm, params):
        key = (algorithm, params)
        try:
            hash(key)
        except TypeError:  # an unhashable params object: no memo (the plan function raises if it is invalid)
            return original(algorithm, params)
        if key not in plans:
            plans[key] = original(algorithm, params)
        return plans[key]

    selection_reference.selection_plan = plan
    try:
        yield plans
    finally:
        selection_reference.selection_plan = original
