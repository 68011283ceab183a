"""Running a pipeline: Beam options, the local DirectRunner without its Prism detour, the wait policy.

No argument parsing and no output handling here (:mod:`pipelines.cli`, :mod:`pipelines.outputs`), so
both the CLIs and :mod:`pipelines.reporting` import this module without an import cycle.
"""

from __future__ import annotations

import os
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.runners.direct.direct_runner import DirectRunner

# Set by the Dataflow Flex Template launcher image (templates/Dockerfile): the launcher must submit
# the job and return, never wait for it (the launch would time out).
FLEX_TEMPLATE_ENV = "FLEX_TEMPLATE_PYTHON_PY_FILE"


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the arguments our parser did not consume (--runner, Dataflow/Flink options...)."""
    options = PipelineOptions(list(beam_args))
    # DoFns live in the installed package; nothing from __main__ needs pickling.
    options.view_as(SetupOptions).save_main_session = False
    # No construction-time type inference: our transforms declare no type hints, so Beam's check has nothing
    # to check, and inferring every step's output type from its function's bytecode took about half of the
    # graph's construction (DPNE with MAD-SIPS's levels: ~20 s of ~40 s beside other jobs; docs/columnar.md).
    # Every PCollection is then Any (Beam's FastPrimitivesCoder, deterministic for grouping keys).
    options.view_as(TypeOptions).pipeline_type_check = False
    return options


class LocalDirectRunner(DirectRunner):
    """Beam's DirectRunner without its Prism detour.

    Beam 2.5x+'s DirectRunner first tries the Prism runner (downloading its binary from GitHub)
    whenever a pipeline is Prism-compatible, ignoring ``--direct_running_mode``; offline it falls
    back after a failed download, online it silently runs on a different runner than the mode
    asked for. ``DirectRunner.run_pipeline`` skips Prism for interactive pipelines, and that flag
    (``_is_interactive``) is used for nothing else in ``direct_runner.py``, so setting it pins the
    FnApiRunner / BundleBasedDirectRunner path the user asked for with ``--direct_running_mode``.
    """

    _is_interactive = True


def make_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """A Pipeline for ``options``; an explicit ``--direct_running_mode`` with the DirectRunner (or no
    runner) pins :class:`LocalDirectRunner`, so the mode given is the mode that runs."""
    runner = options.view_as(StandardOptions).runner
    flags = getattr(options, "_flags", None) or []  # the raw arguments (an explicit in_memory equals the default)
    mode_given = any(
        str(f).startswith("--direct_running_mode") for f in flags
    ) or "direct_running_mode" in options.get_all_options(drop_default=True)
    if mode_given and runner in (None, "DirectRunner", "direct", "Direct"):
        return beam.Pipeline(runner=LocalDirectRunner(), options=options)
    return beam.Pipeline(options=options)


def run(pipeline: beam.Pipeline):
    """``pipeline.run()``; on :class:`LocalDirectRunner` in batch without Beam's runner-API round trip.

    ``Pipeline.run`` first converts a pipeline to its portable form and back (a test of the conversion,
    about 1-2 s for the ~500 transforms of MAD-SIPS) unless the runner is Fn API compatible; it skips it for
    Beam's own DirectRunner in batch by that runner's class name, which our subclass does not carry. The
    FnApiRunner then converts the pipeline itself, as every other runner does.
    """
    if isinstance(pipeline.runner, LocalDirectRunner) and not pipeline.options.view_as(StandardOptions).streaming:
        return pipeline.run(test_runner_api=False)
    return pipeline.run()


def should_wait(options: PipelineOptions, args) -> bool:
    """Whether the launcher waits for the job to finish.

    Not on a Dataflow Flex Template launch (the launcher image sets ``FLEX_TEMPLATE_PYTHON_PY_FILE``;
    the launcher only builds and submits the job, and a blocking main makes the launch time out),
    not when a classic template is being created (``--template_location``: nothing runs), and not
    with ``--no_wait``. Otherwise (local runs, direct Dataflow/Flink submissions) it waits, so the
    report can be read and summarized.
    """
    if getattr(args, "no_wait", False) or os.environ.get(FLEX_TEMPLATE_ENV):
        return False
    return not options.view_as(GoogleCloudOptions).template_location
