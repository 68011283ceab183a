"""``SelectPartitions``: the single entry point of DP partition selection on Beam.

Input: a PCollection of ``(user, item)`` pairs (duplicates allowed) and/or Arrow batches of them.
Output: the released items, or ``(round, item)`` with ``output_rounds=True`` (each item is released in
exactly one round); with ``params.release_counts`` ``(item, noisy_count)`` (or ``(round, (item,
noisy_count))``), the counts of distinct holders in the same capped user sets (docs/counts.md).

Basic, the DPSU weightings, MAD, MAD2R, DP-SIPS and MAD-SIPS run on the columnar path
(:mod:`transforms.selection.basic`, :mod:`~.mad`, :mod:`~.mad_sips` on the shared engine
:mod:`transforms.core.engine`: Arrow tables through user and item shards, docs/columnar.md);
the sequential policies gather one worker's histogram per element (:mod:`transforms.selection.policy`).

Every algorithm follows its :class:`privacy.selection.SelectionPlan` (:func:`privacy.selection.plan`,
computed once in the constructor): the runner of its shape gets the plan and reads what it needs; the in-memory
oracle with the same randomness contract is :func:`transforms.reference.select`.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import pyarrow as pa

from dp_partition_beam.privacy.selection import SelectionParams, plan
from dp_partition_beam.privacy.validation import check_int
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.allowlist import KeepAllowlisted, KeepAllowlistedRows, check_allowlist
from dp_partition_beam.transforms.core.batches import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    ToBatches,
    normalise_batch,
)
from dp_partition_beam.transforms.core.elements import SELECT_SHAPE, check_pair
from dp_partition_beam.transforms.core.fingerprint import from_key_bytes
from dp_partition_beam.transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS
from dp_partition_beam.transforms.core.noise import only_value, tag_round
from dp_partition_beam.transforms.selection.basic import _DPSIPS, _Basic
from dp_partition_beam.transforms.selection.counts import ReleaseCounts
from dp_partition_beam.transforms.selection.mad import _MAD, _MAD2R
from dp_partition_beam.transforms.selection.mad_sips import _MADSIPS
from dp_partition_beam.transforms.selection.policy import SequentialPolicy


def join_round(element):
    """(item, {'round': [r], 'count': [c]}) -> (r, (item, c)) for items that kept their count."""
    item, grouped = element
    counts = list(grouped["count"])
    if counts:
        (r,) = grouped["round"]
        yield r, (item, counts[0])


class SelectPartitions(beam.PTransform):
    """User-level (epsilon, delta)-DP partition selection, optionally with DP counts of the released items.

    Args:
      algorithm: a key of :data:`privacy.selection.ALGORITHMS`: 'basic' (weighted Gaussian),
        'weighted_laplace', 'count_gaussian', 'count_laplace', 'mad', 'mad2r', 'dp_sips', 'mad_sips', and the
        sequential single-worker 'policy_gaussian', 'policy_laplace' (DPSU paper Alg. 4 and 6;
        :class:`transforms.selection.policy.SequentialPolicy`, limited to ``params.max_sequential_pairs``).
      params: :class:`privacy.selection.SelectionParams`. With ``params.release_counts`` the output
        carries a noisy count of distinct users per released item (``count_budget`` of the budget,
        composed exactly; docs/counts.md) and ``params.min_users`` drops items whose noisy count is below it.
      seed: None for production (OS entropy on workers); an int for reproducible, NON-private runs.
      output_rounds: emit ``(round, item)`` (or ``(round, (item, count))``) instead of ``item``.
      allowlist: optional PUBLIC list of candidate items (an iterable, or a PCollection of items for
        long lists, sent to the workers as a side input): pairs whose item is not in it are dropped
        before contribution bounding. It must not be derived from the private data (docs/counts.md).
      max_users_per_key, max_broadcast_items: execution options of the per-element joins of the
        sequential policies' count release (:class:`transforms.core.joins.JoinValuesToSets`). They change
        the cost, never the output; given with any other algorithm, or without ``release_counts``, they
        are a ``ValueError`` (they would change nothing).
      batch_rows: rows per Arrow table when ``(user, item)`` elements are gathered (docs/columnar.md).
      rows_per_shard: target rows per user shard; the shard count is ceil(input rows / rows_per_shard),
        computed at run time. Neither changes the output.

    Input: PCollection of ``(user, item)`` pairs and/or Arrow ``RecordBatch``/``Table`` elements with
    columns ``user`` and ``item`` (string or binary), checked where they enter
    (:mod:`transforms.core.elements`; docs/python_api.md):

    * a pair is a 2-tuple (or 2-list); its user a non-empty ``str``, its item a ``str`` neither empty nor
      only whitespace (line breaks and TABs are accepted: the output is Python values, the CLI rejects
      them because it writes lines). Typed keys are accepted for both: ``int`` (not ``bool``; an int is
      distinct from its decimal string), non-empty ``bytes``, non-empty tuples of those;
    * a batch has string or binary ``user`` and ``item`` columns, no nulls, no empty value and (string
      item columns) no whitespace-only item, checked per batch with Arrow;
    * anything else (a dict, e.g. ``beam.Map(json.loads)`` output, ``None``, ``bool``, ``float``,
      ``list``, a plain string, a 3-tuple) raises :class:`transforms.core.elements.InputElementError`, a
      ``TypeError`` whose message names this shape and the element's type (a dict's keys), never its
      content: ``SelectPartitions expects (user, item) pairs or Arrow batches: ...; got dict with keys
      ['user', 'item']``.

    Every algorithm except the sequential policies runs on the columnar path
    (:mod:`transforms.core.engine`, docs/columnar.md): global window only.
    Output: released items, or ``(item, noisy_count)`` (ints) with ``release_counts`` (or the
    round-tagged forms with ``output_rounds``). The plan is public: ``self.plan``
    (:class:`privacy.selection.SelectionPlan`), also as ``self.rounds`` (the selection), ``self.counts``
    (:class:`privacy.counts.CountPlan` or None) and ``self.cap_plan``. MAD-SIPS's adaptive cap
    (``params.cap_quantile < 1``, privacy/cap.py): ``self.cap_plan`` holds the rounds of every candidate cap
    (``self.rounds`` are those of Delta_0) and, after ``expand``, ``self.cap`` is the singleton PCollection
    of the cap the run chose (None without the adaptive cap).
    """

    def __init__(
        self,
        algorithm: str,
        params: SelectionParams,
        *,
        seed: Optional[int] = None,
        output_rounds: bool = False,
        allowlist=None,
        max_users_per_key: Optional[int] = None,
        max_broadcast_items: Optional[int] = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        label=None,
    ):
        super().__init__(label)
        self.batch_rows = check_int("batch_rows", batch_rows, 1)
        self.rows_per_shard = check_int("rows_per_shard", rows_per_shard, 1)
        self.plan = plan(algorithm, params)  # calibrated once, before any data is read
        # The join options tune the per-element count join of the sequential policies only; given for
        # any other run they would change nothing, so they are an error there, not silently ignored.
        joins = self.plan.shape not in _COLUMNAR and self.plan.counts is not None
        given = {"max_users_per_key": max_users_per_key, "max_broadcast_items": max_broadcast_items}
        for name, value in given.items():
            if value is not None and not joins:
                raise ValueError(
                    f"{name} is used only by the sequential policies (policy_gaussian, policy_laplace) with "
                    f"release_counts; {self.plan.algorithm} has no such join: leave it unset"
                )
        self.join_options = dict(
            max_users_per_key=check_int(
                "max_users_per_key", 10_000 if max_users_per_key is None else max_users_per_key, 1
            ),
            max_broadcast_items=check_int(
                "max_broadcast_items",
                DEFAULT_MAX_BROADCAST_ITEMS if max_broadcast_items is None else max_broadcast_items,
                0,
            ),
        )
        self.spec, self.algorithm = self.plan.spec, self.plan.algorithm
        self.params = self.plan.params  # budget_split, c_ub at None: the algorithm's
        self.seed = seed
        self.output_rounds = output_rounds
        self.allowlist = check_allowlist(allowlist)
        self.rounds, self.counts, self.cap_plan = self.plan.rounds, self.plan.counts, self.plan.cap
        self.cap = None  # the chosen cap's singleton PCollection, after expand (adaptive cap only)
        self.weight_cap = None  # the chosen weight cap's, after expand (weight_cap='auto' only)

    def expand(self, pcoll):
        randomness.warn_if_seeded(self.seed)
        columnar = _COLUMNAR.get(self.plan.shape)
        if columnar is not None:
            batches = pcoll | "Batch" >> ToBatches(self.batch_rows)  # Table(user, item)
            if self.allowlist is not None:
                batches = batches | "Allowlist" >> KeepAllowlistedRows(self.allowlist)  # Table, items allowed
            runner = columnar(self.plan, self.seed, self.rows_per_shard)
            tagged, counted = batches | self.algorithm.upper() >> runner  # (round, item), (item, count) or None
            self.cap = getattr(runner, "cap", None)  # Delta (adaptive cap), one int
            self.weight_cap = getattr(runner, "weight_cap", None)  # c (weight_cap='auto'), one float
        else:
            pairs = pcoll | "Pairs" >> beam.ParDo(AsPairsFn())  # (user, item)
            if self.allowlist is not None:
                pairs = pairs | "Allowlist" >> KeepAllowlisted(self.allowlist)  # (user, item), item allowed
            runner = _RUNNERS[self.plan.shape](self.plan, self.seed)
            tagged, user_sets = pairs | self.algorithm.upper() >> runner  # (round, item), (user, [item]) or None
            counted = None
        if self.counts is None:
            if self.output_rounds:
                return tagged  # (round, item)
            return tagged | "Items" >> beam.Values()  # item
        if counted is None:
            # The released items feed both the counts and the round tags: materialise them once.
            rounds_by_item = (
                tagged
                | "ItemRound" >> beam.Map(swap)  # (item, round)
                | "CheckpointReleased" >> beam.GroupByKey()  # (item, [round]) materialised
                | "OneRound" >> beam.MapTuple(only_value)  # (item, round)
            )
            released = rounds_by_item | "Released" >> beam.Keys()  # item
            counted = user_sets | "ReleaseCounts" >> ReleaseCounts(
                released, self.counts, self.seed, self.params.min_users, **self.join_options
            )  # (item, noisy_count), noisy_count >= min_users
        else:
            rounds_by_item = tagged | "ItemRound" >> beam.Map(swap)  # (item, round)
        if not self.output_rounds:
            return counted  # (item, noisy_count)
        return (
            {"round": rounds_by_item, "count": counted}
            | "JoinRounds" >> beam.CoGroupByKey()  # (item, {round: [r], count: [c]})
            | "TagCounts" >> beam.FlatMap(join_round)  # (round, (item, noisy_count))
        )


class AsPairsFn(beam.DoFn):
    """(user, item) pairs pass through, checked (:func:`transforms.core.elements.check_pair`); Arrow
    batches (columns user, item) are checked and become pairs (the sequential policies)."""

    def process(self, element):
        if isinstance(element, (pa.RecordBatch, pa.Table)):
            table = normalise_batch(element)
            yield from zip(
                map(from_key_bytes, table.column(USER).to_pylist()), map(from_key_bytes, table.column(ITEM).to_pylist())
            )
        elif type(element) is tuple and len(element) == 2 and _plain_pair(*element):
            yield element
        else:
            yield check_pair(element, "SelectPartitions", SELECT_SHAPE, ITEM)


def _plain_pair(user, item) -> bool:
    """A (str, str) pair with a non-empty user and an item neither empty nor only whitespace."""
    return type(user) is str and type(item) is str and user != "" and item != "" and not item.isspace()


def swap(element):
    """(a, b) -> (b, a)."""
    return element[1], element[0]


class _Sequential(beam.PTransform):
    """The single-worker policy algorithms (DPSU paper Alg. 4 and 6), tagged with their one round."""

    def __init__(self, plan, seed: Optional[int]):
        super().__init__()
        self._spec, self._plan, self._params, self._seed = plan.spec, plan.rounds[0], plan.params, seed

    def expand(self, pairs):
        released, user_sets = pairs | "Policy" >> SequentialPolicy(
            self._spec.name, self._plan, self._params, self._seed, with_user_sets=True
        )  # item, (user, [item])
        return released | "TagRound" >> beam.Map(tag_round, self._plan.index), user_sets  # (1, item)


#: the per-element runner of the sequential shape; with _COLUMNAR one Beam runner per shape of the registry,
#: each built from the run's SelectionPlan
#: (privacy.selection.SHAPES); the reference has the same table
_RUNNERS = {"sequential": _Sequential}


def _columnar_single(plan, seed, rows_per_shard):
    """The one-round shape: MAD's weighting has its own round transform (:mod:`transforms.selection.mad`)."""
    return (_MAD if plan.spec.weighting == "mad" else _Basic)(plan, seed, rows_per_shard)


#: the columnar runners of the parallel shapes (batches of rows, docs/columnar.md)
_COLUMNAR = {
    "single": _columnar_single,
    "dp_sips": _DPSIPS,
    "mad2r": _MAD2R,
    "mad_sips": _MADSIPS,
}
