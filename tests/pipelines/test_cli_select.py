"""End-to-end tests of ``python -m dp_partition_beam.pipelines.select_partitions``."""

import glob
import gzip
import json
import os
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dp_partition_beam.pipelines import select_partitions
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference

from tests.support.user_sets import random_user_sets

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SETS = random_user_sets(random.Random(21), 1000, 200, 12)
PAIRS = [(u, i) for u, items in SETS.items() for i in items]


def write_input(tmp_path, fmt, pairs=PAIRS):
    if fmt == "tsv":
        path = tmp_path / "in.tsv"
        path.write_text("user\titem\n" + "".join(f"{u}\t{i}\n" for u, i in pairs), encoding="utf-8")
    elif fmt == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps({"user": u, "item": i}) + "\n" for u, i in pairs), encoding="utf-8")
    else:
        path = tmp_path / "in.parquet"
        pq.write_table(pa.table({"user": [u for u, _ in pairs], "item": [i for _, i in pairs]}), path)
    return str(path)


def run_cli(tmp_path, input_path, fmt, *extra, name="out"):
    out, report = tmp_path / name / "items", tmp_path / name / "report.json"
    argv = [
        "--input",
        input_path,
        "--input_format",
        fmt,
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
    items = [l.rstrip("\n") for p in sorted(glob.glob(str(out) + "*")) for l in open(p, encoding="utf-8")]
    rep = json.loads(report.read_text()) if report.exists() else None
    return code, items, rep


@pytest.mark.parametrize("fmt", ["tsv", "jsonl", "parquet"])
def test_each_input_format_gives_the_reference_output(tmp_path, fmt):
    path = write_input(tmp_path, fmt)
    code, items, rep = run_cli(tmp_path, path, fmt, "--algorithm", "basic", "--seed", "5")
    assert code == 0
    want = reference.select(SETS, "basic", SelectionParams(2.0, 1e-4, max_contributions=8), seed=5)
    assert set(items) == want and len(items) == len(want) > 0
    for key in ("algorithm", "epsilon", "delta", "max_contributions", "released", "rounds"):
        assert key in rep
    assert rep["released"] == len(items) and rep["epsilon"] == 2.0 and rep["delta"] == 1e-4
    (r,) = rep["rounds"]
    assert set(r) >= {"epsilon", "delta", "noise", "noise_scale", "threshold", "released"}
    assert r["noise"] == "gaussian" and r["released"] == len(items)


def test_report_has_one_entry_per_round_for_dp_sips(tmp_path):
    path = write_input(tmp_path, "tsv")
    split = ["--budget_split", "0.05,0.15,0.8", "--seed", "3"]
    for threshold in ("gaussian", None):  # the papers' rounds; the default (the last round a keep table)
        flags = [] if threshold is None else ["--threshold", threshold]
        code, items, rep = run_cli(tmp_path, path, "tsv", "--algorithm", "dp_sips", *split, *flags, name=f"{threshold}")
        assert code == 0
        assert [r["round"] for r in rep["rounds"]] == [1, 2, 3]
        assert sum(r["released"] for r in rep["rounds"]) == rep["released"] == len(items)
        assert rep["accounting"] == "gdp" and rep["budget_split"] == [0.05, 0.15, 0.8]
        deltas = [round(r["delta"], 12) for r in rep["rounds"]]
        if threshold == "gaussian":  # each round's share of the thresholds' delta
            assert deltas == [round(f * 1e-4, 12) for f in (0.05, 0.15, 0.8)]
            assert [r["noise"] for r in rep["rounds"]] == ["gaussian"] * 3
        else:  # the table round takes the rest: its mixture and the conversion's delta
            assert deltas[:2] == [round(f * 1e-4, 12) for f in (0.05, 0.15)] and deltas[2] > 0.8e-4
            assert [r["noise"] for r in rep["rounds"]] == ["gaussian", "gaussian", "keep_table"]


def test_mad_sips_cli_equals_reference_with_one_report_entry_per_round(tmp_path):
    path = write_input(tmp_path, "tsv")
    split = ["--budget_split", "0.2,0.3,0.5", "--d_max", "6"]
    code, items, rep = run_cli(tmp_path, path, "tsv", "--algorithm", "mad_sips", *split, "--seed", "4")
    assert code == 0
    params = SelectionParams(2.0, 1e-4, max_contributions=8, d_max=6, budget_split=(0.2, 0.3, 0.5))
    assert sorted(items) == sorted(reference.select(SETS, "mad_sips", params, seed=4)) and items
    assert [r["round"] for r in rep["rounds"]] == [1, 2, 3]
    # the default: the last round a keep table (docs/mad_sips.md), no noise scale, W50 as its threshold
    assert [r["h"] for r in rep["rounds"]] == ["1/sqrt(t)", "min(2/sqrt(t), 1)", "table"]
    assert [r["noise"] for r in rep["rounds"]] == ["gaussian", "gaussian", "keep_table"]
    assert rep["rounds"][-1]["noise_scale"] is None and rep["rounds"][-1]["keep_table"]["alpha"] > 1
    assert sum(r["released"] for r in rep["rounds"]) == rep["released"] == len(items)


def test_report_contains_no_item(tmp_path):
    path = write_input(tmp_path, "tsv")
    _, items, rep = run_cli(tmp_path, path, "tsv", "--seed", "5")
    text = json.dumps(rep)
    assert items and not any(f'"{i}"' in text for i in items)


def test_bad_record_fails_with_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.tsv"
    path.write_text("user\titem\nu1\ta\nu2 missing tab\nu3\tb\n", encoding="utf-8")
    code, _, _ = run_cli(tmp_path, str(path), "tsv")
    assert code == 3
    err = capsys.readouterr().err
    assert f"{path}:3" in err and "expected user<TAB>value" in err


@pytest.mark.parametrize(
    "content,line",
    [
        ('{"user": "u1", "item": "a"}\nnot json\n', 2),
        ('{"user": "u1", "item": "a"}\n{"user": "u2"}\n', 2),
        ('{"user": null, "item": "a"}\n', 1),
        ('{"user": "u1", "item": "two\\nlines"}\n', 1),
        ("[1, 2]\n", 1),
    ],
)
def test_bad_jsonl_records_are_reported(tmp_path, capsys, content, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    code, _, _ = run_cli(tmp_path, str(path), "jsonl")
    assert code == 3
    assert f"{path}:{line}:" in capsys.readouterr().err


def test_skip_bad_records_counts_them_only_in_non_private_diagnostics(tmp_path, capsys):
    good = "".join(f"{u}\t{i}\n" for u, i in PAIRS)
    path = tmp_path / "mixed.tsv"
    path.write_bytes(("user\titem\n" + good + "no tab here\n\tempty user\nu9\t\n").encode() + b"u1\t\xff\xfe\n")
    diag = tmp_path / "diag.json"
    code, items, rep = run_cli(
        tmp_path, str(path), "tsv", "--skip_bad_records", "--seed", "5", "--diagnostics", str(diag)
    )
    assert code == 0
    assert "--skip_bad_records" in capsys.readouterr().err  # the operator is warned
    assert "diagnostics_non_private" not in rep and "malformed_records" not in json.dumps(rep)
    d = json.loads(diag.read_text())
    assert d["NON_PRIVATE_DIAGNOSTICS"] is True and "not differentially private" in d["warning"]
    assert d["counts"]["malformed_records"] == 4
    assert d["counts"]["records_read"] == len(PAIRS)
    assert d["counts"]["users"] == len(SETS)
    assert d["counts"]["pairs_after_bounding"] == sum(min(len(s), 8) for s in SETS.values())
    # the CLI's default algorithm
    want = reference.select(SETS, "mad_sips", SelectionParams(2.0, 1e-4, max_contributions=8), seed=5)
    assert set(items) == want  # the good records are all used


def test_glob_over_several_gzip_files(tmp_path):
    half = len(PAIRS) // 2
    for k, chunk in enumerate((PAIRS[:half], PAIRS[half:])):
        with gzip.open(tmp_path / f"part-{k}.tsv.gz", "wt", encoding="utf-8") as f:
            f.writelines(f"{u}\t{i}\n" for u, i in chunk)
    code, items, _ = run_cli(tmp_path, str(tmp_path / "part-*.tsv.gz"), "tsv", "--seed", "5")
    assert code == 0
    assert set(items) == reference.select(SETS, "mad_sips", SelectionParams(2.0, 1e-4, max_contributions=8), seed=5)


def test_missing_input_fails(tmp_path, capsys):
    code, _, _ = run_cli(tmp_path, str(tmp_path / "nothing-*.tsv"), "tsv")
    assert code == 3
    assert "nothing-*.tsv" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm", ["policy_gaussian", "policy_laplace"])
def test_join_options_change_cost_not_output(tmp_path, algorithm):
    """--max_broadcast_items 0 (always the sharded join, 3 users per key) releases exactly what the
    default side-input mode releases under the same seed, and the reference. The joins they tune are
    the sequential policies' count release: the only place they are used (elsewhere they are an error)."""
    path = write_input(tmp_path, "tsv")
    runs = [
        run_cli(tmp_path, path, "tsv", "--algorithm", algorithm, "--release_counts", "--seed", "9", *extra, name=str(k))
        for k, extra in enumerate([[], ["--max_broadcast_items", "0", "--max_users_per_key", "3"]])
    ]
    params = SelectionParams(2.0, 1e-4, max_contributions=8, release_counts=True)
    want = reference.select_counts(SETS, algorithm, params, seed=9)
    assert runs[0][0] == runs[1][0] == 0
    want_lines = sorted(f"{item}\t{count}" for item, count in want.items())
    assert sorted(runs[0][1]) == sorted(runs[1][1]) == want_lines and want


@pytest.mark.parametrize(
    "flag,value,name",
    [
        ("--epsilon", "-1", "epsilon"),
        ("--delta", "1.5", "delta"),
        ("--max_contributions", "0", "max_contributions"),
        ("--d_max", "3", "d_max"),
        ("--b_min", "0.4", "b_min"),
        ("--b_max", "0.9", "b_max"),
        ("--budget_split", "0.5,0.6", "budget_split"),
        ("--max_broadcast_items", "-1", "max_broadcast_items"),
        ("--max_users_per_key", "0", "max_users_per_key"),
    ],
)
def test_bad_parameters_exit_2_naming_the_parameter(tmp_path, capsys, flag, value, name):
    path = write_input(tmp_path, "tsv")
    # each flag with an algorithm that reads it (the join options: the sequential policies' counts)
    algorithm = {"--max_broadcast_items": "policy_gaussian", "--max_users_per_key": "policy_gaussian"}.get(flag)
    extra = ["--algorithm", algorithm, "--release_counts"] if algorithm else []
    with pytest.raises(SystemExit) as exc:
        run_cli(tmp_path, path, "tsv", flag, value, *extra)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert name in err and value.split(",")[0] in err


def test_cli_subprocess_same_items_in_memory_and_multi_processing(tmp_path):
    """The issue's acceptance command, seeded, on both DirectRunner modes (separate processes)."""
    path = write_input(tmp_path, "tsv")
    results = []
    for mode in ("in_memory", "multi_processing"):
        out = tmp_path / mode
        cmd = [
            sys.executable,
            "-m",
            "dp_partition_beam.pipelines.select_partitions",
            "--input",
            path,
            "--input_format",
            "tsv",
            "--output",
            str(out / "items"),
            "--report",
            str(out / "report.json"),
            "--algorithm",
            "basic",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--max_contributions",
            "100",
            "--seed",
            "42",
            "--direct_running_mode",
            mode,
            "--direct_num_workers",
            "2",
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "released" in proc.stdout
        items = sorted(l.rstrip("\n") for p in glob.glob(str(out / "items*")) for l in open(p))
        results.append(items)
    assert results[0] == results[1] and results[0]
    assert set(results[0]) <= {i for _, i in PAIRS}
