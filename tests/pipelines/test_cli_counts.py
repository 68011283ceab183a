"""The count options on the command line: --release_counts, --count_budget, --min_users, --allowlist
(select_partitions and extract_ngrams), against the reference under a seed."""

import glob
import json
import random

import pytest

from dp_partition_beam.pipelines import extract_ngrams, select_partitions
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams, plan_counts
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.dpne.reference import dpne_reference
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

from tests.support.user_sets import random_user_sets

SETS = random_user_sets(random.Random(5), 1500, 150, 10)
PAIRS = [(u, i) for u, items in SETS.items() for i in items]


def write_tsv(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("user\titem\n" + "".join(f"{u}\t{i}\n" for u, i in PAIRS), encoding="utf-8")
    return str(path)


def read_lines(prefix):
    out = []
    for path in sorted(glob.glob(str(prefix) + "*")):
        with open(path, encoding="utf-8") as f:
            out.extend(line.rstrip("\n") for line in f)
    return out


def run_select(tmp_path, *extra, name="out"):
    out, report = tmp_path / name / "items", tmp_path / name / "report.json"
    argv = ["--input", write_tsv(tmp_path), "--input_format", "tsv", "--output", str(out), "--report", str(report)]
    argv += ["--epsilon", "2", "--delta", "1e-5", "--max_contributions", "6", "--algorithm", "mad2r"]
    argv += ["--seed", "8", "--direct_running_mode", "in_memory", "--progress_interval", "0", *extra]
    assert select_partitions.run(argv) == 0
    with open(report, encoding="utf-8") as f:
        return read_lines(out), json.load(f)


def test_select_partitions_writes_item_tab_count_equal_to_the_reference(tmp_path):
    lines, report = run_select(tmp_path, "--release_counts", "--count_budget", "0.3", "--min_users", "5")
    got = {line.split("\t")[0]: int(line.split("\t")[1]) for line in lines}
    params = SelectionParams(
        epsilon=2, delta=1e-5, max_contributions=6, release_counts=True, count_budget=0.3, min_users=5
    )
    assert got == reference.select_counts(SETS, "mad2r", params, seed=8) and len(got) > 10
    plan = plan_counts("mad2r", params)
    c = report["counts"]
    assert c["noise"] == "discrete_gaussian" and c["noise_scale"] == plan.noise_scale
    assert c["error_bound_95"] == plan.error_bound_95 and c["noise_std"] == plan.std
    assert c["min_users"] == 5 and c["count_budget"] == 0.3 and report["released"] == len(got)
    assert report["release_counts"] is True  # the params block has every field


def test_release_counts_takes_a_value_and_allowlist_restricts_the_items(tmp_path):
    allow = sorted({i for _, i in PAIRS})[::3]
    path = tmp_path / "allow.txt"
    path.write_text("".join(f"{i}\n" for i in allow) + "\n", encoding="utf-8")  # a trailing empty line
    lines, report = run_select(tmp_path, "--release_counts=true", "--allowlist", str(path))
    got = {line.split("\t")[0]: int(line.split("\t")[1]) for line in lines}
    params = SelectionParams(epsilon=2, delta=1e-5, max_contributions=6, release_counts=True)
    assert got == reference.select_counts(SETS, "mad2r", params, seed=8, allowlist=allow)
    assert set(got) <= set(allow) and got and report["allowlist"] == str(path)
    lines, report = run_select(tmp_path, "--release_counts=false", name="plain")
    assert all("\t" not in line for line in lines) and "counts" not in report


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--release_counts", "--count_budget", "1.5"], "count_budget"),
        (["--release_counts", "--count_budget", "0"], "count_budget"),
        (["--min_users", "3"], "min_users"),
        (["--release_counts", "--min_users", "-2"], "min_users"),
        (["--release_counts=maybe"], "release_counts"),
    ],
)
def test_bad_count_flags_exit_2_naming_the_parameter(tmp_path, capsys, extra, named):
    argv = ["--input", write_tsv(tmp_path), "--input_format", "tsv", "--output", str(tmp_path / "o")]
    argv += ["--report", str(tmp_path / "r.json"), "--epsilon", "1", "--delta", "1e-5", *extra]
    with pytest.raises(SystemExit) as e:
        select_partitions.run(argv)
    assert e.value.code == 2
    assert named in capsys.readouterr().err


def test_extract_ngrams_writes_counts_equal_to_the_reference(tmp_path):
    recs = markov_corpus(400, vocab=25, branching=3, seed=2)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"user": u, "text": "\n".join(t)}) + "\n" for u, t in recs.items()))
    out, report = tmp_path / "o" / "ng", tmp_path / "o" / "r.json"
    argv = ["--input", str(path), "--input_format", "jsonl", "--output", str(out), "--report", str(report)]
    argv += ["--max_n", "2", "--epsilon", "4", "--delta", "1e-6", "--max_contributions", "10", "--eta", "0.2"]
    argv += ["--release_counts", "--min_users", "3", "--seed", "4", "--direct_running_mode", "in_memory"]
    argv += ["--progress_interval", "0"]
    assert extract_ngrams.run(argv) == 0
    params = DPNEParams(epsilon=4, delta=1e-6, max_n=2, max_contributions=10, eta=0.2, release_counts=True, min_users=3)
    want = dpne_reference([(u, "\n".join(t)) for u, t in recs.items()], "dpne", params, seed=4)
    expected = sorted(f"{k}\t{g}\t{c}" for k, per_k in want.counts.items() for g, c in per_k.items())
    assert sorted(read_lines(out)) == expected and len(expected) > 5
    with open(report, encoding="utf-8") as f:
        rep = json.load(f)
    assert rep["counts"]["noise_scale"] == want.count_plan.noise_scale
    assert rep["counts"]["released_with_counts"] == len(expected)
    assert rep["total_delta_bound"] <= 1e-6
