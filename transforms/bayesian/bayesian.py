"""Beam composite PTransforms of the Bayesian DP n-gram release (Bayesian DP paper, Alg. 1-2, sec. 4.2).

Distributed: tokenising, per-user n-gram counts clamped to C (and W in total), totals ``c``, users
per n-gram ``N``, the brute-force sensitivity (a per-user map + an elementwise max combine) and, with
tuning, Alg. 2's user split and the scoring set's per-user score changes. On one worker: the vector
math over the public vocabulary (:func:`transforms.bayesian.bayesian_kernels.finalize`), which is bounded by
the public vocabulary's size, never by the private data.

N-grams outside the public vocabulary are dropped when counting (the release is a distribution over
the public vocabulary, paper sec. 3 and 4.1); dropping is a per-user map using public data only.

Under ``seed`` the output equals :func:`transforms.bayesian.reference.release` bit for bit.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam
import numpy as np

from dp_partition_beam.privacy.bayesian import BayesianParams, check_mechanism
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.bayesian_kernels import candidate_log_thetas, finalize
from dp_partition_beam.transforms.core import elements as E
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.dofns import WorkerRngDoFn


class UserNgramCountsFn(beam.DoFn):
    """(user, text) -> ((user, vocabulary index), count) for the n-grams of the public vocabulary."""

    def __init__(self, prior: K.PublicPrior, n: int, tokenizer):
        self._vocab = prior.vocab
        self._n = n
        self._tokenizer = tokenizer
        self._index = None

    def setup(self):
        self._index = {g: i for i, g in enumerate(self._vocab)}

    def process(self, element):
        if type(element) is tuple and len(element) == 2 and type(element[0]) is str and element[0] != "":
            user, text = element  # the common case (a text that is no plain str: checked below)
            if type(text) is not str:
                user, text = E.check_pair(element, "BayesianNgrams", E.BAYESIAN_SHAPE, "text")  # or an error
        else:
            user, text = E.check_pair(element, "BayesianNgrams", E.BAYESIAN_SHAPE, "text")  # typed keys, or an error
        for g, k in K.text_ngram_counts(text, self._n, self._tokenizer).items():
            i = self._index.get(g)
            if i is not None:  # outside the public vocabulary: not part of the released distribution
                yield (user, i), k


class ClampUserFn(WorkerRngDoFn):
    """(user, [(index, count)]) -> (user, (indices, counts)) clamped to C each and W in total (Alg. 1 l. 2)."""

    def __init__(self, C: int, W: int, seed: Optional[int]):
        super().__init__(seed)
        self._C, self._W, self._seed = C, W, seed

    def process(self, element):
        user, pairs = element
        counts = {}
        for i, k in pairs:
            counts[i] = counts.get(i, 0) + k
        yield user, K.clamp_user_counts(counts, self._C, self._W, user, self._seed, self._rng)


class SplitUsersFn(WorkerRngDoFn):
    """Alg. 2's disjoint split: the scoring set goes to the ``first`` output, the release set to main."""

    FIRST = "first"

    def __init__(self, fraction: float, seed: Optional[int]):
        super().__init__(seed)
        self._fraction, self._seed = fraction, seed

    def process(self, element):
        if K.in_validation_set(element[0], self._fraction, self._seed, self._rng):
            yield beam.pvalue.TaggedOutput(self.FIRST, element)
        else:
            yield element


class CountStatsFn(beam.CombineFn):
    """(user, (indices, counts)) -> (c, N): totals and users per n-gram (Alg. 1 lines 4-5). Exact (int)."""

    def __init__(self, V: int):
        self._V = V

    def create_accumulator(self):
        return np.zeros(self._V, dtype=np.int64), np.zeros(self._V, dtype=np.int64)

    def add_input(self, acc, element):
        idx, cnt = element[1]
        acc[0][idx] += cnt
        acc[1][idx] += 1
        return acc

    def merge_accumulators(self, accs):
        it = iter(accs)
        c, N = next(it)
        c, N = c.copy(), N.copy()
        for c2, N2 in it:
            c += c2
            N += N2
        return c, N

    def extract_output(self, acc):
        return acc


class MaxVectorFn(beam.CombineFn):
    """Elementwise max of equal-length vectors; zeros when empty (exact, order independent)."""

    def __init__(self, size: int):
        self._size = size

    def create_accumulator(self):
        return np.zeros(self._size)

    def add_input(self, acc, v):
        return np.maximum(acc, v)

    def merge_accumulators(self, accs):
        out = np.zeros(self._size)
        for a in accs:
            out = np.maximum(out, a)
        return out

    def extract_output(self, acc):
        return acc


def _sensitivity_context(stats, S_values, C):
    c, N = stats
    return K.SensitivityContext.build(c, N, S_values, C)


def _user_sensitivity(element, ctx):
    return K.user_sensitivity(ctx, *element[1])


def _user_score_change(element, log_thetas):
    return K.user_score_change(log_thetas, *element[1])


def _log_thetas(stats, prior, params):
    return candidate_log_thetas(prior, stats[0], stats[1], params)


class UserChoiceChangeFn(beam.DoFn):
    """(user, (indices, counts)) -> the private choice's score change per candidate for removing the user
    (:func:`bayesian_kernels.user_choice_change`); the context is built once per worker from ``(c, N)``."""

    def __init__(self, prior: K.PublicPrior, params: BayesianParams):
        self._prior, self._params = prior, params
        self._ctx = self._stats = None

    def process(self, element, stats):
        if self._ctx is None or self._stats is not stats:  # rebuilt if the runner hands over a new side input
            self._ctx = K.ChoiceContext.build(self._prior, stats[0], stats[1], self._params)
            self._stats = stats
        yield K.user_choice_change(self._ctx, *element[1])


def _claim1(stats, S_values, C):
    ctx = _sensitivity_context(stats, S_values, C)
    return K.sensitivities("bound", ctx, None)


class ReleaseFn(WorkerRngDoFn):
    """One worker: the final vector math (:func:`finalize`) -> (n-gram, probability) and the info dict."""

    INFO = "info"

    def __init__(self, algorithm: str, prior: K.PublicPrior, params: BayesianParams, seed: Optional[int]):
        super().__init__(seed)
        self._algorithm, self._prior, self._params, self._seed = algorithm, prior, params, seed

    def process(self, _, stats, gammas, c1=None, set1_changes=None, choice_changes=None):
        theta, info = finalize(
            self._prior,
            self._algorithm,
            self._params,
            stats[0],
            stats[1],
            gammas,
            self._seed,
            self._rng,
            c1=c1,
            set1_changes=set1_changes,
            choice_changes=choice_changes,
        )
        yield beam.pvalue.TaggedOutput(self.INFO, info["public"])
        for g, p in zip(self._prior.vocab, theta.tolist()):
            yield g, p


class ClampedUserCounts(beam.PTransform):
    """(user, text) -> (user, (indices, counts)) over the public vocabulary, clamped to C and W."""

    def __init__(
        self,
        prior: K.PublicPrior,
        params: BayesianParams,
        seed: Optional[int],
        tokenizer=tx.default_tokenize,
        label=None,
    ):
        super().__init__(label)
        self._prior, self._params, self._seed, self._tokenizer = prior, params, seed, tokenizer

    def expand(self, records):
        return (
            records
            | "CountNgrams" >> beam.ParDo(UserNgramCountsFn(self._prior, self._params.n, self._tokenizer))
            # ((user, index), count) per record
            | "SumPerUserNgram" >> beam.CombinePerKey(sum)  # ((user, index), count)
            | "KeyByUser" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))  # (user, (index, count))
            | "GroupByUser" >> beam.GroupByKey()  # (user, [(index, count)])
            | "Clamp" >> beam.ParDo(ClampUserFn(self._params.C, self._params.W, self._seed))
            # (user, (indices, counts)) counts <= C, sum <= W
        )


class BayesianNgrams(beam.PTransform):
    """(user, text) records -> {'distribution': (n-gram, probability), 'info': report dict}.

    ``algorithm`` 'bayesian' (the default) is worst-case (epsilon, delta)-DP: the clamped counts with exact
    discrete Gaussian noise, the posterior and the choice of (S, rho) computed from them (post-processing;
    docs/bayesian_ngrams.md). 'bayesian_data_dependent' is the paper's Algorithm 1 (``params.tune`` False)
    or Algorithm 2 (True), calibrated to data-dependent sensitivities: NOT worst-case DP, it needs
    ``params.acknowledge_data_dependent``. 'laplace' and 'laplace_public' (data-dependent, acknowledged
    likewise) are the section 4.2 baselines. The release is over the public vocabulary of
    ``prior``; the probabilities of the ``distribution`` output sum to 1 (one element per public n-gram).

    Args:
      algorithm: the mechanism, one of :data:`privacy.bayesian.MECHANISMS`.
      prior: the public vocabulary and counts (bounded; shipped with the transform).
      params: :class:`privacy.bayesian.BayesianParams`.
      seed: None (OS entropy on workers) or the reproducible-mode seed (NOT private against anyone
        who knows it); under a seed the output equals :func:`transforms.reference.bayesian_release`.
      tokenizer: ``str -> list[str]`` (picklable top-level function); its output is checked
        (:class:`transforms.core.text.TokenizerError`: a list of non-empty strings without whitespace).

    Input: ``(user, text)`` elements (no Arrow batches), checked where they enter
    (:mod:`transforms.core.elements`): a 2-tuple (or 2-list) of a non-empty ``str`` user (or a typed key:
    ``int``, not ``bool``, distinct from its decimal string; non-empty ``bytes``; a non-empty tuple of
    those) and a ``str`` text. Anything else (a dict, ``None``, a list, an Arrow batch, ...) raises
    :class:`transforms.core.elements.InputElementError` (a ``TypeError`` naming this shape and the
    element's type, never its content).
    """

    def __init__(
        self,
        algorithm: str,
        prior: K.PublicPrior,
        params: BayesianParams,
        *,
        seed: Optional[int] = None,
        tokenizer=tx.default_tokenize,
        label=None,
    ):
        super().__init__(label)
        self.algorithm = check_mechanism(algorithm, params)
        self._prior, self._params, self._seed, self._tokenizer = prior, params, seed, tokenizer

    def expand(self, records):
        randomness.warn_if_seeded(self._seed)
        p, prior, V = self._params, self._prior, self._prior.size
        users = records | "UserCounts" >> ClampedUserCounts(prior, p, self._seed, self._tokenizer)
        # (user, (indices, counts))
        start = records.pipeline | "ReleaseTrigger" >> beam.Create([None])
        side = beam.pvalue.AsSingleton
        if not p.tune:
            stats = users | "Stats" >> beam.CombineGlobally(CountStatsFn(V))  # (c, N)
            gammas = self._gammas(users, stats, "")
            choice = None
            if self.algorithm == "bayesian_data_dependent" and p.choose:
                choice = side(
                    users
                    | "UserChoiceChange" >> beam.ParDo(UserChoiceChangeFn(prior, p), side(stats))  # (K,) per user
                    | "MaxChoiceChange" >> beam.CombineGlobally(MaxVectorFn(len(p.grid)))  # (K,)
                )
            out = start | "Release" >> beam.ParDo(
                ReleaseFn(self.algorithm, prior, p, self._seed), side(stats), gammas, None, None, choice
            ).with_outputs(ReleaseFn.INFO, main="distribution")
        else:
            split = users | "SplitUsers" >> beam.ParDo(SplitUsersFn(p.validation_fraction, self._seed)).with_outputs(
                SplitUsersFn.FIRST, main="second"
            )  # first: scoring set, second: release set
            first, second = split[SplitUsersFn.FIRST], split["second"]
            stats1 = first | "StatsScoringSet" >> beam.CombineGlobally(CountStatsFn(V))  # (c1, N1)
            stats2 = second | "StatsReleaseSet" >> beam.CombineGlobally(CountStatsFn(V))  # (c2, N2)
            gammas = self._gammas(second, stats2, "ReleaseSet")
            c1 = stats1 | "C1" >> beam.Map(lambda s: s[0])  # c1
            set1 = None
            if p.sensitivity == "brute_force":
                log_thetas = stats2 | "CandidateLogThetas" >> beam.Map(_log_thetas, prior, p)  # (K, V)
                set1 = side(
                    first
                    | "UserScoreChange" >> beam.Map(_user_score_change, side(log_thetas))  # (K,)
                    | "MaxScoreChange" >> beam.CombineGlobally(MaxVectorFn(len(p.grid)))  # (K,)
                )
            out = start | "Release" >> beam.ParDo(
                ReleaseFn(self.algorithm, prior, p, self._seed), side(stats2), gammas, side(c1), set1
            ).with_outputs(ReleaseFn.INFO, main="distribution")
        return {"distribution": out["distribution"], "info": out[ReleaseFn.INFO]}

    def _gammas(self, users, stats, suffix):
        p = self._params
        side = beam.pvalue.AsSingleton
        if self.algorithm != "bayesian_data_dependent":
            return None
        if p.sensitivity == "bound":
            return side(stats | f"Claim1Bound{suffix}" >> beam.Map(_claim1, p.S_values, p.C))  # (|S|,)
        ctx = stats | f"SensitivityContext{suffix}" >> beam.Map(_sensitivity_context, p.S_values, p.C)
        return side(
            users
            | f"UserSensitivity{suffix}" >> beam.Map(_user_sensitivity, side(ctx))  # (|S|,) per user
            | f"MaxSensitivity{suffix}" >> beam.CombineGlobally(MaxVectorFn(len(p.S_values)))  # (|S|,)
        )
