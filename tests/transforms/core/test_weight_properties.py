"""Sensitivity properties of the Basic weightings and of contribution bounding (hypothesis)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.transforms import reference

ITEMS = [f"i{j}" for j in range(12)]
user_set = st.lists(st.sampled_from(ITEMS), min_size=1, max_size=12, unique=True)
datasets = st.dictionaries(st.text("abcdef", min_size=1, max_size=3), user_set, max_size=10)


def _distance(w, w2, p):
    keys = set(w) | set(w2)
    diffs = [abs(w2.get(k, 0.0) - w.get(k, 0.0)) for k in keys]
    return math.fsum(d**p for d in diffs) ** (1 / p)


@given(datasets, user_set, st.integers(1, 12), st.integers(0, 10**6))
@settings(max_examples=300, deadline=None)
def test_neighbouring_datasets_sensitivities(sets, new_set, d0, seed):
    """Adding one user moves weighted Gaussian by <= 1 in l2, weighted Laplace by <= 1 in l1, counts by
    <= sqrt(Delta_0) in l2 and <= Delta_0 in l1; the other users' capped sets do not change."""
    new_user = "NEW"
    capped = reference.bound_contributions(sets, d0, seed=seed)
    capped2 = reference.bound_contributions({**sets, new_user: new_set}, d0, seed=seed)
    assert {u: v for u, v in capped2.items() if u != new_user} == capped  # subsampling is per user
    assert len(capped2[new_user]) == min(d0, len(new_set))
    for weighting, p, bound in (
        ("weighted_gaussian", 2, 1.0),
        ("weighted_laplace", 1, 1.0),
        ("count", 2, math.sqrt(d0)),
        ("count", 1, float(d0)),
    ):
        w = reference.basic_weights(capped, weighting)
        w2 = reference.basic_weights(capped2, weighting)
        assert _distance(w, w2, p) <= bound * (1 + 1e-12)
    # novel items (only the new user holds them) get weight <= 1/sqrt(t) under weighted Gaussian
    novel = set(capped2[new_user]) - {i for v in capped.values() for i in v}
    if novel:
        w2 = reference.basic_weights(capped2, "weighted_gaussian")
        assert max(w2[i] for i in novel) <= 1 / math.sqrt(len(novel)) + 1e-12
