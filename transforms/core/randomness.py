"""The randomness contract (docs/design.md, "Randomness contract").

Two modes, chosen by ``seed``:

* ``seed is None`` (production): every draw comes from a ``numpy.random.Generator`` seeded from OS
  entropy *on the worker* (:func:`worker_rng`, called from ``DoFn.setup`` so that every worker
  process, forked or spawned, gets its own state). No seed ever travels in the pipeline graph.
* ``seed`` given (reproducible mode, NOT private against anyone who knows the seed): every draw is a
  deterministic function of ``(seed, purpose, round, key)``; e.g. the noise of item ``i`` in round
  ``r`` is ``keyed_normal(seed, "noise", r, [i])``. The output is then identical on every runner,
  bundle split and worker count, and identical to :mod:`transforms.reference`.

Keys are encoded canonically (:func:`encode_key`): ``str``, ``bytes``, ``int``, ``float``, ``bool``,
``None`` and (nested) tuples/lists of those are supported; anything else falls back to ``repr``.

How a seeded draw is made (so that the columnar path can make it vectorised over Arrow columns):
``draw_key(seed, purpose, round)`` is a 128-bit BLAKE2b digest (once per family of draws); a key's
64-bit fingerprint is :func:`transforms.core.fingerprint.fingerprint_of` of its key bytes (UTF-8 for a
``str``); the draw is ``draw64(draw_key, fingerprint(key))`` (MurmurHash3's finaliser keyed by the
digest), and for a (user, item) pair ``draw64(draw_key, fingerprint(user), fingerprint(item))``.
The scalar functions here and the vectorised ones give the same bits (tests/transforms/core/test_tables.py).
These draws are for reproducibility, not secrecy: the seeded mode is not private anyway.

Seeded Gaussian and Laplace draws are inverse-CDF transforms of a 53-bit uniform taken from the
64-bit draw, so they resolve tails down to about 1e-16 (|z| <= 8.3): ample for tests and
reproducible demos. Production noise uses numpy's generator (full-precision tails).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence

import numpy as np
from scipy import special

from dp_partition_beam.transforms.core import fingerprint as fp
from dp_partition_beam.transforms.core.fingerprint import encode_key

__all__ = [
    "DrawKey",
    "encode_key",
    "draw_key",
    "random_draw_key",
    "draw64",
    "draw64_of",
    "uniform_of_bits",
    "uniforms_of_fingerprints",
    "noise_of_uniform",
    "key_fingerprint",
    "keyed_bytes",
    "keyed_uniform",
    "keyed_normal",
    "keyed_laplace",
    "keyed_generator",
    "KeyedNoise",
    "worker_rng",
    "standard_noise",
    "random_bits",
    "worker_bits",
    "sort_key",
    "subsample",
    "pair_priorities",
    "warn_if_seeded",
    "KEEP_LOW_PURPOSE",
]

_LOG = logging.getLogger(__name__)

#: the purpose of a keep decision's second 64 bits (a 128-bit l2 rule, read only when the first 64 equal the
#: item's limit: privacy/l2_rule.py, ``L2KeepRule.keep``); the first 64 are the round's 'noise' draw
KEEP_LOW_PURPOSE = "noise_low"

_TWO_POW_53 = float(2**53)
_M64 = (1 << 64) - 1


class DrawKey(NamedTuple):
    """The 128-bit key of a family of draws: ``draw_key(seed, purpose, round)`` or a random one."""

    k0: int
    k1: int


def _prefix_hasher(seed: int, purpose: str, round_: int, size: int = 8):
    """BLAKE2b state after (seed, purpose, round).

    ``.copy().update(encode_key(key))`` equals ``_digest(..., key, size)``.
    """
    h = hashlib.blake2b(digest_size=size, person=b"dp-part-beam-v1")
    h.update(encode_key((int(seed), str(purpose), int(round_))))
    return h


def _digest(seed: int, purpose: str, round_: int, key: Any, size: int = 16) -> bytes:
    h = _prefix_hasher(seed, purpose, round_, size)
    h.update(encode_key(key))
    return h.digest()


def _laplace_of(centred):
    """Inverse CDF of the standard Laplace at ``u - 0.5`` (array or scalar; never 0 for our uniforms)."""
    return -np.sign(centred) * np.log1p(-2.0 * np.abs(centred))


def keyed_bytes(seed: int, purpose: str, round_: int, key: Any, size: int = 16) -> bytes:
    """``size`` pseudo-random bytes (<= 64), a function of (seed, purpose, round, key) (e.g. a secret hash key)."""
    return _digest(seed, purpose, round_, key, size)


def draw_key(seed: int, purpose: str, round_: int) -> DrawKey:
    """The 128-bit key of the draws of (seed, purpose, round): a BLAKE2b digest, computed once."""
    d = _digest_of_prefix(seed, purpose, round_)
    return DrawKey(int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little"))


def _digest_of_prefix(seed: int, purpose: str, round_: int) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=b"dp-part-beam-v2")
    h.update(encode_key((int(seed), str(purpose), int(round_))))
    return h.digest()


def random_draw_key(rng: np.random.Generator) -> DrawKey:
    """A draw key from a generator (unseeded mode: OS entropy on the worker)."""
    k0, k1 = (int(v) for v in rng.integers(0, 2**64, size=2, dtype=np.uint64))
    return DrawKey(k0, k1)


def draw64_of(key: DrawKey, *fingerprints: int) -> int:
    """The 64-bit draw of a key and one or more fingerprints (pure Python; oracle of :func:`draw64`)."""
    x = key.k0
    for f in fingerprints:
        x = (fp._fmix64_int(x ^ f) * fp.C_MUL + fp.C_ADD) & _M64
    return fp._fmix64_int(x ^ key.k1)


def draw64(key: DrawKey, *fingerprints: np.ndarray) -> np.ndarray:
    """Vectorised :func:`draw64_of` over uint64 fingerprint arrays (broadcast together)."""
    x = np.uint64(key.k0)
    for f in fingerprints:
        x = fp.fmix64(np.asarray(x ^ f, dtype=np.uint64))
        x *= np.uint64(fp.C_MUL)
        x += np.uint64(fp.C_ADD)
    return fp.fmix64(np.asarray(x ^ np.uint64(key.k1), dtype=np.uint64))


def uniform_of_bits(bits):
    """The uniform in (0, 1) of 64 random bits: the top 53 bits, centred in their cell (array or int)."""
    if isinstance(bits, np.ndarray):
        return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / _TWO_POW_53
    return ((bits >> 11) + 0.5) / _TWO_POW_53


def key_fingerprint(key: Any) -> int:
    """The fingerprint of a Python key's key bytes (:mod:`transforms.core.fingerprint`; any key type)."""
    return fp.fingerprint_of(fp.to_key_bytes(key, strict=False))


def keyed_uniform(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Uniforms in the open interval (0, 1), one per key, each a function of (seed, purpose, round, key).

    ``u = uniform_of_bits(draw64(draw_key(seed, purpose, round), fingerprint(key)))``: the columnar path
    computes the same numbers vectorised from its key-bytes columns (:func:`uniforms_of_columns`).
    """
    k = draw_key(seed, purpose, round_)
    out = np.empty(len(keys), dtype=np.float64)
    for j, key in enumerate(keys):
        out[j] = uniform_of_bits(draw64_of(k, key_fingerprint(key)))
    return out


def uniforms_of_fingerprints(key: DrawKey, *fingerprints: np.ndarray) -> np.ndarray:
    """Vectorised uniforms of (key, fingerprints...): equal to the scalar draws of the same keys."""
    return uniform_of_bits(draw64(key, *fingerprints))


def noise_of_uniform(kind: str, u):
    """Standard Gaussian or Laplace by the inverse CDF of uniforms ``u`` (array or scalar)."""
    if kind == "gaussian":
        return special.ndtri(u)
    if kind == "laplace":
        return _laplace_of(u - 0.5)
    raise ValueError(f"noise kind must be 'gaussian' or 'laplace', got {kind!r}")


class KeyedNoise:
    """Per-key seeded noise, one key at a time: ``draw(key)`` == ``standard_noise(kind, [key], ...)[0]``.

    The draw key of (seed, purpose, round) is derived once; the inverse CDF is applied to a scalar
    (same scipy/numpy ufunc loops as the array path; tests/privacy/test_params_randomness.py checks bitwise
    equality with :func:`standard_noise`).
    """

    def __init__(self, kind: str, seed: int, purpose: str, round_: int):
        if kind not in ("gaussian", "laplace"):
            raise ValueError(f"noise kind must be 'gaussian' or 'laplace', got {kind!r}")
        self._gaussian = kind == "gaussian"
        self._key = draw_key(seed, purpose, round_)

    def draw(self, key: Any) -> float:
        u = uniform_of_bits(draw64_of(self._key, key_fingerprint(key)))
        if self._gaussian:
            return float(special.ndtri(u))
        return float(_laplace_of(u - 0.5))


def keyed_normal(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Standard normal draws, one per key (inverse CDF of :func:`keyed_uniform`)."""
    return special.ndtri(keyed_uniform(seed, purpose, round_, keys))


def keyed_laplace(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Standard Laplace (scale 1) draws, one per key (inverse CDF of :func:`keyed_uniform`)."""
    return _laplace_of(keyed_uniform(seed, purpose, round_, keys) - 0.5)


def keyed_generator(seed: int, purpose: str, round_: int, key: Any) -> np.random.Generator:
    """A numpy Generator (Philox, counter based) determined by (seed, purpose, round, key)."""
    return np.random.Generator(np.random.Philox(key=int.from_bytes(_digest(seed, purpose, round_, key, 16), "big")))


def worker_rng() -> np.random.Generator:
    """A fresh generator seeded from OS entropy. Call it on the worker (``DoFn.setup``)."""
    return np.random.default_rng()


def standard_noise(
    kind: str,
    keys: Sequence[Any],
    purpose: str,
    round_: int,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> np.ndarray:
    """Unit-scale noise (``kind`` = ``gaussian`` or ``laplace``) for each key.

    Seeded: a function of (seed, purpose, round, key). Unseeded: drawn from ``rng`` (OS entropy).
    """
    if kind not in ("gaussian", "laplace"):
        raise ValueError(f"noise kind must be 'gaussian' or 'laplace', got {kind!r}")
    if seed is not None:
        fn = keyed_normal if kind == "gaussian" else keyed_laplace
        return fn(seed, purpose, round_, keys)
    if rng is None:
        raise ValueError("unseeded noise needs a worker generator (rng)")
    if kind == "gaussian":
        return rng.standard_normal(len(keys))
    return rng.laplace(0.0, 1.0, len(keys))


def random_bits(keys: Sequence[Any], purpose: str, round_: int, seed: Optional[int], rng) -> np.ndarray:
    """64 random bits (uint64) per key: seeded, ``draw64`` of (seed, purpose, round, key), the bits whose top
    53 make :func:`keyed_uniform`; unseeded, from ``rng`` (OS entropy). The keep tables' draws
    (privacy/thresholding.py: keep iff bits < F * 2^64)."""
    if seed is not None:
        k = draw_key(seed, purpose, round_)
        return np.array([draw64_of(k, key_fingerprint(key)) for key in keys], dtype=np.uint64)
    return worker_bits(rng, len(keys))


def worker_bits(rng: Optional[np.random.Generator], n: int) -> np.ndarray:
    """``n`` uniform uint64 values from a worker generator (OS entropy): the unseeded random bits."""
    if rng is None:
        raise ValueError("unseeded draws need a worker generator (rng)")
    return rng.integers(0, _M64, size=n, dtype=np.uint64, endpoint=True)


def sort_key(item: Any) -> bytes:
    """Total order on heterogeneous items (canonical encoding), used to make seeded output canonical."""
    return encode_key(item)


def subsample(
    items: Iterable[Any],
    k: int,
    user: Any,
    round_: int,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    purpose: str = "subsample",
) -> List[Any]:
    """Uniform random subset of at most ``k`` of the distinct ``items`` (MAD Alg. 1 lines 4-5).

    Bottom-k sampling: every distinct item gets a uniform priority and the ``k`` smallest are kept,
    which is a uniformly random k-subset of the distinct items. It streams over ``items`` with O(k)
    memory (a user with millions of items is never materialised). Duplicates in ``items`` are
    allowed and count once: the priority of an item is a function of the item (below), so a repeat
    either is already in the sample or loses again (so BoundContributions needs no Distinct step).

    Seeded: the priority of ``item`` is the 64-bit ``draw64(draw_key(seed, purpose, round),
    fingerprint(user), fingerprint(item))`` (ties broken by the smaller key bytes), so the subset does
    not depend on input order or bundling, and the columnar path (:func:`pair_priorities`) picks the
    same subset. Unseeded: the same under a fresh 128-bit key drawn from ``rng`` (OS entropy on the
    worker) for this call, i.e. independent uniform priorities that are consistent across a user's
    duplicates. The result is in canonical order (sorted by :func:`sort_key`).
    """
    if k < 1:
        raise ValueError(f"max_contributions must be >= 1, got {k!r}")
    if seed is None and rng is None:
        raise ValueError("unseeded subsampling needs a worker generator (rng)")
    distinct = {}  # dedup key -> item (str items are their own key), until more than k distinct are seen
    it = iter(items)
    for item in it:
        key = item if type(item) is str else _encode_item(item)
        if key not in distinct:
            distinct[key] = item
            if len(distinct) > k:
                break
    else:  # at most k distinct items: all are kept whatever their priorities (no hashing needed)
        return _canonical_order(distinct)
    # more than k distinct: from here on every key is the encoded item (for the canonical order)
    distinct = {(key if type(key) is bytes else _encode_item(item)): item for key, item in distinct.items()}
    draw = draw_key(seed, purpose, round_) if seed is not None else random_draw_key(rng)
    user_fp = key_fingerprint(user)

    def entry(key, item):
        kb = fp.to_key_bytes(item, strict=False)
        return -draw64_of(draw, user_fp, fp.fingerprint_of(kb)), _neg_bytes(kb), key, item

    # max-heap on (priority, key bytes) via negation, of the k smallest: :func:`pair_priorities`' order
    heap: List[tuple] = sorted(entry(key, item) for key, item in distinct.items())[-k:]
    heapq.heapify(heap)
    in_heap = {e[2] for e in heap}
    for item in it:
        key = _encode_item(item)
        if key in in_heap:
            continue  # a repeat of a sampled item; a repeat of a dropped item has the same priority
        e = entry(key, item)
        if e > heap[0]:
            in_heap.discard(heapq.heapreplace(heap, e)[2])
            in_heap.add(key)
    heap.sort(key=lambda e: e[2])
    return [e[3] for e in heap]


class _neg_bytes:
    """Reverses the order of bytes (the max-heap above keeps the smallest key bytes on ties)."""

    __slots__ = ("b",)

    def __init__(self, b: bytes):
        self.b = b

    def __lt__(self, other):
        return self.b > other.b

    def __gt__(self, other):
        return self.b < other.b

    def __eq__(self, other):
        return self.b == other.b


def pair_priorities(key: DrawKey, user_fps: np.ndarray, item_fps: np.ndarray) -> np.ndarray:
    """The uint64 bottom-k priorities of (user, item) pairs, vectorised (same as :func:`subsample`'s).

    A user keeps its ``k`` items of smallest priority, ties broken by the smaller key bytes.
    """
    return draw64(key, user_fps, item_fps)


def _utf8_order(s: str):
    """Sort key of a str equal to the order of its :func:`encode_key` (UTF-8 length, then UTF-8 bytes).

    UTF-8 preserves code point order bytewise, so comparing the str itself is comparing its bytes.
    """
    return (len(s) if s.isascii() else len(s.encode("utf-8"))), s


def _canonical_order(distinct: dict) -> List[Any]:
    """The items of ``{dedup key: item}`` sorted by :func:`encode_key` (str items without encoding them)."""
    if all(type(key) is str for key in distinct):
        return sorted(distinct, key=_utf8_order)
    return [distinct[key] for key in sorted(distinct, key=lambda key: key if type(key) is bytes else _encode_item(key))]


def _encode_item(item: Any) -> bytes:
    """:func:`encode_key` with the common ``str`` case inlined (hot path of :func:`subsample`)."""
    if type(item) is str:
        data = item.encode("utf-8")
        return b"s" + len(data).to_bytes(8, "big") + data
    return encode_key(item)


def warn_if_seeded(seed: Optional[int]) -> None:
    """Log the warning the contract requires for seeded runs."""
    if seed is not None:
        _LOG.warning(
            "Running with a fixed seed (%d): the output is reproducible but NOT differentially "
            "private against anyone who knows the seed. Do not use --seed in production.",
            seed,
        )
