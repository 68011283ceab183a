"""Pure n-gram kernels for DPNE (no Beam): valid k-grams V_k and spurious k-gram sampling.

N-grams are space-joined strings (:mod:`transforms.core.text`, which also holds the tokenizer).

Everything here is shared by the in-memory reference (:mod:`transforms.dpne.reference`) and the Beam
transform (:mod:`transforms.dpne.dpne`), which is what makes the two produce identical output under a
seed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
from scipy import stats

from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.text import first_word, head, join, last_word, tail

# ---------------------------------------------------------------------------------------------
# Valid k-grams V_k
# ---------------------------------------------------------------------------------------------

PRUNINGS = ("both", "single")


def is_valid(kgram: str, s_prev: Set[str], s1: Set[str], pruning: str = "both") -> bool:
    """Supplement Alg. 3 (CheckValidity) for 'both'; ``V_k = S_{k-1} x S_1`` for 'single'.

    For 'both' we check ``xy, yz in S_{k-1}``; ``x, z in S_1`` then follows because the output is
    downward closed (Prop. 2.1), but we check it as well so the function is correct for any input.
    """
    if pruning == "both":
        return head(kgram) in s_prev and tail(kgram) in s_prev and first_word(kgram) in s1 and last_word(kgram) in s1
    return head(kgram) in s_prev and last_word(kgram) in s1


def lr_counts(s_prev: Iterable[str]) -> Tuple[Dict[str, int], Dict[str, int]]:
    """``L(y) = #{x : xy in S_{k-1}}`` and ``R(y) = #{z : yz in S_{k-1}}`` over (k-2)-grams y."""
    left: Dict[str, int] = defaultdict(int)
    right: Dict[str, int] = defaultdict(int)
    for g in s_prev:
        left[tail(g)] += 1
        right[head(g)] += 1
    return left, right


def valid_count_exact(s_prev: Iterable[str], s1: Iterable[str], pruning: str = "both") -> int:
    """``|V_k|`` exactly: ``sum_y L(y) R(y)`` ('both'; for k = 2, y = "" and it is ``|S_1|^2``),
    ``|S_{k-1}| * |S_1|`` ('single'). Assumes S_1..S_{k-1} downward closed (true for DPNE output)."""
    s_prev = list(s_prev)
    if pruning == "single":
        return len(s_prev) * len(set(s1))
    left, right = lr_counts(s_prev)
    return int(sum(c * right.get(y, 0) for y, c in left.items()))


def brute_force_valid(s_prev: Set[str], s1: Set[str], pruning: str = "both") -> Set[str]:
    """V_k by enumeration of S_{k-1} x S_1 (tests only)."""
    return {join(w, z) for w in s_prev for z in s1 if is_valid(join(w, z), s_prev, s1, pruning)}


def valid_count_sample(s_prev: Sequence[str], s1: Sequence[str], p: float, gen: np.random.Generator) -> float:
    """Supplement Alg. 2 (EstimateValidKgrams): sample ``n = ceil(p |S_1| |S_{k-1}|)`` pairs
    ``x ~ S_1, w = yz ~ S_{k-1}`` and count those with ``xy in S_{k-1}`` (and ``z in S_1``).

    Returns the unbiased estimate ``count * |S_1||S_{k-1}| / n`` (the paper's ``ceil(count / p)``
    differs by the rounding of n and of the result; ours is exactly unbiased).
    """
    s1 = sorted(set(s1))
    s_prev = sorted(set(s_prev))
    m = len(s1) * len(s_prev)
    if m == 0:
        return 0.0
    n = max(1, int(math.ceil(p * m)))
    # Encode the condition "xy in S_{k-1}" as integer pairs (x index, y index).
    x_index = {x: i for i, x in enumerate(s1)}
    ys = sorted({head(w) for w in s_prev} | {tail(w) for w in s_prev})
    y_index = {y: i for i, y in enumerate(ys)}
    ny = len(ys)
    good_pairs = np.array(
        sorted(x_index[first_word(g)] * ny + y_index[tail(g)] for g in s_prev if first_word(g) in x_index),
        dtype=np.int64,
    )
    w_y = np.array([y_index[head(w)] for w in s_prev], dtype=np.int64)
    s1set = set(s1)
    w_zok = np.array([last_word(w) in s1set for w in s_prev], dtype=bool)
    count = 0
    chunk = 1_000_000
    done = 0
    while done < n:
        b = min(chunk, n - done)
        xi = gen.integers(0, len(s1), size=b)
        wi = gen.integers(0, len(s_prev), size=b)
        codes = xi.astype(np.int64) * ny + w_y[wi]
        ok = np.isin(codes, good_pairs) & w_zok[wi]
        count += int(ok.sum())
        done += b
    return count * m / n


# ---------------------------------------------------------------------------------------------
# Uniform sampling from V_k (spurious k-grams)
# ---------------------------------------------------------------------------------------------


class ValidSampler:
    """Draws k-grams uniformly from ``V_k`` given the released ``S_{k-1}`` and ``S_1``.

    'both': pick y with probability ``L(y) R(y) / |V_k|``, then x and z uniformly among
    ``{x : xy in S_{k-1}}`` and ``{z : yz in S_{k-1}}``. 'single': ``w ~ S_{k-1}``, ``z ~ S_1``.
    All lists are sorted, so draws are a deterministic function of the generator state (the
    reference and every Beam worker build the same sampler from the same released sets).
    """

    def __init__(self, s_prev: Iterable[str], s1: Iterable[str], pruning: str = "both"):
        self.pruning = pruning
        s_prev = sorted(set(s_prev))
        s1 = sorted(set(s1))
        if pruning == "single":
            self.s_prev = s_prev
            self.s1 = s1
            self.size = len(s_prev) * len(s1)
            return
        lefts: Dict[str, List[str]] = defaultdict(list)
        rights: Dict[str, List[str]] = defaultdict(list)
        for g in s_prev:  # sorted, so the lists below are sorted too
            lefts[tail(g)].append(first_word(g))
            rights[head(g)].append(last_word(g))
        self.ys = sorted(y for y in lefts if y in rights)
        self.lefts = [lefts[y] for y in self.ys]
        self.rights = [rights[y] for y in self.ys]
        w = np.array([len(l) * len(r) for l, r in zip(self.lefts, self.rights)], dtype=np.float64)
        self.size = int(sum(len(l) * len(r) for l, r in zip(self.lefts, self.rights)))
        self.cum = np.cumsum(w) / w.sum() if self.size else np.zeros(0)

    def draw(self, gen: np.random.Generator, n: int) -> List[str]:
        if n <= 0 or self.size == 0:
            return []
        if self.pruning == "single":
            wi = gen.integers(0, len(self.s_prev), size=n)
            zi = gen.integers(0, len(self.s1), size=n)
            return [join(self.s_prev[a], self.s1[b]) for a, b in zip(wi, zi)]
        u = gen.random(n)
        yi = np.minimum(np.searchsorted(self.cum, u, side="right"), len(self.ys) - 1)
        ux = gen.random(n)
        uz = gen.random(n)
        out = []
        for j in range(n):
            y = yi[j]
            ls, rs = self.lefts[y], self.rights[y]
            x = ls[min(int(ux[j] * len(ls)), len(ls) - 1)]
            z = rs[min(int(uz[j] * len(rs)), len(rs) - 1)]
            out.append(join(x, self.ys[y], z))
        return out


# Probability that the candidate oversample is too small. The run fails loudly in that case rather
# than releasing fewer spurious k-grams than the mechanism requires; at 1e-12 per level this never
# happens in practice (and a failure is not an output, so it costs no privacy beyond a 1e-12 event).
OVERSAMPLE_FAILURE_PROB = 1e-12
CANDIDATE_CHUNK = 50_000
MAX_CANDIDATES = 200_000_000


def spurious_oversample(n_spurious: int, n_avail: int, v_size: int) -> int:
    """Number M of i.i.d. uniform draws from V_k so that, with probability >= 1 - 1e-12, at least
    ``n_spurious`` distinct draws fall outside ``supp(H_k)``.

    While fewer than N distinct outside draws are collected, each draw is a new outside k-gram with
    probability >= p = (n_avail - N + 1) / |V_k|, so #distinct >= min(N, Binomial(M, p)) by coupling;
    M is the smallest with ``P[Binomial(M, p) < N] <= 1e-12`` (found by doubling + bisection).
    """
    if n_spurious <= 0:
        return 0
    p = (n_avail - n_spurious + 1) / v_size
    if p <= 0:
        raise ValueError("cannot draw more spurious k-grams than V_k minus supp(H_k) holds")

    def ok(m: int) -> bool:
        return stats.binom.cdf(n_spurious - 1, m, p) <= OVERSAMPLE_FAILURE_PROB

    hi = max(n_spurious, int(math.ceil(n_spurious / p)))
    while not ok(hi):
        hi *= 2
        if hi > 4 * MAX_CANDIDATES:
            break
    lo = n_spurious
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    if hi > MAX_CANDIDATES:
        # No counts in the message: they are functions of the private |supp(H_k)|.
        raise RuntimeError(
            f"spurious sampling would need more than {MAX_CANDIDATES} candidate draws: V_k is almost "
            "entirely covered by supp(H_k); use a smaller max_n"
        )
    return hi


def chunk_sizes(total: int, chunk: int = CANDIDATE_CHUNK) -> List[Tuple[int, int]]:
    """``[(chunk_index, size)]`` covering ``total`` candidate draws."""
    return [(c, min(chunk, total - c * chunk)) for c in range(int(math.ceil(total / chunk)))]


def candidate_chunk(
    sampler: ValidSampler,
    chunk_index: int,
    size: int,
    k: int,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> List[str]:
    """Candidate draws of one chunk: seeded -> generator keyed (seed, 'spurious', k, ('candidates', c))."""
    gen = randomness.keyed_generator(seed, "spurious", k, ("candidates", chunk_index)) if seed is not None else rng
    if gen is None:
        raise ValueError("unseeded spurious sampling needs a worker generator (rng)")
    return sampler.draw(gen, size)


def spurious_count(n_avail: int, q: float, k: int, seed: Optional[int], rng: Optional[np.random.Generator]) -> int:
    """``B_k ~ Binomial(|V_k| - |supp(H_k)|, q)`` (supplement Alg. 1); seeded: keyed (seed, 'spurious', k, 'count')."""
    if n_avail <= 0 or q <= 0:
        return 0
    gen = randomness.keyed_generator(seed, "spurious", k, "count") if seed is not None else rng
    if gen is None:
        raise ValueError("unseeded spurious sampling needs a worker generator (rng)")
    return int(gen.binomial(int(n_avail), float(q)))


def spurious_priorities(
    cands: Sequence[str], k: int, seed: Optional[int], rng: Optional[np.random.Generator]
) -> np.ndarray:
    """Random priorities for distinct candidates outside supp(H_k); the N smallest are kept."""
    if seed is not None:
        return randomness.keyed_uniform(seed, "spurious_priority", k, list(cands))
    if rng is None:
        raise ValueError("unseeded spurious sampling needs a worker generator (rng)")
    return rng.random(len(cands))


def select_spurious(prioritized: Iterable[Tuple[float, str]], n_spurious: int, k: int) -> List[str]:
    """Keep the ``n_spurious`` candidates with the smallest (priority, k-gram); fail loudly if short."""
    ranked = sorted(prioritized)
    if len(ranked) < n_spurious:
        # No counts in the message: they are functions of the private |supp(H_k)|.
        raise RuntimeError(
            f"level k={k}: the spurious oversample produced too few distinct candidates outside "
            f"supp(H_k) (an event of probability <= {OVERSAMPLE_FAILURE_PROB:g}); nothing was released, rerun"
        )
    return [c for _, c in ranked[:n_spurious]]
