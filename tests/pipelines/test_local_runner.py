"""An explicit --direct_running_mode pins the local runner: no Prism download, the mode asked for runs."""

import logging

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import runner


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--direct_running_mode", "in_memory"], "LocalDirectRunner"),
        (["--runner", "DirectRunner", "--direct_running_mode=multi_processing"], "LocalDirectRunner"),
        (
            ["--runner", "PortableRunner", "--job_endpoint", "localhost:1", "--direct_running_mode", "in_memory"],
            "PortableRunner",
        ),
    ],
)
def test_make_pipeline_pins_the_local_runner_only_for_an_explicit_direct_mode(args, expected):
    pipeline = runner.make_pipeline(runner.pipeline_options(args))
    assert type(pipeline.runner).__name__ == expected


def test_pinned_runner_never_tries_prism(caplog):
    # A Prism-compatible pipeline: Beam's plain DirectRunner would log "Running pipeline with
    # PrismRunner" and try to download it here.
    caplog.set_level(logging.INFO, logger="apache_beam")
    with runner.make_pipeline(runner.pipeline_options(["--direct_running_mode", "in_memory"])) as p:
        _ = p | beam.Create([1, 2, 3]) | beam.Map(str)
    assert not [r for r in caplog.records if "Prism" in r.getMessage()]


def _count_round_trips(monkeypatch):
    calls = []
    real = beam.Pipeline.from_runner_api

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(beam.Pipeline, "from_runner_api", staticmethod(counting))
    return calls


def test_run_skips_the_runner_api_round_trip_on_the_pinned_runner(monkeypatch, tmp_path):
    """Beam's own DirectRunner skips Pipeline.run's round trip through the portable form in batch (by its
    class name); runner.run does the same for LocalDirectRunner, with the same output."""
    calls = _count_round_trips(monkeypatch)
    outputs = []
    for run in (runner.run, beam.Pipeline.run):
        p = runner.make_pipeline(runner.pipeline_options(["--direct_running_mode", "in_memory"]))
        out = tmp_path / f"out{len(outputs)}"
        _ = (
            p
            | beam.Create(["a", "b", "b"])
            | beam.combiners.Count.PerElement()
            | beam.MapTuple(lambda k, n: f"{k}:{n}")
            | beam.io.WriteToText(str(out), shard_name_template="")
        )
        run(p).wait_until_finish()
        outputs.append(sorted(out.read_text().split()))
        if run is runner.run:
            assert calls == []  # no round trip
    assert calls == [1]  # Pipeline.run makes one on our subclass: what runner.run saves
    assert outputs[0] == outputs[1] == ["a:1", "b:2"]


def test_run_keeps_the_round_trip_for_other_runners(monkeypatch):
    """Another runner (here Beam's BundleBasedDirectRunner, not Fn API compatible) keeps Beam's default."""
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    calls = _count_round_trips(monkeypatch)
    p = beam.Pipeline(runner=BundleBasedDirectRunner(), options=runner.pipeline_options([]))
    _ = p | beam.Create([1, 2]) | beam.Map(str)
    runner.run(p).wait_until_finish()
    assert calls == [1]
