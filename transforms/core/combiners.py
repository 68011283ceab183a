"""Order-independent float summation.

Beam sums partial results in whatever order bundles and workers produce them; plain float addition
is not associative, so ``CombinePerKey(sum)`` can differ in the last bits between runners, worker
counts and the in-memory reference. :class:`ExactSumFn` sums in exact integer fixed point: every
finite double is an integer multiple of 2**-1074, so ``x * 2**1074`` is a Python int and integer
addition is exact and associative. The output ``acc / 2**1074`` is correctly rounded (CPython's
int/int true division rounds correctly), i.e. equal to :func:`math.fsum` of all inputs whatever
the order: the seeded Beam output is then bit-identical to :mod:`transforms.reference`.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable

import apache_beam as beam

FIXED_POINT_BITS = 1074  # 2**-1074 is the smallest positive (subnormal) double
_SCALE = 1 << FIXED_POINT_BITS
_CACHE_LIMIT = 65_536


def to_fixed_point(x: float) -> int:
    """``x * 2**1074`` as an exact integer (``x`` a finite float)."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"ExactSumFn inputs must be finite floats, got {x!r}")
    num, den = x.as_integer_ratio()  # den is a power of two <= 2**1074
    return num << (FIXED_POINT_BITS - den.bit_length() + 1)


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
    """The float nearest to ``acc * 2**-1074`` (correctly rounded; OverflowError past the float range)."""
    return acc / _SCALE


def exact_sum(values: Iterable[float]) -> float:
    """Correctly rounded sum (alias of math.fsum), the reference's counterpart of ExactSumFn."""
    return math.fsum(values)


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
