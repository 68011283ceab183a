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
  Spurious     n-gram                                   B_k ~ Bin(|V_k| - |supp H_k|, q_k) uniform
                                                       k-grams of V_k minus supp(H_k): candidates
                                                       drawn uniformly from V_k (y ~ L(y)R(y), then
                                                       x, z), keyed by item shard and joined with the
                                                       support's n-grams, the B_k outside with the
                                                       smallest priority kept (:class:`_Spurious`)
  Checkpoint   (n-gram, holders)                        S_k materialised (read by the output, the
                                                       report, the counts and level k+1)
  Sizes        (|S_{k-1}|, |V_k|, [g])                  singleton: S_{k-1} gathered (public, small),
                                                       |V_k| = sum_y L(y) R(y) (:func:`level_sizes`)
  Level        {rho_k, q_k, |V_k|, ...}                 singleton from Sizes (or the sampling estimator);
                                                       the spurious step reads its own singleton of the
                                                       level dict, the exact |V_k| and S_{k-1} (few routes
                                                       back to S_{k-1}: Flink's plan walk, docs/engines.md)

MAD weighting (``weighting='mad'``) replaces the Partials/GroupItems steps by
:class:`transforms.selection.mad.MADWeights` (MAD paper Alg. 3 on the same capped tables),
with tau_k = rho_k + beta sigma_k a side input (it depends on rho_k, known once S_{k-1} is released).

``selection='mad_sips'`` replaces Grams+Cap .. Spurious of every level (level 1 included) by the rounds of
:func:`privacy.dpne.level_rounds` (:class:`_LevelMADSIPS`: the full valid sets, then per round removal,
biases, hopeless drops, re-subsampling to Delta_k, MAD, noise, rho_r and, for k >= 2, the round's spurious
draws; the rounds are a singleton computed from the Level dict, since q_k is known only at run time).
S_k is the union of the rounds; its holders (for the counts) are those of round 1's capped sets.

Memory: a user shard holds ~rows_per_shard tokens (plus the n-grams of one level while it is capped);
one user's tokens are never split, so a user with 10^7 tokens makes one shard of that size. An item
shard holds at most S rows per n-gram. The candidate spurious k-grams (about B_k, whose expectation is
at most eta |S_{k-1}|) and the released sets travel as side inputs.
"""

from __future__ import annotations

import dataclasses
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
    round_id,
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
    ShardCount,
    binary_array,
    bounded_pieces,
    dictionary_codes,
    owned,
    require_global_window,
    shard_ids,
    split_packed,
    unpack_all,
    unpacked,
    user_chunks,
)
from dp_partition_beam.transforms.core.dofns import SideInputCache, WorkerRngDoFn, in_global_window
from dp_partition_beam.transforms.core.engine import RunSeed, barrier, checkpoint, per_user_step
from dp_partition_beam.transforms.core.fingerprint import from_key_bytes
from dp_partition_beam.transforms.core.tables import item_bits, merge_partials, noisy_weights
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.selection.basic import BasicPartialsFn
from dp_partition_beam.transforms.selection.counts import NoisyCounts
from dp_partition_beam.transforms.selection.mad import MADWeights
from dp_partition_beam.transforms.selection.mad_sips import RoundSetsFn, each_partial, hopeful_table

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


def shard_support_size(element) -> int:
    """(item shard, Table(item, weight, holders)) -> its number of n-grams in supp(H)."""
    return element[1].num_rows


def support_keys_by_shard(element, num_shards):
    """(shard, Table(item, ...)) -> (item shard, Packed(item)) of its n-grams, by the item shard of their key
    bytes (the support of a MAD-SIPS round also holds the level's earlier releases under key 0)."""
    items = element[1].select([ITEM])
    yield from split_packed(items, shard_ids(items.column(ITEM), num_shards), num_shards)


def outside_support(shard, grouped):
    """(item shard, {'cands': [(B_k, [g])], 'support': [Packed(item)]}) -> (B_k, the distinct candidates g of the
    shard outside supp(H)) (a shard with no support: all of its candidates; none outside: an empty list, so
    that B_k reaches the selection, which fails loudly when too few candidates are left)."""
    if not grouped["cands"]:
        return
    n = grouped["cands"][0][0]
    cands = sorted({g for _, grams in grouped["cands"] for g in grams})
    support = unpacked(grouped["support"])
    if support:
        keys = dpne_kernels.string_array(cands).cast(pa.binary())
        items = pa.chunked_array([c for t in support for c in t.column(ITEM).chunks], type=pa.binary())
        inside = pc.is_in(keys, value_set=items.combine_chunks())
        cands = [g for g, i in zip(cands, inside.to_pylist()) if not i]
    yield n, cands


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
    """What the spurious step of level k >= 2 reads, in one singleton: the level dict (rho_k or the table, q_k),
    the exact |V_k| (``v_exact``) and S_{k-1} (``s_prev``, the list)."""
    level = level_k(_, k, sigma, max_contributions, eta, weighting, beta, sizes, v_estimate, table)
    return dict(level, v_exact=sizes[1], s_prev=sizes[2])


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


class SpuriousCandidatesFn(WorkerRngDoFn):
    """Supplement Alg. 1's spurious draws of level k, one element: B_k ~ Bin(|V_k| - |supp H_k|, q_k), then an
    oversample of candidates drawn uniformly from V_k (S_{k-1}, S_1 side inputs) -> (item shard, (B_k, [g])).

    The candidates are drawn in chunks of ``CANDIDATE_CHUNK`` with the chunk's keyed generator (seeded: (seed,
    'spurious', k, ('candidates', c))); B_k travels with them, so the selection reads nothing else
    (:class:`_Spurious`). Nothing is emitted when B_k = 0. |supp H_k| is private; it only sizes internal work
    and never leaves the pipeline.
    """

    def __init__(self, k, seed, pruning):
        super().__init__(seed)
        self._k, self._seed, self._pruning = k, seed, pruning

    def process(self, _, level, n_supp, s1, num_shards, s_prev=None, v_exact=None):
        if not level["spurious_prob"] > 0.0:  # V_k empty (rho_k None)
            return
        # Always the exact |V_k| here (also with vk_method='sample', whose estimate only sets rho_k):
        # then the spurious k-grams are exactly the zero-weight part of the Gaussian mechanism on V_k.
        s_prev = level["s_prev"] if s_prev is None else s_prev
        v_exact = level.get("v_exact", level["v_k"]) if v_exact is None else v_exact
        n_avail = max(0, v_exact - n_supp)
        n = dpne_kernels.spurious_count(n_avail, level["spurious_prob"], self._k, self._seed, self._rng)
        if not n:
            return
        m = dpne_kernels.spurious_oversample(n, n_avail, v_exact)
        sampler = dpne_kernels.ValidSampler(s_prev, s1, self._pruning)
        by_shard = {}
        for chunk, size in dpne_kernels.chunk_sizes(m):
            cands = dpne_kernels.candidate_chunk(sampler, chunk, size, self._k, self._seed, self._rng)
            shards = shard_ids(dpne_kernels.string_array(cands).cast(pa.binary()), num_shards).tolist()
            for g, shard in zip(cands, shards):
                by_shard.setdefault(shard, []).append(g)
        for shard, grams in by_shard.items():
            yield shard, (n, grams)


class SelectSpuriousFn(WorkerRngDoFn):
    """(B_k, [g]) of every item shard -> the B_k distinct candidates outside supp(H_k) with the smallest
    priority (seeded: keyed by (seed, 'spurious_priority', k, g); unseeded: the worker's OS-entropy generator)."""

    def __init__(self, k, seed):
        super().__init__(seed)
        self._k = k

    def process(self, _, outside):
        if not outside:
            return  # B_k = 0: no candidates were drawn
        n = outside[0][0]
        grams = sorted({g for _, shard_grams in outside for g in shard_grams})
        pri = dpne_kernels.spurious_priorities(grams, self._k, self._seed, self._rng)
        yield from dpne_kernels.select_spurious(zip(pri.tolist(), grams), n, self._k)


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
    """Uniform spurious k-grams of V_k minus supp(H_k): support -> g (B_k of them).

    ``k`` is the randomness round of the draws (the level k; with selection='mad_sips' the round id of the
    level's round, :func:`privacy.dpne.round_id`); the k-grams' length is that of V_k (S_{k-1}, S_1). ``level``:
    a singleton dict with 'rho' (None: nothing is drawn), 'spurious_prob', and unless given apart (``v_exact``, a
    singleton, ``s_prev``, a PCollection) the exact |V_k| ('v_exact', else 'v_k') and S_{k-1} ('s_prev', a list).

    Stages (shapes after each step):
      CountSupport  |supp H_k|                  private, sizes internal work only
      Candidates    (item shard, (B_k, [g]))    B_k ~ Bin(|V_k| - |supp H_k|, q_k); candidates g ~ uniform(V_k)
                                                (an oversample, with repeats), by the item shard of g
      SupportKeys   (item shard, Packed(item))  supp(H_k)'s n-grams, by the same item shard
      Outside       (B_k, [g])                  per item shard, the distinct candidates outside supp(H_k)
      KeepB         g                           the B_k of least priority among them

    The candidates meet the support in a keyed join (not as a side input of a step whose output meets them
    again) and B_k travels with them: a level's steps read few PCollections derived from S_{k-1} twice, which
    keeps the paths of Flink's plan walk few (:mod:`pipelines.flink_plan`; docs/engines.md).
    """

    def __init__(self, k, level, v_exact, s_prev, s1, pruning, seed, num_shards, label=None):
        super().__init__(label)
        self._k, self._level, self._v_exact = k, level, v_exact
        self._s_prev, self._s1, self._pruning, self._seed = s_prev, s1, pruning, seed
        self._num_shards = num_shards  # singleton side input (the item shards' count)

    def expand(self, support):
        p = support.pipeline
        k = self._k
        n_supp = (
            support
            | "SupportRows" >> beam.Map(shard_support_size)  # rows of an item shard
            | "CountSupport" >> beam.CombineGlobally(sum)  # |supp H_k| (private, internal)
        )
        s_prev = [] if self._s_prev is None else [beam.pvalue.AsList(self._s_prev)]
        v_exact = [] if self._v_exact is None else [beam.pvalue.AsSingleton(self._v_exact)]
        cands = (
            p
            | "PlanSeed" >> beam.Create([None])
            | "Candidates"
            >> beam.ParDo(
                SpuriousCandidatesFn(k, self._seed, self._pruning),
                beam.pvalue.AsSingleton(self._level),
                beam.pvalue.AsSingleton(n_supp),
                beam.pvalue.AsList(self._s1),
                self._num_shards,
                *s_prev,
                *v_exact,
            )  # (item shard, (B_k, [g])), g ~ uniform(V_k) with repeats
        )
        keys = support | "SupportKeys" >> beam.FlatMap(support_keys_by_shard, self._num_shards)
        # (item shard, Packed(item))
        outside = (
            {"cands": cands, "support": keys}
            | "ByShard" >> beam.CoGroupByKey()  # (item shard, {'cands': [(B_k, [g])], 'support': [Packed(item)]})
            | "Outside" >> beam.FlatMapTuple(outside_support)  # (B_k, [g outside supp(H_k)]) per item shard
        )
        return (
            p
            | "SelectSeed" >> beam.Create([None])
            | "KeepB" >> beam.ParDo(SelectSpuriousFn(k, self._seed), beam.pvalue.AsList(outside))
        )  # g, B_k distinct k-grams outside supp(H_k)


# ---------------------------------------------------------------------------------------------
# MAD-SIPS inside a level (selection='mad_sips'; reference: transforms.dpne.reference.level_mad_sips)
# ---------------------------------------------------------------------------------------------

#: LevelCapFn's cap for a level's full distinct sets with selection='mad_sips' (each round re-subsamples them to
#: Delta_k itself): bottom-k to a cap no user reaches keeps every distinct (valid) n-gram
NO_CAP = 1 << 62


def level_rounds_of(level, run: RunPlan, params: DPNEParams):
    """The level dict -> its rounds (:func:`privacy.dpne.level_rounds`): level 1's from its plan, level k >= 2's
    from q_k (the level dict's 'spurious_prob', known once S_{k-1} and |V_k| are)."""
    k = run.lengths[0]
    return level_rounds(run, params, None if k == 1 else level["spurious_prob"])


def round_tau(rounds, r: int) -> float:
    """MAD's tau of round r (1-based) of the level's rounds."""
    return rounds[r - 1].tau


def round_spurious_level(rounds, r: int):
    """The dict the spurious step of round r reads: its rho (None when infinite: V_k empty) and rate f_r q_k."""
    rd = rounds[r - 1]
    return {"rho": rd.rho if np.isfinite(rd.rho) else None, "spurious_prob": rd.spurious_prob}


def mad_sips_report(_, level, rounds, *released_per_round):
    """The level report with the rounds (:func:`privacy.dpne.rounds_report`), before |S_k| is added."""
    return rounds_report(level, rounds, released_per_round)


class LevelRoundStatusFn(WorkerRngDoFn):
    """(item shard, [partials]) -> (item shard, Table(item, released, holders, bias, hopeless)) of round r
    (:func:`transforms.dpne.dpne_kernels.level_round_status`; the level's rounds: a singleton side input)."""

    def __init__(self, r: int, known_domain: bool, c_lb: float, c_ub: float, seed: Optional[int]):
        super().__init__(seed)
        self._r, self._known, self._c_lb, self._c_ub = r, known_domain, c_lb, c_ub

    def process(self, element, rounds):
        shard, partials = element
        status = dpne_kernels.level_round_status(
            merge_partials(unpacked(partials)),
            rounds,
            self._r,
            self._known,
            self._c_lb,
            self._c_ub,
            self._seed,
            self._rng,
        )
        for piece in bounded_pieces(status):  # grows with the shard's distinct n-grams
            yield shard, piece


def status_released(element):
    """(item shard, status) -> item bytes released by the round's noisy threshold."""
    t = element[1]
    yield from t.filter(t.column("released")).column(ITEM).to_pylist()


def status_support(element):
    """(item shard, status) -> (item shard, Table(item)) of the round's support (holders > 0)."""
    shard, t = element
    return shard, t.filter(pc.greater(t.column("holders"), 0)).select([ITEM])


def items_table(items):
    """[item bytes] -> (0, Table(item)) (the n-grams the level released in earlier rounds, as support rows)."""
    return 0, pa.table({ITEM: binary_array(items)})


def utf8_key(gram: str) -> bytes:
    """A spurious k-gram -> its key bytes (UTF-8, as the item columns)."""
    return gram.encode("utf-8")


def support_holders(element):
    """(item shard, status) -> (item bytes, holders) of the round's support (holders > 0)."""
    t = element[1]
    t = t.filter(pc.greater(t.column("holders"), 0))
    yield from zip(t.column(ITEM).to_pylist(), t.column("holders").to_pylist())


def released_holders(item, grouped):
    """(item bytes, {'held': [holders], 'released': [0]}) -> (item bytes, holders in round 1's capped sets) of
    a released n-gram (0 if no capped user of round 1 held it: the counts' sets, as the single-round path's)."""
    if grouped["released"]:
        yield item, sum(grouped["held"])


def with_zero(item):
    return item, 0


class _LevelMADSIPS(beam.PTransform):
    """(user shard, tokens) -> (n-gram, holders in round 1's capped sets) of S_k, and the level report (without
    |S_k|): MAD-SIPS's rounds inside level k (:func:`transforms.dpne.reference.level_mad_sips`).

    Stages (round r = 1..R, randomness round round_r = k + 100 (r - 1); the rounds, a singleton computed from
    the level dict, give sigma_r, rho_r, tau_r, f_r q_k):
      Sets         (user shard, Table(user, item, degree))   every distinct valid k-gram of each user (no cap)
      R{r}FullSets (user shard, Packed(user, item, degree))  round r's materialised copy of them
      R{r}Sets     (user shard, Packed(user, item, degree[, bias]))   minus S_k so far; r >= 2 minus the user's
                                                           hopeless n-grams unless all are; bottom-k to Delta_k
                                                           with round_r's priorities; biases attached
                   candidates (item shard, Packed zero partials)   r < R: every n-gram of the full sets not
                                                           yet released (round r decides its next entry)
      R{r}MADWeights (item shard, [partials])                MAD, unbiased in round 1, biased after
      R{r}Status   (item shard, Table(item, released, holders, bias, hopeless))   one noisy entry per n-gram
                                                           (absent ones: level 1 pure noise, k >= 2 below
                                                           rho_r), >= rho_r released, next round's biases;
                                                           checkpointed
      R{r}Spurious g                                       k >= 2: B ~ Bin(|V_k| - |supp H_r| - |S_k so
                                                           far|, f_r q_k) uniform k-grams outside both
      JoinHolders  (item bytes, holders)                   S_k's holders in round 1's capped sets (0: none)
      RoundsReport level dict                              the rounds and what each released
    """

    def __init__(self, k, run, params, level, seed, seed_arg, num_shards, side_args, spurious_args=None, label=None):
        super().__init__(label)
        self._k, self._run, self._params, self._level = k, run, params, level
        self._seed, self._seed_arg, self._num_shards, self._side_args = seed, seed_arg, num_shards, side_args
        self._spurious_args = spurious_args  # (v_exact, s_prev, s1) for k >= 2, None at level 1

    def expand(self, tokens):
        k, run, prm = self._k, self._run, self._params
        known = self._spurious_args is not None  # k >= 2: V_k is known, every round has spurious draws
        n_rounds = len(prm.budget_split)
        rounds = self._level | "Rounds" >> beam.Map(level_rounds_of, run, prm)  # (LevelRound, ...) singleton
        rounds_si = beam.pvalue.AsSingleton(rounds)
        pruning = prm.pruning if known else None
        full = tokens | "Sets" >> beam.ParDo(
            LevelCapFn(run.lengths, pruning, NO_CAP, k), self._seed_arg, *self._side_args
        )  # (user shard, Table(user, item, degree)) every distinct valid k-gram of each user
        # each round reads its own materialised copy: the rounds read side inputs computed from `full` (S_k so far,
        # biases) and the next level's sets (from the same token tables) read S_k; with one shared copy the
        # in-memory runner stopped ("watermark-pending bundles did not execute": a round reading the copy
        # waited for a side input from a round whose input was that same copy)
        released_so_far, biases, status1 = None, None, None
        outputs, per_round = [], []
        for r in range(1, n_rounds + 1):
            last = r == n_rounds
            removed = None if released_so_far is None else beam.pvalue.AsList(released_so_far)  # item bytes
            bias_si = None if biases is None else beam.pvalue.AsList(biases)
            source = barrier(full, f"R{r}FullSets", packed=True)  # (user shard, Packed(user, item, degree))
            sets, extra = per_user_step(
                source,
                f"R{r}Sets",
                RoundSetsFn(round_id(k, r)),
                self._seed_arg,
                run.max_contributions,
                removed,
                bias_si,
                None if last else self._num_shards,
                packed=True,
                outputs=(RoundSetsFn.CANDIDATES,),
                whole_users=True,  # TokensByUser's pieces are cut between users
            )  # (user shard, Packed(user, item, degree[, bias])); r < R: candidates (item shard, zero partials)
            tau = beam.pvalue.AsSingleton(rounds | f"R{r}Tau" >> beam.Map(round_tau, r))  # tau_r
            b_min, b_max = (1.0, 1.0) if r == 1 else (prm.b_min, prm.b_max)
            weights = sets | f"R{r}MADWeights" >> MADWeights(tau, prm.d_max, b_min, b_max, self._num_shards)
            # (item shard, [Packed partials])
            if not last:
                weights = (
                    (weights | f"R{r}Parts" >> beam.FlatMapTuple(each_partial), extra[RoundSetsFn.CANDIDATES])
                    | f"R{r}AllParts" >> beam.Flatten()  # (item shard, Packed partials)
                    | f"R{r}GroupParts" >> beam.GroupByKey()  # (item shard, [Packed partials])
                )
            status = barrier(
                weights
                | f"R{r}Status" >> beam.ParDo(LevelRoundStatusFn(r, known, prm.c_lb, prm.c_ub, self._seed), rounds_si),
                f"R{r}Checkpoint",
            )  # (item shard, Table(item, released, holders, bias, hopeless)), materialised: one draw per n-gram
            released_r = status | f"R{r}Released" >> beam.FlatMap(status_released)  # item bytes >= rho_r
            if known:
                support = status | f"R{r}Support" >> beam.Map(status_support)  # (item shard, Table(item)) supp H_r
                if released_so_far is not None:
                    earlier = (
                        released_so_far
                        | f"R{r}EarlierList" >> beam.combiners.ToList()  # [item bytes] of S_k so far
                        | f"R{r}EarlierTable" >> beam.Map(items_table)  # (0, Table(item))
                    )
                    # materialised after the Flatten: the spurious step reads side inputs computed from it
                    support = barrier(
                        (support, earlier) | f"R{r}AllSupport" >> beam.Flatten(), f"R{r}SupportBarrier"
                    )  # (shard, Table(item)) supp H_r and S_k so far
                v_exact, s_prev, s1 = self._spurious_args
                round_level = rounds | f"R{r}SpuriousLevel" >> beam.Map(round_spurious_level, r)  # {rho, q}
                spurious = (
                    support
                    | f"R{r}Spurious"
                    >> _Spurious(
                        round_id(k, r), round_level, v_exact, s_prev, s1, prm.pruning, self._seed, self._num_shards
                    )
                    # g: spurious k-grams of round r
                    | f"R{r}SpuriousKeys" >> beam.Map(utf8_key)  # item bytes
                )
                released_r = (released_r, spurious) | f"R{r}Union" >> beam.Flatten()  # item bytes of round r
            per_round.append(beam.pvalue.AsSingleton(released_r | f"R{r}Count" >> beam.combiners.Count.Globally()))
            outputs.append(released_r)
            if r == 1:
                status1 = status
            if not last:
                released_so_far = (
                    released_r
                    if released_so_far is None
                    else (released_so_far, released_r) | f"R{r}SoFar" >> beam.Flatten()
                )  # item bytes of S_k through round r
                biases = status | f"R{r}Biases" >> beam.Map(hopeful_table)  # Table(item, bias), not hopeless
        s_k = tuple(outputs) | "AllRounds" >> beam.Flatten()  # item bytes of S_k
        holders = (
            {
                "held": status1 | "Round1Holders" >> beam.FlatMap(support_holders),  # (item bytes, holders > 0)
                "released": s_k | "KeyReleased" >> beam.Map(with_zero),  # (item bytes, 0)
            }
            | "JoinHolders" >> beam.CoGroupByKey()  # (item bytes, {'held': [h], 'released': [0]})
            | "ReleasedHolders" >> beam.FlatMapTuple(released_holders)  # (item bytes, holders in round 1's sets)
            | "Decode" >> beam.Map(decode_holders)  # (g, holders)
        )
        # the level dict and the rounds are side inputs here: the counts per round are computed from the rounds
        report = (
            tokens.pipeline
            | "ReportSeed" >> beam.Create([None])
            | "RoundsReport" >> beam.Map(mad_sips_report, beam.pvalue.AsSingleton(self._level), rounds_si, *per_round)
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

    def _mad_sips(self, name, tokens, run, level, s_prev=None, s1=None, v_exact=None):
        """Level k with selection='mad_sips': ((g, holders in round 1's capped sets) of S_k, the level dict with
        its rounds)."""
        k = run.lengths[0]
        side = [
            beam.pvalue.AsList(s_prev) if s_prev is not None else None,
            beam.pvalue.AsList(s1) if s1 is not None else None,
            self._allow_arg,
        ]
        spurious_args = None if s_prev is None else (v_exact, s_prev, s1)
        return tokens | f"{name}/MADSIPS" >> _LevelMADSIPS(
            k, run, self._params, level, self._seed, self._seed_arg, self._num_shards, side, spurious_args
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
            if k == 1:
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level" >> beam.Map(level_one, run, prm.weighting, prm.beta)
                )  # {rho_1, ...}
                if prm.selection == "mad_sips":
                    released, level = self._mad_sips(name, tokens, run, level)  # (w, holders), level dict
                else:
                    kept, _ = self._run(name, tokens, run, k, level)  # (w, holders)
                    released = kept
            else:
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
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level" >> beam.Map(level_k, *level_args, table=run.table)
                )  # {rho_k (or the keep table), q_k, |V_k|, ...}
            if k >= 2 and mad:
                v_exact = sizes | f"{name}/ValidCount" >> beam.Map(valid_size)  # |V_k|
                released, level = self._mad_sips(name, tokens, run, level, s_prev, s1, v_exact)
                # (w, holders in round 1's sets), level dict with the rounds
            elif k >= 2:
                kept, support = self._run(name, tokens, run, k, level, s_prev, s1)  # (w, holders)
                spurious_level = (
                    p
                    | f"{name}/SpuriousSeed" >> beam.Create([None])
                    | f"{name}/SpuriousLevel" >> beam.Map(spurious_level_k, *level_args, table=run.table)
                )  # {rho_k, q_k, exact |V_k|, S_{k-1}}: one singleton (Flink's plan walk, _Spurious)
                spurious = support | f"{name}/Spurious" >> _Spurious(
                    k, spurious_level, None, None, s1, prm.pruning, self._seed, self._num_shards
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
