"""Vectorised kernels of the columnar path (pure numpy/Arrow, no Beam): capping, weights, sums, noise.

Every function takes and returns Arrow tables of key bytes (:mod:`transforms.core.batches`) and is a
pure function of its inputs and the seed, so the Beam stages that call them are deterministic on
retries, and the in-memory reference (:mod:`transforms.selection.reference`) gets the same numbers
from the same draw functions (:mod:`transforms.core.randomness`) and the same exact sums
(:mod:`transforms.core.fixed64`).

Table shapes:
  pairs      (user, item)                          key bytes, repeats allowed
  capped     (user, item, degree)                  distinct pairs, <= Delta_0 per user; degree = |S_u|
  partials   (item, hi, mid, lo, holders)          fixed-point limb sums of weights, holder counts
  weights    (item, weight, holders)               correctly rounded exact weight per item
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy import cap as cap_plans
from dp_partition_beam.privacy.validation import check_choice, check_int
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.batches import ITEM, USER, concat, dictionary_codes
from dp_partition_beam.transforms.core.fingerprint import fingerprint64
from dp_partition_beam.transforms.core.fixed64 import limbs_of, value_of_limbs
from dp_partition_beam.transforms.selection import mad_kernels as K
from dp_partition_beam.transforms.selection.basic_kernels import WEIGHTINGS

__all__ = [
    "SUBSAMPLE",
    "distinct_pairs",
    "cap_pairs",
    "per_item_weights",
    "basic_partials",
    "merge_partials",
    "noisy_weights",
    "drop_items",
]

SUBSAMPLE = "subsample"  # the randomness-contract purpose of the bottom-k priorities (as randomness.subsample)
_LIMBS = ("hi", "mid", "lo")


def _distinct_rows(pairs: pa.Table):
    """(row indices of the distinct (user, item) pairs sorted by (user code, item code), user codes of
    those rows). Codes come from Arrow's dictionary encoding (one hash pass per column)."""
    ucode, _ = dictionary_codes(pairs.column(USER))
    icode, idict = dictionary_codes(pairs.column(ITEM))
    key = ucode * max(1, len(idict)) + icode  # < 2^62: both codes < 2^31
    order = np.argsort(key, kind="stable")
    sk = key[order]
    first = np.r_[True, sk[1:] != sk[:-1]] if len(sk) else np.zeros(0, dtype=bool)
    rows = order[first]
    return rows, ucode[rows]


def distinct_sorted_by_user(pairs: pa.Table):
    """(Table(user, item) of the distinct pairs with each user's rows contiguous, their user codes)."""
    rows, ucode = _distinct_rows(pairs)
    table = pa.table({USER: pairs.column(USER).take(rows), ITEM: pairs.column(ITEM).take(rows)}).combine_chunks()
    return table, ucode


def distinct_pairs(pairs: pa.Table) -> pa.Table:
    """Table(user, item) without repeated rows (sorted by user code, compact buffers)."""
    rows, _ = _distinct_rows(pairs)
    return pa.table({USER: pairs.column(USER).take(rows), ITEM: pairs.column(ITEM).take(rows)}).combine_chunks()


def _segments(sorted_codes: np.ndarray):
    """(start of each run, rank of each position within its run) of a sorted code array."""
    n = len(sorted_codes)
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]) if n else np.zeros(0, np.int64)
    lengths = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, lengths)
    return starts, rank


def cap_pairs(pairs: pa.Table, k: int, seed: int, round_: int = 0, purpose: str = SUBSAMPLE) -> pa.Table:
    """Distinct pairs, each user's items bottom-k subsampled to at most ``k`` (MAD Alg. 1 lines 4-5).

    A user with more than ``k`` distinct items keeps the ``k`` of smallest priority
    ``draw64(draw_key(seed, purpose, round), fingerprint(user), fingerprint(item))`` (ties: smaller
    key bytes): exactly :func:`transforms.core.randomness.subsample`'s choice, so a uniformly random
    k-subset that does not depend on how the rows were batched. Applied to a subset of a user's rows
    it keeps a superset of what it keeps on all rows, so pre-capping per batch is exact.
    Returns Table(user, item, degree) with degree = the user's number of kept items.
    """
    check_int("max_contributions", k, 1)
    rows, ucode = _distinct_rows(pairs)
    t = pa.table({USER: pairs.column(USER).take(rows), ITEM: pairs.column(ITEM).take(rows)}).combine_chunks()
    n = t.num_rows
    counts = np.bincount(ucode) if n else np.zeros(0, np.int64)
    deg = counts[ucode] if n else np.zeros(0, np.int64)
    heavy = np.flatnonzero(deg > k)
    if len(heavy):
        users, items = t.column(USER).take(heavy), t.column(ITEM).take(heavy)
        key = randomness.draw_key(seed, purpose, round_)
        prio = randomness.pair_priorities(key, fingerprint64(users), fingerprint64(items))
        uc = ucode[heavy]
        order = np.lexsort((prio, uc))
        su, sp = uc[order], prio[order]
        ties = np.flatnonzero((su[1:] == su[:-1]) & (sp[1:] == sp[:-1]))
        if len(ties):  # equal 64-bit priorities (fingerprint collisions): order those by key bytes
            item_bytes = items.to_pylist()
            for u in np.unique(su[ties]):
                seg = np.flatnonzero(su == u)
                seg_rows = order[seg]
                order[seg] = sorted(seg_rows, key=lambda r: (int(prio[r]), item_bytes[r]))
        _, rank = _segments(uc[order])
        keep = np.ones(n, dtype=bool)
        keep[heavy[order[rank >= k]]] = False
        t = t.filter(pa.array(keep))
        deg = np.minimum(deg, k)[keep]
    return t.append_column("degree", pa.array(deg.astype(np.int64)))


def per_item_weights(weighting: str, degree: np.ndarray) -> np.ndarray:
    """Basic weightings per row (bit-identical to :func:`transforms.selection.basic_kernels.per_item_weight`)."""
    check_choice("weighting", weighting, WEIGHTINGS)
    d = np.asarray(degree, dtype=np.float64)
    if weighting == "weighted_gaussian":
        return 1.0 / np.sqrt(d)
    if weighting == "weighted_laplace":
        return 1.0 / d
    return np.ones_like(d)


def _limb_table(items: pa.Array, weights: np.ndarray, holders: Optional[np.ndarray] = None) -> pa.Table:
    hi, mid, lo = limbs_of(weights)
    cols = {ITEM: items, "hi": hi, "mid": mid, "lo": lo}
    cols["holders"] = np.ones(len(weights), dtype=np.int64) if holders is None else holders
    return pa.table(cols)


_EXACT_FLOAT_SUM = float(2**52)


def _sum_by_item(table: pa.Table) -> pa.Table:
    """Table(item, hi, mid, lo, holders) summed per item: exact int64 totals.

    Per-item sums by ``np.bincount`` (float64 accumulation) are exact while the sum of absolute values
    stays below 2^52 (limbs < 2^21 and ``hi`` ~ w * 2^22: any shard of fewer than 2^30 rows of weights
    <= 1); otherwise Arrow's int64 hash aggregation is used. Either way the result is exact.
    """
    if table.num_rows == 0:
        return pa.table(
            {ITEM: pa.array([], pa.binary()), **{c: pa.array([], pa.int64()) for c in (*_LIMBS, "holders")}}
        )
    cols = {c: table.column(c).to_numpy() for c in (*_LIMBS, "holders")}
    bound = max(float(np.abs(v).sum(dtype=np.float64)) for v in cols.values())
    if bound >= _EXACT_FLOAT_SUM:
        out = table.group_by(ITEM, use_threads=False).aggregate([(c, "sum") for c in cols]).combine_chunks()
        return out.select([ITEM, "hi_sum", "mid_sum", "lo_sum", "holders_sum"]).rename_columns([ITEM, *cols])
    codes, items = dictionary_codes(table.column(ITEM))
    sums = {c: np.bincount(codes, weights=v, minlength=len(items)).astype(np.int64) for c, v in cols.items()}
    return pa.table({ITEM: items, **sums})


def basic_partials(capped: pa.Table, weighting: str) -> pa.Table:
    """Table(item, hi, mid, lo, holders): per item, the exact fixed-point sum of its holders' weights
    ``w(d)`` (:func:`per_item_weights`) and the number of holders, over the rows of ``capped``."""
    w = per_item_weights(weighting, capped.column("degree").to_numpy())
    return _sum_by_item(_limb_table(capped.column(ITEM), w))


def merge_partials(partials: Iterable[pa.Table]) -> pa.Table:
    """Sums partial tables per item -> Table(item, weight, holders), weight correctly rounded."""
    t = _sum_by_item(concat(partials))
    weight = value_of_limbs(*(t.column(c).to_numpy() for c in _LIMBS))
    return pa.table({ITEM: t.column(ITEM), "weight": weight, "holders": t.column("holders")})


def noisy_weights(
    items: pa.Array,
    weights: np.ndarray,
    noise: str,
    scale: float,
    seed: Optional[int],
    round_: int,
    rng: Optional[np.random.Generator],
    purpose: str = "noise",
) -> np.ndarray:
    """``weight + scale * Z`` per item: seeded, Z of ``(seed, purpose, round, item)`` (vectorised
    :func:`transforms.core.randomness.standard_noise`); unseeded, Z from ``rng`` (OS entropy)."""
    n = len(weights)
    if seed is not None:
        key = randomness.draw_key(seed, purpose, round_)
        z = randomness.noise_of_uniform(noise, randomness.uniforms_of_fingerprints(key, fingerprint64(items)))
    else:
        if rng is None:
            raise ValueError("unseeded noise needs a worker generator (rng)")
        z = rng.standard_normal(n) if noise == "gaussian" else rng.laplace(0.0, 1.0, n)
    return np.asarray(weights, dtype=np.float64) + float(scale) * z


def drop_items(table: pa.Table, items: Optional[pa.Array]) -> pa.Table:
    """The rows of ``table`` whose item is not in ``items`` (DP-SIPS: items released in earlier rounds)."""
    if items is None or len(items) == 0 or table.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column(ITEM), value_set=items)))


def keep_items(table: pa.Table, items: pa.Array) -> pa.Table:
    """The rows of ``table`` whose item is in ``items``."""
    if table.num_rows == 0:
        return table
    return table.filter(pc.is_in(table.column(ITEM), value_set=items))


def drop_hopeless(table: pa.Table, hopeless: Optional[pa.Array]) -> pa.Table:
    """MAD-SIPS: each user's rows without its hopeless items, unless all of the user's items are hopeless.

    The columnar :func:`transforms.selection.reference.drop_hopeless` (docs/mad_sips.md): a user keeps its
    hopeless items only when it has no other item to give its l2 budget to.
    """
    if hopeless is None or len(hopeless) == 0 or table.num_rows == 0:
        return table
    doomed = pc.is_in(table.column(ITEM), value_set=hopeless).to_numpy(zero_copy_only=False)
    codes, users = dictionary_codes(table.column(USER))
    has_hope = np.zeros(len(users), dtype=bool)
    has_hope[codes[~doomed]] = True  # users with at least one item that is not hopeless
    return table.filter(pa.array(~doomed | ~has_hope[codes]))


# --------------------------------------------------------------------------------------------------
# MAD (MAD paper Alg. 3) and MAD2R's round-2 biases (Alg. 4), vectorised over users and items
# --------------------------------------------------------------------------------------------------


def _user_codes(table: pa.Table) -> np.ndarray:
    codes, _ = dictionary_codes(table.column(USER))
    return codes


def with_degree(table: pa.Table) -> pa.Table:
    """Table(user, item, ...) with its ``degree`` column recomputed (rows per user)."""
    codes = _user_codes(table)
    deg = np.bincount(codes)[codes] if table.num_rows else np.zeros(0, np.int64)
    cols = {c: table.column(c) for c in table.column_names if c != "degree"}
    cols["degree"] = pa.array(deg.astype(np.int64))
    return pa.table(cols)


def adaptive_rows(degree: np.ndarray, b_min: float, d_max: float) -> np.ndarray:
    """Alg. 3 line 3 per row: whether the row's user is adaptive (``ceil(1/b_min^2) <= d <= d_max``)."""
    lo, hi = K.adaptive_degree_range(b_min, d_max)
    return (degree >= lo) & (degree <= hi)


def mad_init_partials(capped: pa.Table, b_min: float, d_max: float) -> pa.Table:
    """Alg. 3 lines 3-5: partial sums of ``w_init(i)`` = sum of 1/|S_u| over the adaptive holders."""
    d = capped.column("degree").to_numpy()
    adaptive = adaptive_rows(d, b_min, d_max)
    rows = np.flatnonzero(adaptive)
    return _sum_by_item(_limb_table(capped.column(ITEM).take(rows), 1.0 / d[rows].astype(np.float64)))


def mad_item_excess(w: pa.Table, tau: float):
    """Per item: ``r(i)`` (line 6, erratum) and ``w_trunc(i)`` (line 8) from Table(item, weight=w_init).

    Returns ``(hot, trunc)``: Table(item, r) of the items with r > 0 (the values users need), and the
    partials Table(item, hi, mid, lo, holders=0) of w_trunc (added to the final sum of the item's shard).
    """
    w_init = w.column("weight").to_numpy()
    r = K.excess_fraction(w_init, tau)  # Alg. 3 line 6
    w_trunc = K.truncate(w_init, tau)  # Alg. 3 line 8
    hot = np.flatnonzero(r > 0.0)
    items = w.column(ITEM)
    trunc = _limb_table(items, np.asarray(w_trunc, dtype=np.float64), np.zeros(len(w_init), dtype=np.int64))
    return pa.table({ITEM: items.take(hot), "r": np.asarray(r)[hot]}), trunc


def _per_user_sum(codes: np.ndarray, values: np.ndarray, n_users: int) -> np.ndarray:
    """Exact (fixed64) sum of ``values`` per user code (bincount of the limbs: exact below 2^52)."""
    limbs = limbs_of(values)
    if max(float(np.abs(limb).sum(dtype=np.float64)) for limb in limbs) < _EXACT_FLOAT_SUM:
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
) -> pa.Table:
    """Alg. 3 lines 9-17: every user's contribution to its items, summed per item (partials table).

    ``capped`` is Table(user, item, degree) or, for MAD2R's round 2, Table(user, item, degree, bias).
    ``hot`` is Table(item, r) of the items with r > 0 (others have r = 0). Fully vectorised: users with
    a biased item (b < 1) get Alg. 2 (UserWeights) from
    :func:`transforms.selection.mad_kernels.user_weights_many`, bit-identical to the reference's
    per-user :func:`transforms.selection.mad_kernels.user_weights` whatever the order of the rows
    (its sums are exact), so each row gets the contribution that
    :func:`transforms.selection.mad_kernels.mad_user_contributions` gives its item. ``tau`` enters only
    through ``hot`` (r, Alg. 3 line 6).
    """
    n = capped.num_rows
    if n == 0:
        return _sum_by_item(_limb_table(capped.column(ITEM), np.zeros(0)))
    items = capped.column(ITEM)
    d = capped.column("degree").to_numpy().astype(np.int64)
    df = d.astype(np.float64)
    r = np.zeros(n, dtype=np.float64)
    if hot is not None and hot.num_rows:
        pos = pc.fill_null(pc.index_in(items, value_set=hot.column(ITEM)), -1).to_numpy().astype(np.int64)
        has = pos >= 0
        r[has] = hot.column("r").to_numpy()[pos[has]]
    codes = _user_codes(capped)
    n_users = int(codes.max()) + 1
    e_sum = _per_user_sum(codes, r, n_users)[codes]  # Alg. 3 line 10: sum of r(i) over S_u (exact)
    adaptive = adaptive_rows(d, b_min, d_max)  # Alg. 3 line 3
    alpha = K.reroute_discount(b_min, d_max)  # Alg. 3 line 2
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
            w_b[rows] = K.user_weights_many(codes[rows], bias[rows], b_min, b_max)  # Alg. 2 (Alg. 3 line 13)
    part = np.where(adaptive, w_b - 1.0 / df, w_b)  # Alg. 3 line 15 (adaptive) / 17
    contrib = reroute + part  # Alg. 3 lines 12, 15, 17
    return _sum_by_item(_limb_table(items, contrib))


def round2_biases(w1: np.ndarray, rho2: float, sigma1: float, c_lb: float, c_ub: float):
    """Alg. 4 lines 10-14, vectorised :func:`transforms.selection.mad_kernels.round2_bias`.

    Returns ``(kept, b)``: which items round 2 keeps (not in U_low) and their biases.
    """
    kept = ~(w1 + c_ub * sigma1 < rho2)  # lines 11-13
    w_lb = np.maximum(0.0, w1 - c_lb * sigma1)  # line 10
    with np.errstate(divide="ignore"):
        b = np.where(w_lb <= rho2, 1.0, rho2 / np.where(w_lb > 0.0, w_lb, 1.0))  # line 14
    return kept, b


def attach_biases(capped: pa.Table, biased_items: pa.Table) -> pa.Table:
    """MAD2R line 13: the capped rows whose item round 2 keeps, with its bias, degrees recomputed."""
    if capped.num_rows == 0 or biased_items.num_rows == 0:
        return pa.table(
            {
                USER: pa.array([], pa.binary()),
                ITEM: pa.array([], pa.binary()),
                "degree": pa.array([], pa.int64()),
                "bias": pa.array([], pa.float64()),
            }
        )
    pos = pc.index_in(capped.column(ITEM), value_set=biased_items.column(ITEM))
    keep = pc.is_valid(pos)
    t = capped.filter(keep)
    b = biased_items.column("bias").take(pos.filter(keep))
    return with_degree(pa.table({USER: t.column(USER), ITEM: t.column(ITEM), "bias": b}))


# ---- MAD-SIPS's adaptive cap (privacy/cap.py) ------------------------------------------------------

#: the randomness purpose of the adaptive cap's histogram noise (round 0, key = bucket index)
CAP_NOISE = "cap"


def degree_histogram_of(table: pa.Table, grid) -> np.ndarray:
    """``n_j`` of a piece of distinct (user, item) rows whose users are all complete in it (privacy/cap.py)."""
    if table.num_rows == 0:
        return np.zeros(len(grid), dtype=np.int64)
    degrees = np.bincount(_user_codes(table))
    return cap_plans.degree_histogram(degrees[degrees > 0], grid)


def noisy_cap(histogram: np.ndarray, plan: "cap_plans.CapPlan", seed: Optional[int], rng) -> int:
    """The chosen cap: ``n_j + sigma_H Z_j`` (Z_j keyed by (seed, 'cap', 0, j), or from ``rng``), then
    :func:`privacy.cap.choose_cap`."""
    keys = list(range(len(plan.grid)))
    z = randomness.standard_noise("gaussian", keys, CAP_NOISE, 0, seed, rng)
    noisy = np.asarray(histogram, dtype=np.float64) + plan.noise_scale * z
    return cap_plans.choose_cap(noisy, plan)
