"""DPNE (DP n-gram extraction) as a Beam composite transform: the scalable version of the paper, columnar.

Paper: Kim, Gopi, Kulkarni, Yekhanin, "Differentially Private n-gram Extraction", Algorithm 1 and
supplement Algorithm 1 (scalable). Accounting: :mod:`privacy.dpne`. Kernels shared with the
in-memory reference (:mod:`transforms.dpne.reference`): :mod:`transforms.dpne.dpne_kernels`; the
vectorised token and n-gram kernels: :mod:`transforms.dpne.dpne_kernels`; capping, exact
partial sums and noise: :mod:`transforms.core.tables`.

Input: PCollection of ``(user, text)`` elements and/or Arrow batches (``RecordBatch``/``Table`` with
columns ``user`` and ``text``). A user may have many records; each line of a text is one segment,
n-grams never cross a line break. Output (a dict of PCollections):
  ``ngrams``  ``(k, n-gram)`` released n-grams, words joined by single spaces;
  ``counts``  with ``params.release_counts`` only: ``(k, (n-gram, noisy_count))`` (docs/counts.md);
  ``levels``  one dict per level / run with public quantities only (sigma_k, rho_k, |S_{k-1}|,
              |V_k|, spurious bound, |S_k|) - never |supp(H_k)| or any other count of private data.

Stages (Beam elements are Arrow tables; shapes after each step):
  Batch        Table(user: binary, text: string)       <= batch_rows records (element API gathered per
                                                       bundle, batches cut)
  Tokenize     Table(user, token, rem)                 one row per token, rem = tokens left on its line
  ShardCount   S = max(num_shards, ceil(tokens / rows_per_shard))   singleton
  ShardUsers   (user shard, Packed(user, token, rem))  fingerprint(user) mod S: every token of a user
                                                       in one element, tokenized once for all levels
Per level k (per DPSU run: its lengths, no pruning; S_{k-1}, S_1 are released, hence public, and small:
side inputs):
  Grams+Cap    (user shard, Table(user, item, degree)) valid k-grams only (words in S_1, head and tail
                                                       (k-1)-grams in S_{k-1}; V_k is never
                                                       materialised), allowlist, distinct, bottom-k to
                                                       Delta_k (randomness.subsample's priorities,
                                                       round k)
  Partials     (item shard, Packed(item, hi, mid, lo, holders))  exact fixed-point sums of 1/sqrt(d)
  GroupItems   (item shard, [Packed])                   a hot k-gram is one row per user shard
  Merge        (item shard, Table(item, weight, holders))  H_k over its support
  NoisyKeep    (item bytes, holders)                    H_k + sigma_k Z >= rho_k (rho_k: side input); with
                                                       threshold='optimal' kept with probability F_k(H_k),
                                                       the level's keep table (F_k(0) = q_k at k >= 2)
  Spurious     n-gram                                   a Bernoulli(q_k) subset of V_k drawn from the
                                                       public plan (its size ~ Bin(|V_k|, q_k), then
                                                       that many distinct uniform k-grams: y ~ L(y)R(y),
                                                       then x, z), keyed by item shard and joined with
                                                       the support's n-grams, those outside released
                                                       (:class:`_Spurious`)
  Checkpoint   (n-gram, holders)                        S_k materialised (read by the output, the
                                                       report, the counts and level k+1)
  Sizes        (|S_{k-1}|, |V_k|, [g])                  singleton: S_{k-1} gathered (public, small),
                                                       |V_k| = sum_y L(y) R(y) (:func:`level_sizes`)
  Level        {rho_k, q_k, |V_k|, ...}                 singleton from Sizes (or the sampling estimator);
                                                       the spurious step reads its own singleton of the
                                                       level dict and S_{k-1} (few routes back to S_{k-1}:
                                                       Flink's plan walk, docs/engines.md)

MAD weighting (``weighting='mad'``) replaces the Partials/GroupItems steps by
:class:`transforms.selection.mad.MADWeights` (MAD paper Alg. 3 on the same capped tables),
with tau_k = rho_k + beta sigma_k a side input (it depends on rho_k, known once S_{k-1} is released).

``selection='mad_sips'`` replaces Grams+Cap .. Spurious of every level (level 1 included) by the rounds of
:func:`privacy.dpne.level_rounds` (:class:`_LevelMADSIPS`: the full valid sets, then per round removal,
biases, hopeless drops, re-subsampling to Delta_k, MAD, noise, rho_r and, for k >= 2, the round's spurious
draws, a Bernoulli subset of V_k). The level's plan (its dict and rounds, S_{k-1}, |V_k|: q_k is known only at
run time) is one singleton read by the level's first step and its spurious draws; from there the rounds run as
one chain of GroupByKeys whose elements carry the rounds. S_k is the union of the rounds; its holders (for the
counts) are those of round 1's capped sets.

Memory: a user shard holds ~rows_per_shard tokens (plus the n-grams of one level while it is capped);
one user's tokens are never split, so a user with 10^7 tokens makes one shard of that size. An item
shard holds at most S rows per n-gram. The candidate spurious k-grams (about B_k, whose expectation is
at most eta |S_{k-1}|) and the released sets travel as side inputs (with ``selection='mad_sips'`` the
candidates in the chain, by item shard). A MAD-SIPS level's user shard holds its users' full valid sets and an
item shard their rows of its n-grams, once per hop.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import List, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.privacy.dpne import (
    DPNEParams,
    RunPlan,
    baseline_run_report,
    level_k_report,
    level_one_report,
    level_rounds,
    plan_dpne_counts,
    plan_runs,
    resolved_threshold,
    rounds_report,
)
from dp_partition_beam.privacy.validation import check_int
from dp_partition_beam.transforms.core import elements as E
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.allowlist import check_allowlist
from dp_partition_beam.transforms.core.batches import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_ROWS_PER_SHARD,
    ITEM,
    USER,
    Packed,
    ShardCount,
    bounded_pieces,
    by_item_shard,
    concat,
    dictionary_codes,
    owned,
    require_global_window,
    shard_ids,
    split_by_shard,
    split_packed,
    unpack_all,
    unpacked,
    user_chunks,
)
from dp_partition_beam.transforms.core.dofns import SideInputCache, WorkerRngDoFn, in_global_window
from dp_partition_beam.transforms.core.engine import RunSeed, checkpoint
from dp_partition_beam.transforms.core.fingerprint import from_key_bytes
from dp_partition_beam.transforms.core.tables import ItemIndex, drop_items, item_bits, merge_partials, noisy_weights
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.selection.basic import BasicPartialsFn
from dp_partition_beam.transforms.selection.counts import NoisyCounts
from dp_partition_beam.transforms.selection.mad import MADWeights
from dp_partition_beam.transforms.selection.mad_kernels import (
    check_mad_params,
    mad_contribution_partials,
    mad_init_partials,
    mad_item_excess,
)
from dp_partition_beam.transforms.selection.mad_sips import zero_partials
from dp_partition_beam.transforms.selection.mad_sips_kernels import round_sets

# ---------------------------------------------------------------------------------------------
# Entry: (user, text) elements or Arrow batches -> token tables sharded by user
# ---------------------------------------------------------------------------------------------


class ToTextBatchesFn(beam.DoFn):
    """(user, text) elements or Arrow batches (user, text) -> Table(user: binary, text: string) of
    <= ``batch_rows`` records and about <= ``MAX_BATCH_CHARS`` characters of text (Arrow string offsets
    are 32-bit)."""

    MAX_BATCH_CHARS = 1 << 26

    def __init__(self, batch_rows: int):
        self._batch_rows = batch_rows
        self._users: List = []
        self._texts: List = []
        self._chars = 0

    def start_bundle(self):
        self._users, self._texts, self._chars = [], [], 0

    def _flush(self) -> Optional[pa.Table]:
        if not self._users:
            return None
        table = dpne_kernels.texts_table(self._users, self._texts)
        self._users, self._texts, self._chars = [], [], 0
        E.check_key_column(table.column(USER), USER, "DPNE", E.DPNE_SHAPE, "(user, text) pair")  # no empty user
        return table

    def process(self, element):
        if type(element) is tuple and len(element) == 2 and type(element[0]) is str and type(element[1]) is str:
            user, text = element  # the hot path; an empty user is found per flushed batch (Arrow)
        elif isinstance(element, (pa.RecordBatch, pa.Table)):
            # columns, types, nulls
            E.check_batch_schema(element, "DPNE", E.DPNE_SHAPE, dpne_kernels.TEXT, int_users=True)
            for start in range(0, element.num_rows, self._batch_rows):
                table = dpne_kernels.normalise_text_batch(element.slice(start, self._batch_rows))
                E.check_key_column(table.column(USER), USER, "DPNE", E.DPNE_SHAPE)  # no empty user
                yield owned(table)
            return
        else:
            user, text = E.check_pair(element, "DPNE", E.DPNE_SHAPE, dpne_kernels.TEXT)  # typed user keys, or an error
        self._users.append(user)
        self._texts.append(text)
        self._chars += len(text)
        if len(self._users) >= self._batch_rows or self._chars >= self.MAX_BATCH_CHARS:
            yield self._flush()

    def finish_bundle(self):
        table = self._flush()
        if table is not None:
            yield in_global_window(table)


class TokenizeFn(beam.DoFn):
    """Table(user, text) -> Table(user, token, rem) (:func:`transforms.dpne.dpne_kernels.tokenize_table`)."""

    def __init__(self, tokenizer):
        self._tokenizer = None if tokenizer is tx.default_tokenize else tokenizer

    def process(self, table):
        tokens = dpne_kernels.tokenize_table(table, self._tokenizer)
        if tokens.num_rows:
            yield tokens


def with_min_shards(count, minimum):
    """The shard count: at least ``minimum`` (the ``num_shards`` option)."""
    return max(int(minimum), int(count))


class ShardTokensFn(beam.DoFn):
    """Table(user, token, rem) -> (user shard, rows of that shard) (whole lines: a user's rows stay together)."""

    def process(self, table, num_shards):
        yield from split_packed(table, shard_ids(table.column(USER), num_shards), num_shards)


def token_user_pieces(shard, tables):
    """(shard, [Table(user, token, rem)]) -> (shard, piece): the shard's rows grouped by user (stable: a
    user's tokens keep their order) and cut between users into pieces of about DEFAULT_CHUNK_ROWS rows,
    so no element grows with the data (Flink rejects records larger than its sort buffer)."""
    table = unpack_all(tables)
    codes, _ = dictionary_codes(table.column(USER))
    order = np.argsort(codes, kind="stable")
    table = table.take(pa.array(order))
    for piece in user_chunks(table, codes[order]):
        yield shard, piece


class TokensByUser(beam.PTransform):
    """(user, text) elements / Arrow batches -> ((user shard, Table(user, token, rem)), S)."""

    def __init__(self, tokenizer, batch_rows, rows_per_shard, min_shards, label=None):
        super().__init__(label)
        self._tokenizer, self._batch_rows = tokenizer, batch_rows
        self._rows_per_shard, self._min_shards = rows_per_shard, min_shards

    def expand(self, records):
        require_global_window(records, "DPNE")
        tokens = (
            records
            | "Batch" >> beam.ParDo(ToTextBatchesFn(self._batch_rows))  # Table(user, text)
            | "Tokenize" >> beam.ParDo(TokenizeFn(self._tokenizer))  # Table(user, token, rem)
        )
        num_shards = (
            tokens
            | "ShardCount" >> ShardCount(self._rows_per_shard)  # ceil(tokens / rows_per_shard)
            | "MinShards" >> beam.Map(with_min_shards, self._min_shards)  # S
        )
        sharded = (
            tokens
            | "ShardUsers" >> beam.ParDo(ShardTokensFn(), beam.pvalue.AsSingleton(num_shards))
            # (user shard, Packed(user, token, rem))
            | "GroupUsers" >> beam.GroupByKey()  # (user shard, [Packed])
            | "UserPieces" >> beam.FlatMapTuple(token_user_pieces)  # (user shard, Table(user, token, rem))
        )
        return sharded, num_shards


# ---------------------------------------------------------------------------------------------
# One level / run on the user shards
# ---------------------------------------------------------------------------------------------


class LevelCapFn(beam.DoFn):
    """(user shard, tokens) -> (user shard, Table(user, item, degree)): the run's (valid) n-grams of each
    user, allowlisted, distinct, bottom-k subsampled to ``max_contributions`` (round ``round_``).

    Side inputs: ``seed`` (the run seed), ``s_prev``/``s1`` (lists of released n-grams; None without
    pruning), ``allowlist`` (list of n-grams or None). A shard of more than ``chunk_rows`` tokens is
    capped a chunk of lines at a time (:func:`transforms.dpne.dpne_kernels.capped_level`).
    """

    def __init__(
        self,
        lengths,
        pruning: Optional[str],
        max_contributions: int,
        round_: int,
        chunk_rows=dpne_kernels.DEFAULT_CHUNK_ROWS,
    ):
        self._lengths, self._pruning = tuple(lengths), pruning
        self._cap, self._round, self._chunk_rows = max_contributions, round_, chunk_rows
        self._caches = None

    def setup(self):
        self._caches = (SideInputCache(), SideInputCache(), SideInputCache())

    def process(self, element, seed, s_prev=None, s1=None, allowlist=None):
        if self._caches is None:
            self.setup()
        shard, tokens = element
        prev_c, s1_c, allow_c = self._caches
        capped = dpne_kernels.capped_level(
            tokens,
            self._lengths,
            self._cap,
            seed,
            self._round,
            prev_c.get(s_prev, dpne_kernels.string_array) if self._pruning else None,
            s1_c.get(s1, dpne_kernels.string_array) if self._pruning else None,
            self._pruning or "both",
            allow_c.get(allowlist, dpne_kernels.string_array),
            self._chunk_rows,
        )  # Table(user, item, degree), <= max_contributions per user
        if capped.num_rows:
            yield shard, capped


def merge_shard(shard, partials):
    """(item shard, [Packed partials]) -> (item shard, Table(item, weight, holders))."""
    return shard, merge_partials(unpacked(partials))


class NoisyKeepFn(WorkerRngDoFn):
    """(item shard, Table(item, weight, holders)) -> (item key bytes, holders) with
    ``weight + sigma Z >= rho`` (rho from the level side input; Z keyed (seed, 'noise', round, item)).

    With a keep table (``table``, :class:`privacy.dpne.LevelTable`): kept iff 64 bits keyed (seed, 'noise',
    round, item) are below F(weight) 2^64, the table built from the level's rate q_k at k >= 2 (its
    'spurious_prob'; no table, ``keep_table`` None, when V_k is empty)."""

    def __init__(self, sigma: Optional[float], round_: int, seed: Optional[int], table=None):
        super().__init__(seed)
        self._sigma, self._round, self._table = sigma, round_, table

    def process(self, element, level):
        if self._table is not None:
            yield from self._keep(element, level)
            return
        rho = level["rho"]
        if rho is None:
            return
        _, w = element
        noisy = noisy_weights(
            w.column(ITEM), w.column("weight").to_numpy(), "gaussian", self._sigma, self._seed, self._round, self._rng
        )
        idx = pa.array(np.flatnonzero(passes_threshold(noisy, rho)))
        yield from zip(w.column(ITEM).take(idx).to_pylist(), w.column("holders").take(idx).to_pylist())

    def _keep(self, element, level):
        if level["keep_table"] is None:  # V_k empty
            return
        table = self._table.build(level.get("spurious_prob", 0.0))  # level 1: F(0) = 0; cached per process
        _, w = element
        bits = item_bits(w.column(ITEM), self._seed, self._round, self._rng)
        idx = pa.array(np.flatnonzero(table.keep(w.column("weight").to_numpy(), bits)))
        yield from zip(w.column(ITEM).take(idx).to_pylist(), w.column("holders").take(idx).to_pylist())


def support_keys_by_shard(element, num_shards):
    """(shard, Table(item, ...)) -> (item shard, Packed(item)) of its n-grams, by the item shard of their key
    bytes (the support of a MAD-SIPS round also holds the level's earlier releases under key 0)."""
    items = element[1].select([ITEM])
    yield from split_packed(items, shard_ids(items.column(ITEM), num_shards), num_shards)


def outside_support(shard, grouped):
    """(item shard, {'drawn': [[g]], 'support': [Packed(item)]}) -> the drawn k-grams g of the shard outside
    supp(H) (a shard with no support: all of them)."""
    drawn = sorted({g for grams in grouped["drawn"] for g in grams})
    support = unpacked(grouped["support"])
    if drawn and support:
        keys = dpne_kernels.string_array(drawn).cast(pa.binary())
        items = pa.chunked_array([c for t in support for c in t.column(ITEM).chunks], type=pa.binary())
        inside = pc.is_in(keys, value_set=items.combine_chunks())
        drawn = [g for g, i in zip(drawn, inside.to_pylist()) if not i]
    yield from drawn


def decode_holders(element):
    """(item key bytes, holders) -> (n-gram, holders)."""
    item, holders = element
    return from_key_bytes(item), holders


def with_zero_holders(g):
    """g -> (g, 0) (a spurious k-gram: outside supp(H_k), no capped user holds it)."""
    return g, 0


# ---------------------------------------------------------------------------------------------
# Small functions of the level reports and the spurious step (module level: picklable)
# ---------------------------------------------------------------------------------------------


def level_sizes(grams, pruning, s1):
    """[(k-1)-gram] of S_{k-1} -> (|S_{k-1}|, |V_k|, grams), |V_k| as the reference computes it
    (:func:`transforms.dpne.dpne_kernels.valid_count_exact`)."""
    grams = list(grams)
    return len(grams), dpne_kernels.valid_count_exact(grams, s1, pruning), grams


def first(element):
    return element[0]


def tag_length(element):
    """(g, holders) -> (len(g), g)."""
    return tx.ngram_len(element[0]), element[0]


def tag_k(gram, k):
    return k, gram


def tag_count(element):
    """(g, count) -> (len(g), (g, count))."""
    return tx.ngram_len(element[0]), element


def untag_count(element):
    """(k, (g, count)) -> (k, g)."""
    k, (g, _) = element
    return k, g


def with_released(count, level):
    out = dict(level)
    out["released"] = int(count)
    return out


def level_one(_, plan: RunPlan, weighting, beta):
    return level_one_report(plan, weighting, beta)


def baseline_level(_, plan: RunPlan, weighting, beta):
    return baseline_run_report(plan, weighting, beta)


def level_k(_, k, sigma, max_contributions, eta, weighting, beta, sizes, v_estimate=None, table=None):
    """The public parameters of level k >= 2, from the released sizes (|S_{k-1}|, |V_k|, ...) (``v_estimate``:
    supplement Alg. 2's estimate of |V_k|, which then sets rho_k instead; ``table``: the level's
    :class:`privacy.dpne.LevelTable`, whose table is built here from q_k)."""
    s_prev_size, v_size = sizes[0], sizes[1]
    v_size = v_size if v_estimate is None else v_estimate
    return level_k_report(k, sigma, max_contributions, eta, weighting, beta, s_prev_size, v_size, table)


def spurious_level_k(_, k, sigma, max_contributions, eta, weighting, beta, sizes, v_estimate=None, table=None):
    """What the spurious step of level k >= 2 reads, in one singleton: the level dict (rho_k or the table, q_k)
    and S_{k-1} (``s_prev``, the list; the exact |V_k| is its sampler's size, :class:`SpuriousSubsetFn`)."""
    level = level_k(_, k, sigma, max_contributions, eta, weighting, beta, sizes, v_estimate, table)
    return dict(level, s_prev=sizes[2])


def valid_size(sizes):
    """(|S_{k-1}|, |V_k|, grams) -> |V_k|."""
    return sizes[1]


def level_tau(level):
    return level["tau"]


class EstimateValidFn(WorkerRngDoFn):
    """Supplement Alg. 2 on the released S_1, S_{k-1} (side inputs): the estimate of |V_k| (rounded)."""

    def __init__(self, k, p, seed):
        super().__init__(seed)
        self._k, self._p, self._seed = k, p, seed

    def process(self, _, s_prev, s1):
        gen = randomness.keyed_generator(self._seed, "vk_estimate", self._k, 0) if self._seed is not None else self._rng
        yield int(round(dpne_kernels.valid_count_sample(sorted(s_prev), sorted(s1), self._p, gen)))


class SpuriousSubsetFn(WorkerRngDoFn):
    """Level k's spurious draws, one element: the Bernoulli(q_k) subset of V_k (S_{k-1} in the level singleton,
    S_1 a side input; :func:`transforms.dpne.dpne_kernels.spurious_subset`, randomness round k) -> (item shard,
    [g]) by the item shard of g. It reads the public plan only: no count of the support sizes the draws or their
    failure event (docs/dpne.md, "The spurious draws as a subset of V_k"). Nothing is emitted when V_k is empty
    or nothing is drawn.
    """

    def __init__(self, k, seed, pruning):
        super().__init__(seed)
        self._k, self._seed, self._pruning = k, seed, pruning

    def process(self, _, level, s1, num_shards):
        if not level["spurious_prob"] > 0.0:  # V_k empty (rho_k None)
            return
        sampler = dpne_kernels.ValidSampler(level["s_prev"], s1, self._pruning)  # exact |V_k| = sampler.size
        drawn = dpne_kernels.spurious_subset(sampler, level["spurious_prob"], self._k, self._seed, self._rng)
        if not drawn:
            return
        by_shard = {}
        for g, shard in zip(drawn, shard_ids(dpne_kernels.string_array(drawn).cast(pa.binary()), num_shards).tolist()):
            by_shard.setdefault(shard, []).append(g)
        yield from by_shard.items()


class LevelSizes(beam.PTransform):
    """S_{k-1} (released (k-1)-grams) -> singleton (|S_{k-1}|, |V_k|, [(k-1)-gram]) (:func:`level_sizes`).

    S_{k-1} is public and small (every level's capping reads it as a side input), so one worker computes
    both sizes from the list. One singleton that carries the list to the spurious step keeps the paths of
    Flink's plan walk few (:mod:`pipelines.flink_plan`): every step of level k that reads S_{k-1} more than
    once, along routes that meet again, multiplies them.
    """

    def __init__(self, pruning, s1, label=None):
        super().__init__(label)
        self._pruning, self._s1 = pruning, s1

    def expand(self, s_prev):
        return (
            s_prev
            | "Gather" >> beam.combiners.ToList()  # [(k-1)-gram] of S_{k-1}
            | "Sizes" >> beam.Map(level_sizes, self._pruning, beam.pvalue.AsList(self._s1))  # (|S_{k-1}|, |V_k|, [g])
        )


# ---------------------------------------------------------------------------------------------
# One noisy histogram run
# ---------------------------------------------------------------------------------------------


class _NoisyRun(beam.PTransform):
    """(user shard, tokens) -> the run's noise-released n-grams and the histogram H.

    Returns ``(kept, support)``:
      kept       (n-gram, holders) with H + sigma Z >= rho (holders: capped users holding it)
      support    (item shard, Table(item, weight, holders)): H over supp(H), partitioned by item shard
    """

    def __init__(self, run_args, level, seed, seed_arg, num_shards, side_args, table=None, label=None):
        super().__init__(label)
        self._lengths, self._pruning, self._sigma, self._cap, self._round, self._weighting, self._d_max = run_args
        self._table = table  # privacy.dpne.LevelTable: keep table instead of noise + rho
        self._level, self._seed, self._seed_arg = level, seed, seed_arg
        self._num_shards, self._side_args = num_shards, side_args

    def expand(self, tokens):
        capped = tokens | "Cap" >> beam.ParDo(
            LevelCapFn(self._lengths, self._pruning, self._cap, self._round), self._seed_arg, *self._side_args
        )  # (user shard, Table(user, item, degree)) <= Delta_k per user
        level_si = beam.pvalue.AsSingleton(self._level)
        if self._weighting == "mad":
            tau = beam.pvalue.AsSingleton(self._level | "Tau" >> beam.Map(level_tau))  # tau_k = rho_k + beta sigma_k
            grouped = capped | "MADWeights" >> MADWeights(tau, self._d_max, 1.0, 1.0, self._num_shards)
            # (item shard, [Packed partials]) of MAD's w(i)
        else:
            grouped = (
                capped
                | "Partials" >> beam.ParDo(BasicPartialsFn("weighted_gaussian"), self._num_shards)
                # (item shard, Packed(item, hi, mid, lo, holders))
                | "GroupItems" >> beam.GroupByKey()  # (item shard, [Packed partials])
            )
        merged = grouped | "Merge" >> beam.MapTuple(merge_shard)  # (item shard, Table(item, weight, holders)) = H
        kept = (
            merged
            | "NoisyKeep" >> beam.ParDo(NoisyKeepFn(self._sigma, self._round, self._seed, self._table), level_si)
            # (item bytes, holders), noisy >= rho (or kept by the level's table)
            | "Decode" >> beam.Map(decode_holders)  # (g, holders)
        )
        return kept, merged


class _Spurious(beam.PTransform):
    """Level k's spurious k-grams: support -> g, the Bernoulli(q_k) subset of V_k minus supp(H_k).

    Each k-gram of V_k outside the support is released independently with probability q_k: supplement Alg. 1's
    ``Bin(|V_k| - |supp H_k|, q_k)`` uniform k-grams of V_k minus supp(H_k) in law, drawn from the public plan
    alone (:class:`SpuriousSubsetFn`), so the draws and their failure event depend on no data; the support only
    drops the drawn k-grams it holds. ``k`` is the randomness round of the draws (the level k). ``level``: a
    singleton dict with 'spurious_prob' (0: nothing is drawn) and 's_prev' (S_{k-1}, a list).

    Stages (shapes after each step):
      Subset        (item shard, [g])           the Bernoulli(q_k) subset of V_k, by the item shard of g
      SupportKeys   (item shard, Packed(item))  supp(H_k)'s n-grams, by the same item shard
      ByShard       (item shard, {'drawn', 'support'})
      Outside       g                           the drawn k-grams outside supp(H_k)

    The draws meet the support in a keyed join (not as a side input of a step whose output meets them again): a
    level's steps read few PCollections derived from S_{k-1} twice, which keeps the paths of Flink's plan walk
    few (:mod:`pipelines.flink_plan`; docs/engines.md).
    """

    def __init__(self, k, level, s1, pruning, seed, num_shards, label=None):
        super().__init__(label)
        self._k, self._level, self._s1, self._pruning, self._seed = k, level, s1, pruning, seed
        self._num_shards = num_shards  # singleton side input (the item shards' count)

    def expand(self, support):
        drawn = (
            support.pipeline
            | "PlanSeed" >> beam.Create([None])
            | "Subset"
            >> beam.ParDo(
                SpuriousSubsetFn(self._k, self._seed, self._pruning),
                beam.pvalue.AsSingleton(self._level),
                beam.pvalue.AsList(self._s1),
                self._num_shards,
            )  # (item shard, [g]), the Bernoulli(q_k) subset of V_k
        )
        keys = support | "SupportKeys" >> beam.FlatMap(support_keys_by_shard, self._num_shards)
        # (item shard, Packed(item))
        return (
            {"drawn": drawn, "support": keys}
            | "ByShard" >> beam.CoGroupByKey()  # (item shard, {'drawn': [[g]], 'support': [Packed(item)]})
            | "Outside" >> beam.FlatMapTuple(outside_support)  # g, drawn and outside supp(H_k)
        )


# ---------------------------------------------------------------------------------------------
# MAD-SIPS inside a level (selection='mad_sips'; reference: transforms.dpne.reference.level_mad_sips)
# ---------------------------------------------------------------------------------------------

#: the cap of a level's full distinct sets with selection='mad_sips' (each round re-subsamples them to Delta_k
#: itself): bottom-k to a cap no user reaches keeps every distinct (valid) n-gram
NO_CAP = 1 << 62

# The elements of a level's chain are (shard, (tag, Packed table, ctx)), ctx = (the level's rounds, the number of
# shards): both public (the rounds a function of the level dict) and travelling with every element, so no step of
# the chain reads a side input computed inside the level, and Flink's plan walk meets S_{k-1} along few routes
# (docs/engines.md); nor does a singleton feed more steps than Flink's optimizer takes (64 outputs a node).
ROWS = "rows"  # Table(user, item, bias, hopeless): a user's remaining full set, by user shard (round r >= 2's input)
INIT = "init"  # partials of MAD's w_init (Alg. 3 lines 3-5), by item shard
CAPPED = "capped"  # Table(user, item, degree[, bias][, r]): round r's capped sets, by item shard then by user shard
CONTRIB = "contrib"  # partials of the users' contributions (Alg. 3 lines 9-17), by item shard
FULL = "full"  # Table(user, item): the remaining full sets (r < R), whose items round r gives a status
TRUNC = "trunc"  # partials of w_trunc = min(w_init, tau) (Alg. 3 line 8)
RELEASED = "released"  # Table(item, round, holders): S_k so far, holders in round 1's capped sets
HOLDERS1 = "holders1"  # Table(item, holders): round 1's support not released in round 1 (for the counts)
CANDIDATES = "candidates"  # Table(item, round): the spurious draws of the rounds still to come
#: item-level tables that ride along at their item shard's index, whatever the key of the hop
CARRIED = (FULL, TRUNC, RELEASED, HOLDERS1, CANDIDATES)


def mad_sips_plan(_, run: RunPlan, params: DPNEParams, sizes=None, v_estimate=None):
    """A level's public plan with selection='mad_sips', one singleton: {'level': the level dict, 'rounds': its
    :func:`privacy.dpne.level_rounds` (level k >= 2's from q_k, known once S_{k-1} and |V_k| are), 's_prev':
    S_{k-1} (a list), 'v_exact': the exact |V_k|} (None, None at level 1)."""
    k = run.lengths[0]
    if k == 1:
        level = level_one_report(run, params.weighting, params.beta)
        return {"level": level, "rounds": level_rounds(run, params, None), "s_prev": None, "v_exact": None}
    args = (k, run.sigma, run.max_contributions, params.eta, params.weighting, params.beta, sizes, v_estimate)
    level = level_k(None, *args, table=run.table)
    rounds = level_rounds(run, params, level["spurious_prob"])
    return {"level": level, "rounds": rounds, "s_prev": sizes[2], "v_exact": sizes[1]}


def sum_round_counts(n_rounds: int, counts) -> tuple:
    """Per-round numbers of released n-grams, summed over the item shards (zeros when none)."""
    total = [0] * n_rounds
    for c in counts:
        total = [a + int(b) for a, b in zip(total, c)]
    return tuple(total)


def mad_sips_report(counts, plan):
    """The level report with the rounds and what each released (:func:`privacy.dpne.rounds_report`), before
    |S_k| is added."""
    return rounds_report(plan["level"], plan["rounds"], counts)


def _emit(shard, tag, table, ctx):
    """(shard, (tag, Packed piece, ctx)) for the pieces of a table (nothing for an empty one)."""
    for piece in bounded_pieces(table):
        yield shard, (tag, Packed.of(piece), ctx)


def _emit_by(table, column, tag, ctx):
    """The rows of ``table`` to the shard of their ``column`` (user or item) key."""
    num_shards = ctx[1]
    if table.num_rows == 0:
        return
    for shard, rows in split_by_shard(table, shard_ids(table.column(column), num_shards), num_shards):
        yield from _emit(shard, tag, rows, ctx)


def _gather(values):
    """A group of chain elements -> (ctx: the rounds and the number of shards, {tag: [Packed]})."""
    ctx, parts = None, defaultdict(list)
    for tag, packed, c in values:
        ctx = c
        parts[tag].append(packed)
    return ctx, parts


def _pass(shard, parts, ctx):
    """Every carried table of a group, on to the next hop at the same shard index (packed as it came)."""
    for tag in CARRIED:
        for packed in parts.get(tag, ()):
            yield shard, (tag, packed, ctx)


def _tables(parts, tag) -> List[pa.Table]:
    return [p.table() for p in parts.get(tag, ())]


def _np(column) -> np.ndarray:
    """A table column (chunked or not) as numpy, booleans included."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False)


def _distinct_biases(rows: pa.Table) -> pa.Table:
    """Table(item, bias) of the hopeful items of round r's rows (one bias per item: its status's)."""
    hopeful = rows.filter(pa.array(~_np(rows.column("hopeless"))))
    codes, items = dictionary_codes(hopeful.column(ITEM))
    _, first = np.unique(codes, return_index=True)
    return pa.table({ITEM: items, "bias": _np(hopeful.column("bias"))[first]})


class _RoundSets:
    """Round r's per-user step on whole users' remaining full sets (as :class:`transforms.selection.mad_sips.
    RoundSetsFn`'s ``whole``): drop each user's hopeless n-grams unless all are (Alg. 4 line 13), bottom-k to
    Delta_k with round r's priorities, the biases attached (1 for a kept hopeless n-gram); then MAD's w_init
    partials and the capped rows by item shard, and for r < R the remaining full rows by item shard."""

    def __init__(self, r: int, cap: int, d_max: float, b_min: float, b_max: float):
        self._r, self._cap, self._d_max = r, int(cap), d_max
        self._b = (1.0, 1.0) if r == 1 else (b_min, b_max)  # round 1: unbiased MAD (Alg. 4 line 5)

    def outputs(self, rows: pa.Table, ctx, seed):
        rounds, num_shards = ctx
        rd = rounds[self._r - 1]
        pairs = rows.select([USER, ITEM])
        if "hopeless" in rows.column_names:  # r >= 2: the rows carry their n-gram's status
            capped = round_sets(pairs, self._cap, seed, rd.round_, _np(rows.column("hopeless")), _distinct_biases(rows))
        else:
            capped = round_sets(pairs, self._cap, seed, rd.round_)  # Table(user, item, degree[, bias])
        init = mad_init_partials(capped, self._b[0], self._d_max)  # Alg. 3 lines 3-5
        for shard, packed in by_item_shard(init, num_shards):
            yield shard, (INIT, packed, ctx)
        yield from _emit_by(capped, ITEM, CAPPED, ctx)
        if self._r < len(rounds):
            yield from _emit_by(pairs, ITEM, FULL, ctx)


class LevelRoundOneFn(beam.DoFn):
    """(user shard, tokens) -> round 1's outputs (:class:`_RoundSets`) of every user's distinct valid k-grams
    (:func:`transforms.dpne.dpne_kernels.capped_level` with no cap). Side inputs: the run seed, the level's plan
    (:func:`mad_sips_plan`: the rounds, S_{k-1}), S_1 (a list, None at level 1), the allowlist, the shards."""

    def __init__(self, lengths, pruning, k, cap, d_max, b_min, b_max, chunk_rows=dpne_kernels.DEFAULT_CHUNK_ROWS):
        self._lengths, self._pruning, self._k, self._chunk_rows = tuple(lengths), pruning, k, chunk_rows
        self._sets = _RoundSets(1, cap, d_max, b_min, b_max)
        self._caches = None

    def setup(self):
        self._caches = (SideInputCache(), SideInputCache(), SideInputCache())

    def process(self, element, seed, plan, s1=None, allowlist=None, num_shards=1):
        if self._caches is None:
            self.setup()
        shard, tokens = element
        prev_c, s1_c, allow_c = self._caches
        pruned = self._pruning is not None
        full = dpne_kernels.capped_level(
            tokens,
            self._lengths,
            NO_CAP,
            seed,
            self._k,
            prev_c.get(plan, lambda p: dpne_kernels.string_array(p["s_prev"])) if pruned else None,
            s1_c.get(s1, dpne_kernels.string_array) if pruned else None,
            self._pruning or "both",
            allow_c.get(allowlist, dpne_kernels.string_array),
            self._chunk_rows,
        )  # Table(user, item, degree): every distinct valid k-gram of each user
        if full.num_rows:
            yield from self._sets.outputs(full.select([USER, ITEM]), (plan["rounds"], num_shards), seed)


class RoundUsersFn(beam.DoFn):
    """(user shard, [elements]) -> round r >= 2's outputs (:class:`_RoundSets`) of the users' remaining rows."""

    def __init__(self, r, cap, d_max, b_min, b_max):
        self._sets = _RoundSets(r, cap, d_max, b_min, b_max)

    def process(self, element, seed):
        shard, values = element
        ctx, parts = _gather(values)
        rows = _tables(parts, ROWS)
        if rows:
            yield from self._sets.outputs(concat(rows), ctx, seed)
        yield from _pass(shard, parts, ctx)


class RoundExcessFn(beam.DoFn):
    """(item shard, [elements]) -> the capped rows with r(i) of their item (Alg. 3 line 6, erratum max), by
    user shard, and w_trunc's partials (line 8) carried on (MAD's first pass, :func:`mad_item_excess`)."""

    def __init__(self, r: int):
        self._r = r

    def process(self, element):
        shard, values = element
        ctx, parts = _gather(values)
        rounds = ctx[0]
        capped = _tables(parts, CAPPED)
        if capped:
            capped = concat(capped)
            r = np.zeros(capped.num_rows)
            init = _tables(parts, INIT)  # none when no holder of the shard's n-grams is adaptive (w_init = 0)
            if init:
                hot, trunc = mad_item_excess(merge_partials(init), rounds[self._r - 1].tau)
                if hot.num_rows:
                    pos = ItemIndex(hot.column(ITEM)).positions(capped.column(ITEM))
                    r[pos >= 0] = _np(hot.column("r"))[pos[pos >= 0]]
                yield from _emit(shard, TRUNC, trunc, ctx)
            yield from _emit_by(capped.append_column("r", pa.array(r)), USER, CAPPED, ctx)
        yield from _pass(shard, parts, ctx)


class RoundContribFn(beam.DoFn):
    """(user shard, [elements]) -> the users' contributions (Alg. 3 lines 9-17, Alg. 2 for biased users) by
    item shard (:func:`mad_contribution_partials` with the rows' r(i)); every row of a user is in its group."""

    def __init__(self, r, d_max, b_min, b_max):
        self._r, self._d_max = r, d_max
        self._b = (1.0, 1.0) if r == 1 else (b_min, b_max)

    def process(self, element):
        shard, values = element
        ctx, parts = _gather(values)
        rounds, num_shards = ctx
        capped = _tables(parts, CAPPED)
        if capped:
            t = concat(capped)
            sets = t.select([c for c in (USER, ITEM, "degree", "bias") if c in t.column_names])
            partials = mad_contribution_partials(
                sets, None, rounds[self._r - 1].tau, self._d_max, *self._b, r_rows=_np(t.column("r"))
            )
            for s, packed in by_item_shard(partials, num_shards):
                yield s, (CONTRIB, packed, ctx)
        yield from _pass(shard, parts, ctx)


def _empty_released() -> pa.Table:
    return pa.table(
        {ITEM: pa.array([], pa.binary()), "round": pa.array([], pa.int64()), "holders": pa.array([], pa.int64())}
    )


def _holders_of(items: pa.Array, table: Optional[pa.Table]) -> np.ndarray:
    """Each item's holders in Table(item, holders) (0 if absent)."""
    out = np.zeros(len(items), dtype=np.int64)
    if table is not None and table.num_rows and len(items):
        pos = ItemIndex(table.column(ITEM)).positions(items)
        out[pos >= 0] = _np(table.column("holders"))[pos[pos >= 0]]
    return out


class RoundStatusFn(WorkerRngDoFn):
    """(item shard, [elements]) -> round r's status of the shard's n-grams, what it releases, and what the next
    round needs (:func:`transforms.dpne.dpne_kernels.level_round_status`).

    One noisy entry per n-gram of the support and of the remaining full sets (weight 0 outside the support:
    level 1 pure noise, k >= 2 the truncated draw below rho_r); released: on the support and >= rho_r, and for
    k >= 2 round r's spurious draws (a Bernoulli(f_r q_k) subset of V_k, :func:`dpne_kernels.spurious_subset`)
    outside the support and S_k so far. For r < R: the remaining full rows with their item's bias and hopeless
    flag by user shard, S_k so far, round 1's holders and the later rounds' draws carried on. For r = R: S_k as
    (item bytes, holders in round 1's capped sets), and tagged COUNTS the numbers each round released.
    """

    COUNTS = "counts"

    def __init__(self, r: int, known_domain: bool, c_lb: float, c_ub: float, seed: Optional[int]):
        super().__init__(seed)
        self._r, self._known, self._c_lb, self._c_ub = r, known_domain, c_lb, c_ub

    def process(self, element):
        shard, values = element
        ctx, parts = _gather(values)
        rounds = ctx[0]
        r, n_rounds = self._r, len(rounds)
        partials = _tables(parts, TRUNC) + _tables(parts, CONTRIB)
        full = concat(_tables(parts, FULL)) if parts.get(FULL) else None
        if full is not None:
            partials.append(zero_partials(pc.unique(full.column(ITEM))))  # the full sets' n-grams: a status each
        status = None
        if partials:
            status = dpne_kernels.level_round_status(
                merge_partials(partials), rounds, r, self._known, self._c_lb, self._c_ub, self._seed, self._rng
            )  # Table(item, released, holders, bias, hopeless)
        before = concat(_tables(parts, RELEASED)) if parts.get(RELEASED) else _empty_released()  # S_k so far
        holders1 = concat(_tables(parts, HOLDERS1)) if parts.get(HOLDERS1) else None
        if status is not None:
            released = status.filter(status.column("released"))
            items, holders = released.column(ITEM).combine_chunks(), _np(released.column("holders"))
        else:
            items, holders = pa.array([], pa.binary()), np.zeros(0, dtype=np.int64)
        later = None
        if parts.get(CANDIDATES):
            cands = concat(_tables(parts, CANDIDATES))  # Table(item, round)
            rnd = _np(cands.column("round"))
            drawn = cands.filter(pa.array(rnd == r))
            if status is not None:
                drawn = drop_items(drawn, status.filter(pc.greater(status.column("holders"), 0)).column(ITEM))
            spurious = drop_items(drawn, before.column(ITEM)).column(ITEM)  # outside supp H_r and U_<r
            items = pa.concat_arrays([items, spurious.combine_chunks()])
            holders = np.concatenate([holders, np.zeros(len(spurious), dtype=np.int64)])
            later = cands.filter(pa.array(rnd > r))
        if r >= 2:  # holders in round 1's capped sets (0 if none)
            holders = _holders_of(items, holders1)
        round_r = pa.table({ITEM: items, "round": np.full(len(items), r, dtype=np.int64), "holders": holders})
        so_far = concat([before, round_r])
        if r == n_rounds:
            for item, h in zip(so_far.column(ITEM).to_pylist(), so_far.column("holders").to_pylist()):
                yield item, h  # (item bytes, holders) of S_k
            counts = np.bincount(_np(so_far.column("round")), minlength=n_rounds + 1)[1:]
            yield beam.pvalue.TaggedOutput(self.COUNTS, tuple(int(c) for c in counts))
            return
        if full is not None and full.num_rows:
            rows = drop_items(full, items)  # minus round r's release
            pos = ItemIndex(status.column(ITEM)).positions(rows.column(ITEM))  # every full n-gram has a status
            hopeless = _np(status.column("hopeless"))[pos]
            bias = np.where(hopeless, 1.0, _np(status.column("bias"))[pos])
            rows = pa.table({USER: rows.column(USER), ITEM: rows.column(ITEM), "bias": bias, "hopeless": hopeless})
            yield from _emit_by(rows, USER, ROWS, ctx)
        yield from _emit(shard, RELEASED, so_far, ctx)
        if r == 1 and status is not None:
            held = status.filter(pc.greater(status.column("holders"), 0))
            held = drop_items(held, items).select([ITEM, "holders"])
            yield from _emit(shard, HOLDERS1, held, ctx)
        elif holders1 is not None:
            yield from _emit(shard, HOLDERS1, holders1, ctx)
        if later is not None:
            yield from _emit(shard, CANDIDATES, later, ctx)


class SpuriousSubsetsFn(WorkerRngDoFn):
    """The level's spurious draws for every round, one element (k >= 2): round r's Bernoulli(f_r q_k) subset of
    V_k (:func:`transforms.dpne.dpne_kernels.spurious_subset`, from the public plan alone: no count of the
    support) -> (item shard, (CANDIDATES, Packed(item, round), ctx)), met by round 1's status step and
    carried on to the later rounds'."""

    def __init__(self, seed, pruning):
        super().__init__(seed)
        self._pruning = pruning

    def process(self, _, plan, s1, num_shards):
        rounds = plan["rounds"]
        live = [rd for rd in rounds if rd.spurious_prob and rd.spurious_prob > 0.0 and np.isfinite(rd.rho)]
        if not live:  # V_k empty: nothing can pass
            return
        sampler = dpne_kernels.ValidSampler(plan["s_prev"], s1, self._pruning)
        items, rnd = [], []
        for rd in live:
            drawn = dpne_kernels.spurious_subset(sampler, rd.spurious_prob, rd.round_, self._seed, self._rng)
            items += drawn
            rnd += [rd.index] * len(drawn)
        table = pa.table({ITEM: dpne_kernels.string_array(items).cast(pa.binary()), "round": pa.array(rnd, pa.int64())})
        yield from _emit_by(table, ITEM, CANDIDATES, (rounds, num_shards))


class _LevelMADSIPS(beam.PTransform):
    """(user shard, tokens) -> (n-gram, holders in round 1's capped sets) of S_k, and the level report (without
    |S_k|): MAD-SIPS's rounds inside level k (:func:`transforms.dpne.reference.level_mad_sips`), as one chain.

    Every step has one main input and no side input computed inside the level: the (user, n-gram) pairs, their
    per-n-gram state and the level's rounds travel together through keyed GroupByKeys (item shard, user shard,
    alternately), and what is per n-gram (S_k so far, round 1's holders, the later rounds' spurious draws, MAD's
    w_trunc) rides along at its item shard's index. So the plan's paths grow by few routes per level (Flink's
    plan walk, docs/engines.md): the level's plan is read by the first step and by the spurious draws only.

    Stages (round r = 1..R, randomness round round_r = k + 100 (r - 1); the rounds, from the plan singleton
    :func:`mad_sips_plan`, give sigma_r, rho_r, tau_r, f_r q_k):
      R1Sets / R{r}Sets   (item shard, INIT | CAPPED | FULL)   every distinct valid k-gram of each user (round
                          1) or the rows left (r >= 2, by user shard): hopeless ones dropped unless all are,
                          bottom-k to Delta_k with round_r's priorities, biases attached; MAD's w_init partials,
                          the capped rows and (r < R) the remaining full rows, by item shard
      R{r}Excess          (user shard, CAPPED with r | TRUNC)  w_init, r(i) and w_trunc per n-gram (Alg. 3 l.6-8)
      R{r}Contrib         (item shard, CONTRIB | carried)      each user's contributions (l.9-17), by item shard
      Spurious            (item shard, CANDIDATES)             k >= 2: every round's Bernoulli(f_r q_k) subset
                                                               of V_k, drawn once from the plan (met in round 1)
      R{r}Status          r < R: (user shard, ROWS | carried)  one noisy entry per n-gram, >= rho_r released,
                                                               the spurious draws outside supp H_r and S_k so
                                                               far released, the next round's biases
                          r = R: (item bytes, holders)         S_k; tagged COUNTS: released per round
      Counts, RoundsReport                                     the level dict with the rounds
    """

    def __init__(self, k, run, params, plan, seed, seed_arg, num_shards, s1, allowlist, label=None):
        super().__init__(label)
        self._k, self._run, self._params, self._plan = k, run, params, plan
        self._seed, self._seed_arg, self._num_shards = seed, seed_arg, num_shards
        self._s1, self._allowlist = s1, allowlist  # S_1 (a PCollection, None at level 1), the allowlist argument

    def expand(self, tokens):
        k, run, prm = self._k, self._run, self._params
        known = self._s1 is not None  # k >= 2: V_k is known, every round has spurious draws
        n_rounds = len(prm.budget_split)
        plan = beam.pvalue.AsSingleton(self._plan)
        s1 = None if self._s1 is None else beam.pvalue.AsList(self._s1)
        args = (run.max_contributions, prm.d_max, prm.b_min, prm.b_max)
        check_mad_params(1.0, prm.d_max, prm.b_min, prm.b_max)
        pruning = prm.pruning if known else None
        chain = tokens | "R1Sets" >> beam.ParDo(
            LevelRoundOneFn(run.lengths, pruning, k, *args), self._seed_arg, plan, s1, self._allowlist, self._num_shards
        )  # (item shard, INIT | CAPPED | FULL)
        for r in range(1, n_rounds + 1):
            if r >= 2:
                chain = (
                    chain
                    | f"R{r}ByUser" >> beam.GroupByKey()  # (user shard, [ROWS | carried])
                    | f"R{r}Sets" >> beam.ParDo(RoundUsersFn(r, *args), self._seed_arg)
                )  # (item shard, INIT | CAPPED | FULL | carried)
            chain = (
                chain
                | f"R{r}ByItem" >> beam.GroupByKey()  # (item shard, [INIT | CAPPED | FULL | carried])
                | f"R{r}Excess" >> beam.ParDo(RoundExcessFn(r))  # (user shard, CAPPED | carried)
                | f"R{r}ByUserContrib" >> beam.GroupByKey()  # (user shard, [CAPPED with r | carried])
                | f"R{r}Contrib" >> beam.ParDo(RoundContribFn(r, *args[1:]))
            )  # (item shard, CONTRIB | carried)
            if r == 1 and known:
                draws = (
                    tokens.pipeline
                    | "SpuriousSeed" >> beam.Create([None])
                    | "Spurious" >> beam.ParDo(SpuriousSubsetsFn(self._seed, prm.pruning), plan, s1, self._num_shards)
                )  # (item shard, CANDIDATES): every round's draws
                chain = (chain, draws) | "R1WithSpurious" >> beam.Flatten()
            status_fn = RoundStatusFn(r, known, prm.c_lb, prm.c_ub, self._seed)
            grouped = chain | f"R{r}ByItemStatus" >> beam.GroupByKey()  # (item shard, [CONTRIB | carried])
            if r < n_rounds:
                chain = grouped | f"R{r}Status" >> beam.ParDo(status_fn)  # (user shard, ROWS | ..)
            else:
                last = grouped | f"R{r}Status" >> beam.ParDo(status_fn).with_outputs(
                    RoundStatusFn.COUNTS, main="released"
                )  # (item bytes, holders) of S_k; COUNTS per round
        holders = last.released | "Decode" >> beam.Map(decode_holders)  # (g, holders)
        report = (
            last[RoundStatusFn.COUNTS]
            | "Counts" >> beam.CombineGlobally(functools.partial(sum_round_counts, n_rounds))  # released per round
            | "RoundsReport" >> beam.Map(mad_sips_report, plan)
        )  # level dict with the rounds
        return holders, report


# ---------------------------------------------------------------------------------------------
# DPNE
# ---------------------------------------------------------------------------------------------


class DPNE(beam.PTransform):
    """(user, text) elements or Arrow batches -> {'ngrams': (k, n-gram), 'levels': level dicts} for ``algorithm``.

    With ``params.release_counts`` also ``'counts'``: ``(k, (n-gram, noisy_count))`` for every released
    n-gram whose noisy count is >= ``params.min_users`` (``'ngrams'`` then holds exactly those; the
    levels themselves run on the released sets, the floor is post-processing). ``self.counts`` is the
    :class:`privacy.counts.CountPlan`.

    Args:
      algorithm: one of :data:`privacy.dpne.DPNE_ALGORITHMS`: 'dpne' (the paper's Algorithm 1) or the
        baselines 'dpsu_all', 'dpsu_even', 'dpsu_single' (paper section 3.1.2).
      params: :class:`privacy.dpne.DPNEParams`.
      seed: None (production: OS entropy on workers) or the reproducible-mode seed (NOT private
        against anyone who knows it); under a seed the output equals
        :func:`transforms.dpne.reference.dpne_reference`, whatever the batching and sharding.
      tokenizer: ``str -> list[str]`` (module-level function), default
        :func:`transforms.core.text.default_tokenize` (vectorised for ASCII texts).
      num_shards: execution option: the minimum number of user and item shards (the shard count is
        ``max(num_shards, ceil(tokens / rows_per_shard))``); changes the cost, never the output.
      allowlist: optional PUBLIC list of candidate n-grams (words joined by single spaces; an iterable
        or a PCollection): n-grams not in it are dropped at every level before bounding (docs/counts.md).
      batch_rows: records per Arrow batch gathered from the element API (execution option).
      rows_per_shard: target tokens per user shard (execution option).

    Input elements: ``(user, text)`` pairs and/or ``pyarrow`` RecordBatches/Tables with columns
    ``user`` (string, binary or integer, read as decimal text) and ``text`` (string), checked where they
    enter (:mod:`transforms.core.elements`): a pair is a 2-tuple (or 2-list) of a non-empty ``str`` user
    (or a typed key: ``int``, not ``bool``, distinct from its decimal string; non-empty ``bytes``; a
    non-empty tuple of those) and a ``str`` text (any, an empty one has no n-grams); a batch's columns,
    types, nulls and empty users are checked per batch with Arrow. Anything else (a dict, ``None``, a
    list text, a 3-tuple, ...) raises :class:`transforms.core.elements.InputElementError` (a
    ``TypeError`` naming this shape and the element's type, never its content). The tokenizer's output
    is checked too (:class:`transforms.core.text.TokenizerError`). Global window only.
    """

    def __init__(
        self,
        algorithm: str,
        params: DPNEParams,
        *,
        seed: Optional[int] = None,
        tokenizer=tx.default_tokenize,
        num_shards: int = 8,
        allowlist=None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        label=None,
    ):
        super().__init__(label)
        self.sigma_star, self.runs = plan_runs(algorithm, params)  # validates; calibrated before any data is read
        #: 'optimal' (keep tables, privacy.dpne.plan_tables) or 'gaussian' (the paper's noise + threshold)
        self.threshold = resolved_threshold(algorithm, params)
        self.algorithm = algorithm
        self._params = params
        self._seed = seed
        self._tokenizer = tokenizer
        self._shards = max(1, int(num_shards))
        self._batch_rows = check_int("batch_rows", batch_rows, 1)
        self._rows_per_shard = check_int("rows_per_shard", rows_per_shard, 1)
        self.counts = plan_dpne_counts(algorithm, params)  # privacy.counts.CountPlan or None
        self.allowlist = check_allowlist(allowlist)

    def expand(self, texts):
        randomness.warn_if_seeded(self._seed)
        tokens, num_shards = texts | "Tokens" >> TokensByUser(
            self._tokenizer, self._batch_rows, self._rows_per_shard, self._shards
        )  # (user shard, Table(user, token, rem)), S
        self._num_shards = beam.pvalue.AsSingleton(num_shards)
        if self._seed is not None:
            self._seed_arg = self._seed
        else:
            self._seed_arg = beam.pvalue.AsSingleton(texts.pipeline | "RunSeed" >> RunSeed(None))  # OS entropy
        if self.allowlist is None:
            self._allow_arg = None
        elif isinstance(self.allowlist, beam.pvalue.PCollection):
            self._allow_arg = beam.pvalue.AsList(self.allowlist)
        else:
            self._allow_arg = sorted(self.allowlist)
        if self.algorithm == "dpne":
            return self._dpne(tokens)
        return self._dpsu(tokens)

    def _run(self, name, tokens, run, round_, level, s_prev=None, s1=None):
        prm = self._params
        pruning = prm.pruning if s_prev is not None else None
        run_args = (run.lengths, pruning, run.sigma, run.max_contributions, round_, prm.weighting, prm.d_max)
        side = [
            beam.pvalue.AsList(s_prev) if s_prev is not None else None,
            beam.pvalue.AsList(s1) if s1 is not None else None,
            self._allow_arg,
        ]
        return tokens | f"{name}/Run" >> _NoisyRun(
            run_args, level, self._seed, self._seed_arg, self._num_shards, side, run.table
        )  # (g, holders), H by item shard

    def _mad_sips(self, name, tokens, run, plan, s1=None):
        """Level k with selection='mad_sips': ((g, holders in round 1's capped sets) of S_k, the level dict with
        its rounds). ``plan``: the level's :func:`mad_sips_plan` singleton; ``s1``: S_1 (None at level 1)."""
        k = run.lengths[0]
        return tokens | f"{name}/MADSIPS" >> _LevelMADSIPS(
            k, run, self._params, plan, self._seed, self._seed_arg, self._num_shards, s1, self._allow_arg
        )  # (g, holders), level dict

    def _finish_level(self, name, released, level):
        count = released | f"{name}/CountReleased" >> beam.combiners.Count.Globally()  # |S_k|
        return count | f"{name}/Report" >> beam.Map(with_released, beam.pvalue.AsSingleton(level))  # level dict

    def _dpne(self, tokens):
        prm = self._params
        p = tokens.pipeline
        outputs, reports, counted = [], [], []
        s1 = s_prev = None
        mad = prm.selection == "mad_sips"
        for run in self.runs:
            k = run.lengths[0]
            name = f"L{k}"
            if k >= 2:
                sizes = s_prev | f"{name}/Sizes" >> LevelSizes(prm.pruning, s1)  # (|S_{k-1}|, |V_k|, [g])
                estimate = []
                if prm.vk_method == "sample" and prm.pruning == "both":
                    estimate = [
                        beam.pvalue.AsSingleton(
                            p
                            | f"{name}/EstSeed" >> beam.Create([None])
                            | f"{name}/EstimateValid"
                            >> beam.ParDo(
                                EstimateValidFn(k, prm.sample_rate, self._seed),
                                beam.pvalue.AsList(s_prev),
                                beam.pvalue.AsList(s1),
                            )
                        )
                    ]  # ~|V_k|
                level_args = (k, run.sigma, run.max_contributions, prm.eta, prm.weighting, prm.beta)
                level_args += (beam.pvalue.AsSingleton(sizes), *estimate)
            if mad:
                plan_args = () if k == 1 else (beam.pvalue.AsSingleton(sizes), *estimate)
                plan = (
                    p
                    | f"{name}/PlanSeed" >> beam.Create([None])
                    | f"{name}/Plan" >> beam.Map(mad_sips_plan, run, prm, *plan_args)
                )  # {level dict, rounds, S_{k-1}, |V_k|}: the level's one singleton
                released, level = self._mad_sips(name, tokens, run, plan, s1 if k >= 2 else None)
                # (w, holders in round 1's sets), level dict with the rounds
            elif k == 1:
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level" >> beam.Map(level_one, run, prm.weighting, prm.beta)
                )  # {rho_1, ...}
                kept, _ = self._run(name, tokens, run, k, level)  # (w, holders)
                released = kept
            else:
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level" >> beam.Map(level_k, *level_args, table=run.table)
                )  # {rho_k (or the keep table), q_k, |V_k|, ...}
                kept, support = self._run(name, tokens, run, k, level, s_prev, s1)  # (w, holders)
                spurious_level = (
                    p
                    | f"{name}/SpuriousSeed" >> beam.Create([None])
                    | f"{name}/SpuriousLevel" >> beam.Map(spurious_level_k, *level_args, table=run.table)
                )  # {rho_k, q_k, S_{k-1}}: one singleton (Flink's plan walk, _Spurious)
                spurious = support | f"{name}/Spurious" >> _Spurious(
                    k, spurious_level, s1, prm.pruning, self._seed, self._num_shards
                )  # w (spurious, 0 holders)
                released = (
                    kept,
                    spurious | f"{name}/ZeroHolders" >> beam.Map(with_zero_holders),
                ) | f"{name}/Union" >> beam.Flatten()  # (w, holders) in S_k
            s_k_holders = checkpoint(released, f"{name}/Checkpoint")  # (w, holders) of S_k, materialised
            s_k = s_k_holders | f"{name}/Ngrams" >> beam.Keys()  # w in S_k
            if k == 1:
                s1 = s_k
            outputs.append(s_k | f"{name}/TagK" >> beam.Map(tag_k, k))  # (k, w)
            reports.append(self._finish_level(name, s_k, level))
            if self.counts is not None:
                counted.append(self._count(name, s_k_holders, run))  # (k, (w, noisy_count))
            s_prev = s_k
        return self._outputs(outputs, reports, counted, "AllLevels")

    def _count(self, name, holders, run):
        """The run's released n-grams with their noisy counts on its capped sets: (k, (g, count)).

        ``holders``: (g, capped users holding g) of every released n-gram (0 for the spurious ones).
        """
        plan = dataclasses.replace(self.counts, round=run.round_)  # count noise keyed (seed, 'count_noise', round, g)
        noisy = holders | f"{name}/Counts" >> NoisyCounts(plan, self._seed, self._params.min_users)  # (g, count)
        return noisy | f"{name}/TagCounts" >> beam.Map(tag_count)  # (k, (g, count))

    def _outputs(self, outputs, reports, counted, label):
        levels = tuple(reports) | "AllReports" >> beam.Flatten()  # level / run dict
        if self.counts is None:
            return {"ngrams": tuple(outputs) | label >> beam.Flatten(), "levels": levels}  # (k, n-gram)
        counts = tuple(counted) | "AllCounts" >> beam.Flatten()  # (k, (n-gram, noisy_count)), >= min_users
        return {"ngrams": counts | "KeptNgrams" >> beam.Map(untag_count), "counts": counts, "levels": levels}

    def _dpsu(self, tokens):
        prm = self._params
        p = tokens.pipeline
        outputs, reports, counted = [], [], []
        for run in self.runs:
            name = run.name
            level = (
                p
                | f"{name}/LevelSeed" >> beam.Create([None])
                | f"{name}/Level" >> beam.Map(baseline_level, run, prm.weighting, prm.beta)
            )  # {rho, ...}
            kept, _ = self._run(name, tokens, run, run.round_, level)  # (g, holders)
            released_h = checkpoint(kept, f"{name}/Checkpoint")  # (g, holders), materialised
            released = released_h | f"{name}/Ngrams" >> beam.Keys()  # g
            if self.counts is not None:
                counted.append(self._count(name, released_h, run))  # (k, (g, noisy_count))
            outputs.append(released_h | f"{name}/TagK" >> beam.Map(tag_length))  # (k, g)
            reports.append(self._finish_level(name, released, level))
        return self._outputs(outputs, reports, counted, "AllRuns")
