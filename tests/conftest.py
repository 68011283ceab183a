import logging
import random

import pytest

# benchmarks.shared_data: the one place that says where the large real corpora are read from
# (DP_SHARED_DATA, else ../shared/data); never copied into the repository.
from benchmarks.shared_data import shared_data_path

from tests.support.user_sets import random_user_sets

# Beam prints an apitools warning on import in environments without the gcp extra.
logging.getLogger("root").setLevel(logging.ERROR)


@pytest.fixture
def small_sets():
    return random_user_sets(random.Random(7), 400, 120, 12)


@pytest.fixture(scope="session")
def shared_data():
    """``shared_data(name)``: path of a file of the shared data folder; fails (naming the file and
    DP_SHARED_DATA) if it is absent, never skips."""
    return shared_data_path
