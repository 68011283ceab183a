"""Progress display, stage logs, opt-in NON-PRIVATE diagnostics, plots and offline evaluation."""

import io
import json
import logging
import os
import re

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import observability, reporting, runner

from tests.support.pipeline_cases import IDS, PIPELINES, cli_args, cut_sample, released_lines


def _build(spec, argv):
    m = spec.module()
    args, beam_args = m.build_parser().parse_known_args(argv)
    p = beam.Pipeline(options=runner.pipeline_options(beam_args))
    m.build_pipeline(p, args, m.params_from_args(args))
    return p


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_default_run_exposes_no_data_dependent_counts(spec, tmp_path, caplog):
    """No Beam counter, no count in the progress display, INFO logs name stages only."""
    path = cut_sample(spec, tmp_path)
    argv = cli_args(spec, path, str(tmp_path / "out"), "--runner", "DirectRunner", "--direct_running_mode", "in_memory")
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="dp_partition_beam.pipelines.observability"):
        with observability.ProgressDisplay(0.05, show_counts=False, stream=stream):
            result = _build(spec, argv).run()
            result.wait_until_finish()
    counters = result.metrics().query()["counters"]
    assert counters == [], [str(c.key.metric) for c in counters]
    lines = stream.getvalue().splitlines()
    assert lines and all(
        re.fullmatch(r"\[progress\] +[0-9.]+s elapsed( \(finished\))?; stages started: [A-Za-z, -]+", l) for l in lines
    ), lines
    assert "Read" in lines[-1] and "finished" in lines[-1]
    messages = [r.getMessage() for r in caplog.records if r.name == "dp_partition_beam.pipelines.observability"]
    assert "stage Read running" in messages
    assert all(re.fullmatch(r"stage [A-Za-z]+ running", m) for m in messages), messages


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_diagnostics_are_opt_in_labelled_and_exact(spec, tmp_path):
    path = cut_sample(spec, tmp_path)
    diag = tmp_path / "diag.json"
    argv = cli_args(
        spec,
        path,
        str(tmp_path / "out"),
        "--runner",
        "DirectRunner",
        "--direct_running_mode",
        "in_memory",
        "--diagnostics",
        str(diag),
    )
    result = _build(spec, argv).run()
    result.wait_until_finish()
    d = json.loads(diag.read_text())
    assert d["NON_PRIVATE_DIAGNOSTICS"] is True and "NON-PRIVATE" in d["warning"]
    records = [l.rstrip("\n") for l in open(path, encoding="utf-8") if l.strip()]
    header = 1 if spec.input_format == "tsv" and records[0].startswith("user\t") else 0
    assert d["counts"]["records_read"] == len(records) - header
    assert d["counts"]["malformed_records"] == 0
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}
    assert all(c.key.metric.namespace == observability.NAMESPACE for c in result.metrics().query()["counters"])
    assert counters["records_read"] == d["counts"]["records_read"]
    assert counters["users"] == d["counts"]["users"] > 0
    assert counters["Read_elements"] == d["counts"]["records_read"]


def test_progress_line_shows_counts_only_when_asked():
    progress = {"Read": {"started": 1.0, "elements": 1234}, "Select": {"started": 2.0, "elements": 7}}
    assert "1234" not in observability.progress_line(3.0, False, progress)
    assert "Read, Select" in observability.progress_line(3.0, False, progress)
    assert "Read (1234 elements), Select (7 elements)" in observability.progress_line(3.0, True, progress)


def test_frequency_bins_are_powers_of_two():
    assert [reporting.frequency_bin(u) for u in (1, 2, 3, 4, 7, 8, 1000)] == [
        (1, 1),
        (2, 3),
        (2, 3),
        (4, 7),
        (4, 7),
        (8, 15),
        (512, 1023),
    ]


EVALUATED = [s for s in PIPELINES if s.module().EVALUATION is not None]
EVALUATED_JSONL_LINES = 200


@pytest.mark.parametrize("spec", EVALUATED, ids=[s.name for s in EVALUATED])
def test_plots_and_non_private_evaluation(spec, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    path = cut_sample(spec, tmp_path)
    if spec.input_format == "jsonl":
        # 200 of the cut's 600 users: the evaluation is a second Beam pipeline over every n-gram of the
        # texts, ~2/3 of this test's CPU on 600; on 200 the sample run still releases n-grams (asserted
        # below) and the plots keep their size
        with open(path, encoding="utf-8") as f:
            head = f.readlines()[:EVALUATED_JSONL_LINES]
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(head)
    out = str(tmp_path / "out")
    plots = tmp_path / "plots"
    argv = cli_args(
        spec,
        path,
        out,
        "--runner",
        "DirectRunner",
        "--direct_running_mode",
        "in_memory",
        "--plots",
        str(plots),
        "--evaluate_against",
        path,
        "--progress_interval",
        "0",
    )
    assert spec.module().run(argv) == 0
    for png in ("released.png", "coverage.png"):
        data = (plots / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    ev = json.loads(open(os.path.join(out, "report.json.evaluation.json")).read())
    assert ev["NON_PRIVATE_EVALUATION"] is True
    released = released_lines(out)
    assert released, "a run that releases nothing would make the bins' check vacuous"
    # Every released line is either counted in a frequency bin or reported as absent from the data.
    assert sum(b["released"] for b in ev["bins"]) + sum(ev["released_not_in_true_data"].values()) == len(released)
    for b in ev["bins"]:
        assert b["min_users"] <= b["max_users"] and 0 <= b["released"] <= b["items"]
        assert b["coverage"] == pytest.approx(b["released"] / b["items"])
    report = json.loads(open(os.path.join(out, "report.json")).read())
    assert sum(reporting.released_series(report)[2]) == report["released"] == len(released)


def test_evaluate_against_is_refused_up_front_where_undefined(tmp_path, capsys):
    for spec in PIPELINES:
        if spec.module().EVALUATION is not None:
            continue
        argv = cli_args(spec, str(tmp_path / "none.jsonl"), str(tmp_path / "out"), "--evaluate_against", "x")
        with pytest.raises(SystemExit) as e:
            spec.module().run(argv)
        assert e.value.code == 2 and "--evaluate_against" in capsys.readouterr().err
