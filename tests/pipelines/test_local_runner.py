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
