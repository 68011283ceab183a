"""Text and n-gram string helpers shared by DPNE and the Bayesian n-gram release (pure, no Beam).

Representation: an n-gram is a ``str`` of its words joined by single spaces (``"new york city"``).
Tokens never contain whitespace, so this is unambiguous, cheap to shuffle and a canonical key for
the randomness contract. The empty string ``""`` is the 0-gram (used as the ``y`` of ``x y z`` for
k = 2). An n-gram never crosses a line break: each line of a user's text is one segment.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, Dict, List, Set

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "tokenizer_name",
    "checked_tokens",
    "default_tokenize",
    "segments",
    "text_kgrams",
    "text_all_kgrams",
    "ngram_len",
    "head",
    "tail",
    "last_word",
    "first_word",
    "join",
]

# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

# A token is a maximal run of Unicode "word" characters (letters, digits - any Unicode category
# that str.isalnum() accepts - and '_'), with internal apostrophes allowed: "don't", "o'neil".
# Leading/trailing apostrophes and all other punctuation, symbols and whitespace separate tokens.
# The apostrophe may be ASCII ' or typographic U+2019 (kept as written). This is the tokenization of the
# bundled data's ``*.user_words.tsv.gz`` files (data README).
_TOKEN_RE = re.compile(r"\w+(?:['\u2019]\w+)*")

Tokenizer = Callable[[str], List[str]]


def default_tokenize(segment: str) -> List[str]:
    """Default tokenizer: NFKC-normalise, lowercase, tokens = maximal runs of letters/digits/``_``
    with internal apostrophes (``'`` or U+2019, kept as written).

    Replaceable: pass any ``Callable[[str], list[str]]`` as ``tokenizer=`` to the reference, the
    Beam transform, or the pipeline (``--tokenizer module:function``). A replacement must be a
    deterministic, picklable top-level function and must return a list of non-empty tokens without
    whitespace; anything else raises :class:`TokenizerError` (checked per segment, :func:`checked_tokens`).
    """
    text = unicodedata.normalize("NFKC", segment).lower()
    return _TOKEN_RE.findall(text)


class TokenizerError(ValueError):
    """A custom tokenizer returned something other than a list of strings, or a token that is empty or
    contains whitespace (tokens are joined by single spaces into n-grams). One line naming the
    tokenizer and the type it returned, never the text: ``tokenizer pkg.mod:fn returned str for a
    text segment; it must return a list of strings``. The command-line tools print it as ``error: ...``
    (exit 3)."""


def tokenizer_name(tokenizer) -> str:
    """``module:qualname`` of a tokenizer function (its type name for other callables)."""
    module = getattr(tokenizer, "__module__", None)
    name = getattr(tokenizer, "__qualname__", None) or getattr(tokenizer, "__name__", None)
    if module and name:
        return f"{module}:{name}"
    return name or type(tokenizer).__name__  # e.g. str.split (no module)


_OTHER_WHITESPACE = re.compile(r"[^\S ]")  # any whitespace character but the space


def checked_tokens(tokens, tokenizer) -> List[str]:
    """``tokens`` (the output of ``tokenizer`` for one segment) if it is a list (or tuple) of non-empty
    strings without whitespace, else :class:`TokenizerError`. Costs a join, a count and two scans in C
    (no Python loop per token): about 40 ns per token when called once for many segments' tokens, as
    the columnar DPNE path does. The default tokenizer is trusted and never checked."""
    if type(tokens) is not list and type(tokens) is not tuple:
        raise TokenizerError(
            f"tokenizer {tokenizer_name(tokenizer)} returned {type(tokens).__name__} for a text segment; "
            "it must return a list of strings"
        )
    try:
        joined = " ".join(tokens)
    except TypeError:
        bad = next(t for t in tokens if not isinstance(t, str))
        raise TokenizerError(
            f"tokenizer {tokenizer_name(tokenizer)} returned a list holding {type(bad).__name__} for a text segment; "
            "it must return a list of strings"
        ) from None
    if (
        tokens
        and (
            joined.count(" ") != len(tokens) - 1  # a token holds a space
            or "  " in joined  # ... or (no token holding one) an empty token inside,
            or joined[:1] in ("", " ")  # at the start,
            or joined[-1:] == " "  # at the end
            or (not joined.isprintable() and _OTHER_WHITESPACE.search(joined))  # other whitespace (never printable)
        )
    ):
        raise TokenizerError(
            f"tokenizer {tokenizer_name(tokenizer)} returned an empty token or a token with whitespace for a text "
            "segment; it must return a list of non-empty strings without whitespace"
        )
    return tokens


def segments(text: str) -> List[str]:
    """Lines of a user's text; an n-gram never crosses a line break (each line is one segment)."""
    return text.splitlines()


def text_kgrams(text: str, k: int, tokenizer: Tokenizer = default_tokenize) -> Set[str]:
    """Distinct k-grams (space-joined) of one text, never crossing a line break."""
    out: Set[str] = set()
    check = tokenizer is not default_tokenize
    for seg in segments(text):
        toks = tokenizer(seg)
        if check:
            toks = checked_tokens(toks, tokenizer)
        for i in range(len(toks) - k + 1):
            out.add(" ".join(toks[i : i + k]))
    return out


def text_all_kgrams(text: str, max_n: int, tokenizer: Tokenizer = default_tokenize) -> Dict[int, Set[str]]:
    """``{k: distinct k-grams}`` for k = 1..max_n of one text (tokenizes each line once)."""
    out: Dict[int, Set[str]] = {k: set() for k in range(1, max_n + 1)}
    check = tokenizer is not default_tokenize
    for seg in segments(text):
        toks = tokenizer(seg)
        if check:
            toks = checked_tokens(toks, tokenizer)
        n = len(toks)
        for k in range(1, max_n + 1):
            bucket = out[k]
            for i in range(n - k + 1):
                bucket.add(" ".join(toks[i : i + k]))
    return out


def ngram_len(gram: str) -> int:
    return gram.count(" ") + 1 if gram else 0


def head(gram: str) -> str:
    """All words but the last (``xy`` -> ``x``; a 1-gram -> ``""``)."""
    i = gram.rfind(" ")
    return gram[:i] if i >= 0 else ""


def tail(gram: str) -> str:
    """All words but the first (``xy`` -> ``y``; a 1-gram -> ``""``)."""
    i = gram.find(" ")
    return gram[i + 1 :] if i >= 0 else ""


def last_word(gram: str) -> str:
    i = gram.rfind(" ")
    return gram[i + 1 :] if i >= 0 else gram


def first_word(gram: str) -> str:
    i = gram.find(" ")
    return gram[:i] if i >= 0 else gram


def join(*parts: str) -> str:
    return " ".join(p for p in parts if p)
