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
from apache_beam.transforms.window import GlobalWindows

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
    """(user, item) -> ((item, shard), [user, ...]).

    With ``batch`` (global window only) the users of one join key are gathered per bundle, so the
    shuffle carries one element per (bundle, item, shard) instead of one per pair (per-element
    overhead dominates the DirectRunner; see BENCHMARKS_HEAD.md, "MAD path optimisation"). At most
    ``max_buffered`` users are held before the buffer is emitted (bounded memory). Without
    ``batch`` every pair is its own one-user list.
    """

    def __init__(self, batch: bool = False, max_buffered: int = 200_000):
        self._batch, self._max_buffered = batch, int(max_buffered)
        self._buf: dict = {}
        self._n = 0

    def start_bundle(self):
        self._buf, self._n = {}, 0

    def process(self, element, hot_shards):
        user, item = element
        key = (item, user_shard(user, hot_shards.get(item, 1)))
        if not self._batch:
            yield key, [user]
            return
        users = self._buf.get(key)
        if users is None:
            self._buf[key] = [user]
        else:
            users.append(user)
        self._n += 1
        if self._n >= self._max_buffered:
            buf, self._buf, self._n = self._buf, {}, 0
            yield from buf.items()

    def finish_bundle(self):
        buf, self._buf, self._n = self._buf, {}, 0
        for kv in buf.items():
            yield GlobalWindows.windowed_value(kv)


class ReplicateValueFn(beam.DoFn):
    """(item, value) -> ((item, shard), value) for every shard of the item."""

    def process(self, element, hot_shards):
        item, value = element
        for shard in range(hot_shards.get(item, 1)):
            yield (item, shard), value


class EmitJoinedFn(beam.DoFn):
    """((item, shard), {'users': [[user]], 'value': [v]}) -> (user, (item, v)) when the item has a value.

    With ``per_user_lists`` it emits (user, [(item, v), ...]) instead: with ``batch`` (global window
    only) one list per user and bundle (a user may still get several lists), else one-pair lists.
    """

    def __init__(self, per_user_lists: bool = False, batch: bool = False, max_buffered: int = 200_000):
        self._lists, self._batch = per_user_lists, per_user_lists and batch
        self._max_buffered = int(max_buffered)
        self._buf: dict = {}
        self._n = 0

    def start_bundle(self):
        self._buf, self._n = {}, 0

    def process(self, element):
        (item, _), grouped = element
        values = list(grouped["value"])
        if not values:
            return
        if len(values) > 1:
            raise ValueError(f"AttachItemValues: more than one value for one item ({len(values)})")
        value = values[0]
        if not self._batch:
            for users in grouped["users"]:
                for user in users:
                    yield user, ([(item, value)] if self._lists else (item, value))
            return
        buf = self._buf
        for users in grouped["users"]:
            for user in users:
                got = buf.get(user)
                if got is None:
                    buf[user] = [(item, value)]
                else:
                    got.append((item, value))
                self._n += 1
        if self._n >= self._max_buffered:
            self._buf, self._n = {}, 0
            yield from buf.items()

    def finish_bundle(self):
        buf, self._buf, self._n = self._buf, {}, 0
        for kv in buf.items():
            yield GlobalWindows.windowed_value(kv)


class AttachItemValues(beam.PTransform):
    """(user, item) pairs -> (user, (item, value)) for pairs whose item has a value.

    Args:
      values: PCollection of (item, value), at most one per item.
      counts: PCollection of (item, number of pairs holding it), used to shard hot items.
      max_users_per_key: target number of pairs per join key.
      per_user_lists: emit (user, [(item, value), ...]) lists (several per user possible; their
        union is the user's joined pairs) instead of one element per pair: far fewer Beam elements
        in batch (global window) pipelines.
    """

    def __init__(self, values, counts, max_users_per_key: int = 10_000, per_user_lists: bool = False,
                 label=None):
        super().__init__(label)
        self._per_user_lists = per_user_lists
        self._values = values
        self._counts = counts
        self._max = int(max_users_per_key)

    def expand(self, pairs):
        hot = self._counts | "HotItemShards" >> beam.FlatMap(hot_item_shards, self._max)  # (item, n_shards)
        hot_si = beam.pvalue.AsDict(hot)
        batch = isinstance(pairs.windowing.windowfn, GlobalWindows)
        keyed_pairs = pairs | "KeyPairs" >> beam.ParDo(KeyPairByShardFn(batch), hot_si)  # ((item, shard), [user])
        keyed_values = self._values | "ReplicateValues" >> beam.ParDo(ReplicateValueFn(), hot_si)  # ((item, shard), v)
        return (
            {"users": keyed_pairs, "value": keyed_values}
            | "JoinByItemShard" >> beam.CoGroupByKey()  # ((item, shard), {users: [[user]], value: [v]})
            | "EmitPerUser" >> beam.ParDo(EmitJoinedFn(self._per_user_lists, batch))
            # (user, (item, v)), or (user, [(item, v)]) with per_user_lists
        )
