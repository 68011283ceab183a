"""Noise and threshold (MAD paper Alg. 1 lines 7-8; DPSU Alg. 1)."""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import numpy as np

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn


class AddNoiseFn(WorkerRngDoFn):
    """(item, weight) -> (item, weight + scale * Z), Z standard Gaussian or Laplace.

    Seeded: Z = keyed draw of (seed, purpose, round, item). Unseeded: Z from a generator seeded with
    OS entropy in ``setup`` on the worker (so forked workers never share a state). Noise is drawn
    once per element.
    """

    def __init__(self, noise: str, scale: float, seed: Optional[int], round_: int, purpose: str = "noise"):
        if noise not in ("gaussian", "laplace"):
            raise ValueError(f"noise must be 'gaussian' or 'laplace', got {noise!r}")
        super().__init__(seed)
        self._noise = noise
        self._scale = float(scale)
        self._round = round_
        self._purpose = purpose
        self._keyed = None
        self._buf = None
        self._pos = 0

    def setup(self):
        super().setup()
        if self._seed is not None:
            self._keyed = randomness.KeyedNoise(self._noise, self._seed, self._purpose, self._round)

    def _draw(self, item) -> float:
        if self._seed is not None:
            return self._keyed.draw(item)  # == standard_noise(noise, [item], purpose, round, seed)[0]
        if self._buf is None or self._pos >= len(self._buf):
            self._buf = randomness.standard_noise(
                self._noise, [None] * 4096, self._purpose, self._round, None, self._rng
            )
            self._pos = 0
        z = float(self._buf[self._pos])
        self._pos += 1
        return z

    def process(self, element):
        item, weight = element
        yield item, float(weight) + self._scale * self._draw(item)


def only_value(key, values):
    """(key, iterable of exactly one value) -> (key, value); raises if a key had several values."""
    (value,) = values
    return key, value


class AddNoise(beam.PTransform):
    """(item, weight) -> (item, noisy_weight), one draw per element (:class:`AddNoiseFn`).

    The noise stage of :class:`NoisyThreshold` (the sequential policies). A consumer that reads the
    noisy weights twice must materialise them first (the columnar path's ``checkpoint``/``barrier``,
    :mod:`transforms.core.engine`), so that no re-execution can redraw them.
    """

    def __init__(self, noise: str, scale: float, seed: Optional[int] = None, round_: int = 1, label=None):
        super().__init__(label)
        self._fn = AddNoiseFn(noise, scale, seed, round_)

    def expand(self, weights):
        return weights | "Noise" >> beam.ParDo(self._fn)  # (item, noisy_weight)


class KeepFn(WorkerRngDoFn):
    """(item, weight) -> item, kept with the probability of a keep table or curve (``table.keep``): iff its 64
    random bits, keyed as the noise ((seed, 'noise', round, item); unseeded: OS entropy), pass the rule of
    privacy/thresholding.py. The same bits as :func:`transforms.core.randomness.random_bits` of the reference."""

    def __init__(self, table, seed: Optional[int], round_: int):
        super().__init__(seed)
        self._table, self._round = table, round_
        self._key = None

    def setup(self):
        super().setup()
        if self._seed is not None:
            self._key = randomness.draw_key(self._seed, "noise", self._round)

    def process(self, element):
        item, weight = element
        if self._seed is not None:
            bits = np.array([randomness.draw64_of(self._key, randomness.key_fingerprint(item))], dtype=np.uint64)
        else:
            bits = randomness.worker_bits(self._rng, 1)
        if self._table.keep(np.array([float(weight)]), bits, lambda idx: self._low_bits(item))[0]:
            yield item

    def _low_bits(self, item):  # a 128-bit rule's second draw (keyed (seed, 'noise_low', round, item))
        return randomness.random_bits([item], randomness.KEEP_LOW_PURPOSE, self._round, self._seed, self._rng)


class KeepByTable(beam.PTransform):
    """(item, weight) -> item kept with probability F(weight) (:class:`KeepFn`): the sequential policies'
    release with ``threshold='optimal'`` (Policy Laplace's l1 curve, docs/thresholding.md)."""

    def __init__(self, table, seed: Optional[int] = None, round_: int = 1, label=None):
        super().__init__(label)
        self._fn = KeepFn(table, seed, round_)

    def expand(self, weights):
        return weights | "Keep" >> beam.ParDo(self._fn)  # item


def released_item(element, threshold):
    """(item, noisy weight) -> item if the noisy weight is >= the threshold rho (MAD paper Alg. 1 line 8)."""
    item, noisy_weight = element
    if passes_threshold(noisy_weight, threshold):
        yield item


def tag_round(item, round_):
    """item -> (round, item): which round released it (multi-round algorithms, the report)."""
    return round_, item


class NoisyThreshold(beam.PTransform):
    """(item, weight) -> item, kept iff weight + noise >= threshold (rho); the sequential policies'
    release (the columnar path thresholds whole item shards: ``NoisyThresholdFn``,
    :mod:`transforms.core.engine`).

    Args:
      noise: 'gaussian' or 'laplace'.
      scale: sigma or the Laplace scale.
      threshold: rho.
      seed, round_: randomness contract; item i's noise in round r is keyed (seed, 'noise', r, i).
    """

    def __init__(
        self,
        noise: str,
        scale: float,
        threshold: float,
        seed: Optional[int] = None,
        round_: int = 1,
        label=None,
    ):
        super().__init__(label)
        self._noise, self._scale, self._seed, self._round = noise, scale, seed, round_
        self._threshold = float(threshold)

    def expand(self, weights):
        return (
            weights
            | "AddNoise" >> AddNoise(self._noise, self._scale, self._seed, self._round)  # (item, noisy_w)
            | "KeepAboveRho" >> beam.FlatMap(released_item, self._threshold)  # item with noisy_w >= rho
        )
