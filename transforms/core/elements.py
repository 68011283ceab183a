"""Entry checks of the public transforms' input elements: one clear error instead of a silent misreading.

``SelectPartitions`` takes ``(user, item)`` elements, ``DPNE`` and ``BayesianNgrams`` ``(user, text)``
elements; ``SelectPartitions`` and ``DPNE`` also take Arrow batches. A Python value that merely
*unpacks* into two (a dict's first two keys, a two-character string) or a ``None`` would otherwise be
read as a user and an item; each transform checks every element where it enters and raises
:class:`InputElementError` naming the expected shape and what it got.

The rules (docs/python_api.md, the same as the command line's readers
``pipelines/io.py`` where they apply to Python values):

* an element is a 2-tuple (or a 2-list) ``(user, value)``, or for ``SelectPartitions`` and ``DPNE`` a
  ``pyarrow.RecordBatch`` / ``pyarrow.Table``;
* a **user** is a non-empty ``str`` (whitespace allowed, as in the CLI), or a typed key: an ``int``
  (not ``bool``), non-empty ``bytes``, or a non-empty tuple of such keys. An ``int`` user is a typed key,
  distinct from its decimal string (the CLI reads jsonl integer users as decimal strings; convert them
  yourself if a source mixes ``7`` and ``"7"``);
* an **item** (``SelectPartitions``) is a ``str`` that is neither empty nor only whitespace (the CLI's
  rule), or a typed key as above. Line breaks and TABs inside an item are accepted here: the transforms
  return Python values, and formatting them unambiguously is the caller's choice (the CLI rejects them
  because it writes one item per line, ``item<TAB>count``);
* a **text** (``DPNE``, ``BayesianNgrams``) is any ``str`` (an empty one has no n-grams);
* rejected: ``None``, ``bool``, ``float``, ``list``, ``dict``, ``set`` and every other type as a user or
  item, an empty string as a user or item, a whitespace-only item. ``str`` and ``int`` subclasses
  (``numpy.str_``, ``IntEnum``) are taken as plain ``str`` / ``int``;
* Arrow batches: columns ``user`` and ``item`` (``text``) present, string or binary (DPNE: also integer
  users, read as decimal text; text: string), no nulls, no empty user or item; string ``item`` columns
  also no whitespace-only item. Checked per batch with Arrow kernels, never row by row in Python.

Messages never contain an element's content (private data): they name its type, the types of a
tuple's parts and, for a dict, its keys (at most 5, each cut to 30 characters), never its values.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "InputElementError",
    "SELECT_SHAPE",
    "DPNE_SHAPE",
    "BAYESIAN_SHAPE",
    "describe",
    "check_pair",
    "column",
    "check_batch_schema",
    "check_key_column",
    "check_item_strings",
]

USER = "user"
ITEM = "item"
TEXT = "text"

SELECT_SHAPE = (
    "(user, item) pairs or Arrow batches: 2-tuples of non-empty strings (or int/bytes/tuple keys), "
    "or RecordBatch/Table with string or binary columns 'user' and 'item'"
)
DPNE_SHAPE = (
    "(user, text) pairs or Arrow batches: 2-tuples of a non-empty string user (or an int/bytes/tuple key) "
    "and a str text, or RecordBatch/Table with columns 'user' (string, binary or integer) and 'text' (string)"
)
BAYESIAN_SHAPE = "(user, text) pairs: 2-tuples of a non-empty string user (or an int/bytes/tuple key) and a str text"

_MAX_KEYS_SHOWN = 5
_MAX_KEY_CHARS = 30


class InputElementError(TypeError, ValueError):
    """An input element of the wrong shape or type (a TypeError; also a ValueError, as the batch checks'
    errors were before). The message names the expected shape and the element's type, never its content."""


def _key_name(key) -> str:
    if type(key) is str:
        return repr(key if len(key) <= _MAX_KEY_CHARS else key[:_MAX_KEY_CHARS] + "...")
    return type(key).__name__


def describe(value: Any) -> str:
    """``value``'s type for an error message, never its content: ``dict with keys ['user', 'item']``,
    ``tuple (str, NoneType)``, ``list of 3``, ``str``."""
    if isinstance(value, dict):
        keys = [_key_name(k) for k in itertools.islice(value, _MAX_KEYS_SHOWN)]
        more = ", ..." if len(value) > _MAX_KEYS_SHOWN else ""
        return f"dict with keys [{', '.join(keys)}{more}]"
    if isinstance(value, (tuple, list)):
        if len(value) == 2:
            return f"{type(value).__name__} ({type(value[0]).__name__}, {type(value[1]).__name__})"
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _key(key, item: bool) -> Tuple[Any, Optional[str]]:
    """``(key as the transforms use it, None)`` or ``(None, why it is rejected)``."""
    t = type(key)
    if isinstance(key, str):
        key = key if t is str else str.__str__(key)  # a subclass's value as a plain str
        if not key:
            return None, "an empty string"
        if item and key.isspace():
            return None, "only whitespace"
        return key, None
    if isinstance(key, int) and t is not bool:
        return (key if t is int else int.__int__(key)), None  # a subclass's value as a plain int
    if t is bytes:
        return (key, None) if key else (None, "empty bytes")
    if t is tuple:
        if not key:
            return None, "an empty tuple"
        parts = []
        for part in key:
            value, why = _key(part, False)
            if why is not None:
                return None, f"a tuple holding {why}"
            parts.append(value)
        return tuple(parts), None
    if key is None:
        return None, "None"
    return None, _a(t.__name__)


def _text(text) -> Tuple[Any, Optional[str]]:
    if type(text) is str:
        return text, None
    if isinstance(text, str):
        return str.__str__(text), None
    return None, "None" if text is None else _a(type(text).__name__)


def _fail(transform: str, shape: str, got: str) -> InputElementError:
    return InputElementError(f"{transform} expects {shape}; got {got}")


def check_pair(element, transform: str, shape: str, value: str) -> tuple:
    """``element`` as a checked ``(user, value)`` tuple (``value`` is ``'item'`` or ``'text'``), or
    :class:`InputElementError` naming ``transform``, the expected ``shape`` and what was wrong."""
    if type(element) not in (tuple, list) or len(element) != 2:
        raise _fail(transform, shape, describe(element))
    user, why = _key(element[0], False)
    if why is not None:
        raise _fail(transform, shape, f"{describe(element)} whose user is {why}")
    if value == ITEM:
        val, why = _key(element[1], True)
    else:
        val, why = _text(element[1])
    if why is not None:
        raise _fail(transform, shape, f"{describe(element)} whose {value} is {why}")
    return user, val


def column(batch, name: str):
    """Column ``name`` of a RecordBatch/Table as one Array (chunks combined)."""
    col = batch.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col


def check_batch_schema(batch, transform: str, shape: str, value: str, int_users: bool = False) -> None:
    """Schema and nulls of an Arrow batch (metadata only: O(columns), not O(rows)): columns ``user`` and
    ``value`` present; ``user`` string or binary (or integer with ``int_users``); ``item`` string or
    binary, ``text`` string; no nulls."""
    names = batch.schema.names
    kind = type(batch).__name__
    if USER not in names or value not in names:
        raise _fail(transform, shape, f"{kind} with columns {names} (needs columns {USER!r} and {value!r})")
    for name in (USER, value):
        t = batch.schema.field(name).type
        ok = pa.types.is_string(t) or pa.types.is_large_string(t)
        if name == USER or value == ITEM:
            ok = ok or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        if name == USER and int_users:
            ok = ok or pa.types.is_integer(t)
        if not ok:
            allowed = "string" if name == TEXT else "string or binary"
            raise _fail(transform, shape, f"{kind} whose column {name!r} is {t} (must be {allowed})")
        if batch.column(name).null_count:
            raise _fail(transform, shape, f"{kind} whose column {name!r} has null values")


def check_key_column(col, name: str, transform: str, shape: str, what: str = "batch") -> None:
    """No empty value in a string or binary key column (one Arrow pass over the offsets)."""
    if len(col) and pc.min(pc.binary_length(col)).as_py() == 0:
        raise _fail(transform, shape, f"a {what} with an empty {name}")


def check_item_strings(col, transform: str, shape: str, what: str = "batch") -> None:
    """No whitespace-only value in a string item column (``utf8_is_space``: the same characters as
    ``str.isspace``; empty values are :func:`check_key_column`'s)."""
    if len(col) and pc.any(pc.utf8_is_space(col)).as_py():
        raise _fail(transform, shape, f"a {what} with an item that is only whitespace")
