"""Beam transforms of the foundation against the in-memory reference, under fixed seeds."""

import random

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.bounding import BoundContributions
from dp_partition_beam.transforms.core.joins import AttachItemValues
from dp_partition_beam.transforms.core.noise import AddNoise, NoisyThreshold
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect, collect_pairs, make_test_pipeline
from tests.support.user_sets import pairs_of, random_user_sets


def _as_sorted_lists(user_sets):
    return {u: sorted(items) for u, items in user_sets.items()}


def test_bound_contributions_matches_reference_and_caps():
    sets = random_user_sets(random.Random(1), 60, 50, 30)
    pairs = pairs_of(sets) + pairs_of(sets)[:100]  # duplicates must be removed
    k = 7
    got = collect(
        lambda p: (
            p
            | beam.Create(pairs)
            | BoundContributions(k, seed=11)
            | beam.MapTuple(lambda u, it: f"{u}\t{'|'.join(sorted(it))}")
        )
    )
    got = {line.split("\t")[0]: line.split("\t")[1].split("|") for line in got}
    want = _as_sorted_lists(reference.bound_contributions(sets, k, seed=11))
    assert got == want
    for user, items in got.items():
        assert len(items) == min(k, len(sets[user]))
        assert len(set(items)) == len(items)
        assert set(items) <= set(sets[user])


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


def test_add_noise_seeded_matches_reference_and_differs_by_round():
    weights = {f"i{j}": float(j) for j in range(300)}
    got = dict(
        collect_pairs(lambda p: p | beam.Create(list(weights.items())) | AddNoise("gaussian", 2.0, seed=5, round_=3))
    )
    want = reference.add_noise(weights, "gaussian", 2.0, seed=5, round_=3)
    assert got == want
    other = reference.add_noise(weights, "gaussian", 2.0, seed=5, round_=4)
    assert all(other[i] != want[i] for i in weights)


def test_noisy_threshold_keeps_exactly_items_at_or_above_rho():
    weights = {f"i{j}": float(j) / 10 for j in range(200)}
    plan = plan_rounds("basic", SelectionParams(epsilon=1.0, delta=1e-5))[0]
    noisy = reference.add_noise(weights, plan.noise, plan.noise_scale, seed=3, round_=1)
    want = sorted(i for i, w in noisy.items() if w >= plan.threshold)
    with make_test_pipeline() as p:
        out = (
            p
            | beam.Create(list(weights.items()))
            | NoisyThreshold(plan.noise, plan.noise_scale, plan.threshold, seed=3, round_=1)
        )
        assert_that(out, equal_to(want))
    assert want == sorted(reference.noisy_threshold(weights, plan, seed=3))


def _flatten_joined(element, per_user_lists):
    user, joined = element
    if not per_user_lists:
        return [(user, joined)]
    assert isinstance(joined, list) and joined  # (user, [(item, v), ...]) lists, never empty
    return [(user, iv) for iv in joined]


@pytest.mark.parametrize("per_user_lists", [False, True])
def test_attach_item_values_shards_hot_items_without_losing_pairs(per_user_lists):
    rng = random.Random(3)
    pairs = [(f"u{u}", "hot") for u in range(500)] + [
        (f"u{rng.randrange(500)}", f"c{rng.randrange(40)}") for _ in range(400)
    ]
    pairs = sorted(set(pairs))
    values = {"hot": 0.5, **{f"c{j}": j / 7 for j in range(0, 40, 2)}}
    counts = {}
    for _, i in pairs:
        counts[i] = counts.get(i, 0) + 1
    want = sorted(f"{u}\t{i}\t{values[i]!r}" for u, i in pairs if i in values)

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

    assert sorted(collect(build)) == want


@pytest.mark.parametrize("algorithm", ["basic", "weighted_laplace", "count_gaussian", "count_laplace", "dp_sips"])
def test_select_partitions_equals_reference_under_seed(algorithm):
    sets = random_user_sets(random.Random(4), 1500, 300, 15)
    params = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, budget_split=(0.3, 0.7))
    want = reference.select(sets, algorithm, params, seed=123)
    got = collect(lambda p: p | beam.Create(pairs_of(sets)) | SelectPartitions(algorithm, params, seed=123))
    assert len(got) == len(set(got))  # each item released once
    assert set(got) == want
    union = {i for items in sets.values() for i in items}
    assert 0 < len(want) < len(union)  # a non-trivial instance: some but not all items released


def test_dp_sips_three_rounds_rounds_are_disjoint():
    sets = random_user_sets(random.Random(5), 1500, 300, 15)
    params = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, budget_split=(0.05, 0.15, 0.8))
    plans, per_round = reference.select_rounds(sets, "dp_sips", params, seed=9)
    assert len(plans) == 3
    assert sum(len(v) for v in per_round.values()) == len(set().union(*per_round.values()))
    got = collect(
        lambda p: (
            p
            | beam.Create(pairs_of(sets))
            | SelectPartitions("dp_sips", params, seed=9, output_rounds=True)
            | beam.MapTuple(lambda r, i: f"{r}\t{i}")
        )
    )
    want = sorted(f"{r}\t{i}" for r, items in per_round.items() for i in items)
    assert sorted(got) == want


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


def test_join_values_to_sets_same_in_broadcast_and_join_mode():
    """JoinValuesToSets: one element per user, with exactly the values of the user's items, whichever
    mode the run picks (max_broadcast_items 0 forces the sharded join; hot item over 14 shards)."""
    from dp_partition_beam.transforms.core.joins import JoinValuesToSets

    rng = random.Random(8)
    sets = {
        f"u{u}": sorted({"hot"} | {f"c{rng.randrange(40)}" for _ in range(rng.randrange(1, 6))}) for u in range(500)
    }
    values = {"hot": 0.5, **{f"c{j}": j / 7 for j in range(0, 40, 2)}}
    rows = list(sets.items())
    want = sorted(f"{u}\t{sorted((i, values[i]) for i in s if i in values)}" for u, s in sets.items())

    def build(limit):
        def fn(p):
            vals = p | "V" >> beam.Create(list(values.items()))
            return (
                p
                | "S" >> beam.Create(rows)
                | JoinValuesToSets(vals, max_users_per_key=37, max_broadcast_items=limit)
                | beam.MapTuple(lambda u, sv: f"{u}\t{sorted(sv[1])}")
            )

        return fn

    assert sorted(collect(build(0))) == want
    assert sorted(collect(build(len(values)))) == want
    with pytest.raises(ValueError, match="max_broadcast_items"):
        JoinValuesToSets(None, max_broadcast_items=-1)
