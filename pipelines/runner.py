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
from apache_beam.runners.worker import bundle_processor

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


def release_output_buffers() -> bool:
    """Make the Beam SDK harness of this process free a step's output buffer when the step's bundle ends.

    Each output of a fused stage is encoded into an output stream (``DataOutputOperation.output_stream``)
    that flushes every ~10 MB but keeps its buffer's capacity (up to ~2x that); the operation keeps its last
    stream after ``finish`` and Beam caches the finished bundle processor, so every stage that ran kept up to
    ~20 MB per output until the end of the run. The in-memory DirectRunner runs the harness in the launching
    process: MAD-SIPS's ~50 stages on the 4M-pair Zipf TSV held ~330 MB this way, 40% of its peak resident
    memory (docs/columnar.md, "Memory"). After this, ``finish`` drops the closed stream (the next bundle sets
    a new one before it emits anything); what is emitted and when is unchanged.

    Affects bundle processors in this process only (the in-memory DirectRunner; not the SDK workers of
    multi_processing, Flink, Spark or Dataflow). Idempotent; returns whether the change is in place (False
    if this Beam's ``DataOutputOperation`` has not the shape it was written for, left as it is).
    """
    op = getattr(bundle_processor, "DataOutputOperation", None)
    finish = getattr(op, "finish", None)
    if finish is None or not hasattr(op, "set_output_stream"):
        return False
    if getattr(finish, "_releases_output_stream", False):
        return True

    def finish_and_release(self):
        finish(self)  # closes the stream: its bytes go to the runner
        self.output_stream = None  # and its buffer is freed with it

    finish_and_release._releases_output_stream = True
    finish_and_release.__doc__ = finish.__doc__
    op.finish = finish_and_release
    return True


def run(pipeline: beam.Pipeline):
    """``pipeline.run()``; on :class:`LocalDirectRunner` in batch without Beam's runner-API round trip.

    ``Pipeline.run`` first converts a pipeline to its portable form and back (a test of the conversion,
    about 1-2 s for the ~500 transforms of MAD-SIPS) unless the runner is Fn API compatible; it skips it for
    Beam's own DirectRunner in batch by that runner's class name, which our subclass does not carry. The
    FnApiRunner then converts the pipeline itself, as every other runner does. Every step of an in-process
    run frees its output buffer when its bundle ends (:func:`release_output_buffers`).
    """
    release_output_buffers()
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
