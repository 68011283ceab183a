import logging
import os
import random
import sys

import pytest

# The repository root on the path, for benchmarks.shared_data: the one place that says where the large
# real corpora are read from (DP_SHARED_DATA, else ../shared/data); never copied into the repository.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from benchmarks.shared_data import shared_data_path  # noqa: E402

# Beam prints an apitools warning on import in environments without the gcp extra.
logging.getLogger("root").setLevel(logging.ERROR)


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


@pytest.fixture
def small_sets():
    return random_user_sets(random.Random(7), 400, 120, 12)


@pytest.fixture(scope="session")
def shared_data():
    """``shared_data(name)``: path of a file of the shared data folder; fails (naming the file and
    DP_SHARED_DATA) if it is absent, never skips."""
    return shared_data_path


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "engines: runs pipelines on real Apache Flink and Spark job servers (tests/test_engines.py); needs "
        "Java and .ci/engines.sh (which runs them in .venv-engines)",
    )
