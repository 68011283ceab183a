"""DPNE (DP n-gram extraction) as a Beam composite transform: the scalable version of the paper.

Paper: Kim, Gopi, Kulkarni, Yekhanin, "Differentially Private n-gram Extraction", Algorithm 1 and
supplement Algorithm 1 (scalable). Accounting: :mod:`privacy.dpne`. Kernels shared with the
in-memory reference (:mod:`transforms.dpne.reference`): :mod:`transforms.dpne.dpne_kernels`.

Input: PCollection of ``(user, text)`` (a user may have many records; each line of a text is one
segment, n-grams never cross a line break). Output (a dict of PCollections):
  ``ngrams``  ``(k, n-gram)`` released n-grams, words joined by single spaces;
  ``counts``  with ``params.release_counts`` only: ``(k, (n-gram, noisy_count))`` (docs/counts.md);
  ``levels``  one dict per level / run with public quantities only (sigma_k, rho_k, |S_{k-1}|,
              |V_k|, spurious bound, |S_k|) - never |supp(H_k)| or any other count of private data.

Stages of level k >= 2 (``S_1``, ``S_{k-1}`` are released PCollections, hence public):
  Tokenize       (user, [[token]])             once per record, tokens of each line
  Grams          (user, kgram)                 distinct per record
  Prune          (user, kgram) valid only      two keyed joins: head(w) in S_{k-1}, then tail(w) in
                                               S_{k-1} ('both') or last word in S_1 ('single');
                                               keys sharded by user so a hot (k-1)-gram is spread
                                               over ``num_shards`` workers (S_{k-1} is replicated to
                                               every shard: it is small, it is the output). V_k is
                                               never materialised.
  Bound          (user, [kgram]) |.| <= Delta_k  uniform subsample (randomness.subsample, round k)
  Weights        (kgram, w)                    weighted Gaussian 1/sqrt(d) or MAD (tau_k side input)
  Level          {rho_k, q_k, |V_k|, ...}      singleton: |V_k| = sum_y L(y) R(y) by a keyed combine
                                               over S_{k-1} (or the sampling estimator)
  Noise/Keep     kgram with H_k + sigma_k Z >= rho_k   (noisy weights checkpointed)
  Spurious       B_k ~ Bin(|V_k| - |supp H_k|, q_k) uniform k-grams of V_k minus supp(H_k):
                 oversampled candidates drawn uniformly from V_k (y ~ L(y)R(y), then x, z), a keyed
                 join with supp(H_k) drops the ones in the support and deduplicates, the B_k with the
                 smallest random priority are kept.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import apache_beam as beam

from privacy.dpne import (
    DPNEParams,
    RunPlan,
    baseline_run_report,
    level_k_report,
    level_one_report,
    plan_dpne_counts,
    plan_runs,
)
from transforms.core import randomness
from transforms.core import text as tx
from transforms.core.allowlist import KeepAllowlisted, check_allowlist
from transforms.core.bounding import BoundContributions
from transforms.core.dofns import WorkerRngDoFn
from transforms.core.joins import user_shard
from transforms.core.noise import AddNoise
from transforms.dpne import dpne_kernels
from transforms.selection.basic import UserSetWeights
from transforms.selection.counts import ReleaseCounts
from transforms.selection.mad import MADWeights

# ---------------------------------------------------------------------------------------------
# Small functions / DoFns (module level: picklable, importable by multi-process workers)
# ---------------------------------------------------------------------------------------------


class TokenizeFn(beam.DoFn):
    """(user, text) -> (user, [tokens of each line]) (lines with no token dropped; once per record)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def process(self, element):
        user, text = element
        segs = [toks for toks in (self._tokenizer(seg) for seg in tx.segments(text)) if toks]
        if segs:
            yield user, segs


def user_grams(element, lengths):
    """(user, [tokens per line]) -> (user, g) for each distinct n-gram g of a length in ``lengths``."""
    user, segs = element
    seen = set()
    for toks in segs:
        n = len(toks)
        for k in lengths:
            for i in range(n - k + 1):
                seen.add(" ".join(toks[i : i + k]))
    for g in seen:
        yield user, g


def key_by_head(element, num_shards):
    """(user, w) -> ((head(w), shard(user)), (user, w))."""
    user, w = element
    return (tx.head(w), user_shard(user, num_shards)), (user, w)


def key_by_suffix(element, pruning, num_shards):
    """(user, w) -> ((tail(w) | last word, shard(user)), (user, w))."""
    user, w = element
    return (dpne_kernels.suffix_key(w, pruning), user_shard(user, num_shards)), (user, w)


def replicate_marker(gram, num_shards):
    """g -> ((g, s), True) for every shard s (the released set is small and public)."""
    for s in range(num_shards):
        yield (gram, s), True


def emit_if_present(element):
    """((key, shard), {'pairs': [(user, w)], 'ok': [True]}) -> (user, w) when the key is released."""
    _, grouped = element
    if any(True for _ in grouped["ok"]):
        yield from grouped["pairs"]


def lr_parts(gram):
    """(k-1)-gram g = x y = y' z -> (y, (1, 0)) for L(y) and (y', (0, 1)) for R(y')."""
    yield tx.tail(gram), (1, 0)
    yield tx.head(gram), (0, 1)


def sum_pairs(values):
    a = b = 0
    for x, y in values:
        a += x
        b += y
    return a, b


def lr_product(element):
    _, (left, right) = element
    return left * right


def product(a, b):
    return a * b


def keep_at_or_above_rho(element, level):
    rho = level["rho"]
    return rho is not None and element[1] >= rho


def first(element):
    return element[0]


def as_key_marker(item):
    return item, True


def as_candidate(item):
    return item, None


def outside_support(element):
    """(g, {'cand': [...], 'supp': [...]}) -> g if drawn as a candidate and not in supp(H_k)."""
    g, grouped = element
    if any(True for _ in grouped["supp"]):
        return
    if any(True for _ in grouped["cand"]):
        yield g


def tag_length(gram):
    return tx.ngram_len(gram), gram


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


def level_k(_, k, sigma, max_contributions, eta, weighting, beta, s_prev_size, v_size):
    """The public parameters of level k >= 2, from the released |S_{k-1}| and |V_k|."""
    return level_k_report(k, sigma, max_contributions, eta, weighting, beta, s_prev_size, v_size)


class EstimateValidFn(WorkerRngDoFn):
    """Supplement Alg. 2 on the released S_1, S_{k-1} (side inputs): the estimate of |V_k| (rounded)."""

    def __init__(self, k, p, seed):
        super().__init__(seed)
        self._k, self._p, self._seed = k, p, seed

    def process(self, _, s_prev, s1):
        gen = randomness.keyed_generator(self._seed, "vk_estimate", self._k, 0) if self._seed is not None else self._rng
        yield int(round(dpne_kernels.valid_count_sample(sorted(s_prev), sorted(s1), self._p, gen)))


class SpuriousPlanFn(WorkerRngDoFn):
    """Draws B_k ~ Bin(|V_k| - |supp H_k|, q_k) and sizes the candidate oversample.

    Emits one dict {'n': B_k, 'chunks': [(chunk, size)]}. |supp H_k| is private; it only sizes
    internal work and never leaves the pipeline.
    """

    def __init__(self, k, seed, pruning):
        super().__init__(seed)
        self._k, self._seed, self._pruning = k, seed, pruning

    def process(self, _, level, n_supp, v_exact):
        if level["rho"] is None:
            yield {"n": 0, "chunks": []}
            return
        # Always the exact |V_k| here (also with vk_method='sample', whose estimate only sets rho_k):
        # then the spurious k-grams are exactly the zero-weight part of the Gaussian mechanism on V_k.
        n_avail = max(0, v_exact - n_supp)
        n = dpne_kernels.spurious_count(n_avail, level["spurious_prob"], self._k, self._seed, self._rng)
        m = dpne_kernels.spurious_oversample(n, n_avail, v_exact) if n else 0
        yield {"n": n, "chunks": dpne_kernels.chunk_sizes(m)}


def plan_chunks(_, plan):
    return list(plan["chunks"])


class CandidatesFn(WorkerRngDoFn):
    """(chunk, size) -> candidate k-grams drawn uniformly from V_k (S_{k-1}, S_1 side inputs)."""

    def __init__(self, k, pruning, seed):
        super().__init__(seed)
        self._k, self._pruning, self._seed = k, pruning, seed
        self._sampler = None

    def process(self, element, s_prev, s1):
        chunk, size = element
        if self._sampler is None:
            self._sampler = dpne_kernels.ValidSampler(s_prev, s1, self._pruning)
        yield from dpne_kernels.candidate_chunk(self._sampler, chunk, size, self._k, self._seed, self._rng)


class PriorityFn(WorkerRngDoFn):
    """g -> (priority, g): keyed uniform (seeded) or worker OS-entropy uniform."""

    def __init__(self, k, seed):
        super().__init__(seed)
        self._k, self._seed = k, seed

    def process(self, g):
        yield float(dpne_kernels.spurious_priorities([g], self._k, self._seed, self._rng)[0]), g


def select_spurious(prioritized, plan, k):
    return dpne_kernels.select_spurious(prioritized, plan["n"], k)


class ExactValidCount(beam.PTransform):
    """S_{k-1} (released (k-1)-grams) -> singleton |V_k| = sum_y L(y) R(y) (or |S_{k-1}| |S_1|)."""

    def __init__(self, pruning, s1_count=None, label=None):
        super().__init__(label)
        self._pruning = pruning
        self._s1_count = s1_count

    def expand(self, s_prev):
        if self._pruning == "single":
            return (
                s_prev
                | "CountPrev" >> beam.combiners.Count.Globally()  # |S_{k-1}|
                | "TimesS1" >> beam.Map(product, beam.pvalue.AsSingleton(self._s1_count))  # |V_k|
            )
        return (
            s_prev
            | "LRParts" >> beam.FlatMap(lr_parts)  # (y, (1,0) | (0,1))
            | "LR" >> beam.CombinePerKey(sum_pairs)  # (y, (L(y), R(y)))
            | "Product" >> beam.Map(lr_product)  # L(y) R(y)
            | "Sum" >> beam.CombineGlobally(sum)  # |V_k|
        )


class PruneToValid(beam.PTransform):
    """(user, kgram) -> (user, kgram) for valid k-grams only, by two sharded keyed joins."""

    def __init__(self, s_prev, s1, pruning, num_shards, label=None):
        super().__init__(label)
        self._s_prev, self._s1, self._pruning, self._shards = s_prev, s1, pruning, num_shards

    def expand(self, pairs):
        n = self._shards
        prev_markers = self._s_prev | "PrevMarkers" >> beam.FlatMap(replicate_marker, n)  # ((g, shard), True)
        if self._pruning == "both":
            suffix_markers = prev_markers
        else:
            suffix_markers = self._s1 | "S1Markers" >> beam.FlatMap(replicate_marker, n)  # ((z, shard), True)
        head_ok = (
            {"pairs": pairs | "KeyByHead" >> beam.Map(key_by_head, n), "ok": prev_markers}
            | "JoinHead" >> beam.CoGroupByKey()  # ((xy, shard), {pairs, ok})
            | "HeadReleased" >> beam.FlatMap(emit_if_present)  # (user, w) with xy in S_{k-1}
        )
        return (
            {"pairs": head_ok | "KeyBySuffix" >> beam.Map(key_by_suffix, self._pruning, n), "ok": suffix_markers}
            | "JoinSuffix" >> beam.CoGroupByKey()  # ((yz | z, shard), {pairs, ok})
            | "SuffixReleased" >> beam.FlatMap(emit_if_present)  # (user, w) valid
        )


# ---------------------------------------------------------------------------------------------
# MAD weighting: tau_k = rho_k + beta sigma_k is known only once S_{k-1} is released (side input)
# ---------------------------------------------------------------------------------------------


def level_tau(level):
    return level["tau"]


# ---------------------------------------------------------------------------------------------
# One noisy histogram run
# ---------------------------------------------------------------------------------------------


class _NoisyRun(beam.PTransform):
    """(user, g) valid pairs -> released g (not yet spurious) and H's support.

    Returns (released, support, user_sets): the capped (user, [g]) sets are what the count release
    counts. ``level`` is the singleton dict with rho (and tau for MAD).
    """

    def __init__(self, level, sigma, max_contributions, round_, weighting, d_max, seed, label=None):
        super().__init__(label)
        self._level = level
        self._sigma, self._cap, self._round = sigma, max_contributions, round_
        self._weighting, self._d_max, self._seed = weighting, d_max, seed

    def expand(self, pairs):
        user_sets = pairs | "Bound" >> BoundContributions(self._cap, self._seed, round_=self._round)  # (user, [g])
        if self._weighting == "mad":
            tau = beam.pvalue.AsSingleton(self._level | "Tau" >> beam.Map(level_tau))  # tau_k = rho_k + beta sigma_k
            hist = user_sets | "MADWeights" >> MADWeights(tau, self._d_max)  # (g, w)
        else:
            hist = user_sets | "Weights" >> UserSetWeights("weighted_gaussian")  # (g, w)
        released = (
            hist
            | "AddNoise" >> AddNoise("gaussian", self._sigma, self._seed, self._round, checkpoint=True)  # (g, noisy)
            | "KeepAboveRho" >> beam.Filter(keep_at_or_above_rho, beam.pvalue.AsSingleton(self._level))  # (g, noisy)
            | "Released" >> beam.Map(first)  # g
        )
        support = hist | "Support" >> beam.Map(first)  # g in supp(H)
        return released, support, user_sets


class _Spurious(beam.PTransform):
    """Uniform spurious k-grams of V_k minus supp(H_k): (support) -> g."""

    def __init__(self, k, level, v_exact, s_prev, s1, pruning, seed, label=None):
        super().__init__(label)
        self._k, self._level, self._v_exact = k, level, v_exact
        self._s_prev, self._s1, self._pruning, self._seed = s_prev, s1, pruning, seed

    def expand(self, support):
        p = support.pipeline
        k = self._k
        n_supp = support | "CountSupport" >> beam.combiners.Count.Globally()  # |supp H_k| (private, internal)
        plan = (
            p
            | "PlanSeed" >> beam.Create([None])
            | "Plan"
            >> beam.ParDo(
                SpuriousPlanFn(k, self._seed, self._pruning),
                beam.pvalue.AsSingleton(self._level),
                beam.pvalue.AsSingleton(n_supp),
                beam.pvalue.AsSingleton(self._v_exact),
            )  # {'n': B_k, 'chunks': [(c, size)]}
        )
        plan_si = beam.pvalue.AsSingleton(plan)
        cands = (
            p
            | "ChunkSeed" >> beam.Create([None])
            | "Chunks" >> beam.FlatMap(plan_chunks, plan_si)  # (chunk, size)
            | "SpreadChunks" >> beam.Reshuffle()  # (chunk, size)
            | "Draw"
            >> beam.ParDo(
                CandidatesFn(k, self._pruning, self._seed),
                beam.pvalue.AsList(self._s_prev),
                beam.pvalue.AsList(self._s1),
            )  # g ~ uniform(V_k), with repeats
        )
        outside = (
            {
                "cand": cands | "KeyCand" >> beam.Map(as_candidate),
                "supp": support | "KeySupp" >> beam.Map(as_candidate),
            }
            | "JoinSupport" >> beam.CoGroupByKey()  # (g, {cand, supp})
            | "Outside" >> beam.FlatMap(outside_support)  # g not in supp(H_k), distinct
        )
        return (
            outside
            | "Priority" >> beam.ParDo(PriorityFn(k, self._seed))  # (priority, g)
            | "Gather" >> beam.combiners.ToList()  # [(priority, g)]  (~ B_k / (1 - |supp|/|V_k|) items)
            | "KeepB" >> beam.FlatMap(select_spurious, plan_si, k)  # g, B_k of them
        )


# ---------------------------------------------------------------------------------------------
# DPNE
# ---------------------------------------------------------------------------------------------


class DPNE(beam.PTransform):
    """(user, text) -> {'ngrams': (k, n-gram), 'levels': level dicts} for ``algorithm``.

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
        :func:`transforms.dpne.reference.dpne_reference`.
      tokenizer: ``str -> list[str]`` (module-level function), default
        :func:`transforms.core.text.default_tokenize`.
      num_shards: execution option: user shards per join key in the pruning joins (spreads hot
        (k-1)-grams); changes the cost, never the output.
      allowlist: optional PUBLIC list of candidate n-grams (words joined by single spaces; an iterable
        or a PCollection): n-grams not in it are dropped at every level before bounding (docs/counts.md).
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
        label=None,
    ):
        super().__init__(label)
        self.sigma_star, self.runs = plan_runs(algorithm, params)  # validates; calibrated before any data is read
        self.algorithm = algorithm
        self._params = params
        self._seed = seed
        self._tokenizer = tokenizer
        self._shards = max(1, int(num_shards))
        self.counts = plan_dpne_counts(algorithm, params)  # privacy.counts.CountPlan or None
        self.allowlist = check_allowlist(allowlist)

    def expand(self, texts):
        randomness.warn_if_seeded(self._seed)
        tokens = texts | "Tokenize" >> beam.ParDo(TokenizeFn(self._tokenizer))  # (user, [[token]])
        if self.algorithm == "dpne":
            return self._dpne(tokens)
        return self._dpsu(tokens)

    def _finish_level(self, name, released, level):
        count = released | f"{name}/CountReleased" >> beam.combiners.Count.Globally()  # |S_k|
        return count | f"{name}/Report" >> beam.Map(with_released, beam.pvalue.AsSingleton(level))  # level dict

    def _dpne(self, texts):
        prm = self._params
        p = texts.pipeline
        outputs, reports, counted = [], [], []
        s1 = s_prev = None
        s1_count = None
        for run in self.runs:
            k = run.lengths[0]
            name = f"L{k}"
            pairs = texts | f"{name}/Grams" >> beam.FlatMap(user_grams, (k,))  # (user, kgram)
            if self.allowlist is not None:
                pairs = pairs | f"{name}/Allowlist" >> KeepAllowlisted(self.allowlist)  # (user, kgram) allowed
            if k == 1:
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level" >> beam.Map(level_one, run, prm.weighting, prm.beta)
                )  # {rho_1, ...}
                released, _, user_sets = pairs | f"{name}/Run" >> _NoisyRun(
                    level, run.sigma, run.max_contributions, k, prm.weighting, prm.d_max, self._seed
                )  # w
                s_k = released | f"{name}/Checkpoint" >> beam.Reshuffle()  # S_1, materialised
                s1 = s_k
                s1_count = s1 | f"{name}/CountS1" >> beam.combiners.Count.Globally()  # |S_1|
            else:
                v_exact = s_prev | f"{name}/ValidCount" >> ExactValidCount(prm.pruning, s1_count)  # |V_k|
                if prm.vk_method == "sample" and prm.pruning == "both":
                    v_used = (
                        p
                        | f"{name}/EstSeed" >> beam.Create([None])
                        | f"{name}/EstimateValid"
                        >> beam.ParDo(
                            EstimateValidFn(k, prm.sample_rate, self._seed),
                            beam.pvalue.AsList(s_prev),
                            beam.pvalue.AsList(s1),
                        )
                    )  # ~|V_k|
                else:
                    v_used = v_exact
                prev_count = s_prev | f"{name}/CountPrev" >> beam.combiners.Count.Globally()  # |S_{k-1}|
                level = (
                    p
                    | f"{name}/LevelSeed" >> beam.Create([None])
                    | f"{name}/Level"
                    >> beam.Map(
                        level_k,
                        k,
                        run.sigma,
                        run.max_contributions,
                        prm.eta,
                        prm.weighting,
                        prm.beta,
                        beam.pvalue.AsSingleton(prev_count),
                        beam.pvalue.AsSingleton(v_used),
                    )
                )  # {rho_k, q_k, |V_k|, ...}
                valid = pairs | f"{name}/Prune" >> PruneToValid(s_prev, s1, prm.pruning, self._shards)  # (user, w)
                released, support, user_sets = valid | f"{name}/Run" >> _NoisyRun(
                    level, run.sigma, run.max_contributions, k, prm.weighting, prm.d_max, self._seed
                )  # w
                spurious = support | f"{name}/Spurious" >> _Spurious(
                    k, level, v_exact, s_prev, s1, prm.pruning, self._seed
                )  # w (spurious)
                s_k = (
                    (released, spurious)
                    | f"{name}/Union" >> beam.Flatten()  # w in S_k
                    | f"{name}/Checkpoint" >> beam.Reshuffle()  # S_k, materialised
                )
            outputs.append(s_k | f"{name}/TagK" >> beam.Map(tag_k, k))  # (k, w)
            reports.append(self._finish_level(name, s_k, level))
            if self.counts is not None:
                counted.append(self._count(name, user_sets, s_k, run))  # (k, (w, noisy_count))
            s_prev = s_k
        return self._outputs(outputs, reports, counted, "AllLevels")

    def _count(self, name, user_sets, released, run):
        """The run's released n-grams with their noisy counts on its capped sets: (k, (g, count))."""
        plan = dataclasses.replace(self.counts, round=run.round_)  # count noise keyed (seed, 'count_noise', round, g)
        return (
            user_sets
            | f"{name}/Counts" >> ReleaseCounts(released, plan, self._seed, self._params.min_users)  # (g, count)
            | f"{name}/TagCounts" >> beam.Map(tag_count)  # (k, (g, count))
        )

    def _outputs(self, outputs, reports, counted, label):
        levels = tuple(reports) | "AllReports" >> beam.Flatten()  # level / run dict
        if self.counts is None:
            return {"ngrams": tuple(outputs) | label >> beam.Flatten(), "levels": levels}  # (k, n-gram)
        counts = tuple(counted) | "AllCounts" >> beam.Flatten()  # (k, (n-gram, noisy_count)), >= min_users
        return {"ngrams": counts | "KeptNgrams" >> beam.Map(untag_count), "counts": counts, "levels": levels}

    def _dpsu(self, texts):
        prm = self._params
        p = texts.pipeline
        outputs, reports, counted = [], [], []
        for run in self.runs:
            name = run.name
            level = (
                p
                | f"{name}/LevelSeed" >> beam.Create([None])
                | f"{name}/Level" >> beam.Map(baseline_level, run, prm.weighting, prm.beta)
            )  # {rho, ...}
            pairs = texts | f"{name}/Grams" >> beam.FlatMap(user_grams, run.lengths)  # (user, g)
            if self.allowlist is not None:
                pairs = pairs | f"{name}/Allowlist" >> KeepAllowlisted(self.allowlist)  # (user, g) allowed
            released, _, user_sets = pairs | f"{name}/Run" >> _NoisyRun(
                level, run.sigma, run.max_contributions, run.round_, prm.weighting, prm.d_max, self._seed
            )  # g
            if self.counts is not None:
                released = released | f"{name}/Checkpoint" >> beam.Reshuffle()  # read by output and counts
                counted.append(self._count(name, user_sets, released, run))  # (k, (g, noisy_count))
            outputs.append(released | f"{name}/TagK" >> beam.Map(tag_length))  # (k, g)
            reports.append(self._finish_level(name, released, level))
        return self._outputs(outputs, reports, counted, "AllRuns")
