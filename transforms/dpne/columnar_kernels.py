"""Vectorised n-gram kernels of DPNE's columnar path (pure Arrow/numpy, no Beam).

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
every text under a custom tokenizer, through the Python tokenizer (tests/test_dpne_columnar.py
compares both with the per-line tokenizer).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.batches import ITEM, USER, concat, key_bytes_column
from dp_partition_beam.transforms.core.tables import cap_pairs

__all__ = [
    "TEXT",
    "TOKEN",
    "REM",
    "texts_table",
    "normalise_text_batch",
    "tokenize_table",
    "ngrams_at",
    "level_pairs",
    "line_chunks",
    "capped_level",
    "string_array",
    "DEFAULT_CHUNK_ROWS",
]

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
