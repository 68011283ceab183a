"""SequentialPolicy (POLICY LAPLACE / POLICY GAUSSIAN) on Beam: equal to the reference under a seed,
independent of input order, the memory guard, and the CLI.

The Beam cases that succeed are labelled branches of one in_memory pipeline (tests/support/selection_cases.py),
run once per module by the ``branches`` fixture; each test compares its own branch with its own reference result
(the guard's failing run is a pipeline of its own). The policies in multi_processing mode, on shuffled input:
tests/transforms/selection/test_multiprocessing.py."""

import json
import math
import random

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import select_partitions
from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.selection.policy import GuardAndKeyToOneFn, SequentialSizeError
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.selection_cases import Branch, Select, item_lines, run_cases
from tests.support.user_sets import pairs_of, random_user_sets

SETS = random_user_sets(random.Random(4), 1500, 300, 15)
PARAMS = SelectionParams(epsilon=2.0, delta=1e-4, max_contributions=8)


ALGORITHMS = ["policy_gaussian", "policy_laplace"]
EVERYONE = {u: items + ["everyone"] for u, items in SETS.items()}  # an item in all 1500 sets


def _bounded_pairs(seed):
    return sum(len(v) for v in reference.bound_contributions(SETS, PARAMS.max_contributions, seed).values())


@pytest.fixture(scope="module")
def branches():
    """{case: sorted output lines} of every Beam case that succeeds, from one in_memory pipeline
    (tests/support/selection_cases.py): each test compares its own branch with its own reference."""
    cases = {}
    for algorithm in ALGORITHMS:
        for passes in (1, 2):
            cases[f"seeded/{algorithm}/{passes}"] = Select(
                pairs_of(SETS), algorithm, PARAMS.replace(passes=passes), seed=123
            )
        cases[f"unseeded/{algorithm}"] = Select(pairs_of(EVERYONE), algorithm, PARAMS.replace(alpha=15.0), seed=None)
    cases["empty"] = Branch(
        lambda p: (
            p
            | beam.Create([("u", "x")])
            | beam.Filter(lambda e: False)
            | SelectPartitions("policy_laplace", PARAMS, seed=1)
        )
    )
    limit = PARAMS.replace(max_sequential_pairs=_bounded_pairs(3))
    cases["guard_at_the_limit"] = Select(pairs_of(SETS), "policy_laplace", limit, seed=3)
    return run_cases(cases)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("passes", [1, 2])
def test_beam_equals_reference_in_memory(branches, algorithm, passes):
    params = PARAMS.replace(passes=passes)
    want = reference.select(SETS, algorithm, params, seed=123)
    got = branches[f"seeded/{algorithm}/{passes}"]
    assert got == item_lines(want) and len(got) == len(set(got))
    basic = reference.select(SETS, "basic" if algorithm == "policy_gaussian" else "weighted_laplace", PARAMS, seed=123)
    assert len(want) > len(basic) > 0  # the policies release more here, as the paper claims


def test_output_does_not_depend_on_input_order():
    shuffled = dict(reversed(list(SETS.items())))
    for alg in ALGORITHMS:
        assert reference.select(shuffled, alg, PARAMS, seed=4) == reference.select(SETS, alg, PARAMS, seed=4)
    # a different seed changes the order, the histogram and (here) the output
    assert reference.select(SETS, "policy_gaussian", PARAMS, seed=4) != reference.select(
        SETS, "policy_gaussian", PARAMS, seed=5
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unseeded_run_releases_items_every_user_holds(branches, algorithm):
    """Production mode (OS entropy). An item in all 1500 sets survives the cap to 8 in most of them
    and is pushed to the cutoff Gamma (alpha = 15): the l1 curve keeps it with probability 1 - 0.5 e^-15 (missed:
    1.5e-7 per run), and the l2 rule's Gamma, the weight kept with probability Phi(15) = 1 - 4e-51, is capped at
    the rule's last knot (kept with probability >= 1 - 1e-8: a finite cutoff for any alpha)."""
    got = branches[f"unseeded/{algorithm}"]
    assert "everyone" in got and set(got) <= {i for v in EVERYONE.values() for i in v}


def test_empty_input_releases_nothing(branches):
    assert branches["empty"] == []


def test_memory_guard_fails_before_gathering_with_a_clear_error(branches):
    n = _bounded_pairs(3)
    ok = branches["guard_at_the_limit"]  # max_sequential_pairs=n
    assert ok == item_lines(reference.select(SETS, "policy_laplace", PARAMS, seed=3)) and ok  # limit is inclusive
    with pytest.raises(Exception) as err:
        below = PARAMS.replace(max_sequential_pairs=n - 1)
        run_cases({"guard": Select(pairs_of(SETS), "policy_laplace", below, seed=3)})
    msg = str(err.value)
    assert "SequentialSizeError" in msg and f"max_sequential_pairs={n - 1:,d}" in msg
    assert "--max_sequential_pairs" in msg and "mad2r" in msg
    assert f"{n:,d}" not in msg and str(n) not in msg  # no exact data-dependent count leaks


@pytest.mark.parametrize("algorithm", ["policy_laplace", "policy_gaussian"])
def test_reference_enforces_the_limit_the_reserve_assumes(algorithm):
    """Issue 59 point 4: the keep curve's and rule's realisation reserve counts at most max_sequential_pairs
    items on the policy's worker; the reference enforces it as the Beam transform does (same error, the
    limit inclusive, counted after contribution bounding), before anything is released."""
    n = _bounded_pairs(3)
    assert reference.select(SETS, algorithm, PARAMS.replace(max_sequential_pairs=n), seed=3) is not None
    with pytest.raises(SequentialSizeError) as err:
        reference.select(SETS, algorithm, PARAMS.replace(max_sequential_pairs=n - 1), seed=3)
    assert f"max_sequential_pairs={n - 1:,d}" in str(err.value) and str(n) not in str(err.value)
    with pytest.raises(SequentialSizeError):  # the release entry point too, with counts
        reference.release(SETS, algorithm, PARAMS.replace(max_sequential_pairs=n - 1), 3)


def test_guard_fn_raises_on_the_first_element_past_the_limit():
    fn = GuardAndKeyToOneFn("policy_gaussian", 10)
    assert list(fn.process(("u", ["a"]), 10)) == [(0, ("u", ["a"]))]
    with pytest.raises(SequentialSizeError, match="max_sequential_pairs=10 "):
        list(fn.process(("u", ["a"]), 11))


def _cli(tmp_path, *extra):
    path = tmp_path / "in.tsv"
    path.write_text("user\titem\n" + "".join(f"{u}\t{i}\n" for u, i in pairs_of(SETS)), encoding="utf-8")
    out, report = tmp_path / "items", tmp_path / "report.json"
    argv = [
        "--input",
        str(path),
        "--input_format",
        "tsv",
        "--output",
        str(out),
        "--report",
        str(report),
        "--epsilon",
        "2",
        "--delta",
        "1e-4",
        "--max_contributions",
        "8",
        "--direct_running_mode",
        "in_memory",
        *extra,
    ]
    code = select_partitions.run(argv)
    items = [l.rstrip("\n") for p in sorted(tmp_path.glob("items*")) for l in open(p, encoding="utf-8")]
    return code, items, (json.loads(report.read_text()) if report.exists() else None)


def test_cli_policy_gaussian_with_alpha_and_passes(tmp_path):
    code, items, rep = _cli(tmp_path, "--algorithm", "policy_gaussian", "--alpha", "3", "--passes", "2", "--seed", "5")
    assert code == 0
    params = PARAMS.replace(alpha=3.0, passes=2)
    assert set(items) == reference.select(SETS, "policy_gaussian", params, seed=5) and items
    assert rep["algorithm"] == "policy_gaussian" and rep["alpha"] == 3.0 and rep["passes"] == 2
    (r,) = rep["rounds"]
    # the default l2 keep rule: Gamma is the weight it keeps with probability Phi(3), as rho + 3 sigma for the
    # Gaussian rule (--threshold gaussian, below)
    rule = plan_rounds("policy_gaussian", params)[0].keep_table
    phi = 0.5 * math.erfc(-3.0 / math.sqrt(2.0))
    assert r["noise"] == "keep_rule" and r["cutoff"] == pytest.approx(rule.weight_for(phi))
    assert r["released"] == len(items) and r["weighting"] == "l2_descent"
    (tmp_path / "g").mkdir()
    code, items, rep = _cli(
        tmp_path / "g", *("--algorithm", "policy_gaussian", "--threshold", "gaussian", "--alpha", "3"), "--seed", "5"
    )
    (r,) = rep["rounds"]
    assert code == 0 and r["cutoff"] == pytest.approx(r["threshold"] + 3.0 * r["noise_scale"])


def test_cli_memory_guard_exits_3_with_the_message(tmp_path, capsys):
    code, _, _ = _cli(tmp_path, "--algorithm", "policy_laplace", "--max_sequential_pairs", "100", "--seed", "1")
    assert code == 3
    err = capsys.readouterr().err
    assert "max_sequential_pairs=100 " in err and "mad2r" in err and "Traceback" not in err


@pytest.mark.parametrize("flag,value", [("--alpha", "-2"), ("--passes", "0"), ("--max_sequential_pairs", "0")])
def test_cli_rejects_bad_policy_parameters(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        _cli(tmp_path, "--algorithm", "policy_laplace", flag, value)
    assert e.value.code == 2 and flag.lstrip("-") in capsys.readouterr().err
