"""Order-independent float summation.

Beam sums partial results in whatever order bundles and workers produce them; plain float addition
is not associative, so ``CombinePerKey(sum)`` can differ in the last bits between runners, worker
counts and the in-memory reference. :class:`ExactSumFn` keeps Shewchuk's non-overlapping partials
(the algorithm behind :func:`math.fsum`), so the result is the correctly rounded sum of all inputs
whatever the order: the seeded Beam output is then bit-identical to :mod:`transforms.reference`.
"""
from __future__ import annotations

import math
from typing import Iterable, List

import apache_beam as beam


def add_partial(partials: List[float], x: float) -> List[float]:
    """Adds ``x`` to Shewchuk partials in place (Python recipe 393090, used by math.fsum)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]
    return partials


def exact_sum(values: Iterable[float]) -> float:
    """Correctly rounded sum (alias of math.fsum), the reference's counterpart of ExactSumFn."""
    return math.fsum(values)


class ExactSumFn(beam.CombineFn):
    """CombineFn computing the correctly rounded float sum, independent of order and bundling."""

    def create_accumulator(self):
        return []

    def add_input(self, partials, x):
        return add_partial(partials, float(x))

    def add_inputs(self, partials, xs):
        for x in xs:
            add_partial(partials, float(x))
        return partials

    def merge_accumulators(self, accumulators):
        it = iter(accumulators)
        out = list(next(it, []))
        for acc in it:
            for x in acc:
                add_partial(out, x)
        return out

    def compact(self, partials):
        return partials

    def extract_output(self, partials):
        return math.fsum(partials)
