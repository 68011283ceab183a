"""Synthetic data for benchmarks and tests: Zipf (user, item) pairs generated inside pipelines, the MAD
paper's heavy/light instance, and Markov-chain user text (DPNE).

``beam.Create`` of a big list is slow (~16k elements/s), so benchmarks create a few chunk ids and
expand each into pairs on the workers with :func:`zipf_pairs_of_chunk` (deterministic per chunk).
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Tuple

import numpy as np


def zipf_pairs_of_chunk(
    chunk: int,
    users_per_chunk: int,
    mean_degree: float = 10.0,
    n_items: int = 1_000_000,
    exponent: float = 1.1,
    seed: int = 0,
) -> Iterator[Tuple[str, str]]:
    """(user, item) pairs of ``users_per_chunk`` users; degrees ~ 1 + Geometric, items ~ Zipf(exponent).

    Items are ``"w<rank>"`` with rank drawn from a Zipf law truncated to ``n_items``; a user's
    duplicate draws are kept (BoundContributions removes them), so the number of pairs is exact:
    ``users_per_chunk * mean_degree`` on average.
    """
    degrees, ranks = _chunk_draws(chunk, users_per_chunk, mean_degree, n_items, exponent, seed)
    pos = 0
    base = chunk * users_per_chunk
    for j, d in enumerate(degrees):
        user = f"u{base + j}"
        for r in ranks[pos : pos + d]:
            yield user, f"w{r}"
        pos += d


def _chunk_draws(chunk, users_per_chunk, mean_degree, n_items, exponent, seed):
    """(degree per user, item rank per pair) of one chunk."""
    rng = np.random.default_rng([seed, chunk])
    degrees = _chunk_degrees(rng, users_per_chunk, mean_degree)
    total = int(degrees.sum())
    ranks = rng.zipf(exponent, size=total * 2)
    ranks = ranks[ranks <= n_items][:total]
    while len(ranks) < total:  # extremely rare top-up
        extra = rng.zipf(exponent, size=total)
        ranks = np.concatenate([ranks, extra[extra <= n_items]])[:total]
    return degrees, ranks


def zipf_table_of_chunk(
    chunk: int,
    users_per_chunk: int,
    mean_degree: float = 10.0,
    n_items: int = 1_000_000,
    exponent: float = 1.1,
    seed: int = 0,
):
    """The pairs of :func:`zipf_pairs_of_chunk` (same chunk, same rows) as one Arrow Table(user, item)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    degrees, ranks = _chunk_draws(chunk, users_per_chunk, mean_degree, n_items, exponent, seed)
    users = np.repeat(np.arange(chunk * users_per_chunk, (chunk + 1) * users_per_chunk), degrees)
    return pa.table(
        {
            "user": pc.binary_join_element_wise("u", pc.cast(pa.array(users), pa.string()), ""),
            "item": pc.binary_join_element_wise("w", pc.cast(pa.array(ranks), pa.string()), ""),
        }
    )


def _chunk_degrees(rng: np.random.Generator, users_per_chunk: int, mean_degree: float) -> np.ndarray:
    return np.maximum(rng.geometric(1.0 / mean_degree, size=users_per_chunk), 1)


def zipf_pair_count(n_chunks: int, users_per_chunk: int, mean_degree: float = 10.0, seed: int = 0) -> int:
    """Number of pairs :func:`zipf_pairs_of_chunk` yields over chunks 0..n_chunks-1 (without generating them)."""
    return sum(
        int(_chunk_degrees(np.random.default_rng([seed, c]), users_per_chunk, mean_degree).sum())
        for c in range(n_chunks)
    )


def zipf_pairs(n_chunks: int, users_per_chunk: int, **kwargs) -> List[Tuple[str, str]]:
    """All pairs of :func:`zipf_pairs_of_chunk` for chunks 0..n_chunks-1 (in memory)."""
    out: List[Tuple[str, str]] = []
    for c in range(n_chunks):
        out.extend(zipf_pairs_of_chunk(c, users_per_chunk, **kwargs))
    return out


SKEW_ROWS_PER_CHUNK = 100_000


def skew_chunks(hot_users: int, whale_items: int) -> int:
    """Chunks of :func:`skew_table_of_chunk` for ``hot_users`` holders of the hot item and a whale."""
    return -(-hot_users // SKEW_ROWS_PER_CHUNK) + -(-whale_items // SKEW_ROWS_PER_CHUNK)


def skew_table_of_chunk(chunk: int, hot_users: int, whale_items: int):
    """The skew instance of issue 29 in chunks of SKEW_ROWS_PER_CHUNK rows, as Table(user, item): users
    ``u0..u{hot_users-1}`` each hold the item ``hot`` (one item held by every user but one), and one user
    ``whale`` holds ``whale_items`` distinct items ``w0, w1, ...`` (every row distinct: nothing to
    deduplicate). Chunks first cover the hot item's holders, then the whale's items."""
    import pyarrow as pa
    import pyarrow.compute as pc

    hot_chunks = -(-hot_users // SKEW_ROWS_PER_CHUNK)
    if chunk < hot_chunks:
        ids = np.arange(chunk * SKEW_ROWS_PER_CHUNK, min((chunk + 1) * SKEW_ROWS_PER_CHUNK, hot_users))
        users = pc.binary_join_element_wise("u", pc.cast(pa.array(ids), pa.string()), "")
        return pa.table({"user": users, "item": pa.array(["hot"] * len(ids))})
    start = (chunk - hot_chunks) * SKEW_ROWS_PER_CHUNK
    ids = np.arange(start, min(start + SKEW_ROWS_PER_CHUNK, whale_items))
    items = pc.binary_join_element_wise("w", pc.cast(pa.array(ids), pa.string()), "")
    return pa.table({"user": pa.array(["whale"] * len(ids)), "item": items})


def heavy_light_sets(n_users: int = 15_000, n_light: int = 1_000, light_per_user: int = 2, seed: int = 0) -> dict:
    """The MAD paper's section 6.2 instance: every user holds the heavy item and 2 of m light items."""
    rng = np.random.default_rng(seed)
    sets = {}
    for u in range(n_users):
        light = rng.choice(n_light, size=light_per_user, replace=False)
        sets[f"u{u}"] = ["heavy"] + [f"light{j}" for j in light]
    return sets


def markov_corpus(
    n_users: int,
    vocab: int = 300,
    branching: int = 4,
    seed: int = 0,
    lines: Tuple[int, int] = (1, 4),
    length: Tuple[int, int] = (3, 14),
) -> Dict[str, List[str]]:
    """Synthetic user text from a sparse first-order Markov chain over ``w0..w{vocab-1}``.

    Start words are Zipf(1.1)-distributed; each word has ``branching`` successors with Zipf weights,
    so popular paths (long n-grams shared by many users) coexist with a long tail. Returns
    ``{user: [line, ...]}`` (deterministic in ``seed``).
    """
    gen = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab + 1) ** 1.1
    start_p = zipf / zipf.sum()
    succ = gen.integers(0, vocab, size=(vocab, branching))
    bw = 1.0 / np.arange(1, branching + 1) ** 1.5
    bw = bw / bw.sum()
    out: Dict[str, List[str]] = {}
    for u in range(n_users):
        texts = []
        for _ in range(int(gen.integers(lines[0], lines[1] + 1))):
            n = int(gen.integers(length[0], length[1] + 1))
            w = int(gen.choice(vocab, p=start_p))
            toks = [w]
            for _ in range(n - 1):
                w = int(succ[w, gen.choice(branching, p=bw)])
                toks.append(w)
            texts.append(" ".join(f"w{t}" for t in toks))
        out[f"user{u:06d}"] = texts
    return out
