"""Order-independent float summation.

Beam sums partial results in whatever order bundles and workers produce them; plain float addition
is not associative, so ``CombinePerKey(sum)`` can differ in the last bits between runners, worker
counts and the in-memory reference. :class:`ExactSumFn` sums in exact integer fixed point: every
finite double is an integer multiple of 2**-1074, so ``x * 2**1074`` is a Python int and integer
addition is exact and associative. The output ``acc / 2**1074`` is correctly rounded (CPython's
int/int true division rounds correctly), i.e. equal to :func:`math.fsum` of all inputs whatever
the order: the seeded Beam output is then bit-identical to :mod:`transforms.reference`.

(An earlier version kept Shewchuk partials per key; the integer accumulator gives the same bits at a
fraction of the per-element cost: see BENCHMARKS.md, "Optimisations".)
"""

from __future__ import annotations

import math
from typing import Dict, Iterable

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

FIXED_POINT_BITS = 1074  # 2**-1074 is the smallest positive (subnormal) double
_SCALE = 1 << FIXED_POINT_BITS
_CACHE_LIMIT = 65_536
# finish_bundle outputs must be WindowedValues; building one per element (GlobalWindows.windowed_value)
# costs a Timestamp construction each (~4 us, a large share of the MAD2R profile), so copy a template.
_GLOBAL_WV = GlobalWindows.windowed_value(None)


def in_global_window(value):
    """``value`` as a WindowedValue in the global window (for ``finish_bundle`` outputs)."""
    return _GLOBAL_WV.with_value(value)


def to_fixed_point(x: float) -> int:
    """``x * 2**1074`` as an exact integer (``x`` a finite float)."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"ExactSumFn inputs must be finite floats, got {x!r}")
    num, den = x.as_integer_ratio()  # den is a power of two <= 2**1074
    return num << (FIXED_POINT_BITS - den.bit_length() + 1)


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
        self._cache: Dict[float, int] = {}

    def _fixed(self, x) -> int:
        v = self._cache.get(x)
        if v is None:
            v = to_fixed_point(x)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[x] = v
        return v

    def create_accumulator(self):
        return 0

    def add_input(self, acc, x):
        v = self._cache.get(x)
        return acc + (self._fixed(x) if v is None else v)

    def add_inputs(self, acc, xs):
        cache, fixed = self._cache, self._fixed
        for x in xs:
            v = cache.get(x)
            acc += fixed(x) if v is None else v
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


class BundleDictFn(beam.DoFn):
    """Base of DoFns that pre-aggregate into a dict ``self._acc`` (key -> partial) per bundle.

    Subclasses update ``self._acc`` in ``process`` and end it with ``yield from self._flush_if_full()``;
    the partials are emitted when ``max_keys`` keys are buffered (bounded memory) and when the bundle
    ends. Global window only (the callers check): the partials must be exact (ints), so how elements
    fall into bundles cannot change the combined result.
    """

    def __init__(self, max_keys: int = 100_000):
        self._max_keys = int(max_keys)
        self._acc: Dict = {}

    def start_bundle(self):
        self._acc = {}

    def process(self, element, *args, **kwargs):  # pragma: no cover - subclasses implement it
        raise NotImplementedError(f"{type(self).__name__} must implement process")

    def _flush_if_full(self):
        if len(self._acc) >= self._max_keys:
            acc, self._acc = self._acc, {}
            yield from acc.items()

    def finish_bundle(self):
        acc, self._acc = self._acc, {}
        for kv in acc.items():
            yield in_global_window(kv)
