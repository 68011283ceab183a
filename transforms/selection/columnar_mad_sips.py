"""MAD-SIPS on the columnar path (docs/mad_sips.md): R rounds of MAD with removal, re-subsampling, biases.

Built from the columnar building blocks of :mod:`transforms.selection.columnar` (ShardedUsers,
MADWeightsColumnar, MADRound, the count release's holders) and the kernels of
:mod:`transforms.selection.columnar_kernels`. Stages of round r (shapes after each step):

  Sets_r      (user shard, Table(user, item, degree[, bias]))   full distinct sets minus U_<r; r >= 2:
                                                                minus the user's hopeless items unless
                                                                all of its items are hopeless,
                                                                bottom-k to Delta_0 with round r's
                                                                priorities (re-subsampling), biases attached
  MADWeights_r (item shard, [partials])                         MAD (Alg. 3), biased from round 2
  r < R:
  Candidates_r (item shard, zero partials)                      every item of the full sets minus U_<r,
                                                                weight 0, holders 0: the items whose
                                                                next-round status round r must decide
  Status_r    (item shard, Table(item, released, bias, hopeless)) merged weight + noise of round r (one
                                                                draw per item; items outside round r's
                                                                union get their pure-noise entry, holders
                                                                0, never released), U_r = union items
                                                                >= rho_r, next round's hopeless/bias
                                                                (Alg. 4 lines 10-14 with rho_{r+1});
                                                                checkpointed (one draw whatever retries)
  r = R:      NoisyThreshold (round R, item bytes)

Equal to :func:`transforms.selection.reference._mad_sips` under a seed (tests/test_mad_sips_beam.py).
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.batches import DEFAULT_ROWS_PER_SHARD, ITEM, by_item_shard, unpacked
from transforms.core.dofns import SideInputCache, WorkerRngDoFn
from transforms.selection import columnar_kernels as C
from transforms.selection.columnar import (
    MADRound,
    MADWeightsColumnar,
    ShardedUsers,
    _counts,
    _seed_arg,
    all_rounds,
    barrier,
    concat_or_none,
    holders_in_round0_sets,
    released_through,
    removed_before,
)

__all__ = ["ColumnarMADSIPS"]

_ZERO_COLUMNS = ("hi", "mid", "lo", "holders")


def zero_partials(items: pa.Array) -> pa.Table:
    """Table(item, hi, mid, lo, holders) of weight 0 and no holders (the schema of the MAD partials)."""
    zeros = np.zeros(len(items), dtype=np.int64)
    return pa.table({ITEM: items, **{c: zeros for c in _ZERO_COLUMNS}})


class RoundSetsFn(beam.DoFn):
    """(user shard, Table(user, item)) -> (user shard, Table(user, item, degree[, bias])): round r's sets.

    Drops U_<r (post-processing), from round 2 each user's hopeless items unless all of its items are
    hopeless (Alg. 4 line 13; :func:`columnar_kernels.drop_hopeless`), then bottom-k with round r's
    priorities (re-subsampling, as DP-SIPS).
    """

    def __init__(self, k: int, round_: int):
        self._k, self._round = k, round_
        self._biases = SideInputCache()  # one Table(item, bias, hopeless) of round r's candidates

    def process(self, element, seed, released=None, bias_tables=None):
        shard, table = element
        if released:
            table = C.drop_items(table, pa.array(released, type=pa.binary()))  # remove U_<r
        if bias_tables is not None:
            biased = self._biases.get(bias_tables, concat_or_none)
            if biased is None or biased.num_rows == 0:
                return
            # every item left is a candidate of round r - 1's status (CandidatePartialsFn), so it has a row
            hopeless = biased.column(ITEM).filter(biased.column("hopeless"))
            table = C.drop_hopeless(table, hopeless.combine_chunks())  # drop U_low (Alg. 4 line 13)
        capped = C.cap_pairs(table, self._k, seed, self._round)  # re-subsample to Delta_0 (round r)
        if bias_tables is not None:
            capped = C.attach_biases(capped, biased)  # Table(user, item, degree, bias)
        if capped.num_rows:
            yield shard, capped


class CandidatePartialsFn(beam.DoFn):
    """(user shard, Table(user, item)) -> (item shard, Packed zero partials) of the items not in U_<r."""

    def process(self, element, num_shards, released=None):
        table = element[1]
        if released:
            table = C.drop_items(table, pa.array(released, type=pa.binary()))
        items = pc.unique(table.column(ITEM).combine_chunks())
        if len(items):
            yield from by_item_shard(zero_partials(items), num_shards)  # packed


class RoundStatusFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (item shard, Table(item, released, bias, hopeless)) of round r's items.

    One noisy draw per item (round r's key): released = in round r's union (holders > 0) and >= rho_r;
    the others go to round r + 1 with their bias (Alg. 4 lines 10, 14 with rho_{r+1} and sigma_r), marked
    hopeless (lines 11-13) when below ``rho_drop``, the least threshold of rounds r+1..R (bias 1 then).
    Items outside round r's union carry weight 0: their noisy weight is the extended vector's pure-noise
    entry.
    """

    def __init__(self, plan, next_plan, rho_drop, params, seed):
        super().__init__(seed)
        self._plan, self._next, self._rho_drop, self._params = plan, next_plan, rho_drop, params

    def process(self, element):
        shard, partials = element
        w = C.merge_partials(unpacked(partials))
        p, q = self._plan, self._next
        noisy = C.noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), p.noise, p.noise_scale, self._seed, p.index, self._rng
        )  # w~_r on round r's union and the candidates
        holders = w.column("holders").to_numpy()
        released = (holders > 0) & (noisy >= p.threshold)  # U_r
        c_lb, c_ub = self._params.c_lb, self._params.c_ub
        _, b = C.round2_biases(noisy, q.threshold, p.noise_scale, c_lb, c_ub)  # Alg. 4 lines 10, 14 (rho_{r+1})
        hopeless = noisy + c_ub * p.noise_scale < self._rho_drop  # lines 11-13 with the least remaining rho
        if w.num_rows:
            yield shard, pa.table({ITEM: w.column(ITEM), "released": released, "bias": b, "hopeless": hopeless})


def candidate_table(element):
    """(item shard, status) -> Table(item, bias, hopeless) of the items round r + 1 may send (not released)."""
    t = element[1]
    return t.filter(pc.invert(t.column("released"))).select([ITEM, "bias", "hopeless"])


def released_rows(round_: int):
    """(item shard, status) -> (round, item bytes) of the status's released items."""

    def rows(element):
        table = element[1]
        for item in table.filter(table.column("released")).column(ITEM).to_pylist():
            yield round_, item

    return rows


class ColumnarMADSIPS(beam.PTransform):
    """MAD-SIPS (docs/mad_sips.md): batches -> ((round, item), counts or None).

    Round r: the full distinct sets minus U_<r, minus the items that round r - 1's status dropped (from
    round 2), re-subsampled to Delta_0 with round r's priorities, biased MAD (unbiased in round 1), noise,
    rho_r. Counts (optional) count holders in one round-0 subsample of the full sets (as DP-SIPS).
    """

    def __init__(self, plans, params, seed, counts_plan=None, rows_per_shard=DEFAULT_ROWS_PER_SHARD, label=None):
        super().__init__(label)
        self._plans, self._params, self._seed = plans, params, seed
        self._counts_plan, self._rows_per_shard = counts_plan, rows_per_shard

    def expand(self, batches):
        p = self._params
        k = p.max_contributions
        seed_arg = _seed_arg(batches, self._seed, "RunSeed")
        full, num_shards = batches | "Users" >> ShardedUsers(seed_arg, None, self._rows_per_shard)
        # (user shard, Table(user, item)) all distinct rows
        shards_si = beam.pvalue.AsSingleton(num_shards)
        # rounds >= 2 read side inputs computed from `full` itself: their reads must not fuse into its stage
        later = barrier(full, "LaterRounds") if len(self._plans) > 1 else None  # (user shard, Table(user, item))
        outputs, released_so_far, biases = [], None, None
        last = len(self._plans)
        for plan in self._plans:
            r = plan.index
            removed = removed_before(released_so_far, r)  # side input of U_<r, None in round 1
            bias_si = None if biases is None else beam.pvalue.AsList(biases)
            source = full if r == 1 else later
            sets = source | f"Sets{r}" >> beam.ParDo(RoundSetsFn(k, r), seed_arg, removed, bias_si)
            # (user shard, Table(user, item, degree[, bias]))
            b_min, b_max = (1.0, 1.0) if r == 1 else (p.b_min, p.b_max)
            if r == last:
                released_r = sets | f"Round{r}" >> MADRound(plan, p, self._seed, shards_si, b_min, b_max)
                # (r, item bytes)
            else:
                weights = sets | f"MADWeights{r}" >> MADWeightsColumnar(plan.tau, p.d_max, b_min, b_max, shards_si)
                # (item shard, [Packed partials])
                candidates = source | f"Candidates{r}" >> beam.ParDo(CandidatePartialsFn(), shards_si, removed)
                # (item shard, Packed zero partials)
                status_fn = RoundStatusFn(plan, self._plans[r], rho_drop(self._plans, r), p, self._seed)
                status = barrier(
                    (weights | f"Parts{r}" >> beam.FlatMapTuple(each_partial), candidates)
                    | f"AllParts{r}" >> beam.Flatten()  # (item shard, Packed partials)
                    | f"GroupParts{r}" >> beam.GroupByKey()  # (item shard, [Packed partials])
                    | f"Status{r}" >> beam.ParDo(status_fn),
                    f"Checkpoint{r}",
                )  # (item shard, Table(item, released, bias)), materialised: one draw per item
                released_r = status | f"ReleasedRows{r}" >> beam.FlatMap(released_rows(r))  # (r, item bytes)
                biases = status | f"Biases{r}" >> beam.Map(candidate_table)  # Table(item, bias, hopeless)
                released_so_far = released_through(released_so_far, released_r, r)  # U_<=r
            outputs.append(released_r)
        released, tagged = all_rounds(outputs)  # (round, item bytes), (round, item)
        if self._counts_plan is None:
            return tagged, None
        holders = holders_in_round0_sets(full, released, k, seed_arg, shards_si)  # (item bytes, holders)
        return tagged, _counts(holders, self._counts_plan, self._seed, p.min_users)


def rho_drop(plans, r: int) -> float:
    """The hopeless bound of the round after round r: the least threshold of rounds r+1..R."""
    return min(p.threshold for p in plans[r:])


def each_partial(shard, tables):
    """(item shard, [Packed partials]) -> (item shard, Packed partials) (to regroup them with others)."""
    for table in tables:
        yield shard, table
