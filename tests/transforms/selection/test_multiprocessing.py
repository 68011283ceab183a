"""Runs in DirectRunner multi_processing mode with 2 worker processes: forked workers draw distinct noise,
seeded runs of every shape equal the reference there (DoFns imported by module name, per-worker set-up
such as the sampler's source), and unseeded multi-round runs stay consistent.

Every case is a labelled branch of ONE multi_processing pipeline (tests/support/selection_cases.py), run once
per module by the ``branches`` fixture: the worker processes start once per pipeline (seconds each time);
each test compares its own branches with their own reference result.
"""

import ast
import random

import apache_beam as beam
import pytest

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.noise import AddNoise
from dp_partition_beam.transforms.testing.beam import TagWithPidFn, zero_weight

from tests.support.selection_cases import Branch, Select, count_lines, item_lines, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

NOISE_ITEMS = [f"i{j}" for j in range(4000)]
# seeded one-round and DP-SIPS shapes (Reshuffle: the pairs reach both workers)
SEEDED_SETS = random_user_sets(random.Random(11), 1200, 250, 12)
SEEDED_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8)
# the MAD family
MAD_SETS = random_user_sets(random.Random(12), 1200, 250, 12)
MAD_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, d_max=6)
# the count release (tests/transforms/selection/test_counts_beam.py's data)
COUNT_SETS = random_user_sets(random.Random(3), 2500, 150, 12)
COUNT_PARAMS = SelectionParams(epsilon=2.0, delta=1e-5, max_contributions=5, release_counts=True, min_users=1)
# the sequential policies on shuffled input (tests/transforms/selection/test_policy_beam.py's data)
POLICY_SETS = random_user_sets(random.Random(4), 1500, 300, 15)
POLICY_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8)
POLICY_PAIRS = pairs_of(POLICY_SETS)
random.Random(1).shuffle(POLICY_PAIRS)  # input order is irrelevant too
# unseeded multi-round runs
MULTI_ROUND_SETS = random_user_sets(random.Random(13), 1200, 250, 12)
MULTI_ROUND_PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, d_max=6, budget_split=(0.3, 0.7))

SEEDED = {  # case: (algorithm, sets, params, seed)
    "basic": ("basic", SEEDED_SETS, SEEDED_PARAMS, 77),
    "dp_sips": ("dp_sips", SEEDED_SETS, SEEDED_PARAMS, 77),
    "mad": ("mad", MAD_SETS, MAD_PARAMS, 31),
    "mad2r": ("mad2r", MAD_SETS, MAD_PARAMS, 31),
}
POLICIES = ["policy_gaussian", "policy_laplace"]
MULTI_ROUND = ["dp_sips", "mad2r", "mad_sips"]  # mad_sips with its adaptive cap on (the default)


def _pid_noise(p):
    return (
        p
        | beam.Create(NOISE_ITEMS)
        | beam.Reshuffle()
        | beam.Map(zero_weight)
        | AddNoise("gaussian", 1.0, seed=None)  # (item, noise)
        | beam.Values()
        | beam.ParDo(TagWithPidFn())  # (pid, noise)
    )


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every case, from one multi_processing pipeline with 2 workers."""
    cases = {"pid_noise": Branch(_pid_noise)}
    for case, (algorithm, sets, params, seed) in SEEDED.items():
        cases[f"seeded/{case}"] = Select(pairs_of(sets), algorithm, params, seed=seed, reshuffle=True)
    cases["counts/mad"] = Select(pairs_of(COUNT_SETS), "mad", COUNT_PARAMS, seed=21)
    for algorithm in POLICIES:
        cases[f"policy/{algorithm}"] = Select(POLICY_PAIRS, algorithm, POLICY_PARAMS, seed=9)
    for algorithm in MULTI_ROUND:
        cases[f"unseeded/{algorithm}"] = Select(
            pairs_of(MULTI_ROUND_SETS), algorithm, MULTI_ROUND_PARAMS, seed=None, output_rounds=True, reshuffle=True
        )
    return run_cases(cases, mode="multi_processing", workers=2)


def test_unseeded_noise_is_distinct_across_worker_processes(branches):
    # If forked workers shared one generator state, the first draws of the two workers would coincide.
    lines = branches["pid_noise"]
    assert len(lines) == len(NOISE_ITEMS)
    tagged = [ast.literal_eval(line) for line in lines]  # (pid, noise): floats to 17 digits
    noises = [z for _, z in tagged]
    assert len({pid for pid, _ in tagged}) == 2  # both worker processes drew noise
    assert len(set(noises)) == len(noises)
    # Standard normal sanity (false-failure rate < 1e-6): mean within 5/sqrt(n), sd in [0.9, 1.1].
    n = len(noises)
    mean = sum(noises) / n
    sd = (sum((z - mean) ** 2 for z in noises) / n) ** 0.5
    assert abs(mean) < 5 / n**0.5 and 0.9 < sd < 1.1


@pytest.mark.parametrize("case", list(SEEDED))
def test_seeded_select_is_identical_in_multi_processing_mode(branches, case):
    """Basic, DP-SIPS, MAD and MAD2R: the reference's items, each once."""
    algorithm, sets, params, seed = SEEDED[case]
    want = reference.select(sets, algorithm, params, seed=seed)
    assert branches[f"seeded/{case}"] == item_lines(want) and want


def test_counts_in_multi_processing_mode_equal_the_reference(branches):
    """The count release (the sampler's source set up per worker): the reference's (item, int count) pairs."""
    want = reference.select_counts(COUNT_SETS, "mad", COUNT_PARAMS, seed=21)
    assert branches["counts/mad"] == count_lines(want) and len(want) > 10


@pytest.mark.parametrize("algorithm", POLICIES)
def test_policies_equal_the_reference_in_multi_processing_mode(branches, algorithm):
    """The sequential policies (one worker gathers every set) on shuffled input: the reference's items."""
    want = reference.select(POLICY_SETS, algorithm, POLICY_PARAMS, seed=9)
    assert branches[f"policy/{algorithm}"] == item_lines(want) and want


@pytest.mark.parametrize("algorithm", MULTI_ROUND)
def test_unseeded_multi_round_consumers_see_the_same_noise(branches, algorithm):
    """Unseeded DP-SIPS, MAD2R and MAD-SIPS (its adaptive cap on) in 2 processes: an item released in
    round r is removed from later rounds, so it must never be released twice (which would happen if the
    removal saw another noise draw than the output)."""
    union = {i for items in MULTI_ROUND_SETS.values() for i in items}
    tagged = [ast.literal_eval(line) for line in branches[f"unseeded/{algorithm}"]]  # (round, item)
    items = [i for _, i in tagged]
    assert len(items) == len(set(items)) and set(items) <= union
    assert {r for r, _ in tagged} == {1, 2}
