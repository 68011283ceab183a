"""Exact sampling from the discrete Gaussian N_Z(0, sigma^2) (pure Python, no Beam, no floating point).

Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020; CKS below),
section 5: Algorithm 1 (Bernoulli(exp(-gamma)) for a rational gamma), Algorithm 2 (discrete Laplace
by rejection) and Algorithm 3 (discrete Gaussian by rejection from the discrete Laplace). OpenDP and
Google's differential-privacy library sample the same way.

``N_Z(0, sigma^2)`` is the distribution on the integers with ``P[X = x] proportional to
exp(-x^2 / (2 sigma^2))``. Here ``sigma^2`` is an exact rational (:class:`fractions.Fraction`) and
every step is integer arithmetic on uniform random integers: the only randomness consumed is
``randbelow(n)`` (a uniform integer in ``[0, n)``), and every comparison is between integers. No
floating-point value is ever computed, so the output distribution is exactly ``N_Z(0, sigma^2)``
(given a uniform source) and no low-order bit can depend on the data: the released value is
``true count + X``, an integer (docs/security.md, "Released counts").

Sources of uniform integers (:class:`UniformSource`):

* :class:`SystemSource` - ``os.urandom`` (the kernel CSPRNG, what ``secrets`` uses): production
  (unseeded) draws. Its only state is a buffer of OS bytes, dropped when the process id changes, so
  forked workers cannot share one.
* :class:`PhiloxSource` - the raw 64-bit words of a counter-based Philox bit generator: seeded draws.
  :func:`keyed_source` keys it by ``(seed, purpose, round, key)`` through
  :func:`transforms.core.randomness.keyed_generator`, so the draw for a key is a deterministic function
  of (seed, purpose, round, key), whatever the runner, bundle or order (docs/design.md, randomness
  contract). Only ``random_raw`` words are used (Philox's output is fixed by its specification), never
  numpy's distribution methods, whose algorithms may change between numpy versions.

Speed (``benchmarks/explore/bench_counts.py --sampler``): a few tens of thousands of draws per second per core
for sigma in the tens to thousands, in pure Python; the count release draws one per *released* item.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Any, List, Sequence, Union

from dp_partition_beam.transforms.core import randomness

__all__ = [
    "UniformSource",
    "SystemSource",
    "PhiloxSource",
    "keyed_source",
    "as_sigma2",
    "bernoulli_exp",
    "sample_discrete_laplace",
    "sample_discrete_gaussian",
    "DiscreteGaussian",
]


class UniformSource:
    """Uniform random integers: ``randbelow(n)`` in ``[0, n)`` for any int ``n >= 1`` (big ints too)."""

    def randbelow(self, n: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class SystemSource(UniformSource):
    """Uniform integers from OS entropy (``os.urandom``: the kernel CSPRNG), cryptographically secure.

    Bytes are read 4 KiB at a time (one system call per ~250 draws instead of one per uniform
    integer; ~3x faster end to end) and turned into integers by rejection sampling, like
    :class:`PhiloxSource`. The buffer is dropped if the process id changes, so a process forked after
    filling it can never replay the parent's bytes.
    """

    _CHUNK = 4096

    def __init__(self):
        self._buf = b""
        self._pos = 0
        self._pid = None

    def _bytes(self, k: int) -> bytes:
        if self._pid != os.getpid() or self._pos + k > len(self._buf):
            self._pid = os.getpid()
            self._buf = os.urandom(max(self._CHUNK, k))
            self._pos = 0
        out = self._buf[self._pos : self._pos + k]
        self._pos += k
        return out

    def randbelow(self, n: int) -> int:
        if n <= 1:
            if n == 1:
                return 0
            raise ValueError(f"randbelow needs n >= 1, got {n!r}")
        k = (n - 1).bit_length()
        nbytes = (k + 7) // 8
        shift = 8 * nbytes - k
        while True:
            v = int.from_bytes(self._bytes(nbytes), "big") >> shift
            if v < n:
                return v


class PhiloxSource(UniformSource):
    """Uniform integers from the raw 64-bit output of a Philox bit generator (rejection sampling).

    ``randbelow(n)``: draw ``k = (n - 1).bit_length()`` bits (the top ``k`` of ``ceil(k / 64)`` raw
    words, most significant word first) and retry while the value is ``>= n``: exactly uniform, and a
    function of the bit generator's stream only.
    """

    def __init__(self, bit_generator):
        self._raw = bit_generator.random_raw
        self._buf: List[int] = []

    def _word(self) -> int:
        if not self._buf:
            self._buf = [int(w) for w in self._raw(16)][::-1]
        return self._buf.pop()

    def randbelow(self, n: int) -> int:
        if n <= 1:
            if n == 1:
                return 0
            raise ValueError(f"randbelow needs n >= 1, got {n!r}")
        k = (n - 1).bit_length()
        words = (k + 63) // 64
        shift = 64 * words - k
        while True:
            v = 0
            for _ in range(words):
                v = (v << 64) | self._word()
            v >>= shift
            if v < n:
                return v


def keyed_source(seed: int, purpose: str, round_: int, key: Any) -> PhiloxSource:
    """The seeded uniform source of ``key``: Philox keyed by (seed, purpose, round, key) (randomness contract)."""
    return PhiloxSource(randomness.keyed_generator(seed, purpose, round_, key).bit_generator)


def as_sigma2(sigma2: Union[Fraction, int, float]) -> Fraction:
    """``sigma^2`` as an exact positive rational (a float is taken exactly: ``Fraction(0.1)`` is the double)."""
    if isinstance(sigma2, bool) or not isinstance(sigma2, (Fraction, int, float)):
        raise ValueError(f"sigma2 must be a positive rational (Fraction, int or float), got {sigma2!r}")
    if isinstance(sigma2, float) and not math.isfinite(sigma2):
        raise ValueError(f"sigma2 must be a positive finite number, got {sigma2!r}")
    s = Fraction(sigma2)
    if s <= 0:
        raise ValueError(f"sigma2 must be > 0, got {sigma2!r}")
    return s


def _bernoulli(src: UniformSource, num: int, den: int) -> bool:
    """Bernoulli(num/den) for integers 0 <= num <= den: one uniform integer compared with num."""
    return src.randbelow(den) < num


def _bernoulli_exp_at_most_one(src: UniformSource, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS Algorithm 1, first case).

    Draw A_k ~ Bernoulli(gamma/k) for k = 1, 2, ... until the first A_k = 0; return whether that k is
    odd. P[A_1 = ... = A_k = 1] = gamma^k / k!, so P[k odd] = sum_j (-gamma)^j / j! = exp(-gamma).
    """
    k = 1
    while _bernoulli(src, num, den * k):  # A_k = 1 with probability gamma / k
        k += 1
    return k % 2 == 1


def bernoulli_exp(src: UniformSource, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) exactly, for integers ``num >= 0``, ``den >= 1`` (CKS Algorithm 1).

    For gamma > 1: exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))), a product of
    independent Bernoulli trials (stop at the first failure).
    """
    if num < 0 or den < 1:
        raise ValueError(f"bernoulli_exp needs num >= 0 and den >= 1, got {num}/{den}")
    whole, rest = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_at_most_one(src, 1, 1):
            return False
    return _bernoulli_exp_at_most_one(src, rest, den)


def sample_discrete_laplace(src: UniformSource, t: int) -> int:
    """X with P[X = x] proportional to exp(-|x| / t), integer ``t >= 1`` (CKS Algorithm 2 with s = 1).

    U uniform in {0..t-1} accepted with probability exp(-U/t), V ~ Geometric(1 - exp(-1)) counted by
    Bernoulli(exp(-1)) trials, magnitude U + t V; a fair sign, rejecting "negative zero".
    """
    if t < 1:
        raise ValueError(f"t must be a positive integer, got {t!r}")
    while True:
        u = src.randbelow(t)
        if not bernoulli_exp(src, u, t):
            continue
        v = 0
        while bernoulli_exp(src, 1, 1):
            v += 1
        x = u + t * v
        negative = src.randbelow(2) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def sample_discrete_gaussian(src: UniformSource, sigma2: Fraction) -> int:
    """One exact draw of N_Z(0, sigma^2) (CKS Algorithm 3).

    With ``t = floor(sigma) + 1``: draw Y from the discrete Laplace of scale t and accept it with
    probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``. With ``sigma^2 = a/b`` the exponent is the
    rational ``(|Y| b t - a)^2 / (2 a b t^2)``, so the acceptance is :func:`bernoulli_exp` on integers.
    """
    a, b = sigma2.numerator, sigma2.denominator
    t = math.isqrt(a // b) + 1  # floor(sqrt(a/b)) = isqrt(floor(a/b)), so t = floor(sigma) + 1
    den = 2 * a * b * t * t
    while True:
        y = sample_discrete_laplace(src, t)
        num = (abs(y) * b * t - a) ** 2
        if bernoulli_exp(src, num, den):
            return y


class DiscreteGaussian:
    """N_Z(0, sigma^2) noise for keys, seeded (keyed) or from OS entropy.

    ``draw(key)``: with a seed, the draw of ``key`` is a function of (seed, purpose, round, key) only
    (its own Philox stream); without, it comes from ``os.urandom`` (OS entropy; no seed in the
    pipeline graph). ``draw_many(keys)`` is the same per key.
    """

    def __init__(self, sigma2, seed=None, purpose: str = "count_noise", round_: int = 0):
        self.sigma2 = as_sigma2(sigma2)
        self._seed, self._purpose, self._round = seed, str(purpose), int(round_)
        self._system = SystemSource() if seed is None else None

    def draw(self, key: Any = None) -> int:
        if self._seed is None:
            return sample_discrete_gaussian(self._system, self.sigma2)
        return sample_discrete_gaussian(keyed_source(self._seed, self._purpose, self._round, key), self.sigma2)

    def draw_many(self, keys: Sequence[Any]) -> List[int]:
        return [self.draw(k) for k in keys]
