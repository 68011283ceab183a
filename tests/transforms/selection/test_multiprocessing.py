"""Runs in DirectRunner multi_processing mode with 2 worker processes."""

import random

import apache_beam as beam

from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.noise import AddNoise
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing.beam import TagWithPidFn, zero_weight

from tests.support.beam_helpers import collect
from tests.support.user_sets import pairs_of, random_user_sets


def test_unseeded_noise_is_distinct_across_worker_processes():
    # If forked workers shared one generator state, the first draws of the two workers would coincide.
    items = [f"i{j}" for j in range(4000)]

    def build(p):
        return (
            p
            | beam.Create(items)
            | beam.Reshuffle()
            | beam.Map(zero_weight)
            | AddNoise("gaussian", 1.0, seed=None)  # (item, noise)
            | beam.Values()
            | beam.ParDo(TagWithPidFn())  # (pid, noise)
            | beam.MapTuple(lambda pid, z: f"{pid}\t{z!r}")
        )

    lines = collect(build, mode="multi_processing", workers=2)
    assert len(lines) == len(items)
    noises = [float(l.split("\t")[1]) for l in lines]
    assert len({l.split("\t")[0] for l in lines}) == 2  # both worker processes drew noise
    assert len(set(noises)) == len(noises)
    # Standard normal sanity (false-failure rate < 1e-6): mean within 5/sqrt(n), sd in [0.9, 1.1].
    n = len(noises)
    mean = sum(noises) / n
    sd = (sum((z - mean) ** 2 for z in noises) / n) ** 0.5
    assert abs(mean) < 5 / n**0.5 and 0.9 < sd < 1.1


def test_seeded_select_is_identical_in_multi_processing_mode():
    sets = random_user_sets(random.Random(11), 1200, 250, 12)
    params = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8)
    for algorithm in ("basic", "dp_sips"):
        want = reference.select(sets, algorithm, params, seed=77)
        got = collect(
            lambda p: p | beam.Create(pairs_of(sets)) | beam.Reshuffle() | SelectPartitions(algorithm, params, seed=77),
            mode="multi_processing",
            workers=2,
        )
        assert set(got) == want and len(got) == len(want) and want


def test_unseeded_multi_round_consumers_see_the_same_noise():
    """Unseeded DP-SIPS, MAD2R and MAD-SIPS (its adaptive cap on) in 2 processes: an item released in
    round r is removed from later rounds, so it must never be released twice (which would happen if the
    removal saw another noise draw than the output)."""
    sets = random_user_sets(random.Random(13), 1200, 250, 12)
    params = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8, d_max=6, budget_split=(0.3, 0.7))
    union = {i for items in sets.values() for i in items}
    for algorithm in ("dp_sips", "mad2r", "mad_sips"):
        lines = collect(
            lambda p: (
                p
                | beam.Create(pairs_of(sets))
                | beam.Reshuffle()
                | SelectPartitions(algorithm, params, seed=None, output_rounds=True)
                | beam.MapTuple(lambda r, i: f"{r}\t{i}")
            ),
            mode="multi_processing",
            workers=2,
        )
        items = [l.split("\t")[1] for l in lines]
        rounds = {l.split("\t")[0] for l in lines}
        assert len(items) == len(set(items)) and set(items) <= union
        assert rounds == {"1", "2"}
