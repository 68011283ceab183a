"""DPNE's keep tables (``threshold='optimal'``, privacy/dpne.py ``plan_tables``, docs/dpne.md "Keep tables at every
level"): the plan spends at most (epsilon, delta) over random settings; every level's table satisfies the proof's
step conditions and starts at its spurious rate; one added user changes each known-domain level's release by a
pair of product-Bernoulli laws within the level's RDP budget, on random neighbouring corpora."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy import thresholding as th
from dp_partition_beam.privacy.dpne import DPNEParams, level_shares, plan_runs, plan_tables, release_privacy
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.dpne.reference import _capped, dpne_reference, histogram, user_kgrams

PROPS = settings(max_examples=12, deadline=None, derandomize=True)


@PROPS
@given(
    epsilon=st.floats(0.5, 8.0),
    delta=st.floats(1e-10, 1e-4),
    deltas=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    decay=st.floats(0.7, 1.3),
    counts=st.booleans(),
)
def test_plan_spends_at_most_the_budget(epsilon, delta, deltas, decay, counts):
    params = DPNEParams(
        epsilon=epsilon,
        delta=delta,
        max_n=len(deltas),
        max_contributions=tuple(deltas),
        sigma_decay=decay,
        threshold="optimal",
        release_counts=counts,
    )
    plan = plan_tables(params)
    priv = release_privacy(plan_runs("dpne", params)[1], params)
    assert epsilon * (1 - 1e-9) <= priv["epsilon_at_delta"] <= epsilon
    assert priv["total_delta"] <= delta * (1 + 1e-12)
    eps_k = np.array([t.epsilon_rdp for t in plan.levels])
    assert np.allclose(eps_k / eps_k.sum(), level_shares(params), rtol=1e-9)  # sigma_decay's shares
    assert [t.delta_rdp for t in plan.levels] == [plan.delta_level_1] + [0.0] * (len(deltas) - 1)
    assert (plan.counts_rdp > 0) == counts and {t.alpha for t in plan.levels} == {plan.alpha}


@PROPS
@given(eta=st.floats(1e-3, 0.5), ratio=st.floats(1e-6, 1.0), d0=st.integers(1, 12), k=st.integers(1, 3))
def test_level_tables_are_sound_and_start_at_the_spurious_rate(eta, ratio, d0, k):
    params = DPNEParams(epsilon=2.0, delta=1e-7, max_n=3, max_contributions=d0, eta=eta, threshold="optimal")
    spec = plan_tables(params).levels[k - 1]
    q = 0.0 if k == 1 else eta * ratio
    table = spec.build(q)
    assert th.table_violations(table) == {"decreasing": 0, "above_step": 0, "unseen": 0}
    assert table.unseen == th.keep_rate(q) <= q and q - table.unseen < 2.0**-64
    assert table.complete and table.contributions == th.basic_contributions(d0)


texts = st.lists(st.lists(st.sampled_from("abcd"), min_size=1, max_size=6).map(" ".join), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(base=st.lists(texts, min_size=4, max_size=20), added=texts, seed=st.integers(0, 2**31))
def test_one_user_moves_a_known_domain_level_within_its_budget(base, added, seed):
    """Level k >= 2 given the released S_1, S_{k-1} (those of the run on D): every k-gram g of V_k is kept
    independently with F_k(W_g) on D and F_k(W'_g) on D' = D + one user; the sum over g of the Bernoulli
    Renyi divergences (both directions) is at most the level's epsilon_rdp (docs/dpne.md, step 1)."""
    T, cap = 3, 3
    params = DPNEParams(epsilon=8.0, delta=1e-6, max_n=T, max_contributions=cap, eta=0.3, threshold="optimal")
    d = {f"u{i}": t for i, t in enumerate(base)}
    d_prime = dict(d, added=added)
    ug, ug_prime = user_kgrams(d, T), user_kgrams(d_prime, T)
    res = dpne_reference(None, "dpne", params, seed=seed, user_grams=ug)
    plan = plan_tables(params)
    for k in range(2, T + 1):
        level = res.levels[k - 1]
        q = level["spurious_prob"]
        if q <= 0:
            continue
        s_prev, s1 = res.ngrams[k - 1], res.ngrams[1]
        table = plan.levels[k - 1].build(q)
        weights = []
        for grams in (ug, ug_prime):  # the same keyed subsample for every user present in both
            users = {u: {g for g in gs if dpne_kernels.is_valid(g, s_prev, s1, "both")} for u, gs in grams[k].items()}
            weights.append(histogram(_capped(users, cap, k, seed, None), "weighted_gaussian", None, 50))
        items = sorted(set(weights[0]) | set(weights[1]))  # elsewhere W = W' = 0: the same law
        if not items:
            continue
        f = table.keep_probability([weights[0].get(g, 0.0) for g in items])
        f_prime = table.keep_probability([weights[1].get(g, 0.0) for g in items])
        budget = plan.levels[k - 1].epsilon_rdp * (1 + 1e-9)
        for a, b in ((f, f_prime), (f_prime, f)):
            assert math.fsum(th.bernoulli_renyi(table.alpha, a, b)) <= budget, (k, items)
