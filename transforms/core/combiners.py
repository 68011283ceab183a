"""Order-independent float summation for the per-element transforms (the columnar path: fixed64 limbs).

Beam sums partial results in whatever order bundles and workers produce them; plain float addition
is not associative, so ``CombinePerKey(sum)`` can differ in the last bits between runners, worker
counts and the in-memory reference. :class:`ExactSumFn` sums in exact integer fixed point at 2^-64:
every input is rounded once to ``round_half_even(x * 2**64)`` (:func:`transforms.core.fixed64.fixed64_of`,
exact for any double of magnitude >= 2^-11), the Python ints are added exactly, and the output
``acc / 2**64`` is correctly rounded. The result is :func:`transforms.core.fixed64.exact_sum64` of the
inputs whatever the order: the same numbers as the columnar path's int64 limbs and the in-memory reference.
"""

from __future__ import annotations

from typing import Dict, Iterable

import apache_beam as beam

from transforms.core.fixed64 import FRACTION_BITS, exact_sum64, fixed64_of

FIXED_POINT_BITS = FRACTION_BITS  # 2**-64: see transforms/core/fixed64.py
_SCALE = 1 << FIXED_POINT_BITS
_CACHE_LIMIT = 65_536


def to_fixed_point(x: float) -> int:
    """``round_half_even(x * 2**64)`` as an exact integer (``x`` a finite float, ``|x| < 2**40``)."""
    return fixed64_of(x)


class FixedPointCache:
    """``cache(x) == to_fixed_point(x)``, memoised: weights take few distinct values (e.g. 1/sqrt(d) for
    d <= Delta_0), so each worker converts each value once. Bounded (cleared past 65,536 values)."""

    def __init__(self):
        self._cache: Dict[float, int] = {}

    def __call__(self, x) -> int:
        v = self._cache.get(x)
        if v is None:
            v = to_fixed_point(x)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[x] = v
        return v


def from_fixed_point(acc: int) -> float:
    """The float nearest to ``acc * 2**-64`` (correctly rounded)."""
    return acc / _SCALE


def exact_sum(values: Iterable[float]) -> float:
    """The reference's counterpart of ExactSumFn (:func:`transforms.core.fixed64.exact_sum64`)."""
    return exact_sum64(values)


class ExactSumFn(beam.CombineFn):
    """CombineFn computing the correctly rounded float sum, independent of order and bundling.

    The accumulator is one Python int (the fixed-point sum). Weights take few distinct values
    (e.g. 1/sqrt(d) for d <= Delta_0), so conversions are cached per worker.
    """

    def __init__(self):
        self._fixed = FixedPointCache()

    def create_accumulator(self):
        return 0

    def add_input(self, acc, x):
        return acc + self._fixed(x)

    def add_inputs(self, acc, xs):
        fixed = self._fixed
        for x in xs:
            acc += fixed(x)
        return acc

    def merge_accumulators(self, accumulators):
        return sum(accumulators)

    def extract_output(self, acc):
        return from_fixed_point(acc)


class FixedPointSumFn(beam.CombineFn):
    """Sums exact fixed-point partial sums (ints from :func:`to_fixed_point`); outputs the float.

    The counterpart of :class:`ExactSumFn` for inputs already pre-summed in fixed point (e.g. per
    bundle by :class:`transforms.selection.basic.BundleWeightSumsFn`): same correctly rounded result.
    """

    def create_accumulator(self):
        return 0

    def add_input(self, acc, x):
        return acc + x

    def add_inputs(self, acc, xs):
        return acc + sum(xs)

    def merge_accumulators(self, accumulators):
        return sum(accumulators)

    def extract_output(self, acc):
        return from_fixed_point(acc)
