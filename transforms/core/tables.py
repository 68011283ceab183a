"""Table kernels of the columnar engine (pure numpy/Arrow, no Beam): distinct, cap, exact partial sums, noise.

Every function takes and returns Arrow tables of key bytes (:mod:`transforms.core.batches`) and is a
pure function of its inputs and the seed, so the Beam stages that call them are deterministic on
retries, and the in-memory references get the same numbers from the same draw functions
(:mod:`transforms.core.randomness`) and the same exact sums (:mod:`transforms.core.fixed64`). The
algorithms' own table kernels sit beside their scalar forms: :mod:`transforms.selection.basic_kernels`,
:mod:`~.mad_kernels`, :mod:`~.mad_sips_kernels`, :mod:`transforms.dpne.dpne_kernels`.

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

from dp_partition_beam.privacy.validation import check_int
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.batches import ITEM, USER, concat, dictionary_codes
from dp_partition_beam.transforms.core.fingerprint import fingerprint64
from dp_partition_beam.transforms.core.fixed64 import limbs_of, value_of_limbs

__all__ = [
    "SUBSAMPLE",
    "distinct_pairs",
    "cap_pairs",
    "limb_table",
    "sum_by_item",
    "merge_partials",
    "noisy_weights",
    "drop_items",
    "keep_items",
    "with_degree",
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


def limb_table(items: pa.Array, weights: np.ndarray, holders: Optional[np.ndarray] = None) -> pa.Table:
    hi, mid, lo = limbs_of(weights)
    cols = {ITEM: items, "hi": hi, "mid": mid, "lo": lo}
    cols["holders"] = np.ones(len(weights), dtype=np.int64) if holders is None else holders
    return pa.table(cols)


EXACT_FLOAT_SUM = float(2**52)


def sum_by_item(table: pa.Table) -> pa.Table:
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
    if bound >= EXACT_FLOAT_SUM:
        out = table.group_by(ITEM, use_threads=False).aggregate([(c, "sum") for c in cols]).combine_chunks()
        return out.select([ITEM, "hi_sum", "mid_sum", "lo_sum", "holders_sum"]).rename_columns([ITEM, *cols])
    codes, items = dictionary_codes(table.column(ITEM))
    sums = {c: np.bincount(codes, weights=v, minlength=len(items)).astype(np.int64) for c, v in cols.items()}
    return pa.table({ITEM: items, **sums})


def merge_partials(partials: Iterable[pa.Table]) -> pa.Table:
    """Sums partial tables per item -> Table(item, weight, holders), weight correctly rounded."""
    t = sum_by_item(concat(partials))
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


def item_bits(
    items: pa.Array, seed: Optional[int], round_: int, rng: Optional[np.random.Generator], purpose: str = "noise"
) -> np.ndarray:
    """64 random bits per item (uint64): seeded, ``draw64`` of ``(seed, purpose, round, item)``, the bits of
    :func:`noisy_weights`'s uniforms (equal to :func:`transforms.core.randomness.random_bits` on the items);
    unseeded, from ``rng``. The draws of a keep-probability table (privacy/thresholding.py)."""
    if seed is not None:
        return randomness.draw64(randomness.draw_key(seed, purpose, round_), fingerprint64(items))
    return randomness.worker_bits(rng, len(items))


def drop_items(table: pa.Table, items: Optional[pa.Array]) -> pa.Table:
    """The rows of ``table`` whose item is not in ``items`` (DP-SIPS: items released in earlier rounds)."""
    if items is None or len(items) == 0 or table.num_rows == 0:
        return table
    return table.filter(pc.invert(pc.is_in(table.column(ITEM), value_set=items)))


class ItemIndex:
    """Positions of key bytes in a fixed array ``items`` (distinct), built once for many lookups.

    ``pc.index_in(column, value_set=items)`` hashes all of ``items`` on every call; a side input of a
    million items looked up from every piece paid that each time (MAD-SIPS's hopeful candidates, once per
    piece and round). Here the fingerprints of ``items`` are sorted once and cut into about 2 len(items)
    buckets by their top bits (``_starts``: where each bucket begins in the sorted fingerprints); a lookup
    reads the query's bucket, which holds at most a few fingerprints, instead of a binary search of the whole
    array (3-5x faster on 65k-row pieces against 200k items). Every hit is checked byte for byte, so the
    answer is exact. Fingerprints shared by two of ``items`` (never seen, but possible) fall back to
    ``pc.index_in``.

    ``fingerprints``: those of ``items`` if already computed (``fingerprint64(items)``).
    """

    #: at most 2^22 buckets (a 16 MB table); more items share buckets
    MAX_BUCKET_BITS = 22

    def __init__(self, items: pa.Array, fingerprints: Optional[np.ndarray] = None):
        self.items = items.combine_chunks() if isinstance(items, pa.ChunkedArray) else items
        fp = fingerprint64(self.items) if fingerprints is None else np.asarray(fingerprints, dtype=np.uint64)
        self._order = np.argsort(fp, kind="stable")
        self._sorted = fp[self._order]
        self._exact = len(fp) < 2 or bool(np.all(self._sorted[1:] != self._sorted[:-1]))
        bits = max(1, min(self.MAX_BUCKET_BITS, len(fp).bit_length() + 1))
        self._shift = np.uint64(64 - bits)
        bounds = np.arange(1 << bits, dtype=np.uint64) << self._shift  # the least fingerprint of each bucket
        self._starts = np.append(np.searchsorted(self._sorted, bounds), len(fp)).astype(np.int64)

    def positions(self, column) -> np.ndarray:
        """int64 position in ``items`` of each value of ``column``, -1 where absent."""
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if len(self.items) == 0 or len(column) == 0:
            return np.full(len(column), -1, dtype=np.int64)
        if not self._exact:
            return pc.index_in(column, value_set=self.items).fill_null(-1).to_numpy().astype(np.int64)
        fp = fingerprint64(column)
        bucket = (fp >> self._shift).astype(np.int64)
        lo = self._starts[bucket]
        count = self._starts[bucket + 1] - lo  # fingerprints of items in the query's bucket
        at = np.minimum(lo, len(self._sorted) - 1)
        pos = np.where((count > 0) & (self._sorted[at] == fp), self._order[at], -1).astype(np.int64)
        more, j = np.flatnonzero(count > 1), 1  # buckets of two or more: their next fingerprints
        while len(more):
            at = lo[more] + j
            same = self._sorted[at] == fp[more]
            pos[more[same]] = self._order[at[same]]
            j += 1
            more = more[count[more] > j]
        hit = np.flatnonzero(pos >= 0)
        if len(hit):  # the same fingerprint: the same bytes too?
            same = pc.equal(column.take(pa.array(hit)), self.items.take(pa.array(pos[hit]))).to_numpy(
                zero_copy_only=False
            )
            pos[hit[~same]] = -1
        return pos


def keep_items(table: pa.Table, items: pa.Array) -> pa.Table:
    """The rows of ``table`` whose item is in ``items``."""
    if table.num_rows == 0:
        return table
    return table.filter(pc.is_in(table.column(ITEM), value_set=items))


def user_codes(table: pa.Table) -> np.ndarray:
    codes, _ = dictionary_codes(table.column(USER))
    return codes


def with_degree(table: pa.Table) -> pa.Table:
    """Table(user, item, ...) with its ``degree`` column recomputed (rows per user)."""
    codes = user_codes(table)
    deg = np.bincount(codes)[codes] if table.num_rows else np.zeros(0, np.int64)
    cols = {c: table.column(c) for c in table.column_names if c != "degree"}
    cols["degree"] = pa.array(deg.astype(np.int64))
    return pa.table(cols)
