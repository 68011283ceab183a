"""A public allowlist of candidate items: (user, item) pairs whose item is outside it are dropped.

The list must be PUBLIC (fixed without looking at the private data). Filtering every record by a
fixed list is a per-record map, so neighbouring inputs stay neighbouring and no sensitivity, noise
scale or threshold changes (docs/counts.md, "Allowlist").
"""

from __future__ import annotations

import apache_beam as beam

__all__ = ["check_allowlist", "in_allowlist", "KeepAllowlisted"]


def check_allowlist(allowlist):
    """None, a PCollection of items, or an iterable of hashable items (frozen into a frozenset)."""
    if allowlist is None or isinstance(allowlist, beam.pvalue.PCollection):
        return allowlist
    if isinstance(allowlist, (str, bytes)):
        raise ValueError("allowlist must be an iterable of items (e.g. a list or set), not a single str")
    try:
        return frozenset(allowlist)
    except TypeError:
        raise ValueError(
            f"allowlist must be None, a PCollection of items or an iterable of hashable items, got "
            f"{type(allowlist).__name__}"
        ) from None


def in_allowlist(pair, allowed) -> bool:
    """(user, item) -> whether the item is in the allowlist (a frozenset or a side-input dict)."""
    return pair[1] in allowed


def as_present(item):
    return item, True


class KeepAllowlisted(beam.PTransform):
    """(user, item) -> (user, item) for items in the allowlist (a frozenset, or a PCollection of items
    sent to the workers as a side-input dict)."""

    def __init__(self, allowlist, label=None):
        super().__init__(label)
        self._allowlist = check_allowlist(allowlist)

    def expand(self, pairs):
        allowed = self._allowlist
        if isinstance(allowed, beam.pvalue.PCollection):
            allowed = beam.pvalue.AsDict(allowed | "AllowlistAsDict" >> beam.Map(as_present))  # item -> True
        return pairs | "InAllowlist" >> beam.Filter(in_allowlist, allowed)  # (user, item), item allowed
