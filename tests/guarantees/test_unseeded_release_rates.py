"""Unseeded runs (OS entropy, as in production) release items at the rates the plan says.

Seeded runs are checked bit for bit against the reference elsewhere; these check the other branch of every
draw, the worker generator of an unseeded run (``tables.noisy_weights`` and ``tables.item_bits`` with
``seed=None``), end to end through ``SelectPartitions`` on the in-memory runner. Each item is held by k users
who hold nothing else, so its weight is exactly k; Basic releases it with probability
P(k + sigma Z >= rho) (Gaussian threshold) or F(k) (keep table). Two weights per case, one in the lower tail
and one above the middle, 4,000 items each: a wrong noise scale, threshold, comparison or a missing draw
moves a count far outside its exact binomial bounds.

False-failure rate: each count's two one-sided bounds spend 2.5e-7 each, so a correct implementation fails
a case with probability <= 1e-6. (A noise scale off by 25% moves the lower-tail count by ~5 of its
standard deviations, as does rho off by half a sigma.)
"""

import apache_beam as beam
import pytest
from scipy import stats

from dp_partition_beam.privacy import selection
from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect

PARAMS = dict(epsilon=2.0, delta=1e-5, max_contributions=6, d_max=8)
ITEMS = 4000
SIDE_ALPHA = 2.5e-7


def _pass_probability(round_plan, weight: float) -> float:
    if round_plan.keep_table is not None:
        return float(round_plan.keep_table.keep_probability([weight])[0])
    return float(stats.norm.sf((round_plan.threshold - weight) / round_plan.noise_scale))


def _weights(round_plan):
    """Two integer weights: the least with pass probability >= 3% and the least with >= 60%."""
    low = next(k for k in range(1, 200) if _pass_probability(round_plan, k) >= 0.03)
    high = next(k for k in range(low, 200) if _pass_probability(round_plan, k) >= 0.6)
    return low, high


@pytest.mark.parametrize("threshold", ["gaussian", "optimal"])
def test_unseeded_basic_releases_at_the_planned_rates(threshold):
    params = selection.SelectionParams(threshold=threshold, **PARAMS)
    (round_plan,) = selection.plan("basic", params).rounds
    assert (round_plan.keep_table is not None) == (threshold == "optimal")
    assert passes_threshold(1.0, 1.0)  # the release rule is noisy >= rho, the tail _pass_probability takes
    weights = _weights(round_plan)
    pairs = [
        (f"u{k}_{i}_{j}", f"w{k}_{i}")  # item w{k}_{i}: k users holding only it, weight k
        for k in weights
        for i in range(ITEMS)
        for j in range(k)
    ]
    released = collect(lambda p: p | beam.Create(pairs) | SelectPartitions("basic", params))  # unseeded
    for k in weights:
        count = sum(item.startswith(f"w{k}_") for item in released)
        p = _pass_probability(round_plan, k)
        lower = stats.binom.ppf(SIDE_ALPHA, ITEMS, p)
        upper = stats.binom.isf(SIDE_ALPHA, ITEMS, p)
        assert lower <= count <= upper, (threshold, k, p, count, (lower, upper), ITEMS * p)
    assert len(set(released)) == len(released)
