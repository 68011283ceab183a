"""Key bytes and 64-bit fingerprints, vectorised over Arrow columns and scalar for Python keys.

The columnar path (:mod:`transforms.core.batches`) stores users and items as Arrow ``binary``
columns of *key bytes*:

* a ``str`` key is its UTF-8 bytes;
* any other key (``bytes``, ``int``, ``float``, ``bool``, ``None``, tuples of those) is ``0xFF``
  followed by :func:`transforms.core.randomness.encode_key` (type-tagged, length-prefixed).

Valid UTF-8 never contains the byte ``0xFF``, so the two kinds never collide and the mapping is
injective: grouping on key bytes is exact (two different keys are never merged), and
:func:`from_key_bytes` decodes them back. Fingerprints are used only where a collision is harmless:
to pick a shard (the same key always goes to the same shard; two keys sharing a shard is normal)
and as the input of seeded draws (:mod:`transforms.core.randomness`; two keys with equal
fingerprints would get equal draws, probability ~ n^2 / 2^65 for n keys, which changes no
privacy property: capping and noise never rely on draws being distinct).

The fingerprint ``fingerprint64`` of key bytes ``b`` (length L, read as little-endian 64-bit words
``w_0 .. w_{m-1}``, the last zero-padded) is::

    h = (L * C_LEN) ^ C_INIT
    for each word: h = fmix64(h ^ w_j) * C_MUL + C_ADD      (mod 2^64)
    fingerprint = fmix64(h)

with MurmurHash3's 64-bit finaliser ``fmix64`` (a bijection with full avalanche). The numpy
version processes word j of every key at once (keys sorted by length, so the active keys of step j
are a prefix); the pure-Python version is the oracle (tests/transforms/core/test_tables.py).
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, List

import numpy as np
import pyarrow as pa

__all__ = [
    "encode_key",
    "NON_STR_MARK",
    "to_key_bytes",
    "from_key_bytes",
    "decode_key",
    "key_bytes_array",
    "fingerprint64",
    "fingerprint_of",
    "fmix64",
]

NON_STR_MARK = b"\xff"  # never in valid UTF-8


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


_M64 = (1 << 64) - 1
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
C_LEN = 0x9E3779B97F4A7C15
C_INIT = 0x2545F4914F6CDD1D
C_MUL = 0xD6E8FEB86659FD93
C_ADD = 0x94D049BB133111EB


def to_key_bytes(key: Any, strict: bool = True) -> bytes:
    """The key bytes of a user or item (see the module docstring).

    ``strict``: TypeError for a key with no exact encoding (``encode_key``'s ``repr`` fallback);
    the seeded draws pass ``strict=False`` (any key can be drawn for, as before).
    """
    if type(key) is str:
        return key.encode("utf-8")
    data = encode_key(key)
    if strict and data[:1] == b"r":
        raise TypeError(f"keys must be str, bytes, int, float, bool, None or tuples of those; got {type(key).__name__}")
    return NON_STR_MARK + data


def _decode(data: bytes, pos: int):
    tag = data[pos : pos + 1]
    pos += 1
    if tag in (b"s", b"b", b"i", b"t"):
        (n,) = struct.unpack_from(">Q", data, pos)
        pos += 8
        if tag == b"t":
            out = []
            for _ in range(n):
                value, pos = _decode(data, pos)
                out.append(value)
            return tuple(out), pos
        raw = data[pos : pos + n]
        pos += n
        if tag == b"s":
            return raw.decode("utf-8"), pos
        if tag == b"b":
            return bytes(raw), pos
        return int(raw.decode("ascii")), pos
    if tag == b"f":
        (value,) = struct.unpack_from(">d", data, pos)
        return value, pos + 8
    if tag == b"B":
        return data[pos : pos + 1] == b"1", pos + 1
    if tag == b"n":
        return None, pos
    raise ValueError(f"not an encoded key (tag {tag!r})")


def decode_key(data: bytes) -> Any:
    """Inverse of :func:`transforms.core.randomness.encode_key` (lists come back as tuples)."""
    value, pos = _decode(bytes(data), 0)
    if pos != len(data):
        raise ValueError("trailing bytes after an encoded key")
    return value


def from_key_bytes(data: bytes) -> Any:
    """Inverse of :func:`to_key_bytes`."""
    if data[:1] == NON_STR_MARK:
        return decode_key(data[1:])
    return data.decode("utf-8")


def key_bytes_array(keys: Iterable[Any]) -> pa.BinaryArray:
    """An Arrow binary array of the key bytes of ``keys``."""
    return pa.array([to_key_bytes(k) for k in keys], type=pa.binary())


def _fmix64_int(x: int) -> int:
    x ^= x >> 33
    x = (x * _C1) & _M64
    x ^= x >> 33
    x = (x * _C2) & _M64
    return x ^ (x >> 33)


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser over a uint64 array (wrapping arithmetic; returns a new array)."""
    x = x ^ (x >> np.uint64(33))
    x *= np.uint64(_C1)
    x ^= x >> np.uint64(33)
    x *= np.uint64(_C2)
    x ^= x >> np.uint64(33)
    return x


def fingerprint_of(data: bytes) -> int:
    """The 64-bit fingerprint of one key's bytes (pure Python; the oracle of :func:`fingerprint64`)."""
    n = len(data)
    h = ((n * C_LEN) & _M64) ^ C_INIT
    padded = data + b"\0" * (-n % 8)
    for j in range(0, len(padded), 8):
        w = int.from_bytes(padded[j : j + 8], "little")
        h = (_fmix64_int(h ^ w) * C_MUL + C_ADD) & _M64
    return _fmix64_int(h)


def _offsets_and_data(arr: pa.Array):
    """(int64 offsets of the array's values, uint8 data) of a binary/string (or large_*) array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        raise ValueError("key columns must not contain nulls")
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_binary(t):
        odt = np.int32
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        odt = np.int64
    else:
        raise TypeError(f"key columns must be binary or string, got {t}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=odt, count=len(arr) + 1, offset=arr.offset * np.dtype(odt).itemsize)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def fingerprint64(arr) -> np.ndarray:
    """The 64-bit fingerprints (uint64) of an Arrow binary/string array of key bytes, vectorised.

    Equal to ``[fingerprint_of(b) for b in arr]`` (tests/transforms/core/test_tables.py).
    """
    offsets, data = _offsets_and_data(arr)
    n = len(offsets) - 1
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = (lengths.astype(np.uint64) * np.uint64(C_LEN)) ^ np.uint64(C_INIT)
    if n == 0:
        return h
    nwords = (lengths + 7) // 8
    max_words = int(nwords.max())
    if max_words:
        lo, hi = int(starts.min()), int(offsets[1:].max())
        # every 8-byte window of the values (unaligned strided view), zero-padded at the end
        padded = np.zeros(hi - lo + 8, dtype=np.uint8)
        padded[: hi - lo] = data[lo:hi]
        windows = np.ndarray(shape=(hi - lo + 1,), dtype="<u8", buffer=padded, strides=(1,))
        order = np.argsort(-nwords, kind="stable")  # longest first: step j's active keys are a prefix
        active_counts = n - np.searchsorted(np.sort(nwords), np.arange(max_words), side="right")
        hs = h[order]
        base = starts[order] - lo
        rem_all = lengths[order]
        full = np.uint64(_M64)
        for j in range(max_words):
            m = int(active_counts[j])
            w = windows[base[:m] + 8 * j]
            rem = rem_all[:m] - 8 * j  # bytes of this key left from word j on (>= 1)
            tail = rem < 8
            if tail.any():
                shift = np.minimum(rem, 7).astype(np.uint64) * np.uint64(8)
                mask = np.where(tail, (np.uint64(1) << shift) - np.uint64(1), full)
                w = w & mask
            x = fmix64(hs[:m] ^ w)
            x *= np.uint64(C_MUL)
            x += np.uint64(C_ADD)
            hs[:m] = x
        h = np.empty_like(hs)
        h[order] = hs
    return fmix64(h)


def fingerprints_of(keys: Iterable[Any]) -> List[int]:
    """Fingerprints of Python keys (their key bytes), pure Python."""
    return [fingerprint_of(to_key_bytes(k)) for k in keys]
