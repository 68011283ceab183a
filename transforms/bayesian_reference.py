"""In-memory reference of the Bayesian DP n-gram release (Alg. 1-2 and the sec. 4.2 baselines).

The test oracle of :class:`transforms.bayesian.BayesianNgrams` and the fast path for small data: same
parameters, same randomness contract, same output (bit for bit under a seed). :func:`finalize` is the
single-worker vector math both run after the distributed aggregation.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from privacy.bayesian_params import BayesianParams
from privacy.calibration import analytic_gaussian_sigma
from transforms import bayesian_kernels as K
from transforms import ngrams


def candidate_log_thetas(prior: K.PublicPrior, c2: np.ndarray, N2: np.ndarray, params: BayesianParams) -> np.ndarray:
    """Alg. 2 line 3: ``log softmax(mu_ps^(k))`` of every (S, rho) candidate, from the release set."""
    mu_p = K.mu_prior(prior.alpha)
    xh = K.x_hat(c2)
    return np.stack([K.log_softmax(K.posterior_mean(xh, K.decay_weights(N2, S, params.C), mu_p, rho))
                     for S, rho in params.grid])


def finalize(
    prior: K.PublicPrior,
    params: BayesianParams,
    c: np.ndarray,
    N: np.ndarray,
    gammas: Optional[np.ndarray],
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    c1: Optional[np.ndarray] = None,
    set1_changes: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """The released distribution over ``prior.vocab`` and a report dict.

    Args:
      c, N: totals and users per n-gram of the release set (all users, or Alg. 2's second set).
      gammas: sensitivity of ``r`` per S in ``params.S_values`` (bayesian only).
      c1, set1_changes: Alg. 2's scoring set totals and, for ``brute_force``, the max over its users
        of the score change per candidate (``None`` without tuning).
    Returns:
      (theta, info): ``info["public"]`` holds what may be reported (DP outputs and public
      parameters); ``info["non_private"]`` holds data-dependent values (sensitivities, sigma) for
      offline evaluation only.
    """
    V = prior.size
    public: Dict[str, Any] = {"mechanism": params.mechanism, "vocabulary_size": V}
    non_private: Dict[str, Any] = {}
    eps = params.epsilon_release
    if params.mechanism == "laplace":
        z = K.standard_noise("laplace", prior.vocab, K.PURPOSE_LAPLACE, seed, rng)
        theta, scale = K.laplace_counts(c, params.W, eps, z)
        public.update(laplace_scale=scale, sensitivity="data-independent", l1_sensitivity=params.W)
        return theta, {"public": public, "non_private": non_private}
    if params.mechanism == "laplace_public":
        z = K.standard_noise("laplace", prior.vocab, K.PURPOSE_LAPLACE, seed, rng)
        theta, scale = K.laplace_public(c, prior.alpha, params.W, eps, z)
        public.update(sensitivity="data-dependent", sensitivity_method="2W/(T-W), T = private total")
        non_private.update(laplace_scale=scale)
        return theta, {"public": public, "non_private": non_private}

    mu_p = K.mu_prior(prior.alpha)
    xh = K.x_hat(c)
    S_index = {S: i for i, S in enumerate(params.S_values)}
    k_star = 0
    if params.tune:
        log_thetas = candidate_log_thetas(prior, c, N, params)
        scores = np.array([K.score_from_log_theta(c1, lt) for lt in log_thetas])  # eq. 6
        sens = 0.0
        for k, (S, rho) in enumerate(params.grid):
            release_term = K.score_sensitivity_release_set(rho, float(gammas[S_index[S]]), c1)
            if params.sensitivity == "brute_force":
                scoring_term = float(set1_changes[k])
            else:
                scoring_term = K.score_change_bound(log_thetas[k], params.C, params.W)
            sens = max(sens, release_term, scoring_term)
        k_star, scale = K.report_noisy_min(scores, sens, params.epsilon_tune, seed, rng)
        non_private.update(tune_scores=scores.tolist(), tune_sensitivity=sens, tune_laplace_scale=scale)
        public.update(tune_epsilon=params.epsilon_tune, tune_candidates=len(params.grid))
    S, rho = params.grid[k_star]
    gamma = float(gammas[S_index[S]])
    mu_ps = K.posterior_mean(xh, K.decay_weights(N, S, params.C), mu_p, rho)
    sigma = K.sigma_ps(gamma, rho, eps, params.delta)
    z = K.standard_noise("gaussian", prior.vocab, K.PURPOSE_GAUSSIAN, seed, rng)
    theta = K.sample_posterior(mu_ps, sigma, z)
    public.update(
        S=S, rho=rho, delta=params.delta,
        sigma_per_unit_sensitivity=analytic_gaussian_sigma(eps, params.delta, 1.0),
        sensitivity="data-dependent", sensitivity_method=params.sensitivity,
    )
    non_private.update(gamma=gamma, sigma_ps=sigma)
    return theta, {"public": public, "non_private": non_private}


def user_counts_from_texts(
    texts: Mapping[Any, Iterable[str]],
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    tokenizer=ngrams.default_tokenize,
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
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """Algorithm 1 (or 2 with ``params.tune``, or a baseline) on already clamped per-user counts."""
    if seed is None and rng is None:
        rng = np.random.default_rng()
    V = prior.size
    order = sorted(users, key=lambda u: str(u))
    if not params.tune:
        c, N = K.accumulate((users[u] for u in order), V)
        gammas = None
        if params.mechanism == "bayesian":
            ctx = K.SensitivityContext.build(c, N, params.S_values, params.C)
            gammas = K.sensitivities(params.sensitivity, ctx, (users[u] for u in order))
        return finalize(prior, params, c, N, gammas, seed, rng)
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
    return finalize(prior, params, c2, N2, gammas, seed, rng, c1=c1, set1_changes=set1_changes)


def release(
    texts: Mapping[Any, Iterable[str]],
    prior: K.PublicPrior,
    params: BayesianParams,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
    tokenizer=ngrams.default_tokenize,
) -> Tuple[Dict[str, float], Dict[str, Any]]:
    """user -> texts in, ``{n-gram: probability}`` over the public vocabulary out (plus the info dict)."""
    if seed is None and rng is None:
        rng = np.random.default_rng()
    users = user_counts_from_texts(texts, prior, params, seed, rng, tokenizer)
    theta, info = release_from_user_counts(users, prior, params, seed, rng)
    return dict(zip(prior.vocab, theta.tolist())), info
