"""MAD-SIPS on Beam (transforms/selection/mad_sips.py) equals the in-memory reference under a seed.

Every case is a labelled branch of one in_memory pipeline (tests/support/selection_cases.py), run once per
module by the ``branches`` fixture; each test compares its own branches with their own reference result. Users
cut across pieces (the per-user join) are tests/transforms/core/test_heavy_users.py's.
"""

import random

import pytest

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference

from tests.support.selection_cases import Select, count_lines, rounds_lines, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

# 1,500 users of degree <= 15 (~10k pairs): users above Delta_0 = 6, so re-subsampling matters
SETS = random_user_sets(random.Random(4), 1500, 300, 15)
# 800 users of degree <= 60 (~16k pairs, median degree ~ 30): weight_cap='auto' chooses a cap below 1
WIDE_SETS = random_user_sets(random.Random(6), 800, 600, 60)
# 800 users of degree <= 12: the count release
COUNT_SETS = random_user_sets(random.Random(5), 800, 200, 12)

BASE = dict(epsilon=2.0, delta=1e-4, max_contributions=6, d_max=6)

ROUNDS = {  # id: (budget_split, accounting, rows_per_shard)
    "gdp_one_shard": ((0.2, 0.3, 0.5), "gdp", 10**9),
    "basic_sharded_700": ((0.3, 0.7), "basic", 700),
    "gdp_sharded_900": ((0.2, 0.3, 0.5), "gdp", 900),
}
KEEP_TABLE = {  # id: (changes, rows_per_shard); {}: no adaptive cap, the default
    "adaptive_cap": ({"cap_quantile": 0.98}, 10**9),
    "fixed_cap_sharded": ({}, 700),
    "one_round": ({"budget_split": (1.0,), "cap_quantile": 1.0}, 10**9),
    "weight_cap": ({"weight_cap": 0.3}, 700),
}
AUTO_WEIGHT_CAP = {  # R <= 2: round 1 reads the weight cap
    "auto": {},
    "auto_adaptive_cap": {"cap_quantile": 0.9},
    "two_rounds": {"budget_split": (0.3, 0.7)},
    "one_round": {"budget_split": (1.0,)},
}
COUNTS = {"gaussian": dict(budget_split=(0.3, 0.7)), "keep_table": dict(threshold="optimal")}


def _rounds_params(split, accounting):
    return SelectionParams(**BASE, budget_split=split, accounting=accounting, c_ub=1.5)


def _keep_table_params(changes):
    return SelectionParams(**BASE, c_ub=1.5, threshold="optimal", **changes)


def _auto_params(changes):
    return SelectionParams(
        epsilon=2.0, delta=1e-4, max_contributions=30, d_max=6, c_ub=1.5, threshold="optimal", weight_cap="auto"
    ).replace(**changes)


def _counts_params(changes):
    return SelectionParams(**BASE, release_counts=True, **changes)


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every case, from one pipeline."""
    cases = {}
    for name, (split, accounting, rps) in ROUNDS.items():
        params = _rounds_params(split, accounting)
        cases[f"rounds/{name}"] = Select(
            pairs_of(SETS), "mad_sips", params, seed=123, output_rounds=True, rows_per_shard=rps
        )
    for name, (changes, rps) in KEEP_TABLE.items():
        params = _keep_table_params(changes)
        cases[f"keep_table/{name}"] = Select(
            pairs_of(SETS), "mad_sips", params, seed=123, output_rounds=True, rows_per_shard=rps
        )
    for name, changes in AUTO_WEIGHT_CAP.items():
        params = _auto_params(changes)
        cases[f"auto/{name}"] = Select(
            pairs_of(WIDE_SETS), "mad_sips", params, seed=123, output_rounds=True, rows_per_shard=700
        )
    for name, changes in COUNTS.items():
        cases[f"counts/{name}"] = Select(pairs_of(COUNT_SETS), "mad_sips", _counts_params(changes), seed=9)
    return run_cases(cases)


@pytest.mark.parametrize("case", list(ROUNDS))
def test_select_mad_sips_equals_reference(branches, case):
    """Users above Delta_0 (re-subsampling matters), three or two rounds; one shard, and several user/item
    shards (700 and 900 rows of ~10k: 11-15 user shards)."""
    split, accounting, _ = ROUNDS[case]
    _, per_round = reference.select_rounds(SETS, "mad_sips", _rounds_params(split, accounting), seed=123)
    assert branches[f"rounds/{case}"] == rounds_lines(per_round)
    assert all(per_round.values())  # every round released something: a non-trivial check


@pytest.mark.parametrize("case", list(COUNTS))
def test_select_mad_sips_counts_equal_reference(branches, case):
    """The count release (Gaussian rounds, and the keep table's round with threshold='optimal'): the same
    (item, int count) pairs, each item once."""
    want = reference.select_counts(COUNT_SETS, "mad_sips", _counts_params(COUNTS[case]), seed=9)
    assert branches[f"counts/{case}"] == count_lines(want) and want


@pytest.mark.parametrize("case", list(KEEP_TABLE))
def test_select_mad_sips_keep_table_equals_reference(branches, case):
    """threshold='optimal' (docs/mad_sips.md): the last round's biased Basic weights rounded onto C and the
    keep table's 64-bit draws are the reference's, bit for bit (one shard, and 700-row shards of ~10k rows:
    15 user shards; no user is cut across pieces here: that join is tests/transforms/core/test_heavy_users.py's)."""
    params = _keep_table_params(KEEP_TABLE[case][0])
    result = reference.release(SETS, "mad_sips", params, seed=123)
    assert result.rounds[-1].noise == "keep_table"
    # the contributions both sides round onto: capped with weight_cap, up to the chosen cap with the default 'auto'
    cap = params.weight_cap if result.weight_cap is None else result.weight_cap
    assert max(result.rounds[-1].keep_table.contributions) == pytest.approx(cap, rel=0.05)
    assert branches[f"keep_table/{case}"] == rounds_lines(result.per_round)
    assert result.per_round[len(result.rounds)]  # the table round released something


@pytest.mark.parametrize("case", list(AUTO_WEIGHT_CAP))
def test_select_mad_sips_auto_weight_cap_equals_reference(branches, case):
    """weight_cap='auto' (docs/mad_sips.md): one noisy histogram (keys (seed, 'cap', 0, j)) picks the weight
    cap (and the adaptive cap), round R - 1's biases use the chosen table's W50, round R its table: the same
    items as the reference (700-row shards of ~16k rows: 23 user shards);
    the choice is below 1 (800 users, median degree ~ 30: the data is wide enough for it)."""
    result = reference.release(WIDE_SETS, "mad_sips", _auto_params(AUTO_WEIGHT_CAP[case]), seed=123)
    assert result.weight_cap == pytest.approx(2**-1.5)  # median bucket (16, 23]: 1.5 / sqrt(23) = 0.31
    assert max(result.rounds[-1].keep_table.contributions) <= result.weight_cap
    assert branches[f"auto/{case}"] == rounds_lines(result.per_round)
    assert result.per_round[len(result.rounds)]
