"""Synthetic private n-gram counts with a related public corpus (Bayesian DP benchmark and tests).

The private distribution is a Zipf law over V n-grams ``"g<rank>"`` (zero-padded, so the sorted public
vocabulary has index == rank order). Each user draws a geometric number of n-gram occurrences from it.
The public corpus draws ``public_size`` occurrences from ``p_private ** tau * exp(noise * Normal)``
(renormalised): ``tau = 1, noise = 0`` makes the public prior the private distribution; smaller tau
and larger noise make it less related (paper Figure 4 degrades the public data the same way).
"""

from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np

from dp_partition_beam.transforms.bayesian import bayesian_kernels as K


@dataclasses.dataclass(frozen=True)
class SyntheticCorpus:
    prior: K.PublicPrior
    users: Dict[str, K.UserCounts]  # clamped to C and W
    p_private: np.ndarray  # the users' unclamped counts, normalised (the evaluation target)


def zipf_probabilities(V: int, exponent: float) -> np.ndarray:
    p = 1.0 / np.arange(1, V + 1, dtype=np.float64) ** exponent
    return p / p.sum()


def synthetic_corpus(
    V: int = 2000,
    users: int = 20000,
    mean_counts: float = 10.0,
    exponent: float = 1.1,
    public_size: int = 1_000_000,
    tau: float = 1.0,
    noise: float = 0.0,
    C: int = 1,
    W: int = 100,
    seed: int = 0,
) -> SyntheticCorpus:
    """A private corpus (users' clamped counts + true distribution) and a related public prior."""
    rng = np.random.default_rng([seed, 61])
    p = zipf_probabilities(V, exponent)
    width = len(str(V - 1))
    vocab = [f"g{i:0{width}d}" for i in range(V)]
    q = p**tau * np.exp(noise * rng.standard_normal(V))
    q /= q.sum()
    public = rng.multinomial(public_size, q)
    prior = K.PublicPrior.from_counts(dict(zip(vocab, public.astype(float).tolist())))
    sizes = np.maximum(1, rng.geometric(1.0 / mean_counts, size=users))
    draws = rng.choice(V, size=int(sizes.sum()), p=p)
    c_true = np.bincount(draws, minlength=V).astype(np.float64)
    out: Dict[str, K.UserCounts] = {}
    pos = 0
    for u, k in enumerate(sizes):
        idx, cnt = np.unique(draws[pos : pos + k], return_counts=True)
        pos += k
        user = f"u{u}"
        out[user] = K.clamp_user_counts(dict(zip(idx.tolist(), cnt.tolist())), C, W, user, seed, None)
    return SyntheticCorpus(prior, out, c_true / c_true.sum())


@dataclasses.dataclass(frozen=True)
class OutlierPair:
    """Neighbouring datasets ``D = D' + outlier`` (issue 59's constructed pair): ``users`` is D', ``outlier``
    the one added user's clamped counts, under the same public prior."""

    prior: K.PublicPrior
    users: Dict[str, K.UserCounts]
    outlier: K.UserCounts

    def dataset(self, with_outlier: bool) -> Dict[str, K.UserCounts]:
        """D (``with_outlier``) or D'."""
        return {**self.users, "outlier": self.outlier} if with_outlier else dict(self.users)


def outlier_pair(
    users: int = 1500,
    V: int = 300,
    held: int = 150,
    max_ngrams: int = 5,
    outlier_ngrams: int = 100,
    exponent: float = 1.1,
    seed: int = 0,
) -> OutlierPair:
    """D' = ``users`` ordinary users, each holding 1..``max_ngrams`` distinct n-grams (count 1) drawn from a
    Zipf law over the first ``held`` n-grams of a V-n-gram vocabulary, with a poor public prior (counts
    uniform in 0..19, unrelated to the private ranking); the outlier holds ``outlier_ngrams`` n-grams
    nobody else writes (indices ``held .. held + outlier_ngrams - 1``, count 1: inside every clamp with
    C >= 1 and W >= outlier_ngrams)."""
    if held + outlier_ngrams > V:
        raise ValueError(f"held + outlier_ngrams must be <= V, got {held} + {outlier_ngrams} > {V}")
    rng = np.random.default_rng(seed)
    p = zipf_probabilities(held, exponent)
    out: Dict[str, K.UserCounts] = {}
    for j in range(users):
        idx = np.unique(rng.choice(held, size=int(rng.integers(1, max_ngrams + 1)), p=p)).astype(np.int64)
        out[f"u{j:05d}"] = (idx, np.ones(idx.size, dtype=np.int64))
    alpha = rng.integers(0, 20, V).astype(np.float64)
    prior = K.PublicPrior(tuple(f"g{i:05d}" for i in range(V)), alpha)
    outlier = (np.arange(held, held + outlier_ngrams, dtype=np.int64), np.ones(outlier_ngrams, dtype=np.int64))
    return OutlierPair(prior, out, outlier)
