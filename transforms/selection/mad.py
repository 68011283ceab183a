"""MAD (MAD paper Alg. 3) and MAD2R (Alg. 4) on Beam: the MAD weighting over capped tables, its rounds.

The arithmetic is :mod:`transforms.selection.mad_kernels` (scalar oracle and vectorised forms side by
side); sharding, capping and barriers are the shared engine (:mod:`transforms.core.engine`). The
runners ``_MAD`` and ``_MAD2R`` are what :class:`transforms.SelectPartitions` runs for MAD's
'single' shape and 'mad2r'; :class:`MADWeights` is reused by MAD-SIPS and DPNE's MAD weighting.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.core.batches import (
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    bounded_pieces,
    by_item_shard,
    chunks,
    pack,
    unpacked,
)
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn
from dp_partition_beam.transforms.core.engine import (
    CapFn,
    ShardedUsers,
    barrier,
    decode_tagged,
    per_user_step,
    run_seed_arg,
    table_of,
)
from dp_partition_beam.transforms.core.item_join import AttachItemColumns
from dp_partition_beam.transforms.core.tables import merge_partials, noisy_weights, with_degree
from dp_partition_beam.transforms.selection.basic import NoisyThresholdFn, _Basic
from dp_partition_beam.transforms.selection.counts import noisy_counts_of_holders
from dp_partition_beam.transforms.selection.mad_kernels import (
    check_mad_params,
    mad_contribution_partials,
    mad_init_partials,
    mad_item_excess,
    round2_biases,
    table_round_partials,
)

__all__ = ["MADWeights", "MADRound", "TableRoundPartialsFn"]


class MADInitPartialsFn(beam.DoFn):
    """(user shard, capped) -> (item shard, partials of w_init)  (Alg. 3 lines 3-5)."""

    def __init__(self, b_min: float, d_max: float):
        self._b_min, self._d_max = b_min, d_max

    def process(self, element, num_shards):
        partials = mad_init_partials(table_of(element[1]), self._b_min, self._d_max)
        yield from by_item_shard(partials, num_shards)  # packed


class MADExcessFn(beam.DoFn):
    """(item shard, [w_init partials]) -> Table(item, r) of the hot items (r > 0, Alg. 3 line 6); and
    ``trunc`` output (item shard, partials of w_trunc = min(w_init, tau)) (line 8)."""

    TRUNC = "trunc"

    def process(self, element, tau):  # tau: a float, or a singleton side input (DPNE's tau_k)
        shard, partials = element
        hot, trunc = mad_item_excess(merge_partials(unpacked(partials)), tau)
        yield from chunks(hot)
        for piece in chunks(trunc):
            yield beam.pvalue.TaggedOutput(self.TRUNC, (shard, pack(piece)))


class MADExcessConstFn(MADExcessFn):
    """:class:`MADExcessFn` with a constant tau held by the DoFn (selection: tau is known at construction)."""

    def __init__(self, tau: float):
        self._tau_const = float(tau)

    def process(self, element):
        yield from MADExcessFn.process(self, element, self._tau_const)


#: the hot items' table (:class:`MADExcessFn`): joined onto the capped rows by item shard
HOT_SCHEMA = pa.schema([(ITEM, pa.binary()), ("r", pa.float64())])


def keyed_hot(table):
    """Table(item, r) -> (0, Table(item, r)): the hot items as values of :class:`AttachItemColumns` (any key:
    the join re-keys them by item)."""
    return 0, table


class MADContributionFn(beam.DoFn):
    """(user shard, Table(user, item, degree[, bias], r)) -> (item shard, partials of the users' contributions)
    (Alg. 3 l.9-17).

    Each row carries r(i) of its item (null: not hot, r = 0), joined by item shard
    (:class:`transforms.core.item_join.AttachItemColumns`): the hot items are at most n_adaptive / tau, which
    grows with the users, so they do not travel as a side input.
    """

    def __init__(self, d_max, b_min, b_max):
        self._params = (d_max, b_min, b_max)

    def process(self, element, num_shards, tau):  # tau: a float or a singleton side input
        table = table_of(element[1])
        r = pc.fill_null(table.column("r"), 0.0).to_numpy()
        rows = table.select([c for c in table.column_names if c != "r"])
        partials = mad_contribution_partials(rows, None, tau, *self._params, r_rows=r)
        yield from by_item_shard(partials, num_shards)  # packed


class MADContributionConstFn(MADContributionFn):
    """:class:`MADContributionFn` with a constant tau held by the DoFn (selection)."""

    def __init__(self, tau, d_max, b_min, b_max):
        MADContributionFn.__init__(self, d_max, b_min, b_max)
        self._tau_const = float(tau)

    def process(self, element, num_shards):
        yield from MADContributionFn.process(self, element, num_shards, self._tau_const)


class MADWeights(beam.PTransform):
    """(user shard, capped) -> (item shard, [partials]) whose merged sum per item is MAD's w(i).

    Stages (Alg. 3 line numbers):
      InitPartials  (item shard, Table(item, w_init parts))   l.3-5, adaptive users add 1/|S_u|
      GroupInit     (item shard, [partials])
      Excess        Table(item, r) of hot items (r > 0)      l.6 (erratum max)
                    trunc: (item shard, w_trunc partials)    l.8
      AttachHot     (user shard, Table(..., r))              each row's r(i) (null: not hot), joined by
                                                             item shard (transforms.core.item_join)
      Contrib       (item shard, contribution partials)      l.9-17 per user (Alg. 2 for biased users)
      AllParts      (item shard, [partials])                 w(i) = w_trunc(i) + sum of contributions (l.12)
    Input: (user shard, Table(user, item, degree)) with every user's rows in one element (``CapFn``'s
    output), or Table(user, item, degree, bias) for biased rounds (MAD2R round 2, MAD-SIPS). Output:
    (item shard, [Packed(item, hi, mid, lo, holders)]); ``merge_partials`` of a group gives Table(item,
    weight, holders) with MAD's w(i) correctly rounded, bit-identical to the reference's ``mad_weights``.
    The hot items are at most n_adaptive / tau (w_init > tau >= 1), which grows with the users: they reach
    the users by a join, never as a side input (docs/columnar.md).
    """

    def __init__(self, tau, d_max, b_min, b_max, num_shards, label=None):
        super().__init__(label)
        # tau: a float, or a singleton side input when it is known only at run time (DPNE's tau_k = rho_k +
        # beta sigma_k, privacy.calibration.mad_tau, always >= 1)
        self._tau_si = tau if isinstance(tau, beam.pvalue.AsSideInput) else None
        check_mad_params(1.0 if self._tau_si is not None else tau, d_max, b_min, b_max)
        tau = None if self._tau_si is not None else float(tau)
        self._tau, self._d_max, self._b_min, self._b_max = tau, d_max, b_min, b_max
        self._num_shards = num_shards

    def _tau_arg(self):
        return self._tau if self._tau_si is None else self._tau_si

    def expand(self, capped):
        excess = (
            capped
            | "InitPartials" >> beam.ParDo(MADInitPartialsFn(self._b_min, self._d_max), self._num_shards)
            # (item shard, w_init partials)
            | "GroupInit" >> beam.GroupByKey()  # (item shard, [Packed partials])
            | "Excess"
            >> (
                beam.ParDo(MADExcessFn(), self._tau_si)
                if self._tau_si is not None
                else beam.ParDo(MADExcessConstFn(self._tau))
            ).with_outputs(MADExcessFn.TRUNC, main="hot")
        )  # hot: Table(item, r); trunc: (item shard, w_trunc partials)
        if self._tau_si is not None:
            contrib = beam.ParDo(
                MADContributionFn(self._d_max, self._b_min, self._b_max), self._num_shards, self._tau_si
            )
        else:
            contrib = beam.ParDo(
                MADContributionConstFn(self._tau, self._d_max, self._b_min, self._b_max), self._num_shards
            )
        hot = excess.hot | "KeyHot" >> beam.Map(keyed_hot)  # (0, Table(item, r))
        contributions = (
            barrier(capped, "Barrier")  # not fused into capped's stage: DPNE's num_shards and tau come from it
            | "AttachHot" >> AttachItemColumns(hot, self._num_shards, HOT_SCHEMA)
            # (user shard, Table(user, item, degree[, bias], r)), r null where the item is not hot
            | "Contrib" >> contrib
        )  # (item shard, contribution partials)
        return (
            (excess[MADExcessFn.TRUNC], contributions)
            | "AllParts" >> beam.Flatten()  # (item shard, partials)
            | "GroupParts" >> beam.GroupByKey()  # (item shard, [Packed partials])
        )


class TableRoundPartialsFn(beam.DoFn):
    """(user shard, Packed(user, item, degree[, bias])) -> (item shard, Packed partials) of a keep-table last
    round (MAD-SIPS, MAD2R: :func:`mad_kernels.table_round_partials`; each element holds whole users).

    ``table``: the round's keep table, or with MAD-SIPS's ``weight_cap='auto'`` a dict {weight cap:
    KeepTableSpec} from which the side input ``weight_cap`` (the run's choice) picks the table to build (once
    per process: the step carries a few numbers per candidate, not six tables)."""

    def __init__(self, b_min, b_max, table):
        self._b_min, self._b_max, self._table = b_min, b_max, table

    def process(self, element, num_shards, weight_cap=None):
        table = self._table if weight_cap is None else self._table[float(weight_cap)].build()
        partials = table_round_partials(table_of(element[1]), self._b_min, self._b_max, table)
        yield from by_item_shard(partials, num_shards)  # packed


class MADRound(beam.PTransform):
    """(user shard, capped[+bias]) -> (round, item bytes) [+ (item bytes, holders)]: MAD weights, noise, rho."""

    def __init__(self, plan, params, seed, num_shards, b_min=1.0, b_max=1.0, with_holders=False, label=None):
        super().__init__(label)
        self._plan, self._params, self._seed, self._num_shards = plan, params, seed, num_shards
        self._b_min, self._b_max, self._with_holders = b_min, b_max, with_holders

    def expand(self, capped):
        p = self._plan
        grouped = capped | "MADWeights" >> MADWeights(
            p.tau, self._params.d_max, self._b_min, self._b_max, self._num_shards
        )  # (item shard, [Packed partials])
        out = grouped | "NoisyThreshold" >> beam.ParDo(
            NoisyThresholdFn(p, self._seed, self._with_holders)
        ).with_outputs(NoisyThresholdFn.HOLDERS, main="released")  # (round, item bytes); holders
        if self._with_holders:
            return out.released, out[NoisyThresholdFn.HOLDERS]
        return out.released


class _MAD(_Basic):
    """MAD (one round): batches -> ((round, item), counts or None); Basic's one-round runner with MAD's round."""

    def round_transform(self, num_shards, with_holders: bool):
        return MADRound(self._plan, self._params, self._seed, num_shards, with_holders=with_holders)


class Round1StatusFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (item shard, Table(item, released, holders, bias)) of the items that
    are released in round 1 (noisy w1 >= rho_1, Alg. 4 line 7) or kept for round 2 with their bias
    (lines 10-14); the other items (hopeless) are dropped. One draw per item for both uses."""

    def __init__(self, r1, r2, params, seed):
        super().__init__(seed)
        self._r1, self._r2, self._params = r1, r2, params

    def process(self, element):
        shard, partials = element
        w = merge_partials(unpacked(partials))
        r1, r2, p = self._r1, self._r2, self._params
        noisy = noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), r1.noise, r1.noise_scale, self._seed, r1.index, self._rng
        )  # Alg. 4 line 6
        released = passes_threshold(noisy, r1.threshold)  # line 7
        kept, b = round2_biases(noisy, r2.threshold, r1.noise_scale, p.c_lb, p.c_ub)  # lines 10-14
        rows = np.flatnonzero(released | kept)
        status = pa.table(
            {
                ITEM: w.column(ITEM).take(rows),
                "released": released[rows],
                "holders": w.column("holders").take(rows),
                "bias": b[rows],
            }
        )
        for piece in bounded_pieces(status):  # an item shard's status grows with the distinct items
            yield shard, piece


def released1_rows(element):
    """(item shard, status) -> (1, item bytes) for the items released in round 1."""
    table = element[1]
    for item in table.filter(table.column("released")).column(ITEM).to_pylist():
        yield 1, item


def released1_holders(element):
    """(item shard, status) -> (item bytes, holders) for the items released in round 1."""
    t = element[1].filter(element[1].column("released"))
    yield from zip(t.column(ITEM).to_pylist(), t.column("holders").to_pylist())


#: round 1's status as round 2's rows read it (:func:`round2_sets`)
R1_STATUS_SCHEMA = pa.schema([(ITEM, pa.binary()), ("released", pa.bool_()), ("bias", pa.float64())])


def round2_rows(shard, table):
    """(user shard, Table(user, item, degree, released, bias)) -> (user shard, Table(user, item, degree, bias)) of
    the round-2 items (line 13): the capped rows whose item round 1 did not release (released false; null:
    no status, never the case for a capped row), with its bias, degrees recomputed (as
    MAD2R line 13)."""
    kept = table.filter(pc.invert(pc.fill_null(table.column("released"), True)))
    if kept.num_rows:
        yield (
            shard,
            with_degree(pa.table({USER: kept.column(USER), ITEM: kept.column(ITEM), "bias": kept.column("bias")})),
        )


class _MAD2R(beam.PTransform):
    """MAD2R (MAD paper Alg. 4): batches -> ((round, item), counts or None).

    Round 1: unbiased MAD on the capped sets (users subsampled once, line 1); its noisy weights never
    leave the item stage: one DoFn releases U_1 and computes round 2's biases from the same draw, and
    that status is checkpointed (one draw per item whatever retries). Round 2: the capped sets minus
    U_1 and U_low, with biases b(i) (round 1's status joined by item shard), biased MAD with
    h(t) = b_max/sqrt(t), noise, rho_2.
    """

    def __init__(self, plan, seed, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        (self._r1, self._r2), self._params, self._seed = plan.rounds, plan.params, seed
        self._counts_plan, self._rows_per_shard = plan.counts, rows_per_shard

    def expand(self, batches):
        p, r1, r2 = self._params, self._r1, self._r2
        k = p.max_contributions
        seed_arg = run_seed_arg(batches, self._seed, "RunSeed")
        sharded, num_shards = batches | "Users" >> ShardedUsers(seed_arg, k, self._rows_per_shard)
        shards_si = beam.pvalue.AsSingleton(num_shards)
        capped = per_user_step(sharded, "Cap", CapFn(k, 0), seed_arg, packed=True)
        # (user shard, Packed capped) (line 1)
        status = barrier(
            capped
            | "R1MADWeights" >> MADWeights(r1.tau, p.d_max, 1.0, 1.0, shards_si)  # (item shard, [parts])
            | "R1Status" >> beam.ParDo(Round1StatusFn(r1, r2.without_keep_table(), p, self._seed)),  # reads rho_2
            "R1Checkpoint",
        )  # (item shard, Table(item, released, holders, bias)), materialised: one draw per item
        released1 = status | "R1Released" >> beam.FlatMap(released1_rows)  # (1, item bytes)
        round2_sets = (
            capped
            | "R1StatusToR2" >> AttachItemColumns(status, shards_si, R1_STATUS_SCHEMA)
            # (user shard, Table(user, item, degree, released, bias)): round 1's status joined by item shard
            | "Round2Sets" >> beam.FlatMapTuple(round2_rows)
        )  # (user shard, Table(user, item, degree, bias)) = S_u minus U_1 and U_low (line 13)
        with_holders = self._counts_plan is not None
        if r2.keep_table is not None:  # threshold 'optimal': biased Basic weights rounded onto C, the table
            out2 = (
                round2_sets
                | "R2TablePartials" >> beam.ParDo(TableRoundPartialsFn(p.b_min, p.b_max, r2.keep_table), shards_si)
                # (item shard, Packed partials)
                | "R2GroupTableParts" >> beam.GroupByKey()  # (item shard, [Packed partials])
                | "R2KeepTable"
                >> beam.ParDo(NoisyThresholdFn(r2, self._seed, with_holders)).with_outputs(
                    NoisyThresholdFn.HOLDERS, main="released"
                )
            )  # (2, item bytes); holders (item bytes, count)
            out2 = (out2.released, out2[NoisyThresholdFn.HOLDERS]) if with_holders else out2.released
        else:
            out2 = round2_sets | "Round2" >> MADRound(
                r2, p, self._seed, shards_si, p.b_min, p.b_max, with_holders=with_holders
            )  # (2, item bytes) [, holders]
        released2, holders2 = out2 if with_holders else (out2, None)
        tagged = (
            (released1, released2)
            | "Union" >> beam.Flatten()  # (round, item bytes)
            | "Decode" >> beam.Map(decode_tagged)  # (round, item)
        )
        if not with_holders:
            return tagged, None
        holders = (status | "Holders1" >> beam.FlatMap(released1_holders), holders2) | "AllHolders" >> beam.Flatten()
        return tagged, noisy_counts_of_holders(holders, self._counts_plan, self._seed, p.min_users)
