"""``--profile PATH`` (issue 31): the NON-PRIVATE timing of a run, written after it like the other outputs.

The CLI runs are in-process (``select_partitions.run``) on a small TSV with the in-memory DirectRunner, the
FnApiRunner, which reports Beam's per-transform execution-time counters; the grouping is checked on
fabricated counters as well.
"""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
from apache_beam.metrics.execution import MetricKey, MetricResult
from apache_beam.metrics.metricbase import MetricName

from dp_partition_beam.pipelines import cli, profiling, select_partitions

from tests.support.files import snapshot

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROUND_GROUP = r"^Select/[A-Z_]+/\*1\*$"  # round 1 of the selection (its numbered steps: Sets1, Status1, ...)


def write_input(path):
    """200 users holding a..e (released under epsilon 4) and one item of their own each (never)."""
    lines = [f"u{j}\t{i}\n" for j in range(200) for i in ("a", "b", "c", "d", "e")]
    lines += [f"u{j}\tcanary{j}\n" for j in range(200)]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def argv(tmp, out, *extra):
    flags = {
        "--input": tmp / "in.tsv",
        "--input_format": "tsv",
        "--output": out / "items",
        "--report": out / "report.json",
        "--epsilon": 4,
        "--delta": "1e-5",
        "--max_contributions": 4,
        "--seed": 3,
        "--direct_running_mode": "in_memory",
        "--progress_interval": 0,
    }
    return [str(x) for flag_value in flags.items() for x in flag_value] + list(extra)


def run(args):
    """The exit code of the CLI run in this process (SystemExit for command-line and contract errors)."""
    try:
        return select_partitions.run(args)
    except SystemExit as e:
        return e.code


def release(out):
    """The released lines, and the report without its paths (the shards' digests and sizes kept)."""
    lines = sorted(l for p in glob.glob(str(out / "items-?????-of-?????")) for l in open(p, encoding="utf-8"))
    report = json.loads((out / "report.json").read_text())
    shards = [(s["bytes"], s["sha256"]) for s in report.pop("outputs")["shards"]]
    return lines, report, shards


def times(value, key=""):
    """Every number in the profile that is a time (keys ``*_s``, ``seconds``), with its key."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from times(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from times(v, key)
    elif (key.endswith("_s") or key == "seconds") and value is not None:
        yield key, value


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One profiled run of the default algorithm: (tmp dir, out dir, profile dict)."""
    tmp = tmp_path_factory.mktemp("profiled")
    write_input(tmp / "in.tsv")
    out = tmp / "out"
    assert run(argv(tmp, out, "--profile", str(out / "profile.json"))) == 0
    return tmp, out, json.loads((out / "profile.json").read_text())


# --- a profiled run ---------------------------------------------------------------------------------------


def test_profile_has_the_times_labelled_non_private(profiled):
    _, _, p = profiled
    for key in ("startup", "run_s", "submit_s", "after_run_s", "total_wall_s", "stages", "stages_total_s"):
        assert key in p, key
    for key in ("runner_overhead_s", "runner_overhead_note", "transforms", "notes", "grouping", "runner"):
        assert key in p, key
    assert p["NON_PRIVATE_TIMING"] is True and "NON-PRIVATE" in p["warning"] and "never publish" in p["warning"]
    assert p["command"] == "dp-select-partitions" and p["waited"] is True and p["result"] == "RunnerResult"
    assert p["runner"].startswith("LocalDirectRunner (in_memory")
    st = p["startup"]
    assert st["parse_validate_build_s"] > 0 and st["prepare_outputs_s"] >= 0
    assert st["process_start_to_cli_s"] is not None and st["process_start_to_cli_s"] > 0  # Linux: /proc
    text = json.dumps(p)
    assert "canary" not in text and not re.search(r"\bu\d+\b", text)  # times and step names: no item, no user
    found = list(times(p))
    assert len(found) > 20 and all(v >= 0 for _, v in found), [kv for kv in found if kv[1] < 0]
    # the phases fit in the total
    assert p["run_s"] > 0 and p["submit_s"] <= p["run_s"] + 1e-3
    parts = st["parse_validate_build_s"] + st["prepare_outputs_s"] + p["run_s"] + p["after_run_s"]
    assert parts <= p["total_wall_s"] + 0.01


def test_stage_groups_cover_read_selection_rounds_and_writes(profiled):
    _, _, p = profiled
    groups = [s["group"] for s in p["stages"]]
    assert any(g.startswith("Read/") for g in groups), groups
    assert any(g.startswith("Select/") for g in groups), groups
    assert any(re.match(ROUND_GROUP, g) for g in groups), groups  # rounds are rows of their own
    assert any(g.startswith("WriteItems/") for g in groups) and any(g.startswith("WriteReport/") for g in groups)
    assert 5 <= len(groups) < len(p["transforms"]), len(groups)
    seconds = [s["seconds"] for s in p["stages"]]
    assert seconds == sorted(seconds, reverse=True) and sum(seconds) > 0
    assert [t["seconds"] for t in p["transforms"]] == sorted((t["seconds"] for t in p["transforms"]), reverse=True)
    # the groups partition the transforms
    assert sum(s["transforms"] for s in p["stages"]) == len(p["transforms"])
    assert abs(sum(t["seconds"] for t in p["transforms"]) - p["stages_total_s"]) < 1e-6 * len(p["transforms"]) + 1e-3
    for s in p["stages"]:
        members = [t for t in p["transforms"] if profiling.stage_group(t["step"]) == s["group"]]
        assert len(members) == s["transforms"] and abs(sum(t["seconds"] for t in members) - s["seconds"]) < 2e-3


def test_stage_times_fit_in_the_run_on_one_in_memory_worker(profiled):
    _, _, p = profiled
    assert p["stages_total_s"] <= p["run_s"] + 0.01  # one worker, bundles one after the other
    assert abs(p["runner_overhead_s"] - (p["run_s"] - p["stages_total_s"])) < 2e-3
    for s in p["stages"]:
        assert s["share_of_run"] == pytest.approx(s["seconds"] / p["run_s"], abs=1e-4)
    assert not any("exceeds" in n or "parallel" in n for n in p["notes"]), p["notes"]


def test_the_table_lists_the_top_groups_the_rest_and_the_overhead(profiled):
    _, _, p = profiled
    table = profiling.format_table(p)
    assert table.startswith("profile (NON-PRIVATE timing") and "stage group" in table
    top = p["stages"][0]
    assert f"  {top['group']} " in table and f"{top['seconds']:.3f}" in table
    rows = [l for l in table.splitlines() if l.strip().endswith("%")]
    shown = [s for s in p["stages"] if s["seconds"] > 0][: profiling.TABLE_ROWS]
    assert [r.split()[0] for r in rows[: len(shown)]] == [s["group"].split()[0] for s in shown]
    rest = len(p["stages"]) - len(shown)
    assert f"({rest} more groups)" in rows[len(shown)] if rest else len(rows) == len(shown) + 1
    assert rows[-1].strip().startswith(profiling.OVERHEAD_LABEL) and f"{p['runner_overhead_s']:.3f}" in rows[-1]


def test_profile_does_not_change_the_release(profiled, tmp_path):
    tmp, out, _ = profiled
    plain = tmp_path / "plain"
    assert run(argv(tmp, plain)) == 0
    lines, report, shards = release(out)
    assert lines and (lines, report, shards) == release(plain)
    assert not os.path.exists(plain / "profile.json")


# --- the output contract ----------------------------------------------------------------------------------


def test_an_existing_profile_stops_the_run_unless_overwrite(tmp_path, capsys):
    write_input(tmp_path / "in.tsv")
    out = tmp_path / "out"
    out.mkdir()
    (out / "profile.json").write_text("an earlier profile")
    before = snapshot(tmp_path)
    assert run(argv(tmp_path, out, "--profile", str(out / "profile.json"))) == 2
    err = capsys.readouterr().err
    assert "output files of an earlier run are in the way" in err and str(out / "profile.json") in err
    assert snapshot(tmp_path) == before  # nothing written, nothing deleted
    assert run(argv(tmp_path, out, "--profile", str(out / "profile.json"), "--overwrite")) == 0
    err = capsys.readouterr().err
    assert "--overwrite: removed 1 file(s)" in err
    p = json.loads((out / "profile.json").read_text())
    assert p["NON_PRIVATE_TIMING"] is True and p["stages"]
    # the table of the profile written, last on stderr, then where the file is
    assert err.endswith(
        profiling.format_table(p) + f"\nNON-PRIVATE timing profile (keep with the operator): {out / 'profile.json'}\n"
    ), err[-3000:]


@pytest.mark.parametrize(
    "where,fragment",
    [
        ("report", "name the same file"),
        ("dir", "is an existing directory"),
        ("shard", "is named like a shard of the release"),
        ("input", "is an input"),
    ],
)
def test_profile_path_is_checked_like_the_other_outputs(tmp_path, capsys, where, fragment):
    write_input(tmp_path / "in.tsv")
    out = tmp_path / "out"
    (out / "adir").mkdir(parents=True)
    path = {
        "report": out / "report.json",
        "dir": out / "adir",
        "shard": out / "items-00000-of-00001",
        "input": tmp_path / "in.tsv",
    }[where]
    before = snapshot(tmp_path)
    assert run(argv(tmp_path, out, "--profile", str(path))) == 2
    assert fragment in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_a_failed_run_leaves_no_profile(tmp_path, capsys):
    (tmp_path / "in.tsv").write_text("u1\ta\nno tab here\n", encoding="utf-8")
    out = tmp_path / "out"
    assert run(argv(tmp_path, out, "--profile", str(out / "profile.json"))) == 3
    assert "bad input record" in capsys.readouterr().err
    assert not os.path.exists(out / "profile.json") and not glob.glob(str(out / "*"))


def test_a_run_not_waited_for_has_no_stages_and_says_why(tmp_path, capsys):
    write_input(tmp_path / "in.tsv")
    out = tmp_path / "out"
    assert run(argv(tmp_path, out, "--profile", str(out / "profile.json"), "--no_wait")) == 0
    p = json.loads((out / "profile.json").read_text())
    assert p["waited"] is False and p["stages"] == [] and p["transforms"] == [] and p["run_s"] is None
    assert any("not waited for" in n for n in p["notes"]), p["notes"]
    assert p["NON_PRIVATE_TIMING"] is True and p["startup"]["parse_validate_build_s"] > 0
    assert "no stage times: the run was not waited for" in capsys.readouterr().err


# --- units ------------------------------------------------------------------------------------------------


def counter(step, ms, name=profiling.EXECUTION_TIME, namespace="beam", committed=True):
    key = MetricKey(step, MetricName(namespace, name))
    return MetricResult(key, ms if committed else None, ms)


class FakeResult:
    def __init__(self, counters):
        self._counters = counters

    def monitoring_metrics(self):
        counters = self._counters

        class Metrics:
            def query(self):
                return {"counters": counters, "distributions": [], "gauges": []}

        return Metrics()


def test_stage_group_cuts_at_the_depth_and_after_numbered_steps():
    g = profiling.stage_group
    assert g("Select/MAD_SIPS/Users/ShardUsers") == "Select/MAD_SIPS/Users"
    assert g("Select/MAD_SIPS/Sets2Group/Read") == "Select/MAD_SIPS/*2*"
    assert g("Select/MAD_SIPS/MADWeights2/Contrib") == "Select/MAD_SIPS/*2*"
    assert g("Select/MAD_SIPS/Checkpoint12Pack") == "Select/MAD_SIPS/*12*"
    assert g("Select/MAD_SIPS/Cap/ChooseCap") == "Select/MAD_SIPS/Cap"
    assert g("DPNE/L3/Run") == "DPNE/*3*"
    assert g("Round1/X") == "Round1/X"  # a numbered top-level step is its own name
    assert g("ShardsSeed/FlatMap(<lambda at core.py:4094>)") == "ShardsSeed/FlatMap(<lambda at core.py:4094>)"
    assert g("Select/MAD_SIPS/AllRounds/Write/0") == "Select/MAD_SIPS/AllRounds"
    assert g("ref_PCollection_PCollection_50/Write") == profiling.BETWEEN_STAGES
    assert g("Select/MAD_SIPS/Users/ShardUsers", depth=2) == "Select/MAD_SIPS"
    assert g("Select/MAD_SIPS/Sets2Group/Read", depth=2) == "Select/MAD_SIPS"
    assert g("Select/MAD_SIPS/Sets2Group/Read", depth=1) == "Select"
    assert g("Read/Parse/ParDo(_ReadPiecesFn)", depth=5) == "Read/Parse/ParDo(_ReadPiecesFn)"


def test_counters_are_read_summed_grouped_and_sorted():
    result = FakeResult(
        [
            counter("Read/Parse/ParDo(_ReadPiecesFn)", 400),
            counter("Select/ALG/Sets1/ParDo", 250),
            counter("Select/ALG/Status1", 150),
            counter("Select/ALG/Sets1/ParDo", 50),  # the same step again (another worker): summed
            counter("Select/ALG/Users/Pack", 300, committed=False),  # no committed value: the attempted one
            counter("WriteItems/Write/WriteImpl/FinalizeWrite", 0),
            counter("Select/ALG/Status1", 999, name="metric:pardo_execution_time:process_bundle_msecs:v1"),
            counter("Select/ALG/Status1", 999, namespace="diagnostics_non_private"),
        ]
    )
    msecs, why = profiling.transform_msecs(result)
    assert why is None
    assert msecs == {
        "Read/Parse/ParDo(_ReadPiecesFn)": 400,
        "Select/ALG/Sets1/ParDo": 300,
        "Select/ALG/Status1": 150,
        "Select/ALG/Users/Pack": 300,
        "WriteItems/Write/WriteImpl/FinalizeWrite": 0,
    }
    part = profiling.group_stages(msecs, run_s=2.0)
    assert [(s["group"], s["seconds"], s["transforms"]) for s in part["stages"]] == [
        ("Select/ALG/*1*", 0.45, 2),
        ("Read/Parse/ParDo(_ReadPiecesFn)", 0.4, 1),
        ("Select/ALG/Users", 0.3, 1),
        ("WriteItems/Write/WriteImpl", 0.0, 1),
    ]
    assert [s["share_of_run"] for s in part["stages"]] == [0.225, 0.2, 0.15, 0.0]
    assert part["transforms"][0] == {"step": "Read/Parse/ParDo(_ReadPiecesFn)", "seconds": 0.4}
    assert [t["step"] for t in part["transforms"][1:3]] == ["Select/ALG/Sets1/ParDo", "Select/ALG/Users/Pack"]
    assert part["stages_total_s"] == 1.15 and part["runner_overhead_s"] == 0.85
    assert [s["group"] for s in profiling.group_stages(msecs, 2.0, depth=1)["stages"]] == [
        "Select",
        "Read",
        "WriteItems",
    ]


def test_overhead_is_clamped_and_explained_when_workers_overlap():
    part = profiling.group_stages({"A/x": 3000, "B/y": 2000}, run_s=4.0)
    assert part["stages_total_s"] == 5.0 and part["runner_overhead_s"] == 0.0
    assert any("exceeds the run's wall" in n and "parallel workers" in n for n in part["notes"]), part["notes"]
    part = profiling.group_stages({"A/x": 1000}, run_s=4.0)
    assert part["runner_overhead_s"] == 3.0 and not any("exceeds" in n for n in part["notes"])


def test_a_runner_without_counters_gives_empty_stages_and_a_note():
    class NoMetrics:
        pass

    clock = profiling.RunClock()
    for mark in ("built", "prepared", "submitted", "finished", "end"):
        clock.mark(mark)

    class UserMetricsOnly:  # a portable runner's result: metrics(), no monitoring_metrics()
        def metrics(self):
            return FakeResult([counter("A/x", 5, namespace="user", name="n")]).monitoring_metrics()

    class Failing:
        def monitoring_metrics(self):
            raise RuntimeError("job service gone")

    for result, fragment in [
        (NoMetrics(), "(NoMetrics) has no metrics"),
        (FakeResult([counter("A/x", 5, name="other")]), "monitoring metrics (FakeResult) hold no"),
        (UserMetricsOnly(), "metrics (UserMetricsOnly) hold no"),
        (Failing(), "monitoring metrics could not be read (RuntimeError)"),
    ]:
        p = profiling.build_profile(clock, "cmd", result, True, "SomeRunner", True)
        assert p["stages"] == [] and p["transforms"] == [] and p["runner_overhead_s"] is None
        assert p["NON_PRIVATE_TIMING"] is True and p["run_s"] is not None
        assert any(fragment in n for n in p["notes"]), p["notes"]
        assert "no stage times" in profiling.format_table(p)
    p = profiling.build_profile(clock, "cmd", FakeResult([counter("A/x", 5)]), True, "SomeRunner", True)
    assert p["stages"][0]["group"] == "A/x" and any("summed worker time" in n for n in p["notes"])

    class PortableLike:  # the counters in metrics(): read from there
        def metrics(self):
            return FakeResult([counter("A/x", 7), counter("B/y", 3, namespace="user", name="n")]).monitoring_metrics()

    assert profiling.transform_msecs(PortableLike()) == ({"A/x": 7}, None)


def test_a_profile_that_cannot_be_written_only_warns(tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    clock = profiling.RunClock()
    clock.mark("built")
    cli.write_profile(str(blocker / "profile.json"), clock, "cmd", object(), None, None, False)
    err = capsys.readouterr().err
    assert err.startswith("warning: --profile: no profile written to ") and err.count("\n") == 1, err
    assert blocker.read_text() == "x" and os.listdir(tmp_path) == ["afile"]


def test_process_age_counts_from_the_process_start():
    code = "\n".join(
        [
            "import time",
            "time.sleep(0.5)",
            "from dp_partition_beam.pipelines import profiling",
            "print(profiling.process_age_s())",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    age = float(out.stdout.strip())
    assert 0.5 <= age < 120  # the sleep and the import are in it
