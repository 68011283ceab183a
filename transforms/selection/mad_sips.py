"""MAD-SIPS on the columnar path (docs/mad_sips.md): R rounds of MAD with removal, re-subsampling, biases.

Built from the shared engine (:mod:`transforms.core.engine`: ShardedUsers, barriers, checkpoints),
:class:`transforms.selection.mad.MADWeights`, :class:`transforms.selection.basic.NoisyThresholdFn`, the
count release's holders, and the kernels of :mod:`transforms.selection.mad_sips_kernels`. With the adaptive
cap or weight_cap 'auto' (privacy/cap.py), first:

  Cap         Delta (one int) and/or c (one float),            per piece n_j of the users' degree
              materialised                                     buckets, summed, noise sigma_H per
                                                                bucket, privacy.cap.choose_cap (Delta: a
                                                                side input of every round) and with
                                                                weight_cap 'auto' choose_weight_cap (c:
                                                                of round R-1's status and round R)

Stages of round r (shapes after each step; plans of the run's cap, Delta_0 without the adaptive cap):

  Sets_r      (user shard, Table(user, item, degree[, bias]))   full distinct sets minus U_<r; r >= 2:
                                                                minus the user's hopeless items unless
                                                                all of its items are hopeless,
                                                                bottom-k to Delta with round r's
                                                                priorities (re-subsampling), biases attached
  MADWeights_r (item shard, [partials])                         MAD (Alg. 3), biased from round 2
  r < R:
  Candidates_r (item shard, zero partials)                      (an output of Sets_r) every item of the
                                                                full sets minus U_<r,
                                                                weight 0, holders 0: the items whose
                                                                next-round status round r must decide
  Status_r    (item shard, Table(item, released, bias, hopeless)) merged weight + noise of round r (one
                                                                draw per item; items outside round r's
                                                                union get their pure-noise entry, holders
                                                                0, never released), U_r = union items
                                                                >= rho_r, next round's hopeless/bias
                                                                (Alg. 4 lines 10-14 with rho_{r+1});
                                                                checkpointed (one draw whatever retries)
  Status{r}To{r+1} (user shard, Table(user, item, released, bias, hopeless))  round r + 1's pieces with
                                                                the status of their items, joined by item
                                                                shard (transforms.core.item_join; an item
                                                                without a status is in U_<r)
  r = R:      NoisyThreshold_R (round R, item bytes)
  r = R, threshold 'optimal': TablePartials_R (item shard, [partials]) of biased Basic weights (Alg. 2
              from the biases, no truncation or rerouting) rounded down onto the keep table's C, then
              KeepTable_R (round R, item bytes): kept iff 64 keyed bits < F(W) 2^64

Every per-user step (Sets_r, the cap's histogram) runs through per_user_step: a user cut across pieces
(more rows than a piece) is joined from its parts (docs/columnar.md, "Bounds").

Equal to :func:`transforms.selection.reference._mad_sips` under a seed
(tests/transforms/selection/test_mad_sips_beam.py).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy import cap as cap_plans
from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.core.batches import (
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    bounded_pieces,
    by_item_shard,
    concat,
    unpacked,
)
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn
from dp_partition_beam.transforms.core.engine import (
    PerUserFn,
    ShardedUsers,
    all_rounds,
    barrier,
    checkpoint,
    per_user_step,
    run_seed_arg,
    table_of,
)
from dp_partition_beam.transforms.core.item_join import AttachItemColumns
from dp_partition_beam.transforms.core.tables import ItemIndex, cap_pairs, merge_partials, noisy_weights
from dp_partition_beam.transforms.selection.basic import NoisyThresholdFn, holders_in_round0_sets
from dp_partition_beam.transforms.selection.counts import noisy_counts_of_holders
from dp_partition_beam.transforms.selection.mad import MADWeights, TableRoundPartialsFn
from dp_partition_beam.transforms.selection.mad_kernels import round2_biases
from dp_partition_beam.transforms.selection.mad_sips_kernels import (
    degree_histogram_of,
    noisy_histogram,
    round_sets,
)

__all__ = ["_MADSIPS"]

_ZERO_COLUMNS = ("hi", "mid", "lo", "holders")


def zero_partials(items: pa.Array) -> pa.Table:
    """Table(item, hi, mid, lo, holders) of weight 0 and no holders (the schema of the MAD partials)."""
    zeros = np.zeros(len(items), dtype=np.int64)
    return pa.table({ITEM: items, **{c: zeros for c in _ZERO_COLUMNS}})


#: the columns of a status (:class:`RoundStatusFn`) that round r + 1's pieces carry (:func:`attach_status`)
STATUS_SCHEMA = pa.schema(
    [(ITEM, pa.binary()), ("released", pa.bool_()), ("bias", pa.float64()), ("hopeless", pa.bool_())]
)


def attach_status(pieces, status, num_shards, label: str):
    """(user shard, Packed(user, item)) pieces -> (user shard, Table(user, item, released, bias, hopeless)):
    each row with round r - 1's status of its item, joined by item shard
    (:class:`transforms.core.item_join.AttachItemColumns`; what a worker holds is bounded by a shard, not by
    the number of candidates). A row whose item has no status is in U_<r - 1 (every other item of the full
    sets was a candidate of round r - 1): its columns are null."""
    return pieces | label >> AttachItemColumns(status, num_shards, STATUS_SCHEMA)


def without_released(table: pa.Table) -> pa.Table:
    """The rows not in U_<r: with round r - 1's status attached, those whose item has a status (a candidate of
    round r - 1: not in U_<r - 1) that round r - 1 did not release; round 1's pieces (no status) whole."""
    if "released" not in table.column_names:
        return table
    return table.filter(pc.invert(pc.fill_null(table.column("released"), True)))


def hopeful_of(table: pa.Table):
    """(doomed, Table(item, bias) of the piece's hopeful items, its ItemIndex) from the attached status of rows
    minus U_<r, or (None, None, None) in round 1. ``doomed[i]``: row i's item is hopeless (Alg. 4 lines 11-13)."""
    if "hopeless" not in table.column_names:
        return None, None, None
    doomed = table.column("hopeless").combine_chunks().to_numpy(zero_copy_only=False).astype(bool)
    hope = table.filter(pa.array(~doomed))
    items = hope.column(ITEM).combine_chunks()
    distinct = pc.unique(items)
    first = pc.index_in(distinct, value_set=items)
    hopeful = pa.table({ITEM: distinct, "bias": hope.column("bias").combine_chunks().take(first)})
    return doomed, hopeful, ItemIndex(distinct)


class RoundSetsFn(PerUserFn):
    """(user shard, Table(user, item[, released, bias, hopeless])) -> (user shard, Table(user, item, degree[,
    bias])): round r's sets.

    From round 2 each row carries round r - 1's status of its item (:func:`attach_status`). Drops U_<r
    (post-processing), from round 2 each user's hopeless items unless all of its items are hopeless (Alg. 4
    line 13; :func:`mad_sips_kernels.drop_hopeless`), then bottom-k to the round's cap (Delta_0, or the
    adaptive cap: a singleton side input) with round r's priorities (re-subsampling, as DP-SIPS), and attaches
    each kept hopeful item's bias (1 for a kept hopeless one). Run by :func:`per_user_step`: the part of a
    user cut across pieces is the bottom-k of its hopeless items and the bottom-k of its other items (minus
    U_<r), with their status, from whose union the join gives exactly the user's sets (its bottom-k of the
    other items if it has any, else of the hopeless ones).
    """

    #: the tag of the candidates output (:meth:`process` with ``num_shards``)
    CANDIDATES = "candidates"

    def __init__(self, round_: int):
        self._round = round_

    def process(self, element, seed, cap, num_shards=None):
        """The sets (:class:`PerUserFn`); with ``num_shards`` (rounds r < R) also, tagged CANDIDATES, (item
        shard, Packed zero partials) of the piece's items not in U_<r: every item whose next-round status
        round r must decide, from the same pass over the full sets."""
        shard, table = element[0], without_released(table_of(element[1]))  # U_<r, once for sets and candidates
        if num_shards is not None:
            items = pc.unique(table.column(ITEM).combine_chunks())
            if len(items):
                for key_value in by_item_shard(zero_partials(items), num_shards):  # packed
                    yield beam.pvalue.TaggedOutput(self.CANDIDATES, key_value)
        if table.num_rows:
            yield from PerUserFn.process(self, (shard, table), seed, cap)

    def whole(self, shard, table, seed, cap, num_shards=None):
        doomed, hopeful, index = hopeful_of(table)
        capped = round_sets(table.select([USER, ITEM]), cap, seed, self._round, doomed, hopeful, index)
        # Table(user, item, degree[, bias])
        if capped.num_rows:
            yield shard, capped

    def part(self, table, seed, cap, num_shards=None):
        """The part's bottom-k of its hopeless rows and of its other rows, with their status columns."""
        if table.num_rows == 0:
            return None
        doomed = hopeful_of(table)[0]
        masks = [None] if doomed is None else [doomed, ~doomed]
        kept = []
        for mask in masks:
            rows = table if mask is None else table.filter(pa.array(mask))
            if rows.num_rows:
                capped = cap_pairs(rows.select([USER, ITEM]), int(cap), seed, self._round)
                kept.append(rows.filter(pc.is_in(rows.column(ITEM), value_set=capped.column(ITEM))))
        return concat(kept)  # one user's rows: an item names one row

    def join(self, shard, parts, seed, cap, num_shards=None):
        yield from self.whole(shard, concat(parts), seed, cap)  # the parts keep their status columns


class RoundStatusFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (item shard, Table(item, released, bias, hopeless)) of round r's items.

    One noisy draw per item (round r's key): released = in round r's union (holders > 0) and >= rho_r;
    the others go to round r + 1 with their bias (Alg. 4 lines 10, 14 with rho_{r+1} and sigma_r), marked
    hopeless (lines 11-13) when below ``rho_drop``, the least threshold of rounds r+1..R (bias 1 then).
    Items outside round r's union carry weight 0: their noisy weight is the extended vector's pure-noise
    entry. The plans are those of the run's cap (``plans_by_cap[cap]``; ``cap`` a side input or Delta_0) and,
    with ``weight_cap='auto'``, of its weight cap (:func:`run_plans`: rho_R is the chosen table's W50).
    """

    def __init__(self, plans_by_cap, round_, params, seed, weight_plan=None):
        super().__init__(seed)
        self._by_cap, self._round, self._params = plans_by_cap, round_, params
        self._weight_plan = weight_plan

    def process(self, element, cap, weight_cap=None):
        plans = run_plans(self._by_cap, cap, self._weight_plan, weight_cap)
        p, q = plans[self._round - 1], plans[self._round]
        shard, partials = element
        w = merge_partials(unpacked(partials))
        noisy = noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), p.noise, p.noise_scale, self._seed, p.index, self._rng
        )  # w~_r on round r's union and the candidates
        holders = w.column("holders").to_numpy()
        released = (holders > 0) & passes_threshold(noisy, p.threshold)  # U_r
        c_lb, c_ub = self._params.c_lb, self._params.c_ub
        _, b = round2_biases(noisy, q.threshold, p.noise_scale, c_lb, c_ub)  # Alg. 4 lines 10, 14 (rho_{r+1})
        hopeless = noisy + c_ub * p.noise_scale < rho_drop(plans, self._round)  # lines 11-13, least remaining rho
        status = pa.table({ITEM: w.column(ITEM), "released": released, "bias": b, "hopeless": hopeless})
        # an item shard's status grows with the distinct items (a user with 10^7 items of its own made one
        # element of ~1.7M rows, which a 512 MB TaskManager could not decode): in bounded pieces
        for piece in bounded_pieces(status):
            yield shard, piece


class LastRoundThresholdFn(NoisyThresholdFn):
    """:class:`NoisyThresholdFn` of round R with the plan of the run's cap (a side input or Delta_0); with
    ``weight_cap='auto'`` (``weight_plan``, a ``privacy.cap.WeightCapPlan`` without tables) the last round of
    the run's weight cap (a second side input), whose table it builds from the candidate's spec (once per
    process) rather than carry six."""

    def __init__(self, plans_by_cap, round_, seed, weight_plan=None):
        super().__init__(None, seed, with_holders=False)
        self._by_cap, self._round, self._weight_plan = plans_by_cap, round_, weight_plan

    def process(self, element, cap, weight_cap=None):
        plan = run_plans(self._by_cap, cap, self._weight_plan, weight_cap)[self._round - 1]
        yield from self.release(element, plan)


def run_plans(plans_by_cap, cap, weight_plan=None, weight_cap=None) -> tuple:
    """The rounds of the run: those of its cap (``plans_by_cap[cap]``), the last one replaced by the chosen
    weight cap's with ``weight_cap='auto'`` (``weight_plan.last_round(weight_cap)``, its table built from the
    candidate's spec once per process; as ``SelectionPlan.rounds_for``)."""
    plans = tuple(plans_by_cap[int(cap)])
    if weight_cap is None:
        return plans
    return plans[:-1] + (weight_plan.last_round(weight_cap),)


def without_keep_tables(plans_by_cap):
    """``plans_by_cap`` with no round's keep table, for the steps that read only noise scales, thresholds and
    tau (the statuses, tau). A keep table (37,362 entries, 337 KB pickled, at epsilon 1, delta 1e-5, Delta_0
    100) is pickled with every DoFn that holds it, and Beam pickles, compresses and unpickles each DoFn
    several times: with the table in every step that holds the plans (and the report's), the CLI's MAD-SIPS
    pipeline was 3.3 MB instead of 1.1 MB. Only the last round's two steps keep it (:class:`LastRoundThresholdFn`,
    ``TableRoundPartialsFn``)."""
    return {cap: tuple(p.without_keep_table() for p in rounds) for cap, rounds in plans_by_cap.items()}


def round_tau(cap, plans_by_cap, round_: int) -> float:
    """MAD's tau of round r under the run's cap (the adaptive cap's rounds differ by cap)."""
    return plans_by_cap[int(cap)][round_ - 1].tau


class DegreeHistogramFn(PerUserFn):
    """(user shard, Table(user, item)) -> n_j of the piece's users (privacy/cap.py). Run by
    :func:`per_user_step`: a part of a user cut across pieces is its number of rows, the join their sum."""

    def __init__(self, grid):
        self._grid = grid

    def whole(self, shard, table):
        yield degree_histogram_of(table, self._grid)

    def part(self, table):
        return table.num_rows

    def join(self, shard, parts):
        yield cap_plans.degree_histogram(np.array([sum(parts)]), self._grid)


class SumHistogramsFn(beam.CombineFn):
    """Element-wise sum of the pieces' degree histograms (zeros for no input)."""

    def __init__(self, size: int):
        self._size = size

    def create_accumulator(self):
        return np.zeros(self._size, dtype=np.int64)

    def add_input(self, acc, h):
        return acc + h

    def merge_accumulators(self, accs):
        return sum(accs, np.zeros(self._size, dtype=np.int64))

    def extract_output(self, acc):
        return acc


class ChooseCapFn(WorkerRngDoFn):
    """histogram -> (0, cap), or with ``weight_plan`` (0, (cap, weight cap)): noise sigma_H per bucket (key
    (seed, 'cap', 0, j)), then privacy.cap.choose_cap and/or privacy.cap.choose_weight_cap on the one noisy
    histogram (None for a choice whose plan is None; the plans without their rounds: the choices read the grid
    and the noise only). Without the weight cap the output is the adaptive cap's of before, so is its graph."""

    def __init__(self, cap_plan, weight_plan, seed):
        super().__init__(seed)
        self._cap_plan = None if cap_plan is None else dataclasses.replace(cap_plan, rounds=())
        self._weight_plan = None if weight_plan is None else weight_plan.without_tables()

    def process(self, histogram):
        hist = self._cap_plan or self._weight_plan
        noisy = noisy_histogram(histogram, hist.noise_scale, self._seed, self._rng)
        cap = None if self._cap_plan is None else cap_plans.choose_cap(noisy, self._cap_plan)
        weight_cap = None if self._weight_plan is None else cap_plans.choose_weight_cap(noisy, self._weight_plan)
        yield 0, (cap if self._weight_plan is None else (cap, weight_cap))


class _HistogramCaps(beam.PTransform):
    """(user shard, Table(user, item)) full distinct sets -> (the adaptive cap, the weight cap): one noisy degree
    histogram (materialised: one draw whatever retries) and the choices from it (privacy/cap.py:
    post-processing); each a singleton PCollection, or None when its plan is None (``cap_plan``: the adaptive
    cap's, ``weight_plan``: ``weight_cap='auto'``'s; the same grid and noise when both are on)."""

    def __init__(self, cap_plan, weight_plan, seed, label=None):
        super().__init__(label)
        self._cap_plan, self._weight_plan, self._seed = cap_plan, weight_plan, seed

    def expand(self, sharded):
        grid = (self._cap_plan or self._weight_plan).grid
        chosen = (
            checkpoint(
                per_user_step(sharded, "Histograms", DegreeHistogramFn(grid), tables=False)  # n_j of one piece or user
                | "SumHistograms" >> beam.CombineGlobally(SumHistogramsFn(len(grid)))  # n_j
                | "ChooseCap" >> beam.ParDo(ChooseCapFn(self._cap_plan, self._weight_plan, self._seed)),
                # (0, cap) or (0, (cap, weight cap))
                "CheckpointCap",
            )
            | "CapValue" >> beam.Values()
        )  # cap (Delta, one int), or with the weight cap (cap, c)
        if self._weight_plan is None:
            return chosen, None
        cap = None if self._cap_plan is None else chosen | "ChosenCap" >> beam.Map(chosen_cap)  # Delta
        return cap, chosen | "ChosenWeightCap" >> beam.Map(chosen_weight_cap)  # c, one float


def chosen_cap(pair) -> int:
    """(cap, weight cap) -> the adaptive cap."""
    return pair[0]


def chosen_weight_cap(pair) -> float:
    """(cap, weight cap) -> the weight cap."""
    return pair[1]


def released_rows(round_: int):
    """(item shard, status) -> (round, item bytes) of the status's released items."""

    def rows(element):
        table = element[1]
        for item in table.filter(table.column("released")).column(ITEM).to_pylist():
            yield round_, item

    return rows


class _MADSIPS(beam.PTransform):
    """MAD-SIPS (docs/mad_sips.md): batches -> ((round, item), counts or None).

    Round r: the full distinct sets minus U_<r, minus the items that round r - 1's status dropped (from
    round 2), re-subsampled to Delta_0 with round r's priorities, biased MAD (unbiased in round 1), noise,
    rho_r. Counts (optional) count holders in one round-0 subsample of the full sets (as DP-SIPS).

    With ``plan.cap`` (:class:`privacy.cap.CapPlan`, the adaptive cap) a noisy degree histogram of the
    full sets first picks the cap Delta of every round (:class:`_NoisyDegreeHistogram`, then
    ``privacy.cap.choose_cap``); the rounds re-subsample to Delta and use ``plan.cap.rounds_for(Delta)``.
    With ``plan.weight_caps`` (``weight_cap='auto'``) the same histogram picks the keep-table round's weight
    cap c (``privacy.cap.choose_weight_cap``), and that round uses c's table. After ``expand``, :attr:`cap`
    and :attr:`weight_cap` are those singleton PCollections (None when their plan is).
    """

    def __init__(self, plan, seed, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        # plan: the run's privacy.selection.SelectionPlan; plan.cap is the adaptive cap's plan or None
        self._plans, self._params, self._seed = plan.rounds, plan.params, seed
        self._counts_plan, self._rows_per_shard, self._cap_plan = plan.counts, rows_per_shard, plan.cap
        self._weight_plan = plan.weight_caps
        self.cap = self.weight_cap = None

    def expand(self, batches):
        p = self._params
        k = p.max_contributions
        seed_arg = run_seed_arg(batches, self._seed, "RunSeed")
        full, num_shards = batches | "Users" >> ShardedUsers(seed_arg, None, self._rows_per_shard)
        # (user shard, Table(user, item)) all distinct rows
        shards_si = beam.pvalue.AsSingleton(num_shards)
        adaptive, auto = self._cap_plan is not None, self._weight_plan is not None
        if adaptive or auto:  # one histogram for both choices
            self.cap, self.weight_cap = full | "Cap" >> _HistogramCaps(self._cap_plan, self._weight_plan, self._seed)
            # Delta (one int) or None, c (one float) or None
        if adaptive:
            cap_arg = beam.pvalue.AsSingleton(self.cap)
            by_cap = dict(zip(self._cap_plan.grid, self._cap_plan.rounds))
        else:
            cap_arg, by_cap = k, {k: tuple(self._plans)}
        plans = by_cap[max(by_cap)]  # the rounds' count and indices (the same for every cap)
        light = without_keep_tables(by_cap)  # for the steps before the last round's threshold
        weight_light, choice = None, ()
        if auto:  # each candidate's last round as a spec (its table built on the workers); the run's choice
            weight_light = self._weight_plan.without_tables()
            choice = (beam.pvalue.AsSingleton(self.weight_cap),)
        # rounds that read side inputs computed from `full` itself (the cap, the weight cap) must not fuse into
        # its stage, nor round 1 (the cap's reader) into the stage of the later rounds (U_1's readers): without
        # these barriers the in-memory runner stops with "watermark-pending bundles did not execute". Their
        # outputs stay packed: several stages read each (the round's sets and candidates, every later round)
        # and a runner keeps such a PCollection whole; the reading DoFns unpack them (table_of)
        # (with weight_cap 'auto', round R - 1's status and round R read the weight cap: round 1 when R <= 2)
        first = barrier(full, "FirstRound", packed=True) if adaptive or (auto and len(plans) <= 2) else None
        later = barrier(full, "LaterRounds", packed=True) if len(plans) > 1 else None  # (user shard, Packed)
        outputs, status = [], None
        last = len(plans)
        for plan in plans:
            r = plan.index
            source = first if r == 1 else later
            source = full if source is None else source  # (user shard, Packed or Table(user, item))
            if status is not None:  # round r - 1's status of each row's item, joined by item shard
                source = attach_status(source, status, shards_si, f"Status{r - 1}To{r}")
                # (user shard, Table(user, item, released, bias, hopeless))
            shards_arg = shards_si if r < last else None  # rounds r < R: also the candidates of round r's status
            sets, extra = per_user_step(
                source,
                f"Sets{r}",
                RoundSetsFn(r),
                seed_arg,
                cap_arg,
                shards_arg,
                packed=True,
                outputs=(RoundSetsFn.CANDIDATES,),
            )  # (user shard, Packed(user, item, degree[, bias])); candidates (item shard, Packed zero partials)
            b_min, b_max = (1.0, 1.0) if r == 1 else (p.b_min, p.b_max)
            if plan.keep_table is not None:  # the last round with threshold 'optimal' (the same table every cap)
                if auto:  # the table of the chosen weight cap c (a side input), built on the workers
                    tables = dict(zip(weight_light.candidates, weight_light.specs))
                    threshold_fn = (light, r, self._seed, weight_light)
                else:
                    tables, threshold_fn = plan.keep_table, (by_cap, r, self._seed)
                released_r = (
                    sets
                    | f"TablePartials{r}" >> beam.ParDo(TableRoundPartialsFn(b_min, b_max, tables), shards_si, *choice)
                    # (item shard, Packed(item, hi, mid, lo, holders)) of biased Basic weights rounded onto C
                    | f"GroupTableParts{r}" >> beam.GroupByKey()  # (item shard, [Packed partials])
                    | f"KeepTable{r}" >> beam.ParDo(LastRoundThresholdFn(*threshold_fn), cap_arg, *choice)
                )  # (r, item bytes)
                outputs.append(released_r)
                continue
            tau = (
                beam.pvalue.AsSingleton(self.cap | f"Tau{r}" >> beam.Map(round_tau, light, r)) if adaptive else plan.tau
            )
            weights = sets | f"MADWeights{r}" >> MADWeights(tau, p.d_max, b_min, b_max, shards_si)
            # (item shard, [Packed partials])
            if r == last:
                released_r = weights | f"NoisyThreshold{r}" >> beam.ParDo(
                    LastRoundThresholdFn(by_cap, r, self._seed), cap_arg
                )  # (r, item bytes)
            else:
                candidates = extra[RoundSetsFn.CANDIDATES]  # (item shard, Packed zero partials)
                status = barrier(
                    (weights | f"Parts{r}" >> beam.FlatMapTuple(each_partial), candidates)
                    | f"AllParts{r}" >> beam.Flatten()  # (item shard, Packed partials)
                    | f"GroupParts{r}" >> beam.GroupByKey()  # (item shard, [Packed partials])
                    | f"Status{r}"
                    >> beam.ParDo(RoundStatusFn(light, r, p, self._seed, weight_light), cap_arg, *choice),
                    f"Checkpoint{r}",
                )  # (item shard, Table(item, released, bias)), materialised: one draw per item
                released_r = status | f"ReleasedRows{r}" >> beam.FlatMap(released_rows(r))  # (r, item bytes)
            outputs.append(released_r)
        released, tagged = all_rounds(outputs)  # (round, item bytes), (round, item)
        if self._counts_plan is None:
            return tagged, None
        holders = holders_in_round0_sets(full, released, k, seed_arg, shards_si)  # (item bytes, holders)
        return tagged, noisy_counts_of_holders(holders, self._counts_plan, self._seed, p.min_users)


def rho_drop(plans, r: int) -> float:
    """The hopeless bound of the round after round r: the least threshold of rounds r+1..R."""
    return min(p.threshold for p in plans[r:])


def each_partial(shard, tables):
    """(item shard, [Packed partials]) -> (item shard, Packed partials) (to regroup them with others)."""
    for table in tables:
        yield shard, table
