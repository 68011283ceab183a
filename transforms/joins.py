"""Joining per-item values back onto (user, item) pairs without a hot-key bottleneck.

A plain join keyed by item sends every holder of an item to one key: an item held by most users
(a "hot" item, e.g. "the") would be processed by one worker. :class:`AttachItemValues` splits the
pairs of each hot item over ``ceil(n_users / max_users_per_key)`` shards, keyed by
``(item, shard(user))``, and replicates that item's value to each shard. Only the *names* of hot items
travel as a side input (at most total_pairs / max_users_per_key of them), never the values or the
pairs; cold items use a single shard.
"""
from __future__ import annotations

import math
import zlib

import apache_beam as beam

from transforms.randomness import encode_key


def user_shard(user, num_shards: int) -> int:
    """Deterministic shard of a user (stable across processes, unlike ``hash``)."""
    if num_shards <= 1:
        return 0
    return zlib.crc32(encode_key(user)) % num_shards


def hot_item_shards(element, max_users_per_key):
    item, count = element
    if count > max_users_per_key:
        yield item, int(math.ceil(count / max_users_per_key))


class KeyPairByShardFn(beam.DoFn):
    """(user, item) -> ((item, shard), user)."""

    def process(self, element, hot_shards):
        user, item = element
        yield (item, user_shard(user, hot_shards.get(item, 1))), user


class ReplicateValueFn(beam.DoFn):
    """(item, value) -> ((item, shard), value) for every shard of the item."""

    def process(self, element, hot_shards):
        item, value = element
        for shard in range(hot_shards.get(item, 1)):
            yield (item, shard), value


class EmitJoinedFn(beam.DoFn):
    """((item, shard), {'users': [...], 'value': [v]}) -> (user, (item, v)) when the item has a value."""

    def process(self, element):
        (item, _), grouped = element
        values = list(grouped["value"])
        if not values:
            return
        if len(values) > 1:
            raise ValueError(f"AttachItemValues: more than one value for one item ({len(values)})")
        value = values[0]
        for user in grouped["users"]:
            yield user, (item, value)


class AttachItemValues(beam.PTransform):
    """(user, item) pairs -> (user, (item, value)) for pairs whose item has a value.

    Args:
      values: PCollection of (item, value), at most one per item.
      counts: PCollection of (item, number of pairs holding it), used to shard hot items.
      max_users_per_key: target number of pairs per join key.
    """

    def __init__(self, values, counts, max_users_per_key: int = 10_000, label=None):
        super().__init__(label)
        self._values = values
        self._counts = counts
        self._max = int(max_users_per_key)

    def expand(self, pairs):
        hot = self._counts | "HotItemShards" >> beam.FlatMap(hot_item_shards, self._max)  # (item, n_shards)
        hot_si = beam.pvalue.AsDict(hot)
        keyed_pairs = pairs | "KeyPairs" >> beam.ParDo(KeyPairByShardFn(), hot_si)  # ((item, shard), user)
        keyed_values = self._values | "ReplicateValues" >> beam.ParDo(ReplicateValueFn(), hot_si)  # ((item, shard), v)
        return (
            {"users": keyed_pairs, "value": keyed_values}
            | "JoinByItemShard" >> beam.CoGroupByKey()  # ((item, shard), {users: [user], value: [v]})
            | "EmitPerUser" >> beam.ParDo(EmitJoinedFn())  # (user, (item, v))
        )
