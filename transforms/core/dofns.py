"""DoFn bases and windowing helpers shared by the families' Beam transforms.

* :class:`WorkerRngDoFn`: DoFns that draw randomness get an OS-entropy generator on the worker
  (``setup``, after fork/spawn: no two workers share a state) when unseeded (docs/design.md).
* :class:`BundleDictFn`: per-bundle pre-aggregation into a bounded dict of exact partials;
  :class:`BundleListsFn`: per-bundle gathering into bounded per-key lists (the joins).
* :func:`is_batch` / :func:`in_global_window`: the global-window (batch) fast paths and their
  ``finish_bundle`` outputs.
* :class:`SideInputCache`: a value built from a side input once per side-input object.
"""

from __future__ import annotations

from typing import Dict, Optional

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from dp_partition_beam.transforms.core import randomness

# finish_bundle outputs must be WindowedValues; building one per element (GlobalWindows.windowed_value)
# costs a Timestamp construction each (~4 us, a large share of the MAD2R profile), so copy a template.
_GLOBAL_WV = GlobalWindows.windowed_value(None)


def in_global_window(value):
    """``value`` as a WindowedValue in the global window (for ``finish_bundle`` outputs)."""
    return _GLOBAL_WV.with_value(value)


def is_batch(pcoll) -> bool:
    """Whether ``pcoll`` is in the global window: then DoFns may pre-aggregate per bundle and emit in
    ``finish_bundle`` (other windowings emit one element per input and let the combiners sum)."""
    return isinstance(pcoll.windowing.windowfn, GlobalWindows)


_UNSET = object()


class SideInputCache:
    """A value built from a side input (e.g. an Arrow array of a side-input list), rebuilt only when the
    runner hands the DoFn another side-input object (it passes the same object to every element of a
    bundle and window). Holds one (source, value) pair: a DoFn keeps one cache per side input.

    ``None`` stands for "no side input" and gives ``None`` (nothing built).
    """

    __slots__ = ("_source", "_value")

    def __init__(self):
        self._source, self._value = _UNSET, None

    def get(self, source, build):
        """``build(source)``, computed once per ``source`` object."""
        if source is None:
            return None
        if self._source is not source:
            self._value, self._source = build(source), source
        return self._value


class WorkerRngDoFn(beam.DoFn):
    """Base of DoFns that draw randomness: ``self._rng`` is a fresh generator seeded from OS entropy on
    the worker (``setup``) when ``seed`` is None, and None in reproducible mode (seeded draws are
    keyed functions of (seed, purpose, round, key); :mod:`transforms.core.randomness`)."""

    def __init__(self, seed: Optional[int]):
        self._seed = seed
        self._rng = None

    def setup(self):
        if self._seed is None:
            self._rng = randomness.worker_rng()


class BundleDictFn(beam.DoFn):
    """Base of DoFns that pre-aggregate into a dict ``self._acc`` (key -> partial) per bundle.

    Subclasses update ``self._acc`` in ``process`` and end it with ``yield from self._flush_if_full()``;
    the partials are emitted when ``max_keys`` keys are buffered (bounded memory) and when the bundle
    ends. Global window only (the callers check): the partials must be exact (ints), so how elements
    fall into bundles cannot change the combined result.
    """

    def __init__(self, max_keys: int = 100_000):
        self._max_keys = int(max_keys)
        self._acc: Dict = {}

    def start_bundle(self):
        self._acc = {}

    def _flush_if_full(self):
        if len(self._acc) >= self._max_keys:
            acc, self._acc = self._acc, {}
            yield from acc.items()

    def finish_bundle(self):
        acc, self._acc = self._acc, {}
        for kv in acc.items():
            yield in_global_window(kv)


class BundleListsFn(BundleDictFn):
    """Base of DoFns that gather values into per-key lists per bundle (``self._append(key, value)``).

    The lists are emitted as (key, [value, ...]) once ``max_buffered`` values are held (bounded
    memory) and when the bundle ends; a key may therefore be emitted several times, and consumers
    concatenate. Global window only (the callers check).
    """

    def __init__(self, max_buffered: int = 200_000):
        super().__init__(max_buffered)
        self._n = 0

    def start_bundle(self):
        super().start_bundle()
        self._n = 0

    def _append(self, key, value):
        got = self._acc.get(key)
        if got is None:
            self._acc[key] = [value]
        else:
            got.append(value)
        self._n += 1

    def _flush_if_full(self):
        if self._n >= self._max_keys:
            acc, self._acc, self._n = self._acc, {}, 0
            yield from acc.items()

    def finish_bundle(self):
        self._n = 0
        yield from super().finish_bundle()
