"""Tokenizers that break the tokenizer contract, importable by module name for ``--tokenizer MODULE:FN``
(tests/transforms/test_api_types.py). Each returns something other than a list of non-empty strings without
whitespace."""


def returns_str(segment):
    return segment.lower()


def returns_none(segment):
    return None


def returns_ints(segment):
    return [len(w) for w in segment.split()]


def returns_phrase(segment):
    """One token holding the whole line (spaces inside a token)."""
    return [segment] if segment.strip() else []


def returns_tuple(segment):
    """A tuple of good tokens: accepted (tuples work like lists)."""
    return tuple(segment.lower().split())
