"""Exact, order-independent sums of float64 weights, vectorised: fixed point at 2^-64 in three int64 limbs.

Beam adds partial sums in whatever order bundles, shards and workers produce them, and float addition
is not associative. The columnar path therefore sums weights in fixed point: every weight ``w`` is
rounded once to ``q(w) = round_half_even(w * 2^64)`` (an integer), the integers are summed exactly, and
the total is converted back to the float nearest to ``sum(q) / 2^64``. The result does not depend on
order, batching or sharding; the in-memory reference computes the same numbers with Python ints
(:func:`exact_sum64`).

Quantisation: ``q(w) = w * 2^64`` exactly whenever ``w`` is a multiple of 2^-64, e.g. every double of
magnitude >= 2^-11 (its last mantissa bit is worth >= 2^-63). That covers Basic's ``1/sqrt(d)``
(d <= 4 million) and ``count``; ``1/d`` for d <= 2048. Otherwise the rounding moves a weight by at
most 2^-65 ~ 2.7e-20, far below the float rounding of the weights themselves (~1e-16 relative), so the
privacy analysis (done in real arithmetic, like every float implementation's) is not affected
(docs/columnar.md).

Limbs: ``q = hi * 2^42 + mid * 2^21 + lo`` with ``0 <= mid, lo < 2^21`` (``lo`` may be 2^21 after
rounding) and ``hi = floor(w * 2^22)``. Sums of ``mid`` and ``lo`` are exact in int64 for up to 2^42
terms, sums of ``hi`` while ``sum |w| < 2^41``: both far beyond any user count. Weights must be finite
with ``|w| < 2^40``.
"""

from __future__ import annotations

import math
from typing import Iterable, Tuple

import numpy as np

__all__ = ["FRACTION_BITS", "MAX_ABS_WEIGHT", "limbs_of", "value_of_limbs", "fixed64_of", "exact_sum64"]

FRACTION_BITS = 64
MAX_ABS_WEIGHT = float(2**40)
_LIMB = 21
_TWO_21 = float(1 << _LIMB)
_TWO_22 = float(1 << 22)


def _check(w: np.ndarray) -> None:
    if w.size and not (np.isfinite(w).all() and float(np.abs(w).max()) < MAX_ABS_WEIGHT):
        bad = w[~(np.isfinite(w) & (np.abs(w) < MAX_ABS_WEIGHT))][:3]
        raise ValueError(f"weights must be finite with |w| < 2^40, got {bad.tolist()}")


def limbs_of(w) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(hi, mid, lo)`` int64 arrays with ``hi*2^42 + mid*2^21 + lo == round_half_even(w * 2^64)`` exactly.

    Every step is exact in float64: scaling by a power of two, ``floor``, and taking the fractional part.
    """
    w = np.asarray(w, dtype=np.float64)
    _check(w)
    x = w * _TWO_22
    hi = np.floor(x)
    r = (x - hi) * _TWO_21  # in [0, 2^21), exact
    mid = np.floor(r)
    lo = np.rint((r - mid) * _TWO_21)  # round half to even of the last 21 bits (the parity is q's)
    return hi.astype(np.int64), mid.astype(np.int64), lo.astype(np.int64)


def value_of_limbs(hi, mid, lo) -> np.ndarray:
    """The floats nearest to ``(hi*2^42 + mid*2^21 + lo) / 2^64`` (limb sums; correctly rounded).

    Carries are normalised so that ``0 <= mid, lo < 2^21``; then ``hi * 2^-22`` and
    ``(mid * 2^21 + lo) * 2^-64`` are exact floats and their float sum is the correctly rounded total.
    """
    hi = np.atleast_1d(np.asarray(hi, dtype=np.int64)).copy()
    mid = np.atleast_1d(np.asarray(mid, dtype=np.int64)).copy()
    lo = np.atleast_1d(np.asarray(lo, dtype=np.int64)).copy()
    carry = lo >> _LIMB  # floor division (arithmetic shift), also for negative values
    lo -= carry << _LIMB
    mid += carry
    carry = mid >> _LIMB
    mid -= carry << _LIMB
    hi += carry
    low = (mid << _LIMB) + lo  # < 2^42: exact in float64
    out = hi.astype(np.float64) / _TWO_22 + low.astype(np.float64) / float(2**64)
    big = np.abs(hi) >= 1 << 53  # |sum| >= 2^31: hi is not exact in float64; exact Python ints instead
    if big.any():
        for j in np.flatnonzero(big):
            out[j] = ((int(hi[j]) << 42) + (int(mid[j]) << 21) + int(lo[j])) / (1 << FRACTION_BITS)
    return out


def fixed64_of(w: float) -> int:
    """``round_half_even(w * 2^64)`` as a Python int (the scalar oracle of :func:`limbs_of`)."""
    w = float(w)
    if not (math.isfinite(w) and abs(w) < MAX_ABS_WEIGHT):
        raise ValueError(f"weights must be finite with |w| < 2^40, got {w!r}")
    num, den = w.as_integer_ratio()  # den = 2^k
    shift = FRACTION_BITS - (den.bit_length() - 1)
    if shift >= 0:
        return num << shift
    q, rem = divmod(num, 1 << -shift)
    half = 1 << (-shift - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


def exact_sum64(values: Iterable[float]) -> float:
    """The correctly rounded float of ``sum(fixed64_of(v)) / 2^64`` (the reference's per-item sum)."""
    return sum(fixed64_of(v) for v in values) / (1 << FRACTION_BITS)
