"""The randomness contract (DESIGN.md, "Randomness contract").

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


def _digest(seed: int, purpose: str, round_: int, key: Any, size: int = 16) -> bytes:
    h = hashlib.blake2b(digest_size=size, person=b"dp-part-beam-v1")
    h.update(encode_key((int(seed), str(purpose), int(round_))))
    h.update(encode_key(key))
    return h.digest()


def keyed_bytes(seed: int, purpose: str, round_: int, key: Any, size: int = 16) -> bytes:
    """``size`` pseudo-random bytes (<= 64), a function of (seed, purpose, round, key) (e.g. a secret hash key)."""
    return _digest(seed, purpose, round_, key, size)


def keyed_uniform(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Uniforms in the open interval (0, 1), one per key, each a function of (seed, purpose, round, key)."""
    out = np.empty(len(keys), dtype=np.float64)
    for j, key in enumerate(keys):
        bits = int.from_bytes(_digest(seed, purpose, round_, key, 8), "big") >> 11
        out[j] = (bits + 0.5) / _TWO_POW_53
    return out


def keyed_normal(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Standard normal draws, one per key (inverse CDF of :func:`keyed_uniform`)."""
    return special.ndtri(keyed_uniform(seed, purpose, round_, keys))


def keyed_laplace(seed: int, purpose: str, round_: int, keys: Sequence[Any]) -> np.ndarray:
    """Standard Laplace (scale 1) draws, one per key (inverse CDF of :func:`keyed_uniform`)."""
    u = keyed_uniform(seed, purpose, round_, keys) - 0.5
    return -np.sign(u) * np.log1p(-2.0 * np.abs(u))


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


def _scalar_uniform(seed: int, purpose: str, round_: int, key: Any) -> float:
    bits = int.from_bytes(_digest(seed, purpose, round_, key, 8), "big") >> 11
    return (bits + 0.5) / _TWO_POW_53


def subsample(
    items: Iterable[Any],
    k: int,
    user: Any,
    round_: int,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    purpose: str = "subsample",
) -> List[Any]:
    """Uniform random subset of at most ``k`` of the (distinct) ``items`` (MAD Alg. 1 lines 4-5).

    Bottom-k sampling: every item gets an independent uniform priority and the ``k`` smallest are
    kept, which is a uniformly random k-subset. It streams over ``items`` with O(k) memory (a user
    with millions of items is never materialised). Seeded: the priority of ``item`` is
    ``keyed_uniform(seed, purpose, round, (user, item))``, so the subset does not depend on input
    order or bundling. Unseeded: priorities come from ``rng`` (OS entropy on the worker).
    The result is in canonical order (sorted by :func:`sort_key`).
    """
    if k < 1:
        raise ValueError(f"max_contributions must be >= 1, got {k!r}")
    if seed is None and rng is None:
        raise ValueError("unseeded subsampling needs a worker generator (rng)")
    heap: List[tuple] = []  # max-heap on priority via negation: (-priority, sort_key, item)
    buffer_u = None
    pos = 0
    for item in items:
        if seed is not None:
            p = _scalar_uniform(seed, purpose, round_, (user, item))
        else:
            if buffer_u is None or pos >= len(buffer_u):
                buffer_u = rng.random(1024)
                pos = 0
            p = float(buffer_u[pos])
            pos += 1
        entry = (-p, sort_key(item), item)
        if len(heap) < k:
            heapq.heappush(heap, entry)
        elif entry > heap[0]:
            heapq.heapreplace(heap, entry)
    heap.sort(key=lambda e: e[1])
    return [e[2] for e in heap]


def warn_if_seeded(seed: Optional[int]) -> None:
    """Log the warning the contract requires for seeded runs."""
    if seed is not None:
        _LOG.warning(
            "Running with a fixed seed (%d): the output is reproducible but NOT differentially "
            "private against anyone who knows the seed. Do not use --seed in production.",
            seed,
        )
