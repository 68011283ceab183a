"""The l1 keep curve's 64-bit limits, to within ``LIMIT_ERROR`` = 2^-90 of the exact curve (docs/thresholding.md,
"The realised probabilities").

Pure math (no Beam). :class:`privacy.thresholding.L1KeepCurve` keeps an item of weight W iff 64 random bits are
below ``floor(u 2^64)`` (below its midpoint) or drops it iff they are below ``ceil(v 2^64)`` (above), with
``u = K (e^{eps x} - 1)`` and ``v = K (A^2 e^{-eps x} - 1)``, x = W / unit, ``K = delta / (e^eps - 1)`` and
``A = 1 + (e^eps - 1) / (2 delta)`` (``e^{eps x*} = A``). This module computes those limits in double-word
("double-double") arithmetic: every quantity is an unevaluated sum hi + lo of two float64 with
``|lo| <= ulp(hi) / 2``, built from the error-free transformations TwoSum, FastTwoSum and Dekker's TwoProduct,
so that u and v come out within 2^-93 of their exact values at the float weight W (the proof is in the docs,
step by step); then ``floor`` / ``ceil`` of ``(hi + lo) 2^64`` are taken exactly, in integers.

Every function here works elementwise on numpy float64 arrays and on Python floats alike, with the same IEEE
operations in the same order, so both give the same bits: :func:`limits` runs numpy for many weights and plain
floats for a few (:data:`SCALAR_MAX`: one item per call in the policies' Beam step, where numpy's per-call cost
would dominate).
"""

from __future__ import annotations

import dataclasses
import decimal
import math
from typing import Tuple

import numpy as np

__all__ = [
    "LIMIT_ERROR",
    "MAX_EXPONENT",
    "CurveConstants",
    "curve_constants",
    "limits",
    "scaled_floor_ceil",
    "exp_dd",
    "two_sum",
    "two_prod",
    "dd_mul",
    "dd_add",
]

#: the proven bound on |computed - exact| of u and v (the keep and the drop probability) before the floor /
#: ceil to a multiple of 2^-64 (docs/thresholding.md, "The realised probabilities": 2^-93 with eps x* <= 256)
LIMIT_ERROR = 2.0**-90
#: the largest eps x* = ln A the evaluation supports (the proof's error grows with it; a budget's epsilon <= 100
#: and delta >= 1e-30 give at most 168)
MAX_EXPONENT = 256.0
#: up to this many weights :func:`limits` computes on Python floats (same bits as numpy, ~20 us per weight
#: instead of ~300 us of numpy call overhead per array)
SCALAR_MAX = 8

_SPLITTER = 134217729.0  # 2^27 + 1 (Veltkamp's split of a float64 into two halves of 26 bits)
_FLUSH = 2.0**-200  # an exponent below this is taken as 0 (changes u, v by < 2^-199)
_TABLE_BITS = 8  # exp(a) = 2^m 2^{j/256} exp(r), 0 <= j < 256, |r| <= ln2/256 + 2^-42
_DD_DEGREE = 5  # Taylor terms 0..5 of exp(r) in double words, 6..10 in floats (docs)
_FLOAT_DEGREE = 10


def two_sum(a, b):
    """(s, e) with s = RN(a + b) and s + e = a + b exactly (Knuth's TwoSum; no condition on a, b)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):
    """(s, e) with s = RN(a + b) and s + e = a + b exactly, when |a| >= |b| or a = 0 (Dekker's FastTwoSum)."""
    s = a + b
    return s, b - (s - a)


def _split(a):
    t = _SPLITTER * a
    hi = t - (t - a)
    return hi, a - hi


def two_prod(a, b):
    """(p, e) with p = RN(a b) and p + e = a b exactly (Dekker's TwoProduct with Veltkamp's split; exact
    barring underflow, |a|, |b| < 2^995)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_mul(xh, xl, yh, yl):
    """The double word nearest (xh + xl)(yh + yl) to within relative 8.01 q^2 (q = 2^-53; docs, Lemma M)."""
    p, e = two_prod(xh, yh)
    return _fast_two_sum(p, e + (xh * yl + xl * yh))


def _dd_mul_float(xh, xl, y):
    """(xh + xl) y to within relative 3.01 q^2 (docs, Lemma M)."""
    p, e = two_prod(xh, y)
    return _fast_two_sum(p, e + xl * y)


def dd_add(xh, xl, yh, yl):
    """(xh + xl) + (yh + yl) to within 3.01 q^2 (|x| + |y|) (docs, Lemma A: for operands of one sign, or a
    much smaller second operand of the other, this is relative to the sum)."""
    s, e = two_sum(xh, yh)
    return _fast_two_sum(s, e + (xl + yl))


# --- constants, from 60-digit decimals ---------------------------------------------------------------------


def _dd(d: decimal.Decimal) -> Tuple[float, float]:
    """The double word of a decimal: hi = RN(d), lo = RN(d - hi) (relative error <= q^2 (1 + q) + the decimal's;
    in the caller's 60-digit context)."""
    hi = float(d)
    return hi, float(d - decimal.Decimal(hi))


def _context(extra_digits: int = 0) -> decimal.Context:
    return decimal.Context(prec=60 + extra_digits, rounding=decimal.ROUND_HALF_EVEN, Emax=10**6, Emin=-(10**6))


def _tables():
    with decimal.localcontext(_context()):
        ln2 = decimal.Decimal(2).ln()
        step = ln2 / 2**_TABLE_BITS
        # Cody and Waite: ln2/256 = C1 + C2 + C3, C1 and C2 with <= 36 bits so that k C1 and k C2 are exact for
        # integers k < 2^17
        c1 = math.ldexp(float(round(step * 2**44)), -44)
        c2 = math.ldexp(float(round((step - decimal.Decimal(c1)) * 2**80)), -80)
        c3 = float(step - decimal.Decimal(c1) - decimal.Decimal(c2))
        inv = float(2**_TABLE_BITS / ln2)
        two = [_dd((decimal.Decimal(j) * step).exp()) for j in range(2**_TABLE_BITS)]
        fact = [_dd(1 / decimal.Decimal(math.factorial(j))) for j in range(_DD_DEGREE + 1)]
        tail = [float(1 / decimal.Decimal(math.factorial(j))) for j in range(_DD_DEGREE + 1, _FLOAT_DEGREE + 1)]
    return inv, (c1, c2, c3), two, fact, tail


_INV_STEP, (_C1, _C2, _C3), _TWO, _FACT, _TAIL = _tables()
_TWO_HI = np.array([t[0] for t in _TWO])
_TWO_LO = np.array([t[1] for t in _TWO])


@dataclasses.dataclass(frozen=True)
class CurveConstants:
    """The l1 curve's constants as double words (each within relative 2 q^2 = 2^-105 of its exact value).

    Attributes:
      c: eps / unit (y = eps x = c W).
      log_a: ln A = eps x* (A = 1 + (e^eps - 1) / (2 delta)); two_log_a: 2 ln A = eps 2x*.
      k: K = delta / (e^eps - 1).
      weight_cap: a float weight >= 2 x* unit (1 + 2^-31) (beyond it f = 1; weights are clamped to it).
    """

    c: Tuple[float, float]
    log_a: Tuple[float, float]
    two_log_a: Tuple[float, float]
    k: Tuple[float, float]
    weight_cap: float


def curve_constants(eps: float, delta: float, unit: float) -> CurveConstants:
    """The :class:`CurveConstants` of the curve with these exact float parameters (60 significant digits, more
    when eps is small, so that e^eps - 1 keeps 60). An error if ln A > :data:`MAX_EXPONENT`."""
    e, d, w = decimal.Decimal(eps), decimal.Decimal(delta), decimal.Decimal(unit)
    with decimal.localcontext(_context(max(0, -e.adjusted()))):
        em1 = e.exp() - 1
        k = d / em1
        log_a = (1 + em1 / (2 * d)).ln()
        if not decimal.Decimal(2) ** -960 < e / w < decimal.Decimal(2) ** 960:  # (docs: nothing overflows)
            raise ValueError(f"the l1 curve's eps / unit = {eps:g} / {unit:g} is outside (2^-960, 2^960)")
        if not log_a <= MAX_EXPONENT:
            raise ValueError(
                f"the l1 curve's eps x* = ln(1 + (e^eps - 1) / (2 delta)) is {float(log_a):.4g} at epsilon "
                f"{eps:g}, delta {delta:g}: at most {MAX_EXPONENT:g} is supported (a larger delta)"
            )
        c_dd, log_dd, two_log_dd, k_dd = _dd(e / w), _dd(log_a), _dd(2 * log_a), _dd(k)
    cap = 2.0 * log_dd[0] / c_dd[0] * (1.0 + 2.0**-30)  # >= 2 ln A / c (1 + 2^-31): c cap > 2 ln A
    return CurveConstants(c_dd, log_dd, two_log_dd, k_dd, cap)


# --- exp in double words -----------------------------------------------------------------------------------


def _reduce(a_hi, a_lo, kf):
    """r = a - kf ln2/256 as a double word (kf an integer-valued float < 2^17), to within 2^-110."""
    s, s_e = two_sum(a_hi, -(kf * _C1))  # kf C1, kf C2: exact
    q, q_e = two_sum(s, -(kf * _C2))
    r1, r1_e = two_sum(q, a_lo)
    return two_sum(r1, ((s_e + q_e) + r1_e) - kf * _C3)


def _exp_small(r_hi, r_lo):
    """exp(r) for |r| <= ln2/256 + 2^-42, to within relative 6 q^2: Taylor to degree 10 by Horner, the terms of
    degree >= 6 (< 2^-59) in floats, the rest in double words."""
    g = _TAIL[-1]
    for coef in reversed(_TAIL[:-1]):
        g = coef + r_hi * g
    h_hi, h_lo = _dd_mul_float(r_hi, r_lo, g)
    h_hi, h_lo = dd_add(_FACT[-1][0], _FACT[-1][1], h_hi, h_lo)
    for coef_hi, coef_lo in reversed(_FACT[:-1]):
        h_hi, h_lo = dd_mul(r_hi, r_lo, h_hi, h_lo)
        h_hi, h_lo = dd_add(coef_hi, coef_lo, h_hi, h_lo)
    return h_hi, h_lo


def exp_dd(a_hi, a_lo):
    """exp(a_hi + a_lo) as a double word for 0 <= a <= 1.001 :data:`MAX_EXPONENT`, to within relative 16 q^2
    (q = 2^-53): a = (256 m + j) ln2/256 + r, exp(a) = 2^m 2^{j/256} exp(r) (docs). Arrays or floats."""
    if isinstance(a_hi, np.ndarray):
        kf = np.floor(a_hi * _INV_STEP)
        ki = kf.astype(np.int64)
        t_hi, t_lo = _TWO_HI[ki & 255], _TWO_LO[ki & 255]
        m = ki >> _TABLE_BITS
    else:
        ki = math.floor(a_hi * _INV_STEP)
        kf = float(ki)
        t_hi, t_lo = _TWO[ki & 255]
        m = ki >> _TABLE_BITS
    r_hi, r_lo = _reduce(a_hi, a_lo, kf)
    p_hi, p_lo = _exp_small(r_hi, r_lo)
    e_hi, e_lo = dd_mul(t_hi, t_lo, p_hi, p_lo)
    if isinstance(e_hi, np.ndarray):
        return np.ldexp(e_hi, m), np.ldexp(e_lo, m)
    return math.ldexp(e_hi, m), math.ldexp(e_lo, m)


# --- the curve ---------------------------------------------------------------------------------------------


def _exponent(y_hi, y_lo, cc: CurveConstants, lower):
    """a = y (lower piece) or 2 ln A - y (upper piece), flushed to 0 below 2^-200 (and where negative: past 2x*)."""
    if lower is True:
        a_hi, a_lo = y_hi, y_lo
    else:
        # (2 ln A) - y: the two TwoSums are exact, two roundings of small terms (docs)
        s, s_e = two_sum(cc.two_log_a[0], -y_hi)
        t, t_e = two_sum(cc.two_log_a[1], -y_lo)
        v, v_e = two_sum(s, s_e + t)
        u_hi, u_lo = two_sum(v, t_e + v_e)
        if lower is False:
            a_hi, a_lo = u_hi, u_lo
        else:
            a_hi, a_lo = np.where(lower, y_hi, u_hi), np.where(lower, y_lo, u_lo)
    if isinstance(a_hi, np.ndarray):
        small = a_hi < _FLUSH
        return np.where(small, 0.0, a_hi), np.where(small, 0.0, a_lo)
    return (0.0, 0.0) if a_hi < _FLUSH else (a_hi, a_lo)


def _probability(a_hi, a_lo, cc: CurveConstants):
    """K (e^a - 1) as a double word: u (a = y) or v (a = 2 ln A - y)."""
    e_hi, e_lo = exp_dd(a_hi, a_lo)
    s, s_e = two_sum(e_hi, -1.0)
    d_hi, d_lo = two_sum(s, s_e + e_lo)
    return dd_mul(cc.k[0], cc.k[1], d_hi, d_lo)


def scaled_floor_ceil(hi, lo, ceil):
    """``floor((hi + lo) 2^64)``, or ``ceil`` where ``ceil`` is true, exactly, for a double word with
    0 <= hi + lo < 2^-0.5: uint64 for arrays, int for floats (docs: X = hi 2^64 and Y = lo 2^64 are exact,
    X - floor(X) is exact, and TwoSum gives the sign of what remains)."""
    x, y = hi * 2.0**64, lo * 2.0**64  # exact scalings by a power of two
    if isinstance(x, np.ndarray):
        x, y = np.where(hi > 0.0, x, 0.0), np.where(hi > 0.0, y, 0.0)  # (0 is returned there)
        xi = np.floor(x)
        s, e = two_sum(x - xi, y)
        fs = np.floor(s)
        on = s == fs  # s an integer: the exact sum s + e is below it iff e < 0
        f = fs - (on & (e < 0))
        up = np.asarray(ceil) & ~(on & (e == 0))  # ceil = floor + 1 unless the sum is an integer
        out = xi.astype(np.uint64) + (f + up).astype(np.int64).astype(np.uint64)  # mod 2^64: f may be negative
        return np.where(hi > 0.0, out, np.uint64(0))
    if not hi > 0.0:
        return 0
    xi = math.floor(x)
    s, e = two_sum(x - xi, y)
    fs = math.floor(s)
    on = s == fs
    out = xi + fs - (1 if on and e < 0 else 0)
    return out + (1 if ceil and not (on and e == 0) else 0)


def _limits_arrays(w: np.ndarray, cc: CurveConstants):
    p, e = two_prod(cc.c[0], w)
    y_hi, y_lo = _fast_two_sum(p, e + cc.c[1] * w)
    lower = (y_hi - cc.log_a[0]) + (y_lo - cc.log_a[1]) <= 0.0  # y <= ln A: x <= x* (docs: a mis-branch is harmless)
    a_hi, a_lo = _exponent(y_hi, y_lo, cc, lower)
    v_hi, v_lo = _probability(a_hi, a_lo, cc)
    return lower, scaled_floor_ceil(v_hi, v_lo, ~lower)


def _limit_scalar(w: float, cc: CurveConstants):
    p, e = two_prod(cc.c[0], w)
    y_hi, y_lo = _fast_two_sum(p, e + cc.c[1] * w)
    lower = (y_hi - cc.log_a[0]) + (y_lo - cc.log_a[1]) <= 0.0
    a_hi, a_lo = _exponent(y_hi, y_lo, cc, lower)
    v_hi, v_lo = _probability(a_hi, a_lo, cc)
    return lower, scaled_floor_ceil(v_hi, v_lo, not lower)


def limits(weights, cc: CurveConstants) -> Tuple[np.ndarray, np.ndarray]:
    """(lower, limit) per weight (arrays of the weights' shape; bool and uint64): where ``lower`` (x <= x*),
    ``limit = floor(u 2^64)`` and the item is kept iff its 64 random bits are below it; elsewhere
    ``limit = ceil(v 2^64)`` and it is dropped iff they are below it (0 from 2x* on). u and v are within
    :data:`LIMIT_ERROR` of their exact values at the float weight. Weights below 0 count as 0 (limit 0, never
    kept), above ``weight_cap`` (and +inf) as the cap (limit 0 on the upper piece, always kept); NaN is an
    error."""
    w = np.asarray(weights, dtype=np.float64)
    if np.isnan(w).any():
        raise ValueError("the l1 curve got a NaN weight (weights must be numbers)")
    flat = np.minimum(np.maximum(w.ravel(), 0.0), cc.weight_cap)
    if flat.size <= SCALAR_MAX:
        pairs = [_limit_scalar(float(x), cc) for x in flat]
        lower = np.array([p[0] for p in pairs], dtype=bool)
        limit = np.array([p[1] for p in pairs], dtype=np.uint64)
    else:
        with np.errstate(under="ignore"):  # tiny weights' products (docs: absorbed; Python floats never warn)
            lower, limit = _limits_arrays(flat, cc)
    return lower.reshape(w.shape), limit.reshape(w.shape)
