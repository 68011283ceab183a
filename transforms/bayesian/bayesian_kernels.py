"""Pure numpy kernels of the Bayesian DP n-gram release (Bayesian DP paper, Alg. 1-2, sec. 4.2).

Everything is vectorised over the public vocabulary V (a bounded, public list of n-grams, sorted so
that index ``i`` means the same n-gram on every worker). Shared by the in-memory reference
(:mod:`transforms.bayesian.reference`) and the Beam transform (:mod:`transforms.bayesian.bayesian`), which is
what makes the two identical under a seed.

Notation (paper section 3): ``alpha`` public counts, ``c`` private totals after clamping, ``N`` users
per n-gram, ``x_hat`` eq. 2, ``mu_p`` eq. 1, ``w`` eq. 5, ``r = w * x_hat``,
``mu_ps = rho * r + (1 - rho) * mu_p`` (Corollary 1). The sensitivity ``gamma`` is the l2 sensitivity of
``r`` (Alg. 1's gamma; Corollary 1's ``||Delta mu_ps||_2``), so ``sigma_ps = rho * gamma * sigma_1``.

Both sensitivities here (brute force and Claim 1) are functions of the private data (``c``, ``N``):
they are *local* sensitivities at the actual dataset, not global ones. See docs/bayesian_ngrams.md.

Errata (checked by tests/transforms/bayesian/test_bayesian_kernels.py):
  * Claim 1 / eq. 7 use the indicator ``1(N <= C/S)`` for where ``w`` can change; ``w_i`` changes when a
    holder of i is removed iff ``S*(N_i - 1)/C < 1``, i.e. ``N_i < C/S + 1``. The paper's indicator misses
    ``C/S < N_i < C/S + 1`` (non-integer C/S); :func:`claim1_bound` uses the correct one.
  * Claim 2's Lipschitz constant ``rho*||c||_2``: the gradient of eq. 6 in ``r`` is
    ``rho*(T*theta - c)`` (T = sum c), not ``rho*c*(1 - theta)``; its l2 norm is at most
    ``rho*sqrt(T^2 + ||c||_2^2)`` (c, theta >= 0), which :func:`score_sensitivity_release_set` uses.
  * Gaussian calibration: the classic ``sqrt(2 log(1.25/delta))/eps`` of Theorem 1 is only valid for
    eps < 1; we use the analytic Gaussian mechanism (Balle & Wang 2018), valid for every eps and tighter.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import special

from dp_partition_beam.privacy.bayesian import BayesianParams, noisy_counts_plan
from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.core.discrete_gaussian import DiscreteGaussian

# Randomness purposes (the contract's "purpose" field).
PURPOSE_TOTAL_CAP = "bayes_total_cap"
PURPOSE_SPLIT = "bayes_split"
PURPOSE_GAUSSIAN = "bayes_gaussian"
PURPOSE_TUNE = "bayes_tune"
PURPOSE_LAPLACE = "bayes_laplace"
PURPOSE_CHOICE = "bayes_choice"
PURPOSE_COUNT_NOISE = "bayes_count_noise"
PURPOSE_FISSION = "bayes_fission"

UserCounts = Tuple[np.ndarray, np.ndarray]  # (vocabulary indices, sorted; clamped counts)


# ---------------------------------------------------------------------------------------------
# Public prior
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PublicPrior:
    """The public vocabulary (sorted n-grams) and its counts ``alpha``."""

    vocab: Tuple[str, ...]
    alpha: np.ndarray

    @staticmethod
    def from_counts(counts: Mapping[str, float]) -> "PublicPrior":
        if not counts:
            raise ValueError("public counts are empty: the public vocabulary needs at least one n-gram")
        vocab = tuple(sorted(counts))
        alpha = np.array([float(counts[g]) for g in vocab], dtype=np.float64)
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
            raise ValueError("public counts must be finite and >= 0")
        return PublicPrior(vocab, alpha)

    @property
    def size(self) -> int:
        return len(self.vocab)

    def index(self) -> Dict[str, int]:
        return {g: i for i, g in enumerate(self.vocab)}


# ---------------------------------------------------------------------------------------------
# Per-user counts (Alg. 1 lines 1-3)
# ---------------------------------------------------------------------------------------------


def text_ngram_counts(text: str, n: int, tokenizer=tx.default_tokenize) -> Counter:
    """Occurrences of every n-gram (space-joined tokens) in ``text``; never across a line break."""
    out: Counter = Counter()
    check = tokenizer is not tx.default_tokenize
    for seg in tx.segments(text):
        toks = tokenizer(seg)
        if check:
            toks = tx.checked_tokens(toks, tokenizer)  # TokenizerError unless a list of tokens
        for i in range(len(toks) - n + 1):
            out[" ".join(toks[i : i + n])] += 1
    return out


def clamp_user_counts(
    counts: Mapping[int, int], C: int, W: int, user, seed: Optional[int], rng: Optional[np.random.Generator]
) -> UserCounts:
    """One user's counts over the vocabulary, clamped to ``C`` per n-gram (Alg. 1 line 2) and to ``W``
    in total (sec. 4.2/4.3: each user contributes at most W counts overall).

    If the clamped total exceeds W, n-grams are taken in a uniformly random order (priority per
    (user, index): seeded ``keyed_uniform(seed, "bayes_total_cap", 0, (user, i))``, else from ``rng``)
    and each gets ``min(count, what is left of W)``. Returns (sorted indices, counts > 0).
    """
    idx = np.array(sorted(counts), dtype=np.int64)
    cnt = np.minimum(np.array([int(counts[i]) for i in idx], dtype=np.int64), C)
    if cnt.sum() > W:
        if seed is not None:
            prio = randomness.keyed_uniform(seed, PURPOSE_TOTAL_CAP, 0, [(user, int(i)) for i in idx])
        else:
            if rng is None:
                raise ValueError("unseeded total-count capping needs a worker generator (rng)")
            prio = rng.random(len(idx))
        order = np.argsort(prio, kind="stable")
        left = W
        kept = np.zeros_like(cnt)
        for j in order:
            if left <= 0:
                break
            take = min(int(cnt[j]), left)
            kept[j] = take
            left -= take
        keep = kept > 0
        idx, cnt = idx[keep], kept[keep]
    return idx, cnt


def accumulate(users: Iterable[UserCounts], V: int) -> Tuple[np.ndarray, np.ndarray]:
    """Totals ``c`` (Alg. 1 line 4) and users per n-gram ``N`` (line 5) from per-user counts."""
    c = np.zeros(V, dtype=np.int64)
    N = np.zeros(V, dtype=np.int64)
    for idx, cnt in users:
        c[idx] += cnt
        N[idx] += 1
    return c, N


def in_validation_set(user, fraction: float, seed: Optional[int], rng: Optional[np.random.Generator]) -> bool:
    """Alg. 2's disjoint split: True puts the user in the first (scoring) set, with prob. ``fraction``."""
    if seed is not None:
        u = float(randomness.keyed_uniform(seed, PURPOSE_SPLIT, 0, [user])[0])
    else:
        if rng is None:
            raise ValueError("unseeded user split needs a worker generator (rng)")
        u = float(rng.random())
    return u < fraction


# ---------------------------------------------------------------------------------------------
# Equations 1, 2, 5 and the posterior mean
# ---------------------------------------------------------------------------------------------


def log_centered(counts: np.ndarray) -> np.ndarray:
    """``log(a + 1) - mean_j log(a_j + 1)``: eq. 1 for public counts, eq. 2 for private totals."""
    lg = np.log1p(np.asarray(counts, dtype=np.float64))
    return lg - lg.mean()


def mu_prior(alpha: np.ndarray) -> np.ndarray:
    """Eq. 1: the prior mean ``mu_p`` from the public counts."""
    return log_centered(alpha)


def x_hat(c: np.ndarray) -> np.ndarray:
    """Eq. 2: the private counts as one sample in log space."""
    return log_centered(c)


def decay_weights(N: np.ndarray, S: float, C: int) -> np.ndarray:
    """Eq. 5: ``w = min(1, S*N/C)``."""
    return np.minimum(1.0, S * np.asarray(N, dtype=np.float64) / C)


def posterior_mean(xh: np.ndarray, w: np.ndarray, mu_p: np.ndarray, rho: float) -> np.ndarray:
    """Corollary 1: ``mu_ps = rho * w * x_hat + (1 - rho) * mu_p``."""
    return rho * w * xh + (1.0 - rho) * mu_p


# ---------------------------------------------------------------------------------------------
# Sensitivity of r = w * x_hat (Corollary 1 brute force, Claim 1 bound)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SensitivityContext:
    """The global vectors a per-user sensitivity evaluation needs (one per S value in ``S_values``)."""

    c: np.ndarray
    N: np.ndarray
    xh: np.ndarray
    S_values: Tuple[float, ...]
    C: int
    w: np.ndarray  # (len(S_values), V)
    w2: np.ndarray  # (len(S_values),) sum of w^2

    @staticmethod
    def build(c: np.ndarray, N: np.ndarray, S_values: Sequence[float], C: int) -> "SensitivityContext":
        xh = x_hat(c)
        w = np.stack([decay_weights(N, S, C) for S in S_values])
        w2 = np.array([math.fsum(row * row) for row in w])
        return SensitivityContext(
            np.asarray(c, dtype=np.float64),
            np.asarray(N, dtype=np.int64),
            xh,
            tuple(float(s) for s in S_values),
            int(C),
            w,
            w2,
        )


def removal_shift(c: np.ndarray, xh: np.ndarray, idx: np.ndarray, cnt: np.ndarray) -> Tuple[float, np.ndarray]:
    """Removing one user (counts ``cnt`` on n-grams ``idx``) moves eq. 2's ``x_hat`` to ``x_hat + m - d`` on
    the user's n-grams and to ``x_hat + m`` elsewhere, with ``d_i = log(c_i+1) - log(c_i - dc_i + 1)`` and
    ``m = sum(d)/V`` (the change of eq. 3's mean). Returns ``(m, x_hat without the user on idx)``."""
    c_u = c[idx]
    d = np.log1p(c_u) - np.log1p(c_u - cnt)
    m = math.fsum(d) / c.shape[0]
    return m, xh[idx] + m - d


def user_sensitivity(ctx: SensitivityContext, idx: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """``||w * x_hat - w_{-n} * x_hat_{-n}||_2`` for removing one user, for every S (Corollary 1; the
    brute-force term of Alg. 1 computed exactly, in O(|user| * |S|) from the global vectors).

    With ``d_i = log(c_i+1) - log(c_i - dc_i + 1)`` and ``m = sum(d)/V`` (the change of eq. 3's mean):
    ``x_hat_{-n} = x_hat + m - d``; off the user's n-grams ``w`` is unchanged, so those coordinates
    contribute ``m^2 * (sum(w^2) - sum_{i in user} w_i^2)``.
    """
    if idx.size == 0:
        return np.zeros(len(ctx.S_values))
    m, xm_u = removal_shift(ctx.c, ctx.xh, idx, cnt)
    x_u = ctx.xh[idx]
    out = np.empty(len(ctx.S_values))
    n_minus = (ctx.N[idx] - 1).astype(np.float64)
    for k, S in enumerate(ctx.S_values):
        w_u = ctx.w[k, idx]
        wm_u = np.minimum(1.0, S * n_minus / ctx.C)
        diff = w_u * x_u - wm_u * xm_u
        rest = max(0.0, ctx.w2[k] - math.fsum(w_u * w_u)) * m * m
        out[k] = math.sqrt(math.fsum(diff * diff) + rest)
    return out


def brute_force_sensitivity(ctx: SensitivityContext, users: Iterable[UserCounts]) -> np.ndarray:
    """Alg. 1's brute force: max over users of :func:`user_sensitivity` (per S). 0 without users."""
    best = np.zeros(len(ctx.S_values))
    for idx, cnt in users:
        best = np.maximum(best, user_sensitivity(ctx, idx, cnt))
    return best


def claim1_bound(xh: np.ndarray, N: np.ndarray, S: float, C: int) -> float:
    """Claim 1: ``|| w * L * C + (S/C) |x_hat| * 1(w can change) ||_2`` with Lemma 1's
    ``L_i = (1 - 1/V)/N_i + sum_{j != i} 1/(V N_j)``.

    n-grams no user holds (N_j = 0) can change neither ``c_j`` nor ``w_j``: their ``1/N_j`` terms are 0
    and their coordinates contribute 0 (w_j = 0). The indicator is the corrected ``1 <= N_i < C/S + 1``
    (module docstring). Data-dependent: it reads N and x_hat of the private data.
    """
    N = np.asarray(N, dtype=np.float64)
    V = N.shape[0]
    inv = np.divide(1.0, N, out=np.zeros_like(N), where=N > 0)
    H = math.fsum(inv)
    L = (1.0 - 1.0 / V) * inv + (H - inv) / V
    w = decay_weights(N, S, C)
    can_change = (N >= 1) & (S * (N - 1) / C < 1.0)
    term = w * L * C + (S / C) * np.abs(xh) * can_change
    return float(math.sqrt(math.fsum(term * term)))


def sensitivities(kind: str, ctx: SensitivityContext, users: Optional[Iterable[UserCounts]]) -> np.ndarray:
    """gamma per S value: ``brute_force`` (needs ``users``) or ``bound`` (Claim 1)."""
    if kind == "brute_force":
        return brute_force_sensitivity(ctx, users)
    return np.array([claim1_bound(ctx.xh, ctx.N, S, ctx.C) for S in ctx.S_values])


def sigma_ps(gamma: float, rho: float, epsilon: float, delta: float) -> float:
    """Corollary 1: the posterior's noise for an l2 sensitivity ``rho * gamma`` of ``mu_ps``
    (analytic Gaussian calibration instead of the classic eps < 1 formula; module docstring)."""
    if gamma <= 0.0:
        return 0.0
    return rho * gamma * analytic_gaussian_sigma(epsilon, delta, 1.0)


# ---------------------------------------------------------------------------------------------
# Sampling and softmax (Alg. 1 last two lines)
# ---------------------------------------------------------------------------------------------


def softmax(h: np.ndarray) -> np.ndarray:
    """Eq. 4, numerically stable (max-shifted, log-sum-exp); finite, >= 0, sums to 1."""
    h = np.asarray(h, dtype=np.float64)
    if not np.all(np.isfinite(h)):
        raise ValueError("softmax input must be finite")
    p = np.exp(h - special.logsumexp(h))
    return p / p.sum()


def log_softmax(h: np.ndarray) -> np.ndarray:
    return h - special.logsumexp(h)


def standard_noise(
    kind: str, vocab: Sequence[str], purpose: str, seed: Optional[int], rng: Optional[np.random.Generator]
) -> np.ndarray:
    """Unit noise per n-gram: seeded ``keyed_*(seed, purpose, 0, n-gram)``, else from ``rng``."""
    return randomness.standard_noise(kind, list(vocab), purpose, 0, seed, rng)


def sample_posterior(mu_ps: np.ndarray, sigma: float, z: np.ndarray) -> np.ndarray:
    """``theta = softmax(h)``, ``h = mu_ps + sigma * z`` (Alg. 1: sample, then softmax)."""
    return softmax(mu_ps + sigma * z)


# ---------------------------------------------------------------------------------------------
# Algorithm 2: private (S, rho) selection
# ---------------------------------------------------------------------------------------------


def cross_entropy_score(c1: np.ndarray, mu_ps: np.ndarray) -> float:
    """Eq. 6: ``q(c, mu_ps) = -sum_i c_i (mu_ps_i - log sum_j exp mu_ps_j)``."""
    return float(-math.fsum(np.asarray(c1, dtype=np.float64) * log_softmax(mu_ps)))


def score_from_log_theta(c1: np.ndarray, log_theta: np.ndarray) -> float:
    """Eq. 6 given ``log theta = log softmax(mu_ps)``: ``-sum_i c_i log theta_i``."""
    return float(-math.fsum(np.asarray(c1, dtype=np.float64) * log_theta))


def user_score_change(log_thetas: np.ndarray, idx: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """|q(c1) - q(c1 - dc)| for removing one scoring-set user, for every candidate k (Claim 2 first
    term, brute force): ``-sum_i dc_i log theta_k,i`` (>= 0 since log theta <= 0)."""
    if idx.size == 0:
        return np.zeros(log_thetas.shape[0])
    return -(log_thetas[:, idx] @ cnt.astype(np.float64))


def score_change_bound(log_theta: np.ndarray, C: int, W: int) -> float:
    """Data-independent (given theta) max of ``sum_i dc_i |log theta_i|`` over any user with counts
    <= C each and <= W in total: C on each of the largest |log theta_i| until W is used up."""
    a = np.sort(np.abs(log_theta))[::-1]
    full, part = divmod(W, C)
    total = C * math.fsum(a[:full])
    if part and full < a.size:
        total += part * a[full]
    return float(total)


def score_sensitivity_release_set(rho: float, gamma: float, c1: np.ndarray) -> float:
    """Claim 2's second-set term, corrected: removing a user of the release set moves ``r`` by at most
    gamma in l2, and ``|dq/dr| = rho*|T*theta - c|`` has l2 norm <= ``rho*sqrt(T^2 + ||c||^2)``."""
    c1 = np.asarray(c1, dtype=np.float64)
    T = math.fsum(c1)
    return rho * gamma * math.sqrt(T * T + math.fsum(c1 * c1))


def report_noisy_min(
    scores: np.ndarray,
    sensitivity: float,
    epsilon: float,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    purpose: str = PURPOSE_TUNE,
) -> Tuple[int, float]:
    """Theorem 2: ``argmin_k q_k + Lap(2 |Delta q| / epsilon)``; returns (k*, Laplace scale). Seeded noise:
    ``keyed_laplace(seed, purpose, 0, k)``."""
    K = len(scores)
    scale = 2.0 * sensitivity / epsilon
    if seed is not None:
        z = randomness.keyed_laplace(seed, purpose, 0, list(range(K)))
    else:
        if rng is None:
            raise ValueError("unseeded report-noisy-min needs a worker generator (rng)")
        z = rng.laplace(0.0, 1.0, K)
    noisy = np.asarray(scores, dtype=np.float64) + scale * z
    return int(np.argmin(noisy)), scale


# ---------------------------------------------------------------------------------------------
# The private choice of (S, rho) (issue 33; docs/bayesian_ngrams.md "Choosing the prior's weight")
# ---------------------------------------------------------------------------------------------

#: Draws of the noise penalty's numerical integration: fixed, public pseudo-random normals (a quadrature
#: rule, not privacy noise; the same on every worker and run).
PENALTY_DRAWS = 16
PENALTY_SEED = 33


@dataclasses.dataclass(frozen=True)
class ChoiceContext:
    """Everything a per-user score change of the private choice needs, from the totals ``c`` and users per
    n-gram ``N`` (built once per worker from the ``(c, N)`` side input).

    Candidate k is ``(S_k, rho_k)`` with ``h_k = mu_ps`` (Corollary 1) and ``theta_k = softmax(h_k)``; its
    score is the cross-entropy of the private distribution ``p_hat = c / T`` under ``theta_k`` *relative to
    the public prior alone* ``theta_0 = softmax(mu_p)``: ``bias_k = -sum_i p_hat_i log(theta_k,i /
    theta_0,i)`` (= KL(p_hat || theta_k) - KL(p_hat || theta_0)). ``S_of[k]`` indexes ``S_values``.
    """

    candidates: Tuple[Tuple[float, float], ...]
    S_values: Tuple[float, ...]
    S_of: np.ndarray  # (K,)
    rho: np.ndarray  # (K,)
    C: int
    c: np.ndarray  # (V,) float
    N: np.ndarray  # (V,)
    xh: np.ndarray  # (V,)
    T: float
    p_hat: np.ndarray  # (V,)
    w: np.ndarray  # (|S|, V)
    theta: np.ndarray  # (K, V)
    ell: np.ndarray  # (K, V) log theta_k - log theta_0
    p_ell: np.ndarray  # (K,) sum p_hat * ell_k
    theta_w: np.ndarray  # (K,) sum theta_k * w_S(k)
    theta_w2: np.ndarray  # (K,) sum theta_k * w_S(k)^2
    c_w: np.ndarray  # (|S|,) sum c * w_S
    bias: np.ndarray  # (K,) -p_ell

    @staticmethod
    def build(prior: "PublicPrior", c: np.ndarray, N: np.ndarray, params: BayesianParams) -> "ChoiceContext":
        cands = tuple(params.grid)
        S_values = tuple(params.S_values)
        S_pos = {S: i for i, S in enumerate(S_values)}
        S_of = np.array([S_pos[S] for S, _ in cands], dtype=np.int64)
        rho = np.array([r for _, r in cands], dtype=np.float64)
        cf = np.asarray(c, dtype=np.float64)
        N = np.asarray(N, dtype=np.int64)
        T = math.fsum(cf)
        p_hat = cf / T if T > 0 else np.zeros_like(cf)
        xh = x_hat(cf)
        mu_p = mu_prior(prior.alpha)
        lt0 = log_softmax(mu_p)
        w = np.stack([decay_weights(N, S, params.C) for S in S_values])
        log_theta = candidate_log_thetas(prior, cf, N, params)  # (K, V), the candidates' log softmax(mu_ps)
        theta = np.exp(log_theta)
        ell = log_theta - lt0
        p_ell = np.array([math.fsum(p_hat * e) for e in ell])
        wk = w[S_of]
        return ChoiceContext(
            cands,
            S_values,
            S_of,
            rho,
            int(params.C),
            cf,
            N,
            xh,
            T,
            p_hat,
            w,
            theta,
            ell,
            p_ell,
            np.array([math.fsum(r) for r in theta * wk]),
            np.array([math.fsum(r) for r in theta * wk * wk]),
            np.array([math.fsum(r) for r in w * cf]),
            -p_ell,
        )


def user_choice_change(ctx: ChoiceContext, idx: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Per candidate k, a bound on ``|bias_k(D) - bias_k(D - n)|`` for removing this user n (proof in
    docs/bayesian_ngrams.md, "The score's sensitivity"). Two parts, with ``t = sum(cnt)``:

    * the private distribution changes, ``p' = (c - dc) / (T - t)``, at fixed ``theta``:
      ``a = -sum_i (p_hat_i - p'_i) ell_k,i = -(sum_{i in n} dc_i ell_k,i - t * p_ell_k) / (T - t)``, exact;
    * ``h_k`` changes by ``dh = rho_k * (w' x_hat' - w x_hat)`` (exact: on the user's n-grams as in
      :func:`user_sensitivity`, ``rho_k w_j m`` elsewhere) at fixed ``p'``: the cross-entropy
      ``-sum p'_i h_i + lse(h)`` moves by ``F + R`` with the exact first-order term
      ``F = sum_i (theta_i - p'_i) dh_i`` and ``0 <= R <= exp(2 ||dh||_inf) / 2 * sum_i theta_i dh_i^2``
      (lse's Hessian ``diag(theta) - theta theta^T <= diag(theta)``, theta moves by at most
      ``exp(2 ||dh||_inf)`` along the segment).

    The change is ``a - F - R``; returned: ``max(|a - F|, |a - F - R_max|)``, inflated by a relative 1e-9 for
    floating point. ``inf`` for a user holding all the mass (``T == t``: D - n has no distribution).
    """
    K = len(ctx.candidates)
    if idx.size == 0:
        return np.zeros(K)
    cntf = np.asarray(cnt, dtype=np.float64)
    t = math.fsum(cntf)
    rest = ctx.T - t
    if not rest > 0:
        return np.full(K, np.inf)
    a = -((ctx.ell[:, idx] @ cntf) - t * ctx.p_ell) / rest
    c_u = ctx.c[idx]
    m, xm = removal_shift(ctx.c, ctx.xh, idx, cntf)
    n_minus = (ctx.N[idx] - 1).astype(np.float64)
    S_arr = np.array(ctx.S_values)
    w_u = ctx.w[:, idx]  # (|S|, u)
    wm_u = np.minimum(1.0, S_arr[:, None] * n_minus[None, :] / ctx.C)
    dr = (wm_u * xm[None, :] - w_u * ctx.xh[idx][None, :])[ctx.S_of]  # (K, u): change of r = w x_hat
    wk_u = w_u[ctx.S_of]
    th_u = ctx.theta[:, idx]
    pp_u = (c_u - cntf) / rest
    off_theta_w = ctx.theta_w - np.sum(th_u * wk_u, axis=1)
    off_p_w = (ctx.c_w[ctx.S_of] - wk_u @ c_u) / rest
    F = ctx.rho * (np.sum((th_u - pp_u[None, :]) * dr, axis=1) + m * (off_theta_w - off_p_w))
    h_inf = ctx.rho * np.maximum(np.max(np.abs(dr), axis=1), m)
    quad = np.sum(th_u * dr * dr, axis=1) + m * m * np.maximum(0.0, ctx.theta_w2 - np.sum(th_u * wk_u * wk_u, axis=1))
    R = 0.5 * np.exp(2.0 * h_inf) * ctx.rho**2 * quad
    base = a - F
    out = np.maximum(np.abs(base), np.abs(base - R))
    return out * (1.0 + 1e-9) + 1e-15


def noise_penalty(logits: np.ndarray, sigmas: Sequence[float]) -> np.ndarray:
    """``E[lse(h + sigma Z)] - lse(h)`` per sigma, at public logits ``h`` (the prior's): what Gaussian noise
    of scale sigma on the logits adds to the expected KL of any distribution to ``softmax(h + sigma Z)``
    (the linear term has mean 0). A fixed quadrature of :data:`PENALTY_DRAWS` public normal draws."""
    h = np.asarray(logits, dtype=np.float64)
    z = np.random.default_rng(PENALTY_SEED).standard_normal((PENALTY_DRAWS, h.size))
    l0 = special.logsumexp(h)
    out = []
    for s in sigmas:
        if s <= 0.0:
            out.append(0.0)
            continue
        out.append(max(0.0, math.fsum(special.logsumexp(h + s * zz) for zz in z) / PENALTY_DRAWS - l0))
    return np.array(out)


def choice_scores(ctx: ChoiceContext, prior: "PublicPrior", gammas: np.ndarray, params: BayesianParams) -> np.ndarray:
    """Expected-KL score of every candidate relative to the prior alone: ``bias_k + penalty(sigma_k)``, with
    ``sigma_k = rho_k gamma(S_k) sigma_1`` the release noise the candidate would get (gamma held at this
    dataset's value, as the release's own sigma)."""
    sigma1 = analytic_gaussian_sigma(params.epsilon_release, params.delta, 1.0)
    sigmas = ctx.rho * np.asarray(gammas, dtype=np.float64)[ctx.S_of] * sigma1
    return ctx.bias + noise_penalty(mu_prior(prior.alpha), sigmas.tolist())


def gem_normalised_scores(q: np.ndarray, sens: np.ndarray, t: float) -> np.ndarray:
    """The generalized exponential mechanism's normalised scores (Raskhodnikova & Smith 2016), for losses
    ``q`` (lower is better) with sensitivities ``sens``:
    ``s_i = max_j ((q_i + t sens_i) - (q_j + t sens_j)) / (sens_i + sens_j)``, 0 for j = i.

    Each ``s_i`` has sensitivity <= 1 when each ``q_j`` changes by at most ``sens_j``. A candidate with
    infinite sensitivity gets ``inf`` (never chosen)."""
    q = np.asarray(q, dtype=np.float64)
    D = np.asarray(sens, dtype=np.float64)
    f = np.isfinite(D)
    a = q[f] + t * D[f]
    num = a[:, None] - a[None, :]
    den = D[f][:, None] + D[f][None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        # two zero-sensitivity candidates: the better one wins outright (+-inf), equal ones tie (0)
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.sign(num) * np.inf)
    out = np.full(q.shape, np.inf)
    out[f] = np.nan_to_num(r, nan=0.0, posinf=np.inf, neginf=-np.inf).max(axis=1)
    return out


def generalized_exponential_mechanism(
    q: np.ndarray,
    sens: np.ndarray,
    epsilon: float,
    beta: float,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> Tuple[int, float]:
    """Chooses a candidate with (pure) ``epsilon``: report-noisy-min of :func:`gem_normalised_scores`
    (sensitivity 1) with Laplace noise of scale ``2 / epsilon``, ``t = 2 ln(K / beta) / epsilon``.
    Noise: seeded ``keyed_laplace(seed, "bayes_choice", 0, k)``, else from ``rng``. Returns (k, t)."""
    t = 2.0 * math.log(len(q) / beta) / epsilon
    k, _ = report_noisy_min(gem_normalised_scores(q, sens, t), 1.0, epsilon, seed, rng, purpose=PURPOSE_CHOICE)
    return k, t


# ---------------------------------------------------------------------------------------------
# Section 4.2 baselines
# ---------------------------------------------------------------------------------------------


def clip_normalise(v: np.ndarray) -> np.ndarray:
    """Threshold at 0 and normalise; an all-zero vector becomes uniform (nothing survived the noise)."""
    v = np.maximum(np.asarray(v, dtype=np.float64), 0.0)
    s = v.sum()
    if not s > 0.0 or not np.isfinite(s):
        return np.full(v.shape, 1.0 / v.size)
    return v / s


def laplace_counts(c: np.ndarray, W: int, epsilon: float, z: np.ndarray) -> Tuple[np.ndarray, float]:
    """Baseline 1: ``c + Lap(W/epsilon)`` (l1 sensitivity W: each user <= W counts), clip, normalise."""
    scale = W / epsilon
    return clip_normalise(np.asarray(c, dtype=np.float64) + scale * z), scale


def laplace_public_sensitivity(T: float, W: int) -> float:
    """l1 sensitivity of ``c/T - alpha~`` when one user (total t <= W) is removed:
    ``||c/T - (c-dc)/(T-t)||_1 <= 2t/(T-t)``, and never more than 2 (two distributions).
    Data-dependent (T is the private total)."""
    if T > W:
        return min(2.0, 2.0 * W / (T - W))
    return 2.0


def laplace_public(c: np.ndarray, alpha: np.ndarray, W: int, epsilon: float, z: np.ndarray) -> Tuple[np.ndarray, float]:
    """Baseline 2: ``max(sum_n w_n (c~^n - alpha~) + e + alpha~, 0)`` renormalised, where
    ``sum_n w_n c~^n = c / T`` (w_n = |dc^n| / T) and ``sum_n w_n = 1``."""
    c = np.asarray(c, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    a = alpha / alpha.sum() if alpha.sum() > 0 else np.full(alpha.shape, 1.0 / alpha.size)
    T = float(c.sum())
    f = (c / T if T > 0 else np.zeros_like(c)) - a
    scale = laplace_public_sensitivity(T, W) / epsilon
    return clip_normalise(f + scale * z + a), scale


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

KL_SMOOTHING = 1e-9


def kl_divergence(p: np.ndarray, q: np.ndarray, smoothing: float = KL_SMOOTHING) -> float:
    """KL(p || q) in nats, q mixed with the uniform distribution: ``(1 - s) q + s / V``.

    The mixing keeps the Laplace baselines' zero probabilities finite (a language model would smooth
    them too); it changes a strictly positive q (the Bayesian output) by at most a factor 1 - s.
    """
    p = np.asarray(p, dtype=np.float64)
    q = (1.0 - smoothing) * np.asarray(q, dtype=np.float64) + smoothing / p.size
    mask = p > 0
    return float(math.fsum(p[mask] * (np.log(p[mask]) - np.log(q[mask]))))


def normalise(c: np.ndarray) -> np.ndarray:
    c = np.asarray(c, dtype=np.float64)
    s = c.sum()
    if not s > 0:
        raise ValueError("cannot normalise an all-zero count vector")
    return c / s


# ---------------------------------------------------------------------------------------------
# The release after the distributed aggregation (one worker; reference and Beam run the same)
# ---------------------------------------------------------------------------------------------


def candidate_log_thetas(prior: "PublicPrior", c2: np.ndarray, N2: np.ndarray, params: BayesianParams) -> np.ndarray:
    """Alg. 2 line 3: ``log softmax(mu_ps^(k))`` of every (S, rho) candidate, from the release set."""
    mu_p = mu_prior(prior.alpha)
    xh = x_hat(c2)
    return np.stack(
        [log_softmax(posterior_mean(xh, decay_weights(N2, S, params.C), mu_p, rho)) for S, rho in params.grid]
    )


# ---------------------------------------------------------------------------------------------
# The default mechanism: noisy counts, then the posterior as post-processing (issue 59;
# docs/bayesian_ngrams.md "The default: noisy counts")
# ---------------------------------------------------------------------------------------------

#: Draws of the choice's data fission (docs/bayesian_ngrams.md, "Choosing S and rho from the noisy counts").
FISSION_DRAWS = 8
#: The choice's penalty on a candidate's spread: its score plus FISSION_Z times its score's noise scale (a
#: candidate no better than the prior beats it with probability about 2.3%, for Gaussian scores; measured
#: against 1 and 2.86 in docs/bayesian_ngrams.md).
FISSION_Z = 2.0


def noisy_count_vector(c: np.ndarray, vocab: Sequence[str], sigma2, seed: Optional[int]) -> np.ndarray:
    """``c_i + X_i`` per public n-gram, ``X_i ~ N_Z(0, sigma2)`` drawn exactly (an int64 vector): seeded,
    ``X_i`` is a function of (seed, ``bayes_count_noise``, 0, n-gram); unseeded, OS entropy."""
    noise = np.array(DiscreteGaussian(sigma2, seed, PURPOSE_COUNT_NOISE, 0).draw_many(list(vocab)), dtype=np.int64)
    return np.asarray(c, dtype=np.int64) + noise


def noisy_log_theta(counts: np.ndarray, mu_p: np.ndarray, S: float, rho: float, C: int) -> np.ndarray:
    """``log softmax(mu_ps)`` of Corollary 1 computed from (noisy) counts alone: ``c+ = max(counts, 0)``
    stands for ``c``, and ``c+ / C`` for the users per n-gram ``N`` (a user adds at most C to an n-gram,
    so ``N >= c / C``): ``mu_ps = rho w(c+/C) x_hat(c+) + (1 - rho) mu_p``."""
    cp = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    return log_softmax(posterior_mean(x_hat(cp), decay_weights(cp / C, S, C), mu_p, rho))


def fission_scores(
    noisy: np.ndarray,
    prior: "PublicPrior",
    params: BayesianParams,
    noise_scale: float,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> np.ndarray:
    """Scores of the prior alone (index 0) and of every (S, rho) of ``params.grid`` (index k + 1), lower
    is better; a function of the noisy counts, the public prior and public randomness only.

    Data fission (Leiner et al. 2023): with ``W_r = noise_scale * Z_r`` (fresh standard normals per
    n-gram, round r of ``bayes_fission``), ``f_r = noisy + W_r`` and ``g_r = noisy - W_r`` are, for
    Gaussian count noise, independent estimates of ``c``; a candidate is fitted on ``f_r`` and scored on
    ``g_r`` by the cross-entropy ``-sum_i g_r,i log theta_i(f_r)`` (eq. 6 on held-out counts), averaged
    over :data:`FISSION_DRAWS` rounds, plus :data:`FISSION_Z` times the score's noise scale
    ``noise_scale * sqrt(2) * ||log theta(f_r) - log theta_0||_2`` (relative to the prior alone, whose
    score has none), so a candidate has to beat the prior by more than its own noise."""
    mu_p = mu_prior(prior.alpha)
    lt0 = log_softmax(mu_p)
    grid = params.grid
    score = np.zeros(len(grid) + 1)
    spread = np.zeros(len(grid) + 1)
    for r in range(FISSION_DRAWS):
        w = noise_scale * randomness.standard_noise("gaussian", list(prior.vocab), PURPOSE_FISSION, r, seed, rng)
        f, g = noisy + w, noisy - w
        score[0] += -math.fsum(g * lt0)
        for k, (S, rho) in enumerate(grid):
            lt = noisy_log_theta(f, mu_p, S, rho, params.C)
            score[k + 1] += -math.fsum(g * lt)
            d = lt - lt0
            spread[k + 1] += noise_scale * math.sqrt(2.0) * math.sqrt(math.fsum(d * d))
    return (score + FISSION_Z * spread) / FISSION_DRAWS


def finalize_noisy_counts(
    prior: "PublicPrior",
    params: BayesianParams,
    c: np.ndarray,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """The default mechanism ``bayesian`` (worst-case (epsilon, delta)-DP): the clamped counts ``c`` get
    exact discrete Gaussian noise calibrated to their l2 sensitivity (:func:`privacy.bayesian.
    noisy_counts_plan`); everything after, the choice of (S, rho) included, reads only those noisy counts,
    the public prior and public randomness (post-processing). Returns (theta, info) as :func:`finalize`."""
    plan = noisy_counts_plan(params)
    noisy = noisy_count_vector(c, prior.vocab, plan.sigma2, seed)  # the only read of the private data
    theta, public, non_private = release_from_noisy_counts(noisy, prior, params, plan.noise_scale, seed, rng)
    public = {
        "mechanism": "bayesian",
        "vocabulary_size": prior.size,
        "sensitivity": "data-independent",
        "delta": params.delta,
        **plan.as_report(),
        **public,
    }
    return theta, {"public": public, "non_private": non_private}


def release_from_noisy_counts(
    noisy: np.ndarray,
    prior: "PublicPrior",
    params: BayesianParams,
    noise_scale: float,
    seed: Optional[int],
    rng: Optional[np.random.Generator],
) -> Tuple[np.ndarray, Dict[str, Any], Dict[str, Any]]:
    """The default mechanism after its noisy counts (post-processing: no private input): the choice of
    (S, rho) by :func:`fission_scores` when :attr:`BayesianParams.choose`, then ``softmax(mu_ps)`` of the
    chosen candidate (:func:`noisy_log_theta`) or the public prior itself (``softmax(mu_p)``). Returns
    (theta, public report fields, evaluation-only fields)."""
    mu_p = mu_prior(prior.alpha)
    public: Dict[str, Any] = {}
    non_private: Dict[str, Any] = {}
    S, rho = params.S, params.rho
    if params.choose:
        scores = fission_scores(noisy, prior, params, noise_scale, seed, rng)
        k = int(np.argmin(scores))
        public.update(
            choice="post-processing of the noisy counts and the public prior (no budget)",
            choice_candidates=len(scores),
            prior_alone=k == 0,
        )
        non_private.update(choice_scores=scores.tolist())
        if k == 0:
            public.update(S=None, rho=None)
            return softmax(mu_p), public, non_private
        S, rho = params.grid[k - 1]
    public.update(S=S, rho=rho)
    return np.exp(noisy_log_theta(noisy, mu_p, S, rho, params.C)), public, non_private


def finalize(
    prior: "PublicPrior",
    algorithm: str,
    params: BayesianParams,
    c: np.ndarray,
    N: np.ndarray,
    gammas: Optional[np.ndarray],
    seed: Optional[int],
    rng: Optional[np.random.Generator],
    c1: Optional[np.ndarray] = None,
    set1_changes: Optional[np.ndarray] = None,
    choice_changes: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, Dict[str, Any]]:
    """The released distribution over ``prior.vocab`` and a report dict.

    Args:
      algorithm: the mechanism (:data:`privacy.bayesian.MECHANISMS`), validated by the caller.
      c, N: totals and users per n-gram of the release set (all users, or Alg. 2's second set).
      gammas: sensitivity of ``r`` per S in ``params.S_values`` (bayesian only).
      c1, set1_changes: Alg. 2's scoring set totals and, for ``brute_force``, the max over its users
        of the score change per candidate (``None`` without tuning).
      choice_changes: with ``params.choose``, the max over the users of :func:`user_choice_change` per
        candidate of ``params.grid`` (the private choice's sensitivities).
    Returns:
      (theta, info): ``info["public"]`` holds what may be reported (DP outputs and public
      parameters); ``info["non_private"]`` holds data-dependent values (sensitivities, sigma) for
      offline evaluation only.
    """
    if algorithm == "bayesian":
        return finalize_noisy_counts(prior, params, c, seed, rng)
    V = prior.size
    public: Dict[str, Any] = {"mechanism": algorithm, "vocabulary_size": V}
    non_private: Dict[str, Any] = {}
    eps = params.budget(algorithm)["epsilon_release"]
    if algorithm == "laplace":
        z = standard_noise("laplace", prior.vocab, PURPOSE_LAPLACE, seed, rng)
        theta, scale = laplace_counts(c, params.W, eps, z)
        public.update(laplace_scale=scale, sensitivity="data-independent", l1_sensitivity=params.W)
        return theta, {"public": public, "non_private": non_private}
    if algorithm == "laplace_public":
        z = standard_noise("laplace", prior.vocab, PURPOSE_LAPLACE, seed, rng)
        theta, scale = laplace_public(c, prior.alpha, params.W, eps, z)
        public.update(sensitivity="data-dependent", sensitivity_method="2W/(T-W), T = private total")
        non_private.update(laplace_scale=scale)
        return theta, {"public": public, "non_private": non_private}

    mu_p = mu_prior(prior.alpha)
    xh = x_hat(c)
    S_index = {S: i for i, S in enumerate(params.S_values)}
    k_star = 0
    if params.tune:
        log_thetas = candidate_log_thetas(prior, c, N, params)
        scores = np.array([score_from_log_theta(c1, lt) for lt in log_thetas])  # eq. 6
        sens = 0.0
        for k, (S, rho) in enumerate(params.grid):
            release_term = score_sensitivity_release_set(rho, float(gammas[S_index[S]]), c1)
            if params.sensitivity == "brute_force":
                scoring_term = float(set1_changes[k])
            else:
                scoring_term = score_change_bound(log_thetas[k], params.C, params.W)
            sens = max(sens, release_term, scoring_term)
        k_star, scale = report_noisy_min(scores, sens, params.epsilon_tune, seed, rng)
        non_private.update(tune_scores=scores.tolist(), tune_sensitivity=sens, tune_laplace_scale=scale)
        public.update(tune_epsilon=params.epsilon_tune, tune_candidates=len(params.grid))
    if params.choose:
        if choice_changes is None or len(choice_changes) != len(params.grid):
            raise ValueError(
                "the private choice of S, rho needs choice_changes: the max over the users of user_choice_change"
            )
        ctx = ChoiceContext.build(prior, c, N, params)
        q = np.concatenate([[0.0], choice_scores(ctx, prior, gammas, params)])  # index 0: the prior alone
        sens = np.concatenate([[0.0], np.asarray(choice_changes, dtype=np.float64)])
        k, t = generalized_exponential_mechanism(q, sens, params.epsilon_choice, params.choice_beta, seed, rng)
        public.update(
            choice_epsilon=params.epsilon_choice,
            choice_candidates=len(q),
            choice_sensitivity="data-dependent (max over the users of the score change; docs/bayesian_ngrams.md)",
            prior_alone=k == 0,
        )
        non_private.update(choice_scores=q.tolist(), choice_sensitivities=sens.tolist(), choice_t=t)
        if k == 0:  # the public prior itself: no private data in the release, no noise needed
            public.update(S=None, rho=None, delta=params.delta, sensitivity="data-dependent")
            return softmax(mu_p), {"public": public, "non_private": non_private}
        k_star = k - 1
    S, rho = params.grid[k_star]
    gamma = float(gammas[S_index[S]])
    mu_ps = posterior_mean(xh, decay_weights(N, S, params.C), mu_p, rho)
    sigma = sigma_ps(gamma, rho, eps, params.delta)
    z = standard_noise("gaussian", prior.vocab, PURPOSE_GAUSSIAN, seed, rng)
    theta = sample_posterior(mu_ps, sigma, z)
    public.update(
        S=S,
        rho=rho,
        delta=params.delta,
        sigma_per_unit_sensitivity=analytic_gaussian_sigma(eps, params.delta, 1.0),
        sensitivity="data-dependent",
        sensitivity_method=params.sensitivity,
    )
    non_private.update(gamma=gamma, sigma_ps=sigma)
    return theta, {"public": public, "non_private": non_private}
