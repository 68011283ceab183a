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
    deterministic, picklable top-level function and must return tokens without whitespace.
    """
    text = unicodedata.normalize("NFKC", segment).lower()
    return _TOKEN_RE.findall(text)


def segments(text: str) -> List[str]:
    """Lines of a user's text; an n-gram never crosses a line break (each line is one segment)."""
    return text.splitlines()


def text_kgrams(text: str, k: int, tokenizer: Tokenizer = default_tokenize) -> Set[str]:
    """Distinct k-grams (space-joined) of one text, never crossing a line break."""
    out: Set[str] = set()
    for seg in segments(text):
        toks = tokenizer(seg)
        for i in range(len(toks) - k + 1):
            out.add(" ".join(toks[i : i + k]))
    return out


def text_all_kgrams(text: str, max_n: int, tokenizer: Tokenizer = default_tokenize) -> Dict[int, Set[str]]:
    """``{k: distinct k-grams}`` for k = 1..max_n of one text (tokenizes each line once)."""
    out: Dict[int, Set[str]] = {k: set() for k in range(1, max_n + 1)}
    for seg in segments(text):
        toks = tokenizer(seg)
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
