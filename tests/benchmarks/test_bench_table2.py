"""benchmarks/bench_table2.py's core on a tiny synthetic dataset built here (no shared data)."""

import gzip
import logging
import math
import os

import numpy as np
import pytest

from benchmarks import bench_table2
from benchmarks.shared_data import read_user_sets
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms.selection import reference

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

SEEDS = [0, 1, 2]
ORIGINAL_BOUND = reference.bound_contributions
K = (1, 30, 60)


@pytest.fixture(scope="module")
def sets():
    """300 users: item h{j} is held by the first 10 * (j + 1) users, plus one private item each.

    The seeded-run warnings are silenced for this module only (the level is restored: other test files
    assert that the warning is logged)."""
    logger = logging.getLogger("dp_partition_beam.transforms.core.randomness")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield {f"u{u}": [f"h{j}" for j in range(30) if u < 10 * (j + 1)] + [f"p{u}"] for u in range(300)}
    logger.setLevel(level)


@pytest.fixture(scope="module")
def rows(sets):
    configs = [c for c in bench_table2.CONFIGS if c[0] in ("basic", "mad2r", "dp_sips [0.05,0.15,0.8]")]
    return bench_table2.run_dataset("higgs", sets, configs, SEEDS, log=lambda m: None, coverage_k=K)


def test_accountings_follow_the_registry(rows):
    assert [(r["algorithm"], r["accounting"]) for r in rows] == [
        ("basic", "n/a"),
        ("mad2r", "basic"),
        ("mad2r", "gdp"),
        ("dp_sips [0.05,0.15,0.8]", "basic"),
        ("dp_sips [0.05,0.15,0.8]", "gdp"),
    ]
    assert bench_table2.accountings("dp_sips") == ("basic", "gdp")
    assert bench_table2.accountings("policy_gaussian") == ("n/a",)


def test_mean_std_and_coverage_equal_direct_reference_calls(sets, rows):
    holders = {}
    for items in sets.values():
        for i in items:
            holders[i] = holders.get(i, 0) + 1
    assert reference.bound_contributions is ORIGINAL_BOUND  # the memo of run_dataset is gone
    gaussian = {"threshold": "gaussian"}  # the rows' Gaussian last rounds (the tables are their own rows)
    cases = [("basic", None, {}), ("mad2r", "basic", gaussian), ("mad2r", "gdp", gaussian)]
    cases += [("dp_sips", a, {"budget_split": (0.05, 0.15, 0.8), **gaussian}) for a in ("basic", "gdp")]
    for row, (algorithm, accounting, extra) in zip(rows, cases):
        params = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100, **extra)
        if accounting:
            params = params.replace(accounting=accounting)
        released = [reference.select(sets, algorithm, params, seed=s) for s in SEEDS]
        sizes = [len(r) for r in released]
        assert row["seeds"] == len(SEEDS)
        assert row["mean"] == pytest.approx(np.mean(sizes))
        assert row["std"] == pytest.approx(np.std(sizes, ddof=1))
        for k in K:
            held = [i for i, c in holders.items() if c >= k]
            expected = np.mean([sum(i in r for i in held) / len(held) for r in released])
            assert row[f"coverage_k{k}"] == pytest.approx(expected), (row["algorithm"], k)
    # something is released and the data is not trivial: coverage of all items < coverage of frequent ones
    basic = rows[0]
    assert 0 < basic["mean"] < 330
    assert basic["coverage_k1"] < basic["coverage_k60"]
    assert basic["paper"] == 1791 and rows[1]["paper"] == 1767


def test_configs_are_the_papers_settings():
    by_label = {label: (alg, extra) for label, alg, extra in bench_table2.CONFIGS}
    mad2r = bench_table2.params_for(by_label["mad2r"][1], "basic")
    assert (mad2r.d_max, mad2r.beta, mad2r.budget_split, mad2r.b_min, mad2r.b_max, mad2r.c_lb, mad2r.c_ub) == (
        50,
        2.0,
        (0.1, 0.9),
        0.5,
        2.0,
        1.0,
        3.0,
    )
    assert mad2r.accounting == "basic" and (mad2r.epsilon, mad2r.delta, mad2r.max_contributions) == (1.0, 1e-5, 100)
    assert bench_table2.params_for(by_label["policy_gaussian (alpha 4)"][1], "n/a").alpha == 4.0
    splits = {extra["budget_split"] for alg, extra in by_label.values() if alg == "dp_sips"}
    assert splits == {(0.1, 0.9), (0.05, 0.15, 0.8)}
    # every row names its threshold (and MAD-SIPS's table row its cap): a change of the defaults cannot move
    # a row of the table (the keep table became mad2r's and dp_sips's default, issue 30)
    from dp_partition_beam.privacy.selection import resolve_params

    for label, (alg, extra) in by_label.items():
        for accounting in bench_table2.accountings(alg, extra):
            if alg in ("mad2r", "dp_sips", "mad_sips"):
                want = "optimal" if "threshold optimal" in label else "gaussian"
                assert extra.get("threshold") == want, label
                assert resolve_params(alg, bench_table2.params_for(extra, accounting)).threshold == want, label
    assert by_label["mad_sips [0.03,0.07,0.9] threshold optimal"][1]["cap_quantile"] == 1.0


def test_markdown_has_both_tables(rows):
    md = bench_table2.markdown(
        rows, [("higgs", 300, 765, 330, 0.0, 60.0)], "python -m benchmarks.bench_table2", "now", K
    )
    assert "| higgs | mad2r | gdp | 0.1,0.9 | 1,767 +- 15 |" in md
    assert "| dataset | algorithm | accounting | >= 1 | >= 30 | >= 60 |" in md
    assert "(300 users, 765 pairs, 330 items; read in 0 s, all runs 1.0 min)" in md
    assert not math.isnan(rows[0]["std"])


def test_reuse_bounding_returns_the_same_capped_sets_only_for_equal_input(sets):
    smaller = {u: items[:-1] for u, items in sets.items() if len(items) > 1}
    with bench_table2.reuse_bounding() as memo:
        first = reference.bound_contributions(sets, 5, seed=3, round_=1)
        again = reference.bound_contributions(dict(sets), 5, seed=3, round_=1)  # equal, not the same object
        other = reference.bound_contributions(smaller, 5, seed=3, round_=1)
        assert len(memo) == 1
    assert again is first
    assert other == ORIGINAL_BOUND(smaller, 5, seed=3, round_=1) != first
    assert first == ORIGINAL_BOUND(sets, 5, seed=3, round_=1)
    assert reference.bound_contributions is ORIGINAL_BOUND


def test_read_user_sets_splits_lines_at_newline_only(tmp_path):
    path = tmp_path / "x.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        f.write("user\titem\nu1\tmovie\x97just\nu1\ta\x85b\nu1\ta\x85b\nu2\tc\n")
    assert read_user_sets(str(path)) == {"u1": ["movie\x97just", "a\x85b"], "u2": ["c"]}


def test_only_selects_configurations_by_label_and_refuses_an_empty_selection():
    labels = [c[0] for c in bench_table2.CONFIGS if "weight_cap" in c[0]]
    assert labels == [
        "mad_sips threshold optimal, weight_cap 0.25",
        "mad_sips threshold optimal, weight_cap auto (defaults)",
    ]
    by_label = {label: extra for label, _, extra in bench_table2.CONFIGS}
    # the defaults' row leaves weight_cap unset: MAD-SIPS's default, 'auto'
    assert [by_label[label].get("weight_cap") for label in labels] == [0.25, None]
    assert bench_table2.params_for(by_label[labels[1]], "gdp").weight_cap is None
    assert by_label["mad_sips [0.03,0.07,0.9] threshold optimal"]["weight_cap"] == 1.0  # the defaults before
    assert all(by_label[label]["threshold"] == "optimal" for label in labels)
    with pytest.raises(SystemExit) as exit_:  # before any data is read
        bench_table2.main(["--only", "no such row"])
    assert exit_.value.code == 2
