"""basic with ``threshold='optimal'``: the keep-probability table (privacy/thresholding.py) as Basic's release
step. Seeded Beam == the reference (with and without counts), the draws' contract, the keep rate against
F(W), the plan, the report and the flags."""

from __future__ import annotations

import gzip
import json
import math
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from dp_partition_beam.pipelines import select_partitions
from dp_partition_beam.privacy import l2_rule, thresholding
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams, plan
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.fingerprint import key_bytes_array
from dp_partition_beam.transforms.core.tables import item_bits
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WORDS = os.path.join(REPO, "data", "debian_words.tsv.gz")
SEED = 7
PARAMS = SelectionParams(1.0, 1e-5, max_contributions=20, threshold="optimal")


@pytest.fixture(scope="module")
def pairs():
    with gzip.open(WORDS, "rt", encoding="utf-8") as f:
        next(f)
        return [tuple(line.rstrip("\n").split("\t")) for line in f]


@pytest.mark.parametrize("release_counts", [False, True], ids=["items", "counts"])
@pytest.mark.parametrize(
    "algorithm",
    ["basic", "count_gaussian", "weighted_laplace", "count_laplace", "policy_laplace", "policy_gaussian", "mad"],
)  # the step tables, the l1 curve of the Laplace algorithms (NoisyThresholdFn's keep step, KeepByTable),
# Policy Gaussian's l2 rule (KeepByTable) and MAD's 128-bit l2 rule (NoisyThresholdFn)
def test_seeded_beam_equals_the_reference(pairs, algorithm, release_counts):
    params = PARAMS.replace(release_counts=release_counts)
    want = reference.release(reference.user_sets_from_pairs(pairs), algorithm, params, SEED)
    got = collect(lambda p: p | beam.Create(pairs) | SelectPartitions(algorithm, params, seed=SEED), fmt=repr)
    expected = [repr(x) for x in want.items] if not release_counts else [repr(x) for x in want.counts.items()]
    assert sorted(got) == sorted(expected)
    assert len(got) > 5


def test_the_draws_are_the_rounds_noise_bits():
    """Reference and Beam draw the same 64 bits per item: the round's noise key (seed, 'noise', round, item)."""
    items = ["a", "b", "x" * 40, "é", "0"]
    want = randomness.random_bits(items, "noise", 1, SEED, None)
    assert np.array_equal(item_bits(key_bytes_array(items), SEED, 1, None), want)
    # and their top 53 bits are the Gaussian rounds' uniforms of the same key
    u = randomness.keyed_uniform(SEED, "noise", 1, items)
    assert np.array_equal(randomness.uniform_of_bits(want), u)
    # a 128-bit rule's second draws (MAD's l2 rule, read only at a tie: never in a test run otherwise): Beam's
    # release step and the reference draw the same (seed, 'noise_low', round, item) bits for the indices asked
    from dp_partition_beam.transforms.selection.basic import NoisyThresholdFn

    fn = NoisyThresholdFn(plan("mad", PARAMS).rounds[0], SEED, False)
    column = pa.table({"item": key_bytes_array(items)}).column("item")
    got = fn._low_bits(column, fn._plan)(np.array([4, 0, 2]))
    low = randomness.random_bits([items[4], items[0], items[2]], randomness.KEEP_LOW_PURPOSE, 1, SEED, None)
    assert np.array_equal(got, low) and not np.array_equal(low, want[[4, 0, 2]])


def test_the_keep_rate_is_the_table_entry():
    """Unseeded bits from a seeded generator: 200,000 decisions per weight; the rate is within 5 binomial
    standard deviations of F(W) (false-failure rate < 6e-7 per weight, 3 weights)."""
    table = plan("basic", PARAMS).rounds[0].keep_table
    rng = np.random.default_rng(0)
    n = 200_000
    for p_target in (0.05, 0.5, 0.95):
        w = table.weight_for(p_target)
        f = float(table.keep_probability(w))
        bits = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
        rate = table.keep(np.full(n, w), bits).mean()
        assert abs(rate - f) <= 5 * math.sqrt(f * (1 - f) / n), (w, f, rate)


def test_plan_and_report():
    p = plan("basic", PARAMS)
    (r,) = p.rounds
    assert r.noise == "keep_table" and r.keep_table is not None and r.h == "table"
    assert thresholding.to_dp(r.keep_table, r.delta_conversion) == pytest.approx((1.0, 1e-5), rel=1e-9)
    rep = r.as_report()
    assert rep["noise_scale"] is None and rep["threshold"] == r.keep_table.weight_for(0.5)
    assert rep["keep_table"]["weight_kept_10_50_90"][1] == rep["threshold"]
    gaussian = plan("basic", PARAMS.replace(threshold="gaussian")).rounds[0].threshold
    assert rep["threshold"] < 0.9 * gaussian  # fewer users per released item (docs/thresholding.md)
    # with counts: the gdp split's counts, composed with the table in RDP (tests/privacy/test_mad_sips_table.py
    # recomputes the budget); the table needs less weight than the Gaussian threshold with the same counts
    pc = plan("basic", PARAMS.replace(release_counts=True, count_budget=0.25))
    gc = plan("basic", PARAMS.replace(release_counts=True, count_budget=0.25, threshold="gaussian"))
    assert pc.counts == gc.counts and pc.rounds[0].threshold < gc.rounds[0].threshold
    json.dumps(p.as_report())  # the report is JSON (no NaN)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_takes_a_keep_rule(algorithm):
    """threshold='optimal' applies to every algorithm (docs/thresholding.md, "Where it applies"): its one round,
    or its last, keeps items by a table, the l1 curve or the l2 rule, with no noise scale."""
    last = plan(algorithm, PARAMS).rounds[-1]
    assert last.noise in ("keep_table", "keep_curve", "keep_rule") and last.keep_table is not None
    assert last.noise_scale == 0.0


def test_policy_gaussian_plan_and_report():
    """Policy Gaussian with the l2 rule (privacy/l2_rule.py): W50 below the Gaussian rho, Gamma the weight kept with
    probability Phi(alpha) (as rho + alpha sigma for the Gaussian), the budget less the float reserve of
    max_sequential_pairs items; with counts, the gdp split's counts and the rule composed with them in RDP."""
    (r,) = plan("policy_gaussian", PARAMS).rounds
    rule = r.keep_table
    assert r.noise == "keep_rule" and r.h == "rule" and (r.epsilon, r.delta) == (1.0, 1e-5)
    reserve = l2_rule.realisation_reserve(1.0, PARAMS.max_sequential_pairs)
    eps = thresholding.rdp_to_dp_epsilon(rule.epsilon_rdp, rule.alpha, r.delta_conversion)
    assert eps == pytest.approx(1.0, rel=1e-9)
    assert rule.delta_rdp + r.delta_conversion + reserve == pytest.approx(1e-5, rel=1e-12)
    phi = 0.5 * math.erfc(-PARAMS.alpha / math.sqrt(2))
    assert float(rule.keep_probability(np.array([r.cutoff]))[0]) == pytest.approx(phi, abs=1e-9)
    gaussian = plan("policy_gaussian", PARAMS.replace(threshold="gaussian")).rounds[0]
    assert r.threshold < 0.9 * gaussian.threshold and r.cutoff < gaussian.cutoff
    rep = r.as_report()
    assert rep["noise_scale"] is None and rep["keep_table"]["kind"] == "l2_rule"
    assert rep["keep_table"]["weight_kept_10_50_90"][1] == rep["threshold"]
    pc = plan("policy_gaussian", PARAMS.replace(release_counts=True, count_budget=0.25))
    gc = plan("policy_gaussian", PARAMS.replace(release_counts=True, count_budget=0.25, threshold="gaussian"))
    assert pc.counts == gc.counts and pc.rounds[0].threshold < gc.rounds[0].threshold
    json.dumps(pc.as_report())
    # a large alpha (Phi(15) rounds to 1 in float): the cutoff is the rule's last knot, finite
    (big,) = plan("policy_gaussian", PARAMS.replace(alpha=15.0)).rounds
    assert math.isfinite(big.cutoff) and big.cutoff == big.keep_table.weight_for(big.keep_table.probs[-1])


@pytest.mark.parametrize("rows_per_shard", [10**9, 900])
def test_dp_sips_last_round_table_equals_the_reference(pairs, rows_per_shard):
    """DP-SIPS with threshold 'optimal': rounds 1..R-1 Gaussian, the last round Basic's table (seeded Beam ==
    reference, items and rounds)."""
    params = PARAMS.replace(budget_split=(0.2, 0.8))
    want = reference.release(reference.user_sets_from_pairs(pairs), "dp_sips", params, SEED)
    assert [r.noise for r in want.rounds] == ["gaussian", "keep_table"] and want.per_round[2]
    got = collect(
        lambda p: (
            p
            | beam.Create(pairs)
            | SelectPartitions("dp_sips", params, seed=SEED, output_rounds=True, rows_per_shard=rows_per_shard)
        ),
        fmt=repr,
    )
    assert sorted(got) == sorted(repr((r, i)) for r, items in want.per_round.items() for i in items)


def test_cli(tmp_path):
    out = tmp_path / "out"
    argv = ["--input", WORDS, "--input_format", "tsv", "--epsilon", "1", "--delta", "1e-5"]
    argv += ["--max_contributions", "20", "--output", str(out / "released"), "--report", str(out / "report.json")]
    argv += ["--direct_running_mode", "in_memory"]
    assert select_partitions.run(argv + ["--algorithm", "basic", "--threshold", "optimal"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["threshold"] == "optimal" and report["rounds"][0]["noise"] == "keep_table"
    assert report["released"] > 20
    # mad_sips: its last round is the table (docs/mad_sips.md), the earlier rounds Gaussian
    assert select_partitions.run([*argv, "--algorithm", "mad_sips", "--threshold", "optimal", "--overwrite"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [r["noise"] for r in report["rounds"]] == ["gaussian", "gaussian", "keep_table"]
    assert report["rounds"][-1]["weighting"] == "biased_basic" and report["released"] > 20
    # a weight cap: the table round's contributions at or below it, its W50 lower than without the cap
    w50 = report["rounds"][-1]["threshold"]
    cap = [*argv, "--algorithm", "mad_sips", "--weight_cap", "0.3", "--overwrite"]
    assert select_partitions.run(cap) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["weight_cap"] == 0.3 and report["rounds"][-1]["threshold"] < w50
    # weight_cap auto: the report names the choice (a DP output) and its table's W50; cap_budget is read
    auto = [*argv, "--algorithm", "mad_sips", "--weight_cap", "auto", "--cap_budget", "0.02", "--overwrite"]
    assert select_partitions.run(auto) == 0
    report = json.loads((out / "report.json").read_text())
    chosen = report["chosen_weight_cap"]
    assert report["weight_cap"] == "auto" and report["auto_weight_cap"]["budget"] == 0.02
    assert chosen in report["auto_weight_cap"]["candidates"]
    params = SelectionParams(1.0, 1e-5, max_contributions=20, weight_cap="auto", cap_budget=0.02)
    assert report["rounds"][-1]["threshold"] == plan("mad_sips", params).weight_caps.last_round(chosen).threshold
    # mad: the l2 rule by default, read with 128 bits; tau is the weight it keeps with probability Phi(beta)
    assert select_partitions.run([*argv, "--algorithm", "mad", "--overwrite"]) == 0
    report = json.loads((out / "report.json").read_text())
    (r,) = report["rounds"]
    assert report["threshold"] == "optimal" and r["noise"] == "keep_rule" and r["keep_table"]["kind"] == "l2_rule"
    assert r["tau"] == plan("mad", SelectionParams(1.0, 1e-5, max_contributions=20)).rounds[0].tau
    with pytest.raises(SystemExit) as exit_:  # a flag mad does not read: exit 2 before anything runs
        select_partitions.run([*argv, "--algorithm", "mad", "--weight_cap", "0.5", "--overwrite"])
    assert exit_.value.code == 2


def test_a_table_of_arrow_batches(pairs):
    """Batched input gives the release of the same pairs as elements (the weights, hence the indices, agree)."""
    table = pa.table({"user": [u for u, _ in pairs], "item": [i for _, i in pairs]})
    elements = collect(lambda p: p | beam.Create(pairs) | SelectPartitions("basic", PARAMS, seed=SEED), fmt=repr)
    batches = collect(lambda p: p | beam.Create([table]) | SelectPartitions("basic", PARAMS, seed=SEED), fmt=repr)
    assert sorted(batches) == sorted(elements)
