"""The l1 keep curve (privacy/thresholding.py, docs/thresholding.md "The l1 curve") as the release step of
weighted_laplace, count_laplace and policy_laplace with ``threshold='optimal'``: the plan and report, the keep
rate, the CLI (seeded Beam == the reference, with and without counts: test_keep_table_beam.py; "the curve releases
more than Laplace" is a benchmark claim: tests/benchmarks/test_utility_claims.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dp_partition_beam.pipelines import select_partitions
from dp_partition_beam.privacy import calibration, thresholding
from dp_partition_beam.privacy.selection import SelectionParams, plan
from dp_partition_beam.transforms import reference

from tests.support.words_cut import words_cut, write_tsv

SEED = 7
PARAMS = SelectionParams(1.0, 1e-5, max_contributions=20, threshold="optimal")
L1_ALGORITHMS = ["weighted_laplace", "count_laplace", "policy_laplace"]


@pytest.mark.parametrize("algorithm", L1_ALGORITHMS)
def test_plan_and_report(algorithm):
    (r,) = plan(algorithm, PARAMS).rounds
    curve = r.keep_table
    assert r.noise == "keep_curve" and r.h == "curve" and (r.epsilon, r.delta) == (1.0, 1e-5)
    changed = PARAMS.max_sequential_pairs if algorithm == "policy_laplace" else 20  # the rounding reserve's items
    assert (curve.epsilon, curve.delta) == (1.0, 1e-5 - thresholding.rounding_reserve(1.0, changed))
    assert curve.unit == (20.0 if algorithm == "count_laplace" else 1.0)
    rep = r.as_report()
    assert rep["noise_scale"] is None and rep["threshold"] == curve.weight_for(0.5)
    assert rep["keep_table"]["weight_kept_10_50_90"][1] == rep["threshold"]
    laplace = plan(algorithm, PARAMS.replace(threshold="laplace")).rounds[0]
    assert rep["threshold"] < laplace.threshold
    if algorithm == "policy_laplace":  # Gamma: kept with probability 1 - e^-alpha / 2, as rho + alpha b for Lap(b)
        assert float(curve.keep_probability(r.cutoff)) == pytest.approx(1 - 0.5 * math.exp(-PARAMS.alpha), abs=1e-9)
        assert r.cutoff < laplace.cutoff
    else:
        assert r.cutoff is None
    json.dumps(plan(algorithm, PARAMS).as_report())


def test_counts_keep_the_pure_split():
    """With counts the curve takes the Laplace round's share (eps_0, (1 - f) delta) of the pure split, and the
    counts are those of the Gaussian threshold's run."""
    p = PARAMS.replace(release_counts=True, count_budget=0.25)
    pc, lc = plan("weighted_laplace", p), plan("weighted_laplace", p.replace(threshold="laplace"))
    assert pc.counts == lc.counts
    assert (pc.rounds[0].epsilon, pc.rounds[0].delta) == (lc.rounds[0].epsilon, lc.rounds[0].delta)
    curve, reserve = pc.rounds[0].keep_table, thresholding.rounding_reserve(lc.rounds[0].epsilon, 20)
    assert (curve.epsilon, curve.delta) == (lc.rounds[0].epsilon, lc.rounds[0].delta - reserve)


def test_the_keep_rate_is_the_curve():
    """Unseeded bits from a seeded generator: 200,000 decisions per weight, within 5 binomial standard
    deviations of f(W) (false-failure rate < 6e-7 per weight, 4 weights, both pieces)."""
    curve = plan("weighted_laplace", PARAMS).rounds[0].keep_table
    rng = np.random.default_rng(0)
    n = 200_000
    for p_target in (0.05, 0.5, 0.7, 0.99):
        w = curve.weight_for(p_target)
        f = float(curve.keep_probability(w))
        bits = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
        rate = curve.keep(np.full(n, w), bits).mean()
        assert abs(rate - f) <= 5 * math.sqrt(f * (1 - f) / n), (w, f, rate)


def test_cli(tmp_path):
    """policy_laplace through the CLI releases the reference's count, on the bundled sample's cut
    (tests/support/words_cut.py: 12 pairs of each of its 1,754 users; 8 contributions, so the bounding samples)."""
    out, cut = tmp_path / "out", words_cut()
    argv = ["--input", write_tsv(cut, tmp_path / "cut.tsv"), "--input_format", "tsv", "--epsilon", "1"]
    argv += ["--delta", "1e-5", "--max_contributions", "8", "--output", str(out / "released")]
    argv += ["--report", str(out / "report.json"), "--direct_running_mode", "in_memory", "--seed", "3"]
    assert select_partitions.run(argv + ["--algorithm", "policy_laplace", "--threshold", "optimal"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["rounds"][0]["noise"] == "keep_curve" and report["released"] > 10
    want = reference.release(
        reference.user_sets_from_pairs(cut), "policy_laplace", PARAMS.replace(max_contributions=8), 3
    )
    assert report["released"] == len(want.items)


def test_laplace_thresholds_unchanged():
    """threshold='gaussian' (for these algorithms: the Laplace noise and rho) is still the DPSU calibration."""
    r = plan("weighted_laplace", PARAMS.replace(threshold="laplace")).rounds[0]
    c = calibration.calibrate_weighted_laplace(1.0, 1e-5, 20)
    assert (r.noise, r.noise_scale, r.threshold) == ("laplace", c.noise_scale, c.threshold)
