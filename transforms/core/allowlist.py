"""A public allowlist of candidate items: (user, item) pairs whose item is outside it are dropped.

The list must be PUBLIC (fixed without looking at the private data). Filtering every record by a
fixed list is a per-record map, so neighbouring inputs stay neighbouring and no sensitivity, noise
scale or threshold changes (docs/counts.md, "Allowlist").
"""

from __future__ import annotations

import apache_beam as beam

from dp_partition_beam.transforms.core.batches import binary_array
from dp_partition_beam.transforms.core.dofns import SideInputCache

__all__ = ["check_allowlist", "in_allowlist", "KeepAllowlisted", "KeepAllowlistedRows"]


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


def item_key_bytes(item) -> bytes:
    """An allowlisted item's key bytes (:mod:`transforms.core.fingerprint`)."""
    from dp_partition_beam.transforms.core.fingerprint import to_key_bytes

    return to_key_bytes(item)


class KeepAllowlistedRowsFn(beam.DoFn):
    """Table(user, item) -> the rows whose item is in the allowlist (key bytes; a list or a side-input list)."""

    def __init__(self):
        self._allowed = SideInputCache()  # the allowlist's Arrow array

    def process(self, table, allowed):
        import pyarrow.compute as pc

        value_set = self._allowed.get(allowed, binary_array)
        kept = table.filter(pc.is_in(table.column("item"), value_set=value_set))
        if kept.num_rows:
            yield kept


class KeepAllowlistedRows(beam.PTransform):
    """Table(user, item) batches -> the rows whose item is in the allowlist (the columnar KeepAllowlisted)."""

    def __init__(self, allowlist, label=None):
        super().__init__(label)
        self._allowlist = check_allowlist(allowlist)

    def expand(self, tables):
        allowed = self._allowlist
        if isinstance(allowed, beam.pvalue.PCollection):
            allowed = beam.pvalue.AsList(allowed | "AllowlistKeyBytes" >> beam.Map(item_key_bytes))  # bytes
        else:
            allowed = sorted(item_key_bytes(i) for i in allowed)
        return tables | "InAllowlist" >> beam.ParDo(KeepAllowlistedRowsFn(), allowed)  # Table, items allowed
