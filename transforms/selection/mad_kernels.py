"""Pure numpy kernels of MaxAdaptiveDegree (MAD), plus an in-memory MAD weighting.

Paper: Chen, Cohen-Addad, Epasto, Zadimoghaddam, "Scalable Private Partition Selection via Adaptive
Weighting" (the MAD paper of docs/design.md), Algorithms 2 (UserWeights) and
3 (MAD). No Beam imports: the Beam transform moves data between these functions, and
:func:`mad_weights` (the in-memory reference) is built from exactly the same kernels.

Erratum used (docs/design.md): Alg. 3 line 6 is ``r(i) = max{0, (w_init(i) - tau) / w_init(i)}``.

How the per-item weight decomposes (Alg. 3 lines 12-17), which is what the Beam version sums::

    w(i) = w_trunc(i) + sum over users u holding i of mad_user_contributions(u)[i]

where ``w_trunc(i) = min(w_init(i), tau)`` (line 8) is a per-item quantity, and a user's
contribution is ``alpha * e_u / d_max + w_b^u(i) - 1/|S_u|`` for an adaptive user (lines 11 and 15)
and ``w_b^u(i)`` for a non-adaptive user (line 17).

Privacy (Lemma 5.3, Lemma 5.6) needs ``tau >= 1``, ``d_max >= 4``, ``b_min in [0.5, 1]`` and
``b_max >= 1``; the MAD entry points check these by default (``require_proof_conditions=True``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Hashable, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy.validation import check_range
from dp_partition_beam.transforms.core.batches import ITEM
from dp_partition_beam.transforms.core.fixed64 import FRACTION_BITS, exact_sum64, limbs_of, value_of_limbs
from dp_partition_beam.transforms.core.randomness import encode_key
from dp_partition_beam.transforms.core.tables import EXACT_FLOAT_SUM, limb_table, sum_by_item, user_codes

__all__ = [
    "user_weights",
    "user_weights_many",
    "table_round_partials",
    "reroute_discount",
    "adaptive_degree_range",
    "is_adaptive",
    "initial_weight",
    "excess_fraction",
    "truncate",
    "user_excess",
    "reroute_weight",
    "mad_user_contributions",
    "mad_weights",
    "mad_weight_components",
    "MadComponents",
    "check_mad_params",
    "round2_bias",
]

# UserWeights stops the rescaling loop once the squared l2 norm is within this of 1 (Alg. 2 line 6).
_NORM_SQ_TOL = 1e-12
# ... or once the scale factor C is no longer meaningfully above 1 (Alg. 2 line 8).
_MIN_SCALE = 1.0 + 1e-15
# sum w^2 <= 1 is checked on the exact fixed-point sum: sum of round(w^2 * 2^64) <= 2^64.
_ONE_FIXED = 1 << FRACTION_BITS
# Tolerance of ceil(1 / b_min^2) (Alg. 3 line 3), so that e.g. b_min = 1/sqrt(2) gives 2, not 3.
_CEIL_REL_TOL = 1e-12


# --------------------------------------------------------------------------------------------------
# Parameter checks
# --------------------------------------------------------------------------------------------------


def _check_bias_range(b_min: Any, b_max: Any, min_b_min: float = 0.0) -> Tuple[float, float]:
    """b_min in (0, 1] (or [min_b_min, 1]), b_max in [1, inf] (+inf allowed: paper's b_max in [1, inf])."""
    b_min_f = check_range("b_min", b_min, min_b_min, 1.0, lo_open=min_b_min <= 0.0)
    if isinstance(b_max, float) and b_max == math.inf:
        return b_min_f, b_max  # check_range treats an infinite bound as open; the paper allows inf
    b_max_f = check_range("b_max", b_max, 1.0, math.inf)
    return b_min_f, b_max_f


def check_mad_params(
    tau: Any,
    d_max: Any,
    b_min: Any = 1.0,
    b_max: Any = 1.0,
    require_proof_conditions: bool = True,
) -> Tuple[float, float, float, float]:
    """Validates MAD's parameters and returns them as floats ``(tau, d_max, b_min, b_max)``.

    Always enforced (the domain of Alg. 3's inputs): ``tau >= 0``, ``d_max > 1``,
    ``b_min in [0.5, 1]``, ``b_max >= 1`` (``inf`` allowed). With ``require_proof_conditions``
    (default) also the conditions of the privacy proof: ``tau >= 1`` and ``d_max >= 4``
    (Lemma 5.3). Errors name the parameter, the value given and the allowed range.
    """
    if require_proof_conditions:  # Lemma 5.3: tau >= 1, d_max >= 4
        tau_f = check_range("tau", tau, 1.0, math.inf, hi_open=True)
        d_max_f = check_range("d_max", d_max, 4.0, math.inf, hi_open=True)
    else:  # the domain of Alg. 3's inputs
        tau_f = check_range("tau", tau, 0.0, math.inf, hi_open=True)
        d_max_f = check_range("d_max", d_max, 1.0, math.inf, lo_open=True, hi_open=True)
    b_min_f, b_max_f = _check_bias_range(b_min, b_max, min_b_min=0.5)
    return tau_f, d_max_f, b_min_f, b_max_f


# --------------------------------------------------------------------------------------------------
# Algorithm 2: UserWeights
# --------------------------------------------------------------------------------------------------

# Every sum of Alg. 2 is an exact, order-independent sum (transforms.core.fixed64): each term is
# rounded once to a multiple of 2^-64 (exactly representable for terms >= 2^-11, e.g. every w^2 of a
# user of degree d <= 2048 * b_min^2), the multiples are added exactly, and the total is rounded once
# to float. So UserWeights depends only on the multiset of a user's biases, not on the order of its
# items, and :func:`user_weights_many` reproduces :func:`user_weights` bit for bit with per-user
# integer sums of the limbs.


def _fixed_sum(values: np.ndarray) -> int:
    """``sum(round_half_even(v * 2^64))`` exactly, as a Python int (the numerator of ``exact_sum64``)."""
    hi, mid, lo = limbs_of(values)
    return (int(hi.sum()) << 42) + (int(mid.sum()) << 21) + int(lo.sum())


def _exact_sum(values: np.ndarray) -> float:
    """``exact_sum64(values)``: the float nearest to the exact fixed-point sum (int / int rounds correctly)."""
    return _fixed_sum(values) / _ONE_FIXED


def user_weights(
    degree_or_biases: Union[int, Sequence[float], np.ndarray],
    b_min: float = 1.0,
    b_max: float = 1.0,
) -> np.ndarray:
    """Algorithm 2 (UserWeights): the l2-bounded weights one user gives to its items.

    Args:
      degree_or_biases: either an ``int`` d - the unbiased user of degree d, whose weights are
        ``d`` copies of ``1/sqrt(d)`` (this is Basic, Alg. 5) - or a 1-D array of biases
        ``b(i) in [0, 1]``, one per item of the user's set in that order (1.0 = unbiased).
      b_min: minimum bias, in (0, 1] (MAD needs [0.5, 1]).
      b_max: maximum bias, in [1, inf].

    Returns:
      ``w_b``, float64 array aligned with the items, with (Lemma 5.4)
      ``b_min/sqrt(d) <= w_b(i) <= b_max/sqrt(d)`` and ``||w_b||_2 <= 1``. The upper bound and the
      norm bound hold exactly in floating point (tiny rounding overshoots are scaled/clipped away);
      the lower bound holds up to ~1e-15 relative. If no item is biased the result is exactly
      ``1/sqrt(d)`` everywhere. ``d = 0`` gives an empty array.

    Sums: every sum over items (lines 5, 6 and 8, and the final norm check) is the exact sum of
    :mod:`transforms.core.fixed64` (each term rounded once to a multiple of 2^-64, exact for terms
    >= 2^-11), not a float sum, so the result depends only on the multiset of biases: permuting the
    items permutes the weights, bit for bit. :func:`user_weights_many` computes the same bits for
    many users at once.

    Termination of the rescaling loop (lines 6-9): every pass either
      (a) has ``C`` = the b_max cap term: the items of ``S_small`` with the largest weight are set
          to ``b_max/sqrt(d) >= 1/sqrt(d)`` and leave ``S_small`` for good (weights never
          decrease), so ``|S_small|`` strictly decreases - at most ``d`` such passes; or
      (b) has ``C`` = the l2 term: the squared norm becomes 1 (exactly in real arithmetic), so the
          loop ends right after this pass.
    ``S_small`` can never be empty while the norm is < 1 in exact arithmetic (all weights
    ``>= 1/sqrt(d)`` give norm >= 1), but the floating-point guards stop on an empty ``S_small``,
    on ``1 - sum w^2 <= 1e-12`` and, in case (b), on ``C <= 1 + 1e-15``. Hence at most ``d + 1``
    passes; the loop is capped at ``d + 2`` and asserts.

    Floating point: for a user with a biased item the result has ``sum w^2 <= 1`` exactly: the
    fixed-point sum of the float squares ``w(i)*w(i)`` (each rounded to a multiple of 2^-64) is
    ``<= 2^64`` as an integer, so also its float value and the correctly rounded float sum of the
    squares are ``<= 1`` whenever every square is >= 2^-11 (a rounding overshoot is scaled away).
    Numpy's pairwise ``np.sum(w * w)`` can still round to a few ulps above 1. The unbiased result
    is exactly ``1/sqrt(d)`` (bit-identical to Basic), whose ``sum w^2`` can exceed 1 by a few ulps
    (e.g. d = 3).
    """
    b_min_f, b_max_f = _check_bias_range(b_min, b_max)
    if isinstance(degree_or_biases, (int, np.integer)) and not isinstance(degree_or_biases, bool):
        d = int(degree_or_biases)
        if d < 0:
            raise ValueError(f"degree must be >= 0, got {degree_or_biases!r}")
        if d == 0:
            return np.zeros(0, dtype=np.float64)
        # Unbiased user (b = 1 everywhere): Alg. 2 line 5 gives min(b_max, 1)/sqrt(d) = 1/sqrt(d)
        # and the loop of lines 6-9 is not entered.
        return np.full(d, 1.0 / math.sqrt(d), dtype=np.float64)

    b = np.asarray(degree_or_biases, dtype=np.float64)
    if b.ndim != 1:
        raise ValueError(f"biases must be a 1-D array, got shape {b.shape}")
    d = b.size
    if d == 0:
        return np.zeros(0, dtype=np.float64)
    _check_biases(b)

    sqrt_d = math.sqrt(d)
    inv_sqrt_d = 1.0 / sqrt_d
    cap = b_max_f / sqrt_d  # b_max / sqrt(|S_u|) (inf if b_max is inf); >= inv_sqrt_d in float

    biased = b < 1.0  # Alg. 2 line 2: S_biased = {i in S_u : b(i) < 1}
    unbiased = ~biased  # Alg. 2 line 3: S_unbiased = S_u \ S_biased
    if not biased.any():
        # Nothing biased: line 5 gives min(b_max/sqrt(d), sqrt(1/d)) = 1/sqrt(d), loop not entered.
        return np.full(d, inv_sqrt_d, dtype=np.float64)

    w = np.zeros(d, dtype=np.float64)  # Alg. 2 line 1: initialise w_b with zeros
    # Alg. 2 line 4: w_b(i) = max{b_min, b(i)} / sqrt(|S_u|) for i in S_biased.
    w[biased] = np.maximum(b_min_f, b[biased]) * inv_sqrt_d
    n_unbiased = int(np.count_nonzero(unbiased))
    if n_unbiased:  # line 5 divides by |S_unbiased|; with no unbiased items it assigns nothing.
        w_biased = w[biased]
        remaining = max(0.0, 1.0 - _exact_sum(w_biased * w_biased))
        # Alg. 2 line 5: w_b(i) = min{b_max/sqrt(|S_u|), sqrt((1 - sum_biased w_b^2)/|S_unbiased|)}.
        w[unbiased] = min(cap, math.sqrt(remaining / n_unbiased))

    max_passes = d + 2
    for _ in range(max_passes):
        deficit = 1.0 - _exact_sum(w * w)
        if deficit <= _NORM_SQ_TOL:  # Alg. 2 line 6: while sum w_b^2 < 1 (float guard)
            break
        small = w < inv_sqrt_d  # Alg. 2 line 7: S_small = {i : w_b(i) < 1/sqrt(|S_u|)}
        if not small.any():  # float guard (impossible in exact arithmetic, see docstring)
            break
        w_small = w[small]
        w_small_max = float(np.max(w_small))
        if not w_small_max > 0.0:  # float guard: only if b_min/sqrt(d) underflows to 0
            break
        # sum_small w_b^2 = m^2 * s with m = max_small w_b, s = sum_small (w_b/m)^2 >= 1: this form
        # cannot underflow to 0 even for subnormal weights.
        rel = w_small / w_small_max
        rel_sq = _exact_sum(rel * rel)
        # Alg. 2 line 8: C = min{(b_max/sqrt(d)) / max_{S_small} w_b, sqrt(1 + deficit/sum_small w_b^2)}
        #                  = min{cap / m, sqrt(m^2 + deficit/s) / m}
        c_cap = cap / w_small_max  # may overflow to inf (b_max huge): then the l2 term decides
        c_norm = math.sqrt(w_small_max * w_small_max + deficit / rel_sq) / w_small_max
        if c_norm <= c_cap:  # C = min{...} is the l2 term: case (b)
            # Float guards: C <= 1 + 1e-15 leaves nothing to do; C = inf only for subnormal weights.
            if c_norm > _MIN_SCALE and math.isfinite(c_norm):
                w[small] = w_small * c_norm  # Alg. 2 line 9
            break  # the l2 budget is filled, sum w_b^2 = 1 (exact arithmetic): the loop ends
        # C is the cap term: case (a). Alg. 2 line 9 with C = cap / max_small w_b >= 1; the largest
        # small items land exactly on the cap (as in exact arithmetic) and leave S_small for good.
        # This is progress even when C rounds to ~1, so no C-guard here.
        w[small] = w_small * c_cap  # Alg. 2 line 9
        small_idx = np.flatnonzero(small)
        w[small_idx[w_small == w_small_max]] = cap
    else:  # pragma: no cover - excluded by the termination argument in the docstring
        raise AssertionError(f"UserWeights did not terminate within {max_passes} passes (d={d})")

    # Lemma 5.4 in floating point: weights <= b_max/sqrt(d) and ||w_b||_2 <= 1 exactly.
    np.minimum(w, cap, out=w)
    norm_fixed = _fixed_sum(w * w)
    if norm_fixed > _ONE_FIXED:  # rounding overshoot of a few ulps: scale down so that sum w^2 <= 1
        w /= math.sqrt(norm_fixed / _ONE_FIXED)
        # terminates: each pass removes ~4 ulps of the (few ulps of) overshoot
        while _fixed_sum(w * w) > _ONE_FIXED:
            w *= _SHRINK
    return w


_SHRINK = 1.0 - 2.0**-50  # the final scale-down step of UserWeights


def _check_biases(b: np.ndarray) -> None:
    if not np.all((b >= 0.0) & (b <= 1.0)):  # also rejects NaN
        raise ValueError(f"biases must lie in [0, 1], got values {b[~((b >= 0.0) & (b <= 1.0))][:5]}")


def _segment_fixed_sums(values: np.ndarray, starts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment ``[starts[k], starts[k+1])``: the exact fixed-point sum as normalised int64 limbs.

    ``hi * 2^42 + mid * 2^21 + lo`` with ``0 <= mid, lo < 2^21`` equals ``_fixed_sum`` of the segment
    (the int64 limb sums are exact: the terms here are squares <= ~2, see transforms.core.fixed64).
    """
    hi, mid, lo = (np.add.reduceat(limb, starts) for limb in limbs_of(values))
    carry = lo >> 21
    lo -= carry << 21
    mid += carry
    carry = mid >> 21
    mid -= carry << 21
    hi += carry
    return hi, mid, lo


def _segment_exact_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per segment: ``_exact_sum`` of its values (value_of_limbs rounds correctly, as int / int does)."""
    return value_of_limbs(*_segment_fixed_sums(values, starts))


def _segment_sums_exceed_one(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per segment: ``_fixed_sum(values of the segment) > 2^64`` (exact integer comparison)."""
    hi, mid, lo = _segment_fixed_sums(values, starts)
    return (hi > 1 << 22) | ((hi == 1 << 22) & ((mid | lo) != 0))


def user_weights_many(
    user_codes: np.ndarray,
    biases: np.ndarray,
    b_min: float = 1.0,
    b_max: float = 1.0,
) -> np.ndarray:
    """Algorithm 2 (UserWeights) for many users at once, bit-identical to :func:`user_weights`.

    Args:
      user_codes: 1-D integer array, the user of each row; a user's rows need not be adjacent.
      biases: 1-D array of ``b(i) in [0, 1]`` aligned with ``user_codes``: each row is one item of
        its user, so the user's degree d is its number of rows.
      b_min, b_max: as in :func:`user_weights`.

    Returns:
      float64 array aligned with the rows: for the rows of each user, exactly
      ``user_weights(biases of that user's rows, b_min, b_max)`` (in the rows' order). The result does
      not depend on the order of the rows: :func:`user_weights` depends only on the multiset of a
      user's biases (its sums are exact, its max and elementwise steps order-free).

    Vectorised: rows are sorted by user (stable), per-user sums are exact integer limb sums over the
    segments (``np.add.reduceat``), maxima are ``np.maximum.reduceat``, and each pass of the rescaling
    loop (lines 6-9) runs on the rows of the users still in it. Every float operation is the same IEEE
    operation on the same operands as in :func:`user_weights`, so the guarantees (Lemma 5.4 bounds,
    ``sum w^2 <= 1`` exactly for users with a biased item, exactly ``1/sqrt(d)`` for unbiased users)
    and the termination argument (at most ``d + 1`` passes per user; asserts after ``d + 2``) carry over.
    """
    b_min_f, b_max_f = _check_bias_range(b_min, b_max)
    codes = np.asarray(user_codes)
    b = np.asarray(biases, dtype=np.float64)
    if codes.ndim != 1 or b.ndim != 1 or codes.shape != b.shape:
        raise ValueError(f"user_codes and biases must be 1-D of equal length, got {codes.shape} and {b.shape}")
    if codes.size and not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"user_codes must be integers, got dtype {codes.dtype}")
    n = b.size
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    _check_biases(b)

    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    degree = np.diff(np.r_[starts, n])
    sqrt_d = np.sqrt(degree.astype(np.float64))
    inv_sqrt_d = 1.0 / sqrt_d
    w_sorted = np.repeat(inv_sqrt_d, degree)  # unbiased users: exactly 1/sqrt(d) (no loop, no clipping)

    bs = b[order]
    n_biased = np.add.reduceat((bs < 1.0).astype(np.int64), starts)
    users = np.flatnonzero(n_biased > 0)  # Alg. 2 line 2: users with S_biased non-empty
    if users.size:
        rows = np.flatnonzero(np.repeat(n_biased > 0, degree))  # their rows, still grouped by user
        w_sorted[rows] = _user_weights_biased(
            bs[rows], degree[users], sqrt_d[users], inv_sqrt_d[users], b_min_f, b_max_f
        )
    out = np.empty(n, dtype=np.float64)
    out[order] = w_sorted
    return out


def _user_weights_biased(
    b: np.ndarray,
    degree: np.ndarray,
    sqrt_d: np.ndarray,
    inv_sqrt_d: np.ndarray,
    b_min: float,
    b_max: float,
) -> np.ndarray:
    """:func:`user_weights_many` for rows grouped by user (``degree`` rows each), every user biased."""
    n_users = degree.size
    starts = np.r_[0, np.cumsum(degree)[:-1]]
    user_of_row = np.repeat(np.arange(n_users), degree)
    cap = b_max / sqrt_d  # per user, as user_weights (inf if b_max is inf)
    inv_row = inv_sqrt_d[user_of_row]
    cap_row = cap[user_of_row]

    biased = b < 1.0  # Alg. 2 line 2
    w = np.zeros(b.size, dtype=np.float64)  # Alg. 2 line 1
    w[biased] = np.maximum(b_min, b[biased]) * inv_row[biased]  # Alg. 2 line 4
    n_unbiased = degree - np.add.reduceat(biased.astype(np.int64), starts)
    w_biased = np.where(biased, w, 0.0)  # zero terms add exactly nothing to a fixed-point sum
    remaining = np.maximum(0.0, 1.0 - _segment_exact_sums(w_biased * w_biased, starts))
    has_unbiased = n_unbiased > 0
    line5 = np.full(n_users, np.nan)
    line5[has_unbiased] = np.minimum(
        cap[has_unbiased], np.sqrt(remaining[has_unbiased] / n_unbiased[has_unbiased].astype(np.float64))
    )
    w[~biased] = line5[user_of_row[~biased]]  # Alg. 2 line 5 (only users with unbiased items have such rows)

    # Alg. 2 lines 6-9, one pass for all users still in the loop. `act` are those users (increasing),
    # `rows` their rows (grouped by user, in the same order), `seg` the segment starts within `rows`.
    act = np.arange(n_users)
    rows = np.arange(b.size)
    seg = starts
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for pass_ in range(int(degree.max()) + 2):
            if act.size == 0:
                break
            wr = w[rows]
            urow = np.repeat(np.arange(act.size), np.diff(np.r_[seg, rows.size]))  # position in act, per row
            deficit = 1.0 - _segment_exact_sums(wr * wr, seg)
            small = wr < inv_row[rows]  # Alg. 2 line 7
            m = np.maximum.reduceat(np.where(small, wr, -np.inf), seg)  # max of S_small (-inf if empty)
            # Alg. 2 line 6 (deficit), empty S_small, and m underflowed to 0: the user leaves the loop.
            go = (deficit > _NORM_SQ_TOL) & (m > 0.0)
            m_row = m[urow]
            take = small & go[urow]
            rel = np.where(take, wr / m_row, 0.0)
            rel_sq = _segment_exact_sums(rel * rel, seg)
            c_cap = cap[act] / m  # Alg. 2 line 8 (cap term)
            c_norm = np.sqrt(m * m + deficit / rel_sq) / m  # Alg. 2 line 8 (l2 term)
            l2 = c_norm <= c_cap  # case (b)
            scale = go & l2 & (c_norm > _MIN_SCALE) & np.isfinite(c_norm)
            capped = go & ~l2  # case (a)
            r_scale = take & scale[urow]
            w[rows[r_scale]] = wr[r_scale] * c_norm[urow[r_scale]]  # Alg. 2 line 9
            r_cap = take & capped[urow]
            new = wr[r_cap] * c_cap[urow[r_cap]]  # Alg. 2 line 9
            top = wr[r_cap] == m_row[r_cap]
            new[top] = cap[act][urow[r_cap]][top]  # the largest small items land exactly on the cap
            w[rows[r_cap]] = new
            # Only case (a) users stay in the loop; user_weights allows d + 2 passes.
            if np.any(capped & (pass_ + 1 >= degree[act] + 2)):  # pragma: no cover - see the docstring
                raise AssertionError("UserWeights did not terminate within d + 2 passes")
            keep_row = capped[urow]
            rows = rows[keep_row]
            act = act[capped]
            seg = np.r_[0, np.cumsum(degree[act])[:-1]] if act.size else seg[:0]
        else:  # pragma: no cover - excluded by the termination argument of user_weights
            if act.size:
                raise AssertionError("UserWeights did not terminate within d + 2 passes")

    # Lemma 5.4 in floating point: weights <= b_max/sqrt(d) and sum w^2 <= 1 exactly.
    np.minimum(w, cap_row, out=w)
    over = _segment_sums_exceed_one(w * w, starts)
    if over.any():
        sel = np.flatnonzero(over[user_of_row])
        norm = _segment_exact_sums(w * w, starts)
        w[sel] /= np.sqrt(norm[user_of_row[sel]])
        act = np.flatnonzero(over)
        while act.size:  # as user_weights: shrink each user's weights until its sum is <= 1
            rows = np.flatnonzero(np.isin(user_of_row, act))
            seg = np.r_[0, np.cumsum(degree[act])[:-1]]
            wr = w[rows]
            still = _segment_sums_exceed_one(wr * wr, seg)
            w[rows[still[np.repeat(np.arange(act.size), degree[act])]]] *= _SHRINK
            act = act[still]
    return w


# --------------------------------------------------------------------------------------------------
# Algorithm 3: MAD, per-line kernels
# --------------------------------------------------------------------------------------------------


def reroute_discount(b_min: float, d_max: float) -> float:
    """Alg. 3 line 2: the reroute discount factor ``alpha = b_min - 1/(2 sqrt(d_max))``."""
    return float(b_min) - 1.0 / (2.0 * math.sqrt(float(d_max)))  # Alg. 3 line 2


def adaptive_degree_range(b_min: float, d_max: float) -> Tuple[int, int]:
    """Alg. 3 line 3: the degrees ``(lo, hi)`` of adaptive users, ``ceil(1/b_min^2) <= d <= d_max``.

    ``ceil`` uses a 1e-12 relative tolerance so that floating-point noise in ``1/b_min^2`` (e.g.
    ``b_min = 1/sqrt(2)``) does not push the bound up by one; ``1/0.5**2 = 4`` gives 4.
    ``hi = floor(d_max)``; the range is empty when ``lo > hi``.
    """
    x = 1.0 / (float(b_min) ** 2)
    lo = max(1, int(math.ceil(x * (1.0 - _CEIL_REL_TOL))))  # Alg. 3 line 3: ceil(1/b_min^2)
    hi = int(math.floor(float(d_max)))  # Alg. 3 line 3: |S_u| <= d_max
    return lo, hi


def is_adaptive(degree: int, b_min: float, d_max: float) -> bool:
    """Alg. 3 line 3: whether a user of this degree is in ``I_adapt``."""
    lo, hi = adaptive_degree_range(b_min, d_max)
    return lo <= int(degree) <= hi  # Alg. 3 line 3


def initial_weight(degree: int) -> float:
    """Alg. 3 line 5: the l1-bounded initial weight ``1/|S_u|`` an adaptive user adds to each item."""
    return 1.0 / int(degree)  # Alg. 3 line 5


def excess_fraction(w_init: Union[float, np.ndarray], tau: float) -> Union[float, np.ndarray]:
    """Alg. 3 line 6 (erratum: max): ``r(i) = max{0, (w_init(i) - tau) / w_init(i)}``, vectorised.

    Returns 0 where ``w_init <= tau`` (in particular where ``w_init == 0``), else a value in
    ``(0, 1)``. Computed as ``1 - tau / w_init``, which equals the formula and is monotone
    non-decreasing in ``w_init`` also in floating point (Proposition 5.5 holds bitwise).
    A scalar input gives a ``float``, an array input an array of the same shape.
    """
    tau_f = float(tau)
    if not tau_f >= 0.0:
        raise ValueError(f"tau must be >= 0, got {tau!r}")
    w = np.asarray(w_init, dtype=np.float64)
    hot = w > tau_f  # implies w > 0: no division by zero below
    safe = np.where(hot, w, 1.0)
    r = np.where(hot, 1.0 - tau_f / safe, 0.0)  # Alg. 3 line 6: max{0, (w_init - tau)/w_init}
    return float(r) if r.ndim == 0 else r


def truncate(w_init: Union[float, np.ndarray], tau: float) -> Union[float, np.ndarray]:
    """Alg. 3 line 8: ``w_trunc(i) = min{w_init(i), tau}``, vectorised (scalar in, float out)."""
    w = np.minimum(np.asarray(w_init, dtype=np.float64), float(tau))  # Alg. 3 line 8
    return float(w) if w.ndim == 0 else w


def user_excess(r_values: Union[Sequence[float], np.ndarray]) -> float:
    """Alg. 3 line 10: ``e_u = (1/|S_u|) sum_{i in S_u} r(i)``, the mean excess fraction (0 if empty)."""
    r = np.asarray(r_values, dtype=np.float64).ravel()
    if r.size == 0:
        return 0.0
    return exact_sum64(r.tolist()) / r.size  # Alg. 3 line 10 (exact sum at 2^-64: order independent)


def reroute_weight(e_u: float, alpha: float, d_max: float) -> float:
    """Alg. 3 line 11: the weight ``alpha * e_u / d_max`` an adaptive user reroutes to each item."""
    return float(alpha) * float(e_u) / float(d_max)  # Alg. 3 line 11


def _user_parts(
    items: Sequence[Hashable],
    r_values: Optional[Sequence[float]],
    biases: Optional[Sequence[float]],
    d_max: float,
    b_min: float,
    b_max: float,
) -> Tuple[bool, float, np.ndarray]:
    """One user's pieces: (adaptive?, rerouted weight per item, w_b - [1/d if adaptive])."""
    d = len(items)
    if biases is None:
        w_b = user_weights(d, b_min, b_max)  # Alg. 3 line 13 (unbiased: Basic)
    else:
        if len(biases) != d:
            raise ValueError(f"got {len(biases)} biases for {d} items")
        w_b = user_weights(np.asarray(biases, dtype=np.float64), b_min, b_max)  # Alg. 3 line 13
    if not is_adaptive(d, b_min, d_max):
        return False, 0.0, w_b  # Alg. 3 lines 16-17: non-adaptive users add w_b
    if r_values is None:
        e_u = 0.0
    else:
        if len(r_values) != d:
            raise ValueError(f"got {len(r_values)} excess fractions for {d} items")
        e_u = user_excess(r_values)  # Alg. 3 line 10
    reroute = reroute_weight(e_u, reroute_discount(b_min, d_max), d_max)  # Alg. 3 lines 2, 11
    return True, reroute, w_b - initial_weight(d)  # Alg. 3 line 15: w_b - 1/|S_u|


def mad_user_contributions(
    items: Sequence[Hashable],
    r_values: Optional[Sequence[float]],
    biases: Optional[Sequence[float]],
    tau: float,
    d_max: float,
    b_min: float = 1.0,
    b_max: float = 1.0,
    *,
    require_proof_conditions: bool = True,
) -> List[Tuple[Hashable, float]]:
    """One user's total contribution to MAD's final weights ``w`` (Alg. 3 lines 10-17).

    Args:
      items: the user's distinct items ``S_u`` (already capped to Delta_0).
      r_values: ``r(i)`` for each of those items (Alg. 3 line 6, :func:`excess_fraction` of the
        item's ``w_init``; 0 for items that are not hot). ``None`` means all 0.
      biases: ``b(i) in [0, 1]`` for each item (1 = unbiased), or ``None`` for all unbiased.
      tau, d_max, b_min, b_max: MAD's parameters (validated by :func:`check_mad_params`).

    Returns:
      ``[(item, contribution)]`` in the order of ``items``: for an adaptive user (line 3)
      ``alpha * e_u / d_max + w_b^u(i) - 1/|S_u|`` (lines 11 and 15), for a non-adaptive user
      ``w_b^u(i)`` (line 17).

    The final MAD weight is ``w(i) = w_trunc(i) + sum over users u holding i of these
    contributions``, where ``w_trunc(i) = min(w_init(i), tau)`` (:func:`truncate`, line 8) is added
    once per item separately, and ``w_init(i)`` is the sum of :func:`initial_weight` over the
    adaptive users holding ``i`` (line 5).
    """
    check_mad_params(tau, d_max, b_min, b_max, require_proof_conditions)
    items = list(items)
    if not items:
        return []
    _, reroute, part = _user_parts(items, r_values, biases, d_max, b_min, b_max)
    contrib = reroute + part  # Alg. 3 lines 12, 15 (adaptive) or 17 (reroute = 0)
    return [(item, float(c)) for item, c in zip(items, contrib)]


# --------------------------------------------------------------------------------------------------
# Algorithm 3: MAD in memory
# --------------------------------------------------------------------------------------------------


class MadComponents(NamedTuple):
    """The weight vectors of Alg. 3 over the union ``U`` of the user sets (dicts item -> float).

    ``w_init`` (line 5), ``r`` (line 6), ``w_trunc`` (line 8), ``w_reroute`` (line 11) and the final
    ``w`` (line 18). Every item of ``U`` is a key of each (0.0 where nothing was added).
    """

    w_init: Dict[Hashable, float]
    r: Dict[Hashable, float]
    w_trunc: Dict[Hashable, float]
    w_reroute: Dict[Hashable, float]
    w: Dict[Hashable, float]


def _canonical_sets(
    user_sets: Mapping[Hashable, Iterable[Hashable]],
) -> List[Tuple[Hashable, List[Hashable]]]:
    """(user, items) pairs, users and each user's items sorted by ``encode_key``; rejects duplicates."""
    out = []
    for user in sorted(user_sets, key=encode_key):
        items = list(user_sets[user])
        if len(set(items)) != len(items):
            raise ValueError(
                f"the item set of a user contains duplicates ({len(items)} items, "
                f"{len(set(items))} distinct); pass distinct items"
            )
        out.append((user, sorted(items, key=encode_key)))
    return out


def mad_weight_components(
    user_sets: Mapping[Hashable, Iterable[Hashable]],
    tau: float,
    d_max: float,
    biases: Optional[Mapping[Hashable, float]] = None,
    b_min: float = 1.0,
    b_max: float = 1.0,
    *,
    require_proof_conditions: bool = True,
) -> MadComponents:
    """Algorithm 3 (MAD) in memory, returning all its weight vectors (see :class:`MadComponents`).

    Same inputs as :func:`mad_weights`. Users are processed in ``encode_key`` order and each
    user's items in ``encode_key`` order, so the floating-point sums are deterministic.
    """
    tau_f, d_max_f, b_min_f, b_max_f = check_mad_params(tau, d_max, b_min, b_max, require_proof_conditions)
    sets = _canonical_sets(user_sets)
    bias_of = biases or {}

    # The union U, in canonical order; every vector below is defined (0.0) on all of U.
    union_keys = sorted({i for _, items in sets for i in items}, key=encode_key)
    pos = {item: k for k, item in enumerate(union_keys)}

    # Float sums below are exact at 2^-64 (exact_sum64 over all parts), so the result does not depend
    # on the order of users: the Beam path (fixed64 limbs, transforms/core/fixed64.py) gives the same bits.
    # Alg. 3 lines 1, 3-5: w_init(i) += 1/|S_u| for adaptive users u (line 3: I_adapt).
    init_parts: List[List[float]] = [[] for _ in union_keys]
    for _, items in sets:
        if items and is_adaptive(len(items), b_min_f, d_max_f):  # Alg. 3 line 3
            w0 = initial_weight(len(items))  # Alg. 3 line 5
            for i in items:
                init_parts[pos[i]].append(w0)
    w_init = np.array([exact_sum64(p) for p in init_parts], dtype=np.float64)
    r = excess_fraction(w_init, tau_f)  # Alg. 3 line 6 (erratum: max)
    w_trunc = truncate(w_init, tau_f)  # Alg. 3 line 8

    reroute_parts: List[List[float]] = [[] for _ in union_keys]
    w_parts: List[List[float]] = [[float(x)] for x in w_trunc]  # Alg. 3 line 12 (w_trunc part)
    for _, items in sets:
        if not items:
            continue
        idx = np.fromiter((pos[i] for i in items), dtype=np.intp, count=len(items))
        user_biases = None
        if biases is not None:
            user_biases = np.fromiter((bias_of.get(i, 1.0) for i in items), dtype=np.float64, count=len(items))
        # Alg. 3 lines 9-11 and 13-17 for this user (same kernel as mad_user_contributions).
        adaptive, reroute, part = _user_parts(items, r[idx], user_biases, d_max_f, b_min_f, b_max_f)
        contrib = reroute + part  # Alg. 3 lines 12 + 15 (adaptive) / 17 (non-adaptive)
        for k, j in enumerate(idx):
            if adaptive:
                reroute_parts[j].append(reroute)  # Alg. 3 line 11
            w_parts[j].append(float(contrib[k]))
    w_reroute = np.array([exact_sum64(p) for p in reroute_parts], dtype=np.float64)
    w = np.array([exact_sum64(p) for p in w_parts], dtype=np.float64)

    as_dict = lambda v: {item: float(x) for item, x in zip(union_keys, v)}  # noqa: E731
    return MadComponents(as_dict(w_init), as_dict(r), as_dict(w_trunc), as_dict(w_reroute), as_dict(w))


def mad_weights(
    user_sets: Mapping[Hashable, Iterable[Hashable]],
    tau: float,
    d_max: float,
    biases: Optional[Mapping[Hashable, float]] = None,
    b_min: float = 1.0,
    b_max: float = 1.0,
    *,
    require_proof_conditions: bool = True,
) -> Dict[Hashable, float]:
    """Algorithm 3 (MAD): the weight of every item of the union of the user sets, in memory.

    Args:
      user_sets: dict user -> iterable of DISTINCT items (already capped to Delta_0; no
        subsampling here). Duplicates raise ``ValueError``.
      tau: adaptive threshold (privacy needs tau >= 1).
      d_max: maximum adaptive degree (privacy needs d_max >= 4).
      biases: dict item -> b in [0, 1]; missing items are unbiased (b = 1). ``None``: all unbiased.
      b_min: minimum bias in [0.5, 1]; b_max: maximum bias in [1, inf].
      require_proof_conditions: if True (default) reject tau < 1 and d_max < 4.

    Returns:
      dict item -> w(i) for every item of the union (Alg. 3 line 18), computed as
      ``w_trunc(i) + sum_u mad_user_contributions(u)[i]`` with users summed in ``encode_key`` order
      (correctly rounded sums, so the Beam path's fixed64 partial sums give identical bits).
    """
    return mad_weight_components(
        user_sets, tau, d_max, biases, b_min, b_max, require_proof_conditions=require_proof_conditions
    ).w


# --------------------------------------------------------------------------------------------------
# Algorithm 4 (MAD2R): round-2 preprocessing from round-1 noisy weights
# --------------------------------------------------------------------------------------------------


def round2_bias(
    noisy_w1: float, rho2: float, sigma1: float, c_lb: float, c_ub: float, rho_drop: Optional[float] = None
) -> Optional[float]:
    """Bias b(i) of an item NOT released in round 1, or None if round 2 drops it.

    line 11: w_ub = w~1 + C_ub * sigma_1; line 12: U_low = {w_ub < rho_2} (dropped, line 13);
    line 10: w_lb = max(0, w~1 - C_lb * sigma_1); line 14: b = min(1, rho_2 / w_lb) (b = 1 when
    w_lb = 0, the limit of rho_2 / w_lb). ``rho_drop`` (default rho_2) replaces rho_2 in line 12: MAD-SIPS
    drops only items hopeless for every remaining round (the least threshold of the rounds left).
    """
    if noisy_w1 + c_ub * sigma1 < (rho2 if rho_drop is None else rho_drop):  # Alg. 4 lines 11-13
        return None
    w_lb = max(0.0, noisy_w1 - c_lb * sigma1)  # Alg. 4 line 10
    if w_lb <= rho2:
        return 1.0  # line 14 with rho_2 / w_lb >= 1 (or w_lb = 0)
    return rho2 / w_lb  # line 14, in (0, 1)


# --------------------------------------------------------------------------------------------------
# MAD (Alg. 3) and MAD2R's round-2 biases (Alg. 4), vectorised over the rows of capped tables (the Beam
# path, :mod:`transforms.selection.mad`)
# --------------------------------------------------------------------------------------------------


def adaptive_rows(degree: np.ndarray, b_min: float, d_max: float) -> np.ndarray:
    """Alg. 3 line 3 per row: whether the row's user is adaptive (``ceil(1/b_min^2) <= d <= d_max``)."""
    lo, hi = adaptive_degree_range(b_min, d_max)
    return (degree >= lo) & (degree <= hi)


def mad_init_partials(capped: pa.Table, b_min: float, d_max: float) -> pa.Table:
    """Alg. 3 lines 3-5: partial sums of ``w_init(i)`` = sum of 1/|S_u| over the adaptive holders."""
    d = capped.column("degree").to_numpy()
    adaptive = adaptive_rows(d, b_min, d_max)
    rows = np.flatnonzero(adaptive)
    return sum_by_item(limb_table(capped.column(ITEM).take(rows), 1.0 / d[rows].astype(np.float64)))


def mad_item_excess(w: pa.Table, tau: float):
    """Per item: ``r(i)`` (line 6, erratum) and ``w_trunc(i)`` (line 8) from Table(item, weight=w_init).

    Returns ``(hot, trunc)``: Table(item, r) of the items with r > 0 (the values users need), and the
    partials Table(item, hi, mid, lo, holders=0) of w_trunc (added to the final sum of the item's shard).
    """
    w_init = w.column("weight").to_numpy()
    r = excess_fraction(w_init, tau)  # Alg. 3 line 6
    w_trunc = truncate(w_init, tau)  # Alg. 3 line 8
    hot = np.flatnonzero(r > 0.0)
    items = w.column(ITEM)
    trunc = limb_table(items, np.asarray(w_trunc, dtype=np.float64), np.zeros(len(w_init), dtype=np.int64))
    return pa.table({ITEM: items.take(hot), "r": np.asarray(r)[hot]}), trunc


def _per_user_sum(codes: np.ndarray, values: np.ndarray, n_users: int) -> np.ndarray:
    """Exact (fixed64) sum of ``values`` per user code (bincount of the limbs: exact below 2^52)."""
    limbs = limbs_of(values)
    if max(float(np.abs(limb).sum(dtype=np.float64)) for limb in limbs) < EXACT_FLOAT_SUM:
        sums = [np.bincount(codes, weights=limb, minlength=n_users).astype(np.int64) for limb in limbs]
    else:
        sums = []
        for limb in limbs:
            acc = np.zeros(n_users, dtype=np.int64)
            np.add.at(acc, codes, limb)
            sums.append(acc)
    return value_of_limbs(*sums)


def mad_contribution_partials(
    capped: pa.Table,
    hot: Optional[pa.Table],
    tau: float,
    d_max: float,
    b_min: float = 1.0,
    b_max: float = 1.0,
    r_rows: Optional[np.ndarray] = None,
) -> pa.Table:
    """Alg. 3 lines 9-17: every user's contribution to its items, summed per item (partials table).

    ``capped`` is Table(user, item, degree) or, for MAD2R's round 2, Table(user, item, degree, bias).
    ``hot`` is Table(item, r) of the items with r > 0 (others have r = 0). Fully vectorised: users with
    a biased item (b < 1) get Alg. 2 (UserWeights) from
    :func:`transforms.selection.mad_kernels.user_weights_many`, bit-identical to the reference's
    per-user :func:`transforms.selection.mad_kernels.user_weights` whatever the order of the rows
    (its sums are exact), so each row gets the contribution that
    :func:`transforms.selection.mad_kernels.mad_user_contributions` gives its item. ``tau`` enters only
    through ``hot`` (r, Alg. 3 line 6). ``r_rows``: r(i) of each row's item given directly instead of ``hot``
    (DPNE's MAD-SIPS levels, whose rows carry it: :class:`transforms.dpne.dpne._LevelMADSIPS`).
    """
    n = capped.num_rows
    if n == 0:
        return sum_by_item(limb_table(capped.column(ITEM), np.zeros(0)))
    items = capped.column(ITEM)
    d = capped.column("degree").to_numpy().astype(np.int64)
    df = d.astype(np.float64)
    r = np.zeros(n, dtype=np.float64) if r_rows is None else np.asarray(r_rows, dtype=np.float64)
    if r_rows is None and hot is not None and hot.num_rows:
        pos = pc.fill_null(pc.index_in(items, value_set=hot.column(ITEM)), -1).to_numpy().astype(np.int64)
        has = pos >= 0
        r[has] = hot.column("r").to_numpy()[pos[has]]
    codes = user_codes(capped)
    n_users = int(codes.max()) + 1
    e_sum = _per_user_sum(codes, r, n_users)[codes]  # Alg. 3 line 10: sum of r(i) over S_u (exact)
    adaptive = adaptive_rows(d, b_min, d_max)  # Alg. 3 line 3
    alpha = reroute_discount(b_min, d_max)  # Alg. 3 line 2
    e_u = e_sum / df  # Alg. 3 line 10
    reroute = np.where(adaptive, alpha * e_u / float(d_max), 0.0)  # Alg. 3 line 11
    w_b = 1.0 / np.sqrt(df)  # Alg. 2 with b = 1
    if "bias" in capped.column_names:
        bias = capped.column("bias").to_numpy()
        biased_user = np.bincount(codes, weights=bias < 1.0, minlength=n_users) > 0
        rows = np.flatnonzero(biased_user[codes])  # every row of the users with a biased item
        if rows.size:
            if not np.array_equal(np.bincount(codes[rows], minlength=n_users)[codes[rows]], d[rows]):
                raise ValueError("the degree column must be the number of rows of each user (with_degree)")
            w_b[rows] = user_weights_many(codes[rows], bias[rows], b_min, b_max)  # Alg. 2 (Alg. 3 line 13)
    part = np.where(adaptive, w_b - 1.0 / df, w_b)  # Alg. 3 line 15 (adaptive) / 17
    contrib = reroute + part  # Alg. 3 lines 12, 15, 17
    return sum_by_item(limb_table(items, contrib))


def round2_biases(
    w1: np.ndarray, rho2: float, sigma1: float, c_lb: float, c_ub: float, rho_drop: Optional[float] = None
):
    """Alg. 4 lines 10-14, vectorised :func:`transforms.selection.mad_kernels.round2_bias`.

    Returns ``(kept, b)``: which items round 2 keeps (not in U_low; ``rho_drop``, default rho_2, replaces rho_2
    in line 12 as in :func:`round2_bias`) and their biases.
    """
    kept = ~(w1 + c_ub * sigma1 < (rho2 if rho_drop is None else rho_drop))  # lines 11-13
    w_lb = np.maximum(0.0, w1 - c_lb * sigma1)  # line 10
    with np.errstate(divide="ignore"):
        b = np.where(w_lb <= rho2, 1.0, rho2 / np.where(w_lb > 0.0, w_lb, 1.0))  # line 14
    return kept, b


def table_round_partials(sets: pa.Table, b_min: float, b_max: float, table) -> pa.Table:
    """Table(item, hi, mid, lo, holders) of a keep-table last round (MAD-SIPS, MAD2R; docs/mad_sips.md, "The last round
    as a keep table"): each user's Algorithm 2 weights from the biases of ``sets`` (1 without a ``bias``
    column), rounded down onto the table's contribution set C (:meth:`privacy.thresholding.KeepTable.
    round_down`), summed exactly per item. A user's weights depend only on its own rows and the public
    biases (no truncation or rerouting), and the rows of a user must all be in ``sets``."""
    if sets.num_rows == 0:
        return sum_by_item(limb_table(sets.column(ITEM), np.zeros(0)))
    biases = sets.column("bias").to_numpy() if "bias" in sets.column_names else np.ones(sets.num_rows)
    weights = user_weights_many(user_codes(sets), biases, b_min, b_max)  # Alg. 2, ||w_u||_2 <= 1
    return sum_by_item(limb_table(sets.column(ITEM), table.round_down(weights)))  # contributions in C
