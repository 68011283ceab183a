"""Random user sets for the Beam == reference tests (Zipf-like item popularity)."""

import random


def random_user_sets(rng: random.Random, n_users: int, n_items: int, max_degree: int, zipf: float = 1.1):
    """dict user -> list of distinct items with Zipf-like item popularity."""
    items = [f"i{j}" for j in range(n_items)]
    weights = [1.0 / (j + 1) ** zipf for j in range(n_items)]
    sets = {}
    for u in range(n_users):
        d = rng.randint(1, max_degree)
        chosen = set(rng.choices(items, weights=weights, k=d))
        sets[f"u{u}"] = sorted(chosen)
    return sets


def pairs_of(user_sets):
    return [(u, i) for u, items in user_sets.items() for i in items]
