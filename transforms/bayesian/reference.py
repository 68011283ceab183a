"""In-memory reference of the Bayesian DP n-gram release (Alg. 1-2 and the sec. 4.2 baselines).

The test oracle of :class:`transforms.bayesian.bayesian.BayesianNgrams` and the fast path for small data: same
parameters, same randomness contract, same output (bit for bit under a seed). :func:`finalize` is the
single-worker vector math both run after the distributed aggregation (a kernel).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import numpy as np

from dp_partition_beam.privacy.bayesian import BayesianParams, check_mechanism
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.bayesian_kernels import candidate_log_thetas, finalize
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx


def user_counts_from_texts(
    texts: Mapping[Any, Iterable[str]],
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    tokenizer=tx.default_tokenize,
) -> Dict[Any, K.UserCounts]:
    """user -> clamped (indices, counts) over the public vocabulary. N-grams outside the vocabulary
    are dropped (the release is a distribution over the public vocabulary, paper sec. 3 and 4.1)."""
    index = prior.index()
    out = {}
    for user, docs in texts.items():
        counts: Dict[int, int] = {}
        for text in docs:
            for g, k in K.text_ngram_counts(text, params.n, tokenizer).items():
                i = index.get(g)
                if i is not None:
                    counts[i] = counts.get(i, 0) + k
        if counts:
            out[user] = K.clamp_user_counts(counts, params.C, params.W, user, seed, rng)
    return out


def release_from_user_counts(
    users: Mapping[Any, K.UserCounts],
    algorithm: str,
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """``algorithm`` (Algorithm 1, or 2 with ``params.tune``, or a baseline) on already clamped
    per-user counts. A building block of :func:`release` (and of offline evaluations that call it
    once per seed): it does not log the seed warning, :func:`release` does."""
    check_mechanism(algorithm, params)
    if seed is None and rng is None:
        rng = np.random.default_rng()
    V = prior.size
    order = sorted(users, key=lambda u: str(u))
    if not params.tune:
        c, N = K.accumulate((users[u] for u in order), V)
        gammas = choice_changes = None
        if algorithm == "bayesian_data_dependent":
            ctx = K.SensitivityContext.build(c, N, params.S_values, params.C)
            gammas = K.sensitivities(params.sensitivity, ctx, (users[u] for u in order))
            if params.choose:
                cctx = K.ChoiceContext.build(prior, c, N, params)
                choice_changes = np.zeros(len(params.grid))
                for u in order:
                    choice_changes = np.maximum(choice_changes, K.user_choice_change(cctx, *users[u]))
        return finalize(prior, algorithm, params, c, N, gammas, seed, rng, choice_changes=choice_changes)
    first = [u for u in order if K.in_validation_set(u, params.validation_fraction, seed, rng)]
    first_set = set(first)
    second = [u for u in order if u not in first_set]
    c1, _ = K.accumulate((users[u] for u in first), V)
    c2, N2 = K.accumulate((users[u] for u in second), V)
    ctx = K.SensitivityContext.build(c2, N2, params.S_values, params.C)
    gammas = K.sensitivities(params.sensitivity, ctx, (users[u] for u in second))
    set1_changes = None
    if params.sensitivity == "brute_force":
        log_thetas = candidate_log_thetas(prior, c2, N2, params)
        set1_changes = np.zeros(len(params.grid))
        for u in first:
            set1_changes = np.maximum(set1_changes, K.user_score_change(log_thetas, *users[u]))
    return finalize(prior, algorithm, params, c2, N2, gammas, seed, rng, c1=c1, set1_changes=set1_changes)


def release(
    texts: Mapping[Any, Iterable[str]],
    algorithm: str,
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
    tokenizer=tx.default_tokenize,
) -> Tuple[Dict[str, float], Dict[str, Any]]:
    """user -> texts in, ``{n-gram: probability}`` over the public vocabulary out (plus the info dict).

    Args:
      algorithm: the mechanism, one of :data:`privacy.bayesian.MECHANISMS` ('bayesian',
        'bayesian_data_dependent', 'laplace', 'laplace_public'), as for :class:`transforms.BayesianNgrams`.
      seed: reproducible mode (NOT private against anyone who knows it); else ``rng`` or OS entropy.
    """
    check_mechanism(algorithm, params)
    randomness.warn_if_seeded(seed)
    if seed is None and rng is None:
        rng = np.random.default_rng()
    users = user_counts_from_texts(texts, prior, params, seed, rng, tokenizer)
    theta, info = release_from_user_counts(users, algorithm, prior, params, seed, rng)
    return dict(zip(prior.vocab, theta.tolist())), info
