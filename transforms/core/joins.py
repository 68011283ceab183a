"""Joining per-item values back onto (user, item) pairs without a hot-key bottleneck.

A plain join keyed by item sends every holder of an item to one key: an item held by most users
(a "hot" item, e.g. "the") would be processed by one worker. :class:`AttachItemValues` splits the
pairs of each hot item over ``ceil(n_users / max_users_per_key)`` shards, keyed by
``(item, shard(user))``, and replicates that item's value to each shard. Only the *names* of hot items
travel as a side input (at most total_pairs / max_users_per_key of them), never the values or the
pairs; cold items use a single shard.

Used by the sequential policies' count release (:class:`transforms.selection.counts.ReleaseCounts`); the
columnar path joins its per-item values onto the user pieces by item shard
(:class:`transforms.core.item_join.AttachItemColumns`).
"""

from __future__ import annotations

import math
import zlib

import apache_beam as beam

from dp_partition_beam.transforms.core.dofns import BundleDictFn, BundleListsFn, is_batch
from dp_partition_beam.transforms.core.randomness import encode_key


def user_shard(user, num_shards: int) -> int:
    """Deterministic shard of a user (stable across processes, unlike ``hash``)."""
    if num_shards <= 1:
        return 0
    return zlib.crc32(encode_key(user)) % num_shards


def hot_item_shards(element, max_users_per_key):
    item, count = element
    if count > max_users_per_key:
        yield item, int(math.ceil(count / max_users_per_key))


class KeyPairByShardFn(BundleListsFn):
    """(user, item) -> ((item, shard), [user, ...]).

    With ``batch`` (global window only) the users of one join key are gathered per bundle, so the
    shuffle carries one element per (bundle, item, shard) instead of one per pair (per-element
    overhead dominates the DirectRunner; see BENCHMARKS_HEAD.md, "MAD path optimisation"). At most
    ``max_buffered`` users are held before the buffer is emitted (bounded memory). Without
    ``batch`` every pair is its own one-user list.
    """

    def __init__(self, batch: bool = False, max_buffered: int = 200_000):
        super().__init__(max_buffered)
        self._batch = batch

    def process(self, element, hot_shards):
        user, item = element
        key = (item, user_shard(user, hot_shards.get(item, 1)))
        if self._batch:
            self._append(key, user)
            yield from self._flush_if_full()
        else:
            yield key, [user]


class ReplicateValueFn(beam.DoFn):
    """(item, value) -> ((item, shard), value) for every shard of the item."""

    def process(self, element, hot_shards):
        item, value = element
        for shard in range(hot_shards.get(item, 1)):
            yield (item, shard), value


class EmitJoinedFn(BundleListsFn):
    """((item, shard), {'users': [[user]], 'value': [v]}) -> (user, (item, v)) when the item has a value.

    With ``per_user_lists`` it emits (user, [(item, v), ...]) instead: with ``batch`` (global window
    only) one list per user and bundle (a user may still get several lists), else one-pair lists.
    """

    def __init__(self, per_user_lists: bool = False, batch: bool = False, max_buffered: int = 200_000):
        super().__init__(max_buffered)
        self._lists, self._batch = per_user_lists, per_user_lists and batch

    def process(self, element):
        (item, _), grouped = element
        values = list(grouped["value"])
        if len(values) > 1:
            raise ValueError(f"AttachItemValues: more than one value for one item ({len(values)})")
        for value in values:  # none: the item has no value, nothing to attach
            for users in grouped["users"]:
                for user in users:
                    if self._batch:
                        self._append(user, (item, value))
                    else:
                        yield user, ([(item, value)] if self._lists else (item, value))
            yield from self._flush_if_full()


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

    def __init__(self, values, counts, max_users_per_key: int = 10_000, per_user_lists: bool = False, label=None):
        super().__init__(label)
        self._per_user_lists = per_user_lists
        self._values = values
        self._counts = counts
        self._max = int(max_users_per_key)

    def expand(self, pairs):
        hot = self._counts | "HotItemShards" >> beam.FlatMap(hot_item_shards, self._max)  # (item, n_shards)
        hot_si = beam.pvalue.AsDict(hot)
        batch = is_batch(pairs)
        keyed_pairs = pairs | "KeyPairs" >> beam.ParDo(KeyPairByShardFn(batch), hot_si)  # ((item, shard), [user])
        keyed_values = self._values | "ReplicateValues" >> beam.ParDo(ReplicateValueFn(), hot_si)  # ((item, shard), v)
        return (
            {"users": keyed_pairs, "value": keyed_values}
            | "JoinByItemShard" >> beam.CoGroupByKey()  # ((item, shard), {users: [[user]], value: [v]})
            | "EmitPerUser" >> beam.ParDo(EmitJoinedFn(self._per_user_lists, batch))
            # (user, (item, v)), or (user, [(item, v)]) with per_user_lists
        )


# --- Per-user sets joined with per-item values: broadcast when the values are few, else sharded join ---

DEFAULT_MAX_BROADCAST_ITEMS = 1_000_000


def fits_broadcast(n_values: int, max_broadcast_items: int) -> bool:
    """Whether ``n_values`` per-item values are few enough to ship to every worker as a side input."""
    return n_values <= max_broadcast_items


def _in_mode(element, broadcast: bool, want: bool):
    """Passes ``element`` on only in the chosen mode (the other branch then processes nothing)."""
    if broadcast == want:
        yield element


class AttachFromDictFn(beam.DoFn):
    """(user, S_u) -> (user, (S_u, [(item, v) for the user's items with a value])), broadcast mode only.

    ``values`` is the side-input dict item -> value; the pair list follows the order of S_u.
    """

    def process(self, element, broadcast, values):
        if not broadcast:
            return
        user, user_set = element
        got = []
        for item in user_set:
            v = values.get(item, _MISSING)
            if v is not _MISSING:
                got.append((item, v))
        yield user, (user_set, got)


_MISSING = object()


class SetToPairsFn(beam.DoFn):
    """(user, S_u) -> (user, item) for every item of S_u."""

    def process(self, element):
        user, user_set = element
        for item in user_set:
            yield user, item


class BundleHolderCountsFn(BundleDictFn):
    """(user, item) -> (item, number of the bundle's pairs holding it), counted per bundle.

    Global window only; emits early once ``max_keys`` items are buffered (bounded memory).
    """

    def process(self, element):
        item = element[1]
        self._acc[item] = self._acc.get(item, 0) + 1
        yield from self._flush_if_full()


def merge_set_and_values(element):
    """(user, {'set': [S_u], 'values': [[(item, v)], ...]}) -> (user, (S_u, [(item, v)]))."""
    user, grouped = element
    sets = list(grouped["set"])
    if len(sets) != 1:
        raise ValueError(f"JoinValuesToSets: a user must have exactly one set, got {len(sets)}")
    return user, (sets[0], [e for part in grouped["values"] for e in part])


class JoinValuesToSets(beam.PTransform):
    """(user, S_u) -> (user, (S_u, [(item, v) for items of S_u that have a value])), one element per user.

    S_u is a list of items; ``values`` is a PCollection of (item, v), at most one per item (used by the
    sequential policies' count release, :class:`transforms.selection.counts.ReleaseCounts`: the values
    are the released items). The mode is chosen at run time from the number of values (the choice
    changes only the cost, never the output):

      CountValues       int                    number of (item, v)
      Broadcast?        bool                   n <= max_broadcast_items
      AttachFromDict    (user, (S_u, [(i, v)])) broadcast mode: the values as a side-input dict,
                                               no shuffle of pairs
      JoinSets ... MergeSetAndValues            otherwise: the sets' pairs are joined by item with the
                                               hot-item-sharded :class:`AttachItemValues` and grouped
                                               back per user (scales to any number of values)

    Outside the global window (streaming/windowed input) the join is always used. The list of a user's
    values follows S_u in broadcast mode and is unordered in join mode: consumers must not depend on its
    order.
    """

    def __init__(
        self,
        values,
        max_users_per_key: int = 10_000,
        max_broadcast_items: int = DEFAULT_MAX_BROADCAST_ITEMS,
        label=None,
    ):
        super().__init__(label)
        self._values = values
        self._max_users_per_key = int(max_users_per_key)
        self._max_broadcast = int(max_broadcast_items)
        if self._max_broadcast < 0:
            raise ValueError(f"max_broadcast_items must be >= 0, got {max_broadcast_items!r}")

    def expand(self, user_sets):
        batch = is_batch(user_sets)
        if not batch:
            return self._join(user_sets, batch)
        broadcast = beam.pvalue.AsSingleton(
            self._values
            | "CountValues" >> beam.combiners.Count.Globally()  # n
            | "Broadcast?" >> beam.Map(fits_broadcast, self._max_broadcast)  # bool
        )
        small_values = self._values | "ValuesIfBroadcast" >> beam.FlatMap(_in_mode, broadcast, True)  # (item, v)
        by_dict = user_sets | "AttachFromDict" >> beam.ParDo(
            AttachFromDictFn(), broadcast, beam.pvalue.AsDict(small_values)
        )
        # (user, (S_u, [(item, v)])) in broadcast mode, nothing otherwise
        join_sets = user_sets | "SetsIfJoin" >> beam.FlatMap(_in_mode, broadcast, False)  # (user, S_u) in join mode
        by_join = self._join(join_sets, batch)  # (user, (S_u, [(item, v)])) in join mode, nothing otherwise
        return (by_dict, by_join) | "EitherMode" >> beam.Flatten()  # (user, (S_u, [(item, v)]))

    def _join(self, user_sets, batch):
        pairs = user_sets | "SetPairs" >> beam.ParDo(SetToPairsFn())  # (user, item)
        if batch:
            counts = (
                pairs
                | "BundleHolderCounts" >> beam.ParDo(BundleHolderCountsFn())  # (item, partial count)
                | "HolderCounts" >> beam.CombinePerKey(sum)  # (item, n pairs)
            )
        else:
            counts = pairs | "PairItems" >> beam.Values() | "HolderCounts" >> beam.combiners.Count.PerElement()
        attached = pairs | "JoinByItem" >> AttachItemValues(
            self._values, counts, self._max_users_per_key, per_user_lists=True
        )  # (user, [(item, v)]) lists
        return (
            {"set": user_sets, "values": attached}
            | "JoinSets" >> beam.CoGroupByKey()  # (user, {set: [S_u], values: [[(item, v)]]})
            | "MergeSetAndValues" >> beam.Map(merge_set_and_values)  # (user, (S_u, [(item, v)]))
        )
