"""basic with ``threshold='optimal'``: the keep-probability table (privacy/thresholding.py) as Basic's release
step. Seeded Beam == the reference (with and without counts, every algorithm's keep rule, one pipeline on a cut
of the bundled data), the draws' contract, the keep rate against F(W), the plan, the report and the flags."""

from __future__ import annotations

import glob
import json
import math
import os
import tempfile

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

from tests.support.beam_helpers import options
from tests.support.words_cut import words_cut, write_tsv

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WORDS = os.path.join(REPO, "data", "debian_words.tsv.gz")
SEED = 7
PARAMS = SelectionParams(1.0, 1e-5, max_contributions=20, threshold="optimal")


# Beam == reference runs on a cut of the bundled data (tests/support/words_cut.py): the first 12 pairs of every
# user (19,363 pairs, all 1,754 users), more than CUT_PARAMS's 8 contributions so the bounding samples. Every
# algorithm releases 24-38 items at epsilon 1 (the full 200k pairs add size, not paths: the release step is per
# item); the columnar algorithms run on ROWS_PER_SHARD-row shards and BATCH_ROWS-row batches (5 shards, 8 batches).
PAIRS_PER_USER = 12
CUT_PARAMS = SelectionParams(1.0, 1e-5, max_contributions=8, threshold="optimal")
ROWS_PER_SHARD, BATCH_ROWS = 4_000, 2_500
MIN_RELEASED = 20  # every case releases at least this many items (the release is not vacuous)
ALGORITHMS_WITH_A_RULE = (
    "basic",
    "count_gaussian",
    "weighted_laplace",
    "count_laplace",
    "policy_laplace",
    "policy_gaussian",
    "mad",
)  # the step tables, the l1 curve of the Laplace algorithms (NoisyThresholdFn's keep step, KeepByTable),
# Policy Gaussian's l2 rule (KeepByTable) and MAD's 128-bit l2 rule (NoisyThresholdFn)


@pytest.fixture(scope="module")
def cut():
    return list(words_cut(PAIRS_PER_USER))


def _cases():
    """(name, algorithm, params, SelectPartitions keywords) of the seeded Beam == reference cases (keyword
    ``input='arrow'``: the cut as one Arrow table instead of pair elements; ``seed``: another seed than SEED)."""
    shards = {"rows_per_shard": ROWS_PER_SHARD, "batch_rows": BATCH_ROWS}
    for algorithm in ALGORITHMS_WITH_A_RULE:
        for counts in (False, True):
            yield (
                f"{algorithm}-{'counts' if counts else 'items'}",
                algorithm,
                CUT_PARAMS.replace(release_counts=counts),
                shards,  # the sequential policies have no shards: the knobs change nothing there
            )
    # the l1 curve is steep: on the cut 0-2 of its ~25 items are borderline, so another bit stream (a wrong round
    # key) leaves a seed's release unchanged in about 1 run of 3; two more seeds make that about 1 in 30
    for algorithm in ("weighted_laplace", "count_laplace", "policy_laplace"):
        for seed in (8, 9):
            yield f"{algorithm}-items-seed{seed}", algorithm, CUT_PARAMS, {**shards, "seed": seed}
    # the same pairs as one Arrow table element: the weights, hence the table indices, agree
    yield "basic-items-arrow-table", "basic", CUT_PARAMS, {"input": "arrow"}
    # DP-SIPS: rounds 1..R-1 Gaussian, the last round Basic's table; items per round, one shard and several
    split = CUT_PARAMS.replace(budget_split=(0.2, 0.8))
    for rows_per_shard in (10**9, 900):
        yield (
            f"dp_sips-rounds-{rows_per_shard}",
            "dp_sips",
            split,
            {"output_rounds": True, "rows_per_shard": rows_per_shard},
        )


def _expected(users, algorithm, params, kwargs):
    want = reference.release(users, algorithm, params, kwargs.get("seed", SEED))
    if kwargs.get("output_rounds"):
        assert [r.noise for r in want.rounds] == ["gaussian", "keep_table"] and want.per_round[1] and want.per_round[2]
        return [repr((r, i)) for r, items in want.per_round.items() for i in items]
    return [repr(x) for x in (want.counts.items() if params.release_counts else want.items)]


@pytest.fixture(scope="module")
def seeded_runs(cut):
    """Every case as a labelled branch of ONE pipeline over one Create of the cut: {case: (got, expected)}."""
    cases = list(_cases())
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(options=options()) as p:
            inputs = {
                "pairs": p | "Create" >> beam.Create(cut),
                "arrow": p | "CreateTable" >> beam.Create([pa.table(dict(zip(("user", "item"), zip(*cut))))]),
            }
            for name, algorithm, params, kwargs in cases:
                kwargs = dict(kwargs)
                source, seed = inputs[kwargs.pop("input", "pairs")], kwargs.pop("seed", SEED)
                _ = (
                    source
                    | f"{name}/Select" >> SelectPartitions(algorithm, params, seed=seed, **kwargs)
                    | f"{name}/Format" >> beam.Map(repr)
                    | f"{name}/Write" >> beam.io.WriteToText(os.path.join(tmp, name, "out"))
                )
        got = {name: _read_lines(os.path.join(tmp, name)) for name, *_ in cases}
    users = reference.user_sets_from_pairs(cut)
    return {name: (got[name], _expected(users, a, params, kw)) for name, a, params, kw in cases}


def _read_lines(folder):
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "out*"))):
        with open(path, encoding="utf-8") as f:
            lines.extend(line.rstrip("\n") for line in f)
    return lines


@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_seeded_beam_equals_the_reference(seeded_runs, case):
    """Seeded Beam == the reference, item for item (and count for count), for every algorithm's keep rule on
    several shards and batches, and DP-SIPS's last-round table per round with one shard and with several. One
    pipeline runs every case (a branch each); this test reads its case's branch."""
    got, expected = seeded_runs[case]
    assert sorted(got) == sorted(expected), case
    assert len(got) >= MIN_RELEASED, case


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


def test_cli(tmp_path, cut):
    """The CLI's flags and report for the keep rules, on the cut (in process, DirectRunner)."""
    out, path = tmp_path / "out", write_tsv(cut, tmp_path / "cut.tsv")
    argv = ["--input", path, "--input_format", "tsv", "--epsilon", "1", "--delta", "1e-5"]
    argv += ["--max_contributions", "8", "--output", str(out / "released"), "--report", str(out / "report.json")]
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
    params = SelectionParams(1.0, 1e-5, max_contributions=8, weight_cap="auto", cap_budget=0.02)
    assert report["rounds"][-1]["threshold"] == plan("mad_sips", params).weight_caps.last_round(chosen).threshold
    # mad: the l2 rule by default, read with 128 bits; tau is the weight it keeps with probability Phi(beta)
    assert select_partitions.run([*argv, "--algorithm", "mad", "--overwrite"]) == 0
    report = json.loads((out / "report.json").read_text())
    (r,) = report["rounds"]
    assert report["threshold"] == "optimal" and r["noise"] == "keep_rule" and r["keep_table"]["kind"] == "l2_rule"
    assert r["tau"] == plan("mad", SelectionParams(1.0, 1e-5, max_contributions=8)).rounds[0].tau
    with pytest.raises(SystemExit) as exit_:  # a flag mad does not read: exit 2 before anything runs
        select_partitions.run([*argv, "--algorithm", "mad", "--weight_cap", "0.5", "--overwrite"])
    assert exit_.value.code == 2
