"""Pure n-gram kernels for DPNE (no Beam): valid k-grams V_k, spurious k-gram sampling, and the vectorised
token and n-gram tables of the Beam path.

N-grams are space-joined strings (:mod:`transforms.core.text`, which also holds the tokenizer).

Everything here is shared by the in-memory reference (:mod:`transforms.dpne.reference`) and the Beam
transform (:mod:`transforms.dpne.dpne`), which is what makes the two produce identical output under a
seed.

Token and n-gram tables (the second half of this module; Arrow/numpy)
---------------------------------------------------------------------

Token tables replace the per-record token lists: one row per token, in text order,

  texts    Table(user: binary, text: string)            user = key bytes (transforms.core.fingerprint)
  tokens   Table(user: binary, token: string, rem: int32)
                                                        rem = tokens left on the token's line after it

so the n-gram starting at row ``i`` exists iff ``rem[i] >= n - 1`` (n-grams never cross a line break:
the lines of a text are its segments, :func:`transforms.core.text.segments`) and is the space-joined
``token[i .. i+n-1]``: the same string, hence the same key bytes (its UTF-8) and the same seeded
draws, as the per-record code and the reference (:func:`transforms.core.text.text_all_kgrams`).
Rows of one line are consecutive, so a token table may be cut or concatenated at any line boundary
(batches, user shards) without changing any n-gram.

Tokenisation is exactly :func:`transforms.core.text.default_tokenize` per line: ASCII texts (NFKC and
``str.lower`` are then ASCII lowercasing, ``\\w`` is ``[A-Za-z0-9_]``, ``str.splitlines`` splits at
``\\r\\n`` and ``[\\n\\r\\x0b\\x0c\\x1c-\\x1e]``) go through Arrow's string kernels; any other text, and
every text under a custom tokenizer, through the Python tokenizer (tests/transforms/dpne/test_dpne_batches.py
compares both with the per-line tokenizer).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import special

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.batches import ITEM, USER, concat, key_bytes_column
from dp_partition_beam.transforms.core.fingerprint import fingerprint64
from dp_partition_beam.transforms.core.tables import cap_pairs, noisy_weights
from dp_partition_beam.transforms.core.text import first_word, head, join, last_word, tail
from dp_partition_beam.transforms.selection.mad_kernels import round2_biases

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


# Probability that the candidate oversample is too small. The run fails loudly in that case rather than
# releasing fewer spurious k-grams than the mechanism requires. The event is a function of the public plan
# (|V_k|, q_k) and of the spurious draws' own randomness only, never of the data (docs/dpne.md, "The spurious
# draws as a subset of V_k"), so a failure reveals nothing; at 1e-12 per level it does not happen in practice.
OVERSAMPLE_FAILURE_PROB = 1e-12
CANDIDATE_CHUNK = 50_000
MAX_CANDIDATES = 200_000_000


def spurious_oversample(n_spurious: int, v_size: int) -> int:
    """Number M of i.i.d. uniform draws from V_k so that, with probability >= 1 - 1e-12, at least
    ``n_spurious`` distinct k-grams are drawn (both arguments public: the subset's size and |V_k|).

    While fewer than N distinct k-grams are collected, each draw is a new one with probability
    >= p = (|V_k| - N + 1) / |V_k|, so #distinct >= min(N, Binomial(M, p)) by coupling; M is the smallest with
    ``P[Binomial(M, p) < N] <= 1e-12`` (found by doubling + bisection).
    """
    if n_spurious <= 0:
        return 0
    p = (v_size - n_spurious + 1) / v_size
    if p <= 0:
        raise ValueError("cannot draw more distinct k-grams than V_k holds")

    from scipy import stats  # here, not at import: scipy.stats costs ~0.3 s and ~25 MB at every CLI start

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
        raise RuntimeError(
            f"spurious sampling would need more than {MAX_CANDIDATES} candidate draws: the level's spurious rate "
            "q_k is close to 1 on a large V_k (public values); use a smaller max_n or a smaller epsilon per level"
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
    label: str = "candidates",
) -> List[str]:
    """Candidate draws of one chunk: seeded -> generator keyed (seed, 'spurious', k, (label, c))."""
    gen = randomness.keyed_generator(seed, "spurious", k, (label, chunk_index)) if seed is not None else rng
    if gen is None:
        raise ValueError("unseeded spurious sampling needs a worker generator (rng)")
    return sampler.draw(gen, size)


def spurious_count(
    n_avail: int, q: float, k: int, seed: Optional[int], rng: Optional[np.random.Generator], key: str = "count"
) -> int:
    """``Binomial(n_avail, q)``, the size of a Bernoulli(q) subset of ``n_avail`` k-grams (:func:`spurious_subset`:
    n_avail = |V_k|, public); seeded: keyed (seed, 'spurious', k, key)."""
    if n_avail <= 0 or q <= 0:
        return 0
    gen = randomness.keyed_generator(seed, "spurious", k, key) if seed is not None else rng
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
        raise RuntimeError(
            f"round {k}: the spurious oversample produced too few distinct k-grams of V_k (an event of probability "
            f"<= {OVERSAMPLE_FAILURE_PROB:g} that depends on no data); nothing was released, rerun"
        )
    return [c for _, c in ranked[:n_spurious]]


def spurious_subset(
    sampler: ValidSampler, p: float, round_: int, seed: Optional[int], rng: Optional[np.random.Generator]
) -> List[str]:
    """A Bernoulli(``p``) subset of all of V_k: ``M ~ Bin(|V_k|, p)`` distinct k-grams, uniform (sorted).

    The spurious draws of a DPNE level k >= 2 (``selection='single'``, round k: the level releases the drawn
    k-grams outside supp(H_k)) and of a MAD-SIPS round inside a level (the round releases the drawn k-grams that
    are outside its support and not released yet); docs/dpne.md, "The spurious draws as a subset of V_k". Each
    k-gram of V_k is in the subset independently with probability p, so those outside any set A are a
    Bernoulli(p) subset of V_k minus A: the law of supplement Alg. 1's ``Bin(|V_k| - |A|, p)`` uniform k-grams
    of V_k minus A, drawn without knowing A (no count of the private support is needed).

    Seeded: M from ``keyed_generator(seed, 'spurious', round, 'subset_count')``, the candidates (uniform over
    V_k, with repeats, enough for M distinct with probability 1 - 1e-12: :func:`spurious_oversample`) from
    ``(seed, 'spurious', round, ('subset_candidates', c))`` per chunk c, and the M distinct ones of least
    priority ``keyed_uniform(seed, 'spurious_priority', round, [g])`` kept (a uniform M-subset of the distinct
    candidates, hence of V_k). Unseeded: all from ``rng``.
    """
    if not p > 0.0 or sampler.size == 0:
        return []
    n = spurious_count(sampler.size, p, round_, seed, rng, key="subset_count")
    if n == 0:
        return []
    distinct: Set[str] = set()
    for c, size in chunk_sizes(spurious_oversample(n, sampler.size)):
        distinct.update(candidate_chunk(sampler, c, size, round_, seed, rng, label="subset_candidates"))
    cands = sorted(distinct)
    pri = spurious_priorities(cands, round_, seed, rng)
    return sorted(select_spurious(zip(pri.tolist(), cands), n, round_))


# ---------------------------------------------------------------------------------------------
# Token and n-gram tables (vectorised tokenisation, the pairs of a level), Arrow/numpy
# ---------------------------------------------------------------------------------------------

TEXT = "text"
TOKEN = "token"
REM = "rem"
DEFAULT_CHUNK_ROWS = 1_000_000  # tokens whose n-grams are built at once (bounds a level's transient memory)
_BINARY = pa.binary()
_STRING = pa.string()

# str.splitlines' line boundaries among ASCII characters (\r\n first: one boundary)
_ASCII_LINE_BREAKS = "\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e]"


def texts_table(users: List, texts: List) -> pa.Table:
    """Table(user: binary key bytes, text: string) from Python ``(user, text)`` values."""
    for t in texts:
        if type(t) is not str:
            raise TypeError(f"DPNE input texts must be str, got {type(t).__name__}")
    return pa.table({USER: key_bytes_column(users), TEXT: pa.array(texts, type=_STRING)})


def normalise_text_batch(batch) -> pa.Table:
    """A RecordBatch/Table with columns ``user`` (string, binary or integer) and ``text`` (string) ->
    Table(user: binary key bytes, text: string); other columns dropped. A string user keeps its UTF-8
    bytes and an integer user is read as its decimal text (as the readers read jsonl), so batches and
    the element API give the same users."""
    if not isinstance(batch, (pa.RecordBatch, pa.Table)):
        raise TypeError(f"expected a pyarrow RecordBatch or Table, got {type(batch).__name__}")
    names = batch.schema.names
    if USER not in names or TEXT not in names:
        raise ValueError(f"a DPNE batch needs columns {USER!r} and {TEXT!r}; got {names}")
    cols = {}
    for name in (USER, TEXT):
        col = batch.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if col.null_count:
            raise ValueError(
                f"batch column {name!r} has {col.null_count} null value(s): every row needs a user and a text"
            )
        t = col.type
        if name == USER and pa.types.is_integer(t):
            col = col.cast(_STRING)
            t = col.type
        ok = pa.types.is_string(t) or pa.types.is_large_string(t)
        if name == USER:
            ok = ok or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        if not ok:
            raise TypeError(
                f"batch column {name!r} must be {'string or binary' if name == USER else 'string'}, got {t}"
            )
        cols[name] = col.cast(_BINARY if name == USER else _STRING)
    return pa.table(cols)


def _rem_of_lines(line_ids: np.ndarray) -> np.ndarray:
    """Tokens left on the line after each token (``line_ids`` non-decreasing, a line's tokens consecutive)."""
    n = len(line_ids)
    if n == 0:
        return np.zeros(0, np.int32)
    ends = np.flatnonzero(np.r_[line_ids[1:] != line_ids[:-1], True])  # last row of each line
    lengths = np.diff(np.r_[-1, ends])
    last = np.repeat(ends, lengths)
    return (last - np.arange(n)).astype(np.int32)


def _ascii_tokens(texts: pa.Array):
    """(record index, line id, token) of ASCII texts, by Arrow kernels (== default_tokenize per line)."""
    lines = pc.split_pattern_regex(texts, _ASCII_LINE_BREAKS)
    line_rec = pc.list_parent_indices(lines).to_numpy()
    s = pc.ascii_lower(pc.list_flatten(lines))
    s = pc.replace_substring_regex(s, "[^a-z0-9_']+", " ")  # non-word characters separate tokens
    s = pc.replace_substring_regex(s, "''+", " ")  # an apostrophe is internal only alone ...
    s = pc.replace_substring_regex(s, "(^| )'", "\\1 ")  # ... and after a word character ...
    s = pc.replace_substring_regex(s, "'( |$)", " \\1")  # ... and before one: \w+(?:'\w+)*
    toks = pc.ascii_split_whitespace(s)
    tok_line = pc.list_parent_indices(toks).to_numpy()
    flat = pc.list_flatten(toks)
    keep = pc.greater(pc.binary_length(flat), 0)  # leading/trailing separators leave empty strings
    flat = flat.filter(keep)
    tok_line = tok_line[keep.to_numpy(zero_copy_only=False)]
    return line_rec[tok_line], tok_line.astype(np.int64), flat


def _python_tokens(texts: Sequence[str], tokenizer):
    """(record index, line id, token) by the Python tokenizer, one segment (line) at a time."""
    recs: List[int] = []
    lines: List[int] = []
    toks: List[str] = []
    line_id = 0
    check = tokenizer is not tx.default_tokenize
    for r, text in enumerate(texts):
        for seg in tx.segments(text):
            seg_toks = tokenizer(seg)
            if check and type(seg_toks) is not list and type(seg_toks) is not tuple:
                tx.checked_tokens(seg_toks, tokenizer)  # TokenizerError: not a list
            if seg_toks:
                toks.extend(seg_toks)
                recs.extend([r] * len(seg_toks))
                lines.extend([line_id] * len(seg_toks))
            line_id += 1
    if check:  # the tokens themselves, all at once (C loops over the joined text, not one call per line)
        tx.checked_tokens(toks, tokenizer)
    return np.asarray(recs, np.int64), np.asarray(lines, np.int64), pa.array(toks, type=_STRING)


def tokenize_table(table: pa.Table, tokenizer=None) -> pa.Table:
    """Table(user, text) -> Table(user, token, rem) (module docstring); ``tokenizer=None`` is the default
    tokenizer (ASCII texts vectorised), else a ``str -> list[str]`` applied to every line."""
    texts = table.column(TEXT)
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    parts = []  # (record index, line id, tokens)
    if tokenizer is None:
        ascii_mask = pc.string_is_ascii(texts).to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(ascii_mask)
        if len(rows):
            rec, line, tok = _ascii_tokens(texts.take(pa.array(rows)) if len(rows) < len(texts) else texts)
            parts.append((rows[rec], line, tok))
        rows = np.flatnonzero(~ascii_mask)
        if len(rows):
            rec, line, tok = _python_tokens(texts.take(pa.array(rows)).to_pylist(), tx.default_tokenize)
            parts.append((rows[rec], line, tok))
    else:
        parts.append(_python_tokens(texts.to_pylist(), tokenizer))
    users = table.column(USER)
    if isinstance(users, pa.ChunkedArray):
        users = users.combine_chunks()
    out_users, out_toks, out_rem = [], [], []
    for rec, line, tok in parts:
        if len(tok):
            out_users.append(users.take(pa.array(rec)))
            out_toks.append(tok)
            out_rem.append(_rem_of_lines(line))
    if not out_toks:
        return pa.table({USER: pa.array([], _BINARY), TOKEN: pa.array([], _STRING), REM: pa.array([], pa.int32())})
    return pa.table(
        {
            USER: pa.concat_arrays(out_users),
            TOKEN: pa.concat_arrays(out_toks),
            REM: pa.array(np.concatenate(out_rem)),
        }
    )


def ngrams_at(tokens: pa.Array, pos: np.ndarray, n: int) -> pa.Array:
    """The n-grams (tokens joined by single spaces) starting at rows ``pos`` (all must have rem >= n-1)."""
    if n == 1:
        return tokens.take(pa.array(pos))
    parts = [tokens.take(pa.array(pos + j)) for j in range(n)]
    return pc.binary_join_element_wise(*parts, " ")


def string_array(values: Iterable[str]) -> pa.Array:
    """An Arrow string array of released n-grams (a side-input list)."""
    return pa.array(list(values), type=_STRING)


def _in(values: pa.Array, value_set: pa.Array) -> np.ndarray:
    if len(value_set) == 0:
        return np.zeros(len(values), dtype=bool)
    return pc.is_in(values, value_set=value_set).to_numpy(zero_copy_only=False)


def level_pairs(
    tokens: pa.Table,
    lengths: Sequence[int],
    s_prev: Optional[pa.Array] = None,
    s1: Optional[pa.Array] = None,
    pruning: str = "both",
    allowlist: Optional[pa.Array] = None,
) -> pa.Table:
    """Table(user: binary, item: binary) of the (user, n-gram) rows of a run, repeats included.

    Without ``s_prev``: every n-gram of the given ``lengths`` (level 1, the DPSU baselines). With the
    released ``s_prev`` = S_{k-1} and ``s1`` = S_1 (string arrays; level ``k = lengths[0] >= 2``) only
    the valid k-grams (:func:`transforms.dpne.dpne_kernels.is_valid`): 'both', ``x``, ``z`` in S_1 and
    ``xy``, ``yz`` in S_{k-1}; 'single', ``xy`` in S_{k-1} and ``z`` in S_1. The (k-1)-grams are built
    only where the words passed, the k-grams only where the (k-1)-grams did. ``allowlist`` (a string
    array): n-grams outside it dropped.
    """
    tok = tokens.column(TOKEN)
    if isinstance(tok, pa.ChunkedArray):
        tok = tok.combine_chunks()
    rem = tokens.column(REM).to_numpy()
    grams, rows = [], []
    if s_prev is None:
        for n in lengths:
            pos = np.flatnonzero(rem >= n - 1)
            grams.append(ngrams_at(tok, pos, n))
            rows.append(pos)
    else:
        (k,) = lengths
        pos = np.flatnonzero(rem >= k - 1)
        in1 = _in(tok, s1)
        ok = in1[pos + k - 1] & (in1[pos] if pruning == "both" else True)
        pos = pos[ok]
        pos = pos[_in(ngrams_at(tok, pos, k - 1), s_prev)]  # head xy in S_{k-1}
        if pruning == "both":
            pos = pos[_in(ngrams_at(tok, pos + 1, k - 1), s_prev)]  # tail yz in S_{k-1}
        grams.append(ngrams_at(tok, pos, k))
        rows.append(pos)
    gram = pa.concat_arrays(grams) if len(grams) > 1 else grams[0]
    row = np.concatenate(rows) if len(rows) > 1 else rows[0]
    if allowlist is not None:
        keep = _in(gram, allowlist)
        gram, row = gram.filter(pa.array(keep)), row[keep]
    users = tokens.column(USER)
    if isinstance(users, pa.ChunkedArray):
        users = users.combine_chunks()
    return pa.table({USER: users.take(pa.array(row)), ITEM: gram.cast(_BINARY)})


def line_chunks(rem: np.ndarray, max_rows: int) -> List[tuple]:
    """``[(start, stop)]`` row ranges covering a token table, cut only at line ends (``rem == 0``), each
    of at most ``max_rows`` rows unless one line is longer (then that line alone)."""
    n = len(rem)
    ends = np.flatnonzero(rem == 0) + 1  # exclusive end of every line
    out, start = [], 0
    while start < n:
        j = int(np.searchsorted(ends, start + max_rows, side="right")) - 1
        stop = int(ends[j]) if j >= 0 and ends[j] > start else int(ends[np.searchsorted(ends, start, side="right")])
        out.append((start, stop))
        start = stop
    return out


def capped_level(
    tokens: pa.Table,
    lengths: Sequence[int],
    max_contributions: int,
    seed: int,
    round_: int,
    s_prev: Optional[pa.Array] = None,
    s1: Optional[pa.Array] = None,
    pruning: str = "both",
    allowlist: Optional[pa.Array] = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> pa.Table:
    """Table(user, item, degree): every user's distinct (valid, allowlisted) n-grams of the run
    (:func:`level_pairs`), bottom-k subsampled to ``max_contributions`` with round ``round_``'s priorities.

    Tables of more than ``chunk_rows`` tokens are processed a chunk of whole lines at a time, each chunk
    pre-capped (a bottom-k of a subset keeps a superset of the final bottom-k: exact), so the n-grams of
    at most ``chunk_rows`` tokens exist at once.
    """
    args = (s_prev, s1, pruning, allowlist)
    if tokens.num_rows <= chunk_rows:
        return cap_pairs(level_pairs(tokens, lengths, *args), max_contributions, seed, round_)
    parts = []
    for start, stop in line_chunks(tokens.column(REM).to_numpy(), chunk_rows):
        pairs = level_pairs(tokens.slice(start, stop - start), lengths, *args)
        parts.append(cap_pairs(pairs, max_contributions, seed, round_).select([USER, ITEM]))
    return cap_pairs(concat(parts), max_contributions, seed, round_)


# ---------------------------------------------------------------------------------------------
# MAD-SIPS inside a level (selection='mad_sips'): one round's status, Arrow/numpy
# ---------------------------------------------------------------------------------------------


def truncated_noise(
    items: pa.Array, sigma: float, rho: float, seed: Optional[int], round_: int, rng: Optional[np.random.Generator]
) -> np.ndarray:
    """``sigma PhiInv(U Phi(rho/sigma))`` per item: ``sigma Z`` given ``sigma Z < rho``, U keyed (seed, 'noise',
    round, item) as the item's noise would be (unseeded: U in (0, 1] from ``rng``). The columnar
    :func:`transforms.dpne.reference.absent_entries` of a known domain (levels k >= 2)."""
    if seed is not None:
        u = randomness.uniforms_of_fingerprints(randomness.draw_key(seed, "noise", round_), fingerprint64(items))
    else:
        if rng is None:
            raise ValueError("unseeded noise needs a worker generator (rng)")
        u = 1.0 - rng.random(len(items))  # (0, 1]
    return sigma * special.ndtri(u * special.ndtr(rho / sigma))


def level_round_status(
    w: pa.Table, rounds, r: int, known_domain: bool, c_lb: float, c_ub: float, seed: Optional[int], rng
) -> pa.Table:
    """Round r of a level's MAD-SIPS on Table(item, weight, holders) (round r's MAD weights, and weight 0 /
    holders 0 for the round's candidates outside its support) -> Table(item, released, holders, bias, hopeless).

    One noisy entry per item: on the support ``weight + sigma_r Z`` (Z keyed (seed, 'noise', round_r, item));
    outside it the previous-round entry :func:`transforms.dpne.reference.absent_entries` gives: ``sigma_r Z``
    (level 1) or the truncated draw below rho_r (``known_domain``, levels k >= 2). released = on the support
    and ``>= rho_r``; for r < R the next round's bias and hopeless flag (MAD paper Alg. 4 lines 10-14 with
    rho_{r+1}, sigma_r; hopeless below the least threshold of rounds r+1..R), as
    :func:`transforms.selection.mad_kernels.round2_bias`. ``rounds``: the level's
    :class:`privacy.dpne.LevelRound` tuple.
    """
    rd = rounds[r - 1]
    items = w.column(ITEM)
    holders = w.column("holders").to_numpy()
    noisy = noisy_weights(items, w.column("weight").to_numpy(), "gaussian", rd.sigma, seed, rd.round_, rng)
    absent = holders == 0
    if known_domain and absent.any():
        noisy[absent] = truncated_noise(items.filter(pa.array(absent)), rd.sigma, rd.rho, seed, rd.round_, rng)
    released = ~absent & passes_threshold(noisy, rd.rho)
    if r < len(rounds):
        rho_drop = min(x.rho for x in rounds[r:])  # hopeless: below the least threshold of rounds r+1..R
        kept, bias = round2_biases(noisy, rounds[r].rho, rd.sigma, c_lb, c_ub, rho_drop)  # Alg. 4 lines 10-14
        hopeless = ~kept
    else:  # the last round: nothing after it
        bias, hopeless = np.ones(len(noisy)), np.zeros(len(noisy), dtype=bool)
    return pa.table({ITEM: items, "released": released, "holders": holders, "bias": bias, "hopeless": hopeless})
