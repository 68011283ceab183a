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

Seeded Gaussian and Laplace draws are inverse-CDF transforms of a 53-bit uniform taken from a
BLAKE2b hash of the key, so they resolve tails down to about 1e-16 (|z| <= 8.3): ample for tests and
reproducible demos. Production noise uses numpy's generator (full-precision tails).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import struct
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np
from scipy import special

_LOG = logging.getLogger(__name__)

_TWO_POW_53 = float(2**53)


def encode_key(value: Any) -> bytes:
    """Canonical, type-tagged byte encoding of a key (item, user, n-gram tuple, ...)."""
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"s" + struct.pack(">Q", len(data)) + data
    if isinstance(value, bytes):
        return b"b" + struct.pack(">Q", len(value)) + value
    if isinstance(value, bool):
        return b"B1" if value else b"B0"
    if isinstance(value, int):
        data = str(value).encode("ascii")
        return b"i" + struct.pack(">Q", len(data)) + data
    if isinstance(value, float):
        return b"f" + struct.pack(">d", value)
    if value is None:
        return b"n"
    if isinstance(value, (tuple, list)):
        parts = [encode_key(v) for v in value]
        return b"t" + struct.pack(">Q", len(parts)) + b"".join(parts)
    data = repr(value).encode("utf-8")
    return b"r" + struct.pack(">Q", len(data)) + data


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


def _uniform_of(digest8: bytes) -> float:
    """The uniform in (0, 1) of an 8-byte digest: its top 53 bits, centred in their cell."""
    return ((int.from_bytes(digest8, "big") >> 11) + 0.5) / _TWO_POW_53


def _laplace_of(centred):
    """Inverse CDF of the standard Laplace at ``u - 0.5`` (array or scalar; never 0 for our uniforms)."""
    return -np.sign(centred) * np.log1p(-2.0 * np.abs(centred))


def keyed_bytes(seed: int, purpose: str, round_: int, key: Any, size: int = 16) -> bytes:
    """``size`` pseudo-random bytes (<= 64), a function of (seed, purpose, round, key) (e.g. a secret hash key)."""
    return _digest(seed, purpose, round_, key, size)


def keyed_uniform(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Uniforms in the open interval (0, 1), one per key, each a function of (seed, purpose, round, key)."""
    prefix = _prefix_hasher(seed, purpose, round_)
    out = np.empty(len(keys), dtype=np.float64)
    for j, key in enumerate(keys):
        h = prefix.copy()
        h.update(encode_key(key))
        out[j] = _uniform_of(h.digest())
    return out


class KeyedNoise:
    """Per-key seeded noise, one key at a time: ``draw(key)`` == ``standard_noise(kind, [key], ...)[0]``.

    The hash state of (seed, purpose, round) is built once, and the inverse CDF is applied to a
    scalar (same scipy/numpy ufunc loops as the array path), so the per-item cost in Beam's noise
    step is one BLAKE2b update instead of re-encoding the whole key tuple (tests/test_params_randomness.py
    checks bitwise equality with :func:`standard_noise`).
    """

    def __init__(self, kind: str, seed: int, purpose: str, round_: int):
        if kind not in ("gaussian", "laplace"):
            raise ValueError(f"noise kind must be 'gaussian' or 'laplace', got {kind!r}")
        self._gaussian = kind == "gaussian"
        self._prefix = _prefix_hasher(seed, purpose, round_)

    def draw(self, key: Any) -> float:
        h = self._prefix.copy()
        h.update(encode_key(key))
        u = _uniform_of(h.digest())
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


def sort_key(item: Any) -> bytes:
    """Total order on heterogeneous items (canonical encoding), used to make seeded output canonical."""
    return encode_key(item)


def _pair_prefix_hasher(seed: int, purpose: str, round_: int, user: Any):
    """BLAKE2b state after hashing ``(seed, purpose, round)`` and the ``(user, ...`` prefix of the key.

    ``encode_key((user, item))`` is ``b"t" + len 2 + encode_key(user) + encode_key(item)``, so
    ``prefix.copy().update(encode_key(item))`` gives exactly ``_digest(seed, purpose, round_,
    (user, item), 8)`` while encoding the seed, purpose, round and user once per user, not per item.
    """
    h = _prefix_hasher(seed, purpose, round_)
    h.update(b"t" + struct.pack(">Q", 2) + encode_key(user))
    return h


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

    Seeded: the priority of ``item`` is ``keyed_uniform(seed, purpose, round, (user, item))``, so the
    subset does not depend on input order or bundling. Unseeded: the same keyed hash under a fresh
    128-bit key drawn from ``rng`` (OS entropy on the worker) for this call, i.e. independent uniform
    priorities that are consistent across a user's duplicates. The result is in canonical order
    (sorted by :func:`sort_key`).
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
    # more than k distinct: from here on every key is the encoded item (hashed below)
    distinct = {(key if type(key) is bytes else _encode_item(item)): item for key, item in distinct.items()}
    if seed is None:
        seed = int.from_bytes(rng.bytes(16), "big")  # a fresh hash key for this call (see above)
    prefix = _pair_prefix_hasher(seed, purpose, round_, user)

    def entry(key, item):
        h = prefix.copy()
        h.update(key)
        return -_uniform_of(h.digest()), key, item

    # max-heap on priority via negation: (-priority, sort_key, item), of the k smallest priorities
    heap: List[tuple] = sorted(entry(key, item) for key, item in distinct.items())[-k:]
    heapq.heapify(heap)
    in_heap = {e[1] for e in heap}
    for item in it:
        key = _encode_item(item)
        if key in in_heap:
            continue  # a repeat of a sampled item; a repeat of a dropped item has the same priority
        e = entry(key, item)
        if e > heap[0]:
            in_heap.discard(heapq.heapreplace(heap, e)[1])
            in_heap.add(key)
    heap.sort(key=lambda e: e[1])
    return [e[2] for e in heap]


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
