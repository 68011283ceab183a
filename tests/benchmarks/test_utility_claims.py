"""Utility claims ("releases more than"): benchmark results, asserted here as small benchmark runs on the
same seeds as the correctness files had them (tests/transforms/selection/test_l1_curve_beam.py,
tests/transforms/dpne/test_dpne_mad_sips.py); the published numbers are in BENCHMARKS.md and docs/."""

import pytest

from benchmarks import bench_dpne
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.dpne.reference import user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.words_cut import words_cut


@pytest.mark.parametrize("algorithm", ["weighted_laplace", "count_laplace", "policy_laplace"])
def test_the_l1_curve_releases_more_than_laplace_on_the_sample(algorithm):
    """Over seeds 0-4 the l1 curve releases more items than the Laplace threshold on the bundled sample's cut
    (12 pairs of each of its 1,754 users, 8 contributions, epsilon 1: 24-27 items a seed against 20-27). Its keep
    probability is above Laplace's at every weight (tests/privacy/test_l1_curve.py); the expected releases are
    bench_thresholding's --rule l1 table (tests/benchmarks/test_bench_thresholding.py)."""
    users = reference.user_sets_from_pairs(words_cut())
    params = SelectionParams(1.0, 1e-5, max_contributions=8, threshold="optimal")
    curve = sum(len(reference.release(users, algorithm, params, s).items) for s in range(5))
    rule = params.replace(threshold="laplace")
    laplace = sum(len(reference.release(users, algorithm, rule, s).items) for s in range(5))
    assert curve > laplace, (curve, laplace)


def test_dpne_mad_sips_releases_more_than_single_on_a_markov_corpus():
    """bench_dpne's run_config (the rows of its corpus tables) on a 1,500-user Markov corpus, seeds 0-2: MAD-SIPS
    inside each level releases more n-grams in all than the paper's single Gaussian round (keep tables, the
    default, are another lever: docs/dpne.md). Measured 161.7 against 153.3 a seed."""
    ug = user_kgrams(markov_corpus(1500, vocab=120, branching=3, seed=4), 5)
    prm = DPNEParams(epsilon=1, delta=1e-7, max_n=5, max_contributions=20)
    single = bench_dpne.run_config(ug, "dpne", prm.replace(selection="single", threshold="gaussian"), range(3))
    mad_sips = bench_dpne.run_config(ug, "dpne", prm.replace(selection="mad_sips"), range(3))
    assert mad_sips["counts"].sum(axis=1).mean() > single["counts"].sum(axis=1).mean()
