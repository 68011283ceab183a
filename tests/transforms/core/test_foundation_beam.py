"""Beam transforms of the foundation against the in-memory reference, under fixed seeds.

Every Beam case is a labelled branch of one in_memory pipeline (tests/support/selection_cases.py), run once
per module by the ``branches`` fixture; each test compares its own branches with their own reference result.
"""

import ast
import random

import apache_beam as beam
import pytest

from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.bounding import BoundContributions
from dp_partition_beam.transforms.core.joins import AttachItemValues, JoinValuesToSets
from dp_partition_beam.transforms.core.noise import AddNoise, NoisyThreshold
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.selection_cases import Branch, Select, item_lines, rounds_lines, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

# BoundContributions: 60 users of degree <= 30 capped to 7, with duplicate pairs
BOUND_SETS = random_user_sets(random.Random(1), 60, 50, 30)
BOUND_PAIRS = pairs_of(BOUND_SETS) + pairs_of(BOUND_SETS)[:100]  # duplicates must be removed
BOUND_K = 7
# AddNoise / NoisyThreshold
NOISE_WEIGHTS = {f"i{j}": float(j) for j in range(300)}
THRESHOLD_WEIGHTS = {f"i{j}": float(j) / 10 for j in range(200)}
THRESHOLD_PLAN = plan_rounds("basic", SelectionParams(epsilon=1.0, delta=1e-5))[0]
# SelectPartitions, one round and DP-SIPS
ALGORITHMS = ["basic", "weighted_laplace", "count_gaussian", "count_laplace", "dp_sips"]
SELECT_SETS = random_user_sets(random.Random(4), 1500, 300, 15)
SELECT_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, budget_split=(0.3, 0.7))
THREE_ROUND_SETS = random_user_sets(random.Random(5), 1500, 300, 15)
THREE_ROUND_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, budget_split=(0.05, 0.15, 0.8))


def _attach_data():
    """500 users holding "hot" (14 shards of <= 37 users) and 400 random cold pairs; values for half the items."""
    rng = random.Random(3)
    pairs = [(f"u{u}", "hot") for u in range(500)] + [
        (f"u{rng.randrange(500)}", f"c{rng.randrange(40)}") for _ in range(400)
    ]
    pairs = sorted(set(pairs))
    values = {"hot": 0.5, **{f"c{j}": j / 7 for j in range(0, 40, 2)}}
    counts = {}
    for _, i in pairs:
        counts[i] = counts.get(i, 0) + 1
    return pairs, values, counts


def _join_data():
    rng = random.Random(8)
    sets = {
        f"u{u}": sorted({"hot"} | {f"c{rng.randrange(40)}" for _ in range(rng.randrange(1, 6))}) for u in range(500)
    }
    values = {"hot": 0.5, **{f"c{j}": j / 7 for j in range(0, 40, 2)}}
    return sets, values


def _flatten_joined(element, per_user_lists):
    user, joined = element
    if not per_user_lists:
        return [(user, joined)]
    assert isinstance(joined, list) and joined  # (user, [(item, v), ...]) lists, never empty
    return [(user, iv) for iv in joined]


def _bound(p):
    return (
        p
        | beam.Create(BOUND_PAIRS)
        | BoundContributions(BOUND_K, seed=11)
        | beam.MapTuple(lambda u, it: f"{u}\t{'|'.join(sorted(it))}")
    )


def _attach(per_user_lists):
    pairs, values, counts = _attach_data()

    def build(p):
        vals = p | "V" >> beam.Create(list(values.items()))
        cnts = p | "C" >> beam.Create(list(counts.items()))
        return (
            p
            | "P" >> beam.Create(pairs)
            | AttachItemValues(vals, cnts, max_users_per_key=37, per_user_lists=per_user_lists)  # "hot" -> 14 shards
            | beam.FlatMap(_flatten_joined, per_user_lists)
            | beam.MapTuple(lambda u, iv: f"{u}\t{iv[0]}\t{iv[1]!r}")
        )

    return build


def _join(limit):
    sets, values = _join_data()

    def build(p):
        vals = p | "V" >> beam.Create(list(values.items()))
        return (
            p
            | "S" >> beam.Create(list(sets.items()))
            | JoinValuesToSets(vals, max_users_per_key=37, max_broadcast_items=limit)
            | beam.MapTuple(lambda u, sv: f"{u}\t{sorted(sv[1])}")
        )

    return build


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every Beam case of the module, from one pipeline."""
    _, join_values = _join_data()
    plan = THRESHOLD_PLAN
    cases = {
        "bound": Branch(_bound),
        "add_noise": Branch(
            lambda p: p | beam.Create(list(NOISE_WEIGHTS.items())) | AddNoise("gaussian", 2.0, seed=5, round_=3)
        ),
        "noisy_threshold": Branch(
            lambda p: (
                p
                | beam.Create(list(THRESHOLD_WEIGHTS.items()))
                | NoisyThreshold(plan.noise, plan.noise_scale, plan.threshold, seed=3, round_=1)
            )
        ),
        "attach/pairs": Branch(_attach(False)),
        "attach/per_user_lists": Branch(_attach(True)),
        "join/sharded": Branch(_join(0)),  # max_broadcast_items 0 forces the sharded join
        "join/broadcast": Branch(_join(len(join_values))),
        "dp_sips_three_rounds": Select(
            pairs_of(THREE_ROUND_SETS), "dp_sips", THREE_ROUND_PARAMS, seed=9, output_rounds=True
        ),
    }
    for algorithm in ALGORITHMS:
        cases[f"select/{algorithm}"] = Select(pairs_of(SELECT_SETS), algorithm, SELECT_PARAMS, seed=123)
    return run_cases(cases)


def _as_sorted_lists(user_sets):
    return {u: sorted(items) for u, items in user_sets.items()}


def test_bound_contributions_matches_reference_and_caps(branches):
    got = {line.split("\t")[0]: line.split("\t")[1].split("|") for line in branches["bound"]}
    want = _as_sorted_lists(reference.bound_contributions(BOUND_SETS, BOUND_K, seed=11))
    assert got == want
    for user, items in got.items():
        assert len(items) == min(BOUND_K, len(BOUND_SETS[user]))
        assert len(set(items)) == len(items)
        assert set(items) <= set(BOUND_SETS[user])


def test_unseeded_subsample_is_uniform_enough():
    # 3000 draws of 2 out of 6: each item kept with prob 1/3; 5-sigma band (false failure ~ 6e-7).
    counts = {c: 0 for c in "abcdef"}
    rng_sets = {f"u{j}": list("abcdef") for j in range(3000)}
    capped = reference.bound_contributions(rng_sets, 2)
    for items in capped.values():
        assert len(items) == 2
        for i in items:
            counts[i] += 1
    mean, sd = 1000.0, (3000 * (1 / 3) * (2 / 3)) ** 0.5
    assert all(abs(c - mean) < 5 * sd for c in counts.values()), counts


def test_add_noise_seeded_matches_reference_and_differs_by_round(branches):
    lines = branches["add_noise"]
    got = dict(ast.literal_eval(line) for line in lines)  # (item, noisy weight): floats to 17 digits
    assert len(got) == len(lines)
    want = reference.add_noise(NOISE_WEIGHTS, "gaussian", 2.0, seed=5, round_=3)
    assert got == want
    other = reference.add_noise(NOISE_WEIGHTS, "gaussian", 2.0, seed=5, round_=4)
    assert all(other[i] != want[i] for i in NOISE_WEIGHTS)


def test_noisy_threshold_keeps_exactly_items_at_or_above_rho(branches):
    plan = THRESHOLD_PLAN
    noisy = reference.add_noise(THRESHOLD_WEIGHTS, plan.noise, plan.noise_scale, seed=3, round_=1)
    want = sorted(i for i, w in noisy.items() if w >= plan.threshold)
    assert branches["noisy_threshold"] == item_lines(want) and want
    assert want == sorted(reference.noisy_threshold(THRESHOLD_WEIGHTS, plan, seed=3))


@pytest.mark.parametrize("per_user_lists", [False, True])
def test_attach_item_values_shards_hot_items_without_losing_pairs(branches, per_user_lists):
    pairs, values, _ = _attach_data()
    want = sorted(f"{u}\t{i}\t{values[i]!r}" for u, i in pairs if i in values)
    assert branches["attach/per_user_lists" if per_user_lists else "attach/pairs"] == want


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_select_partitions_equals_reference_under_seed(branches, algorithm):
    want = reference.select(SELECT_SETS, algorithm, SELECT_PARAMS, seed=123)
    got = branches[f"select/{algorithm}"]
    assert len(got) == len(set(got))  # each item released once
    assert got == item_lines(want)
    union = {i for items in SELECT_SETS.values() for i in items}
    assert 0 < len(want) < len(union)  # a non-trivial instance: some but not all items released


def test_dp_sips_three_rounds_rounds_are_disjoint(branches):
    plans, per_round = reference.select_rounds(THREE_ROUND_SETS, "dp_sips", THREE_ROUND_PARAMS, seed=9)
    assert len(plans) == 3
    assert sum(len(v) for v in per_round.values()) == len(set().union(*per_round.values()))
    assert branches["dp_sips_three_rounds"] == rounds_lines(per_round)


def test_released_items_come_from_the_input_only():
    sets = random_user_sets(random.Random(6), 800, 100, 10)
    union = {i for items in sets.values() for i in items}
    params = SelectionParams(epsilon=5.0, delta=1e-3, max_contributions=10)
    for alg in ("basic", "count_laplace", "dp_sips"):
        out = reference.select(sets, alg, params)  # unseeded (OS entropy)
        assert out <= union


def test_select_partitions_validates_arguments():
    params = SelectionParams(epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="algorithm"):
        SelectPartitions("nope", params)
    with pytest.raises(TypeError, match="SelectionParams"):
        SelectPartitions("basic", {"epsilon": 1})
    with pytest.raises(ValueError, match="mad2r"):
        SelectPartitions("mad2r", SelectionParams(epsilon=1.0, delta=1e-5, budget_split=(0.2, 0.3, 0.5)))


def test_join_values_to_sets_same_in_broadcast_and_join_mode(branches):
    """JoinValuesToSets: one element per user, with exactly the values of the user's items, whichever
    mode the run picks (max_broadcast_items 0 forces the sharded join; hot item over 14 shards)."""
    sets, values = _join_data()
    want = sorted(f"{u}\t{sorted((i, values[i]) for i in s if i in values)}" for u, s in sets.items())
    assert branches["join/sharded"] == want
    assert branches["join/broadcast"] == want
    with pytest.raises(ValueError, match="max_broadcast_items"):
        JoinValuesToSets(None, max_broadcast_items=-1)
