"""Seeded Beam == reference cases as labelled branches of ONE pipeline (tests/support/beam_helpers.py's
``collect_branches``): a DirectRunner pipeline has a fixed cost (seconds in multi_processing mode, where the
worker processes start per pipeline), so a test module runs its cases together, once, in a module fixture,
and each test asserts on its own branch (a failing case is still its own failing test, named by its case).

Each case is a composite ``PTransform`` applied to the pipeline's ``PBegin``: every label of a case is
nested under the case's name, so cases may use the same transforms and labels. Elements are compared as
``str(element)`` (tuples as their ``repr``: ints, floats to 17 digits and strings exactly; a float count
where an int is due, or an item output twice, is a mismatch of the sorted lists).
"""

from __future__ import annotations

import apache_beam as beam
import pytest

from dp_partition_beam.transforms.core import batches
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import Scoped, collect_branches

Branch = Scoped  # ``build(pbegin) -> PCollection`` as a composite (its labels nested under the case's name)


class Select(beam.PTransform):
    """``Create(pairs) [| Reshuffle] | SelectPartitions(algorithm, params, **kwargs)``; ``allowlist`` (a list)
    is given to SelectPartitions as a PCollection (a side input), as the API's long-list form."""

    def __init__(self, pairs, algorithm, params, *, reshuffle=False, allowlist=None, **kwargs):
        super().__init__()
        self._pairs, self._algorithm, self._params = list(pairs), algorithm, params
        self._reshuffle, self._allowlist, self._kwargs = reshuffle, allowlist, kwargs

    def expand(self, pbegin):
        pcoll = pbegin | "Pairs" >> beam.Create(self._pairs)
        if self._reshuffle:
            pcoll = pcoll | "Reshuffle" >> beam.Reshuffle()
        kwargs = dict(self._kwargs)
        if self._allowlist is not None:
            kwargs["allowlist"] = pbegin | "Allowlist" >> beam.Create(list(self._allowlist))
        return pcoll | "Select" >> SelectPartitions(self._algorithm, self._params, **kwargs)


def run_cases(cases, mode="in_memory", workers=None, chunk_rows=None):
    """``{name: PTransform(PBegin -> PCollection)}`` -> ``{name: sorted [str(element)]}``, all from ONE
    pipeline. ``chunk_rows`` sets transforms.core.batches.DEFAULT_CHUNK_ROWS for the run (it is read at run
    time, so it holds for every case of the pipeline; in_memory mode only, where the DoFns run in this
    process) and is restored after."""
    builds = {name: (lambda p, t=t: p | t) for name, t in cases.items()}
    with pytest.MonkeyPatch.context() as patch:
        if chunk_rows is not None:
            assert mode == "in_memory", "DEFAULT_CHUNK_ROWS is patched in this process only"
            patch.setattr(batches, "DEFAULT_CHUNK_ROWS", chunk_rows)
        out = collect_branches(builds, mode=mode, workers=workers)
    return {name: sorted(lines) for name, lines in out.items()}


def rounds_lines(per_round):
    """The sorted ``str((round, item))`` lines of a reference's ``{round: set of items}``."""
    return sorted(str((r, i)) for r, items in per_round.items() for i in items)


def item_lines(items):
    """The sorted ``str(item)`` lines of a reference's items."""
    return sorted(str(i) for i in items)


def count_lines(counts):
    """The sorted ``str((item, count))`` lines of a reference's ``{item: count}``."""
    return sorted(str(kv) for kv in counts.items())
