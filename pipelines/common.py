"""Shared pipeline plumbing: Beam options pass-through, run-time reports, small I/O helpers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Dict, List, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, SetupOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import DirectRunner

from pipelines import observability
from pipelines.io import DEFAULT_MAX_ITEM_LENGTH, DEFAULT_MAX_TEXT_LENGTH, INPUT_FORMATS

_LOG = logging.getLogger(__name__)

# The PipelineResult of the most recent run_main in this process (tests read its Beam metrics).
last_result = None

# Set by the Dataflow Flex Template launcher image (templates/Dockerfile): the launcher must submit
# the job and return, never wait for it (the launch would time out).
FLEX_TEMPLATE_ENV = "FLEX_TEMPLATE_PYTHON_PY_FILE"


def add_input_args(parser: argparse.ArgumentParser, value_column: str) -> None:
    """--input, --input_format, --user_column, --<value>_column, --skip_bad_records, --seed and the
    observability flags (--diagnostics, --progress_interval, --log_level, --no_wait, --plots,
    --evaluate_against; see :mod:`pipelines.observability`)."""
    parser.add_argument("--input", required=True, help="input file path or glob (local, gs://, ...)")
    parser.add_argument("--input_format", required=True, choices=INPUT_FORMATS)
    parser.add_argument("--user_column", default="user", help="name of the user column/key (default: user)")
    parser.add_argument(
        f"--{value_column}_column",
        default=value_column,
        help=f"name of the {value_column} column/key (default: {value_column})",
    )
    parser.add_argument(
        "--skip_bad_records",
        action="store_true",
        help="skip malformed records instead of failing on the first one (default: fail, "
        "naming its file and line). Their number is data-dependent: it is only "
        "written with --diagnostics PATH (non-private)",
    )
    default_max = DEFAULT_MAX_TEXT_LENGTH if value_column == "text" else DEFAULT_MAX_ITEM_LENGTH
    parser.add_argument(
        f"--max_{value_column}_length",
        type=int,
        default=default_max,
        help=f"longest accepted {value_column}, in characters (default %(default)s); longer "
        "ones are bad records (read in bounded chunks, never loaded whole)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="reproducible mode: every random draw is a function of the seed. NOT private "
        "against anyone who knows the seed; for tests and demos only",
    )
    observability.add_args(parser)


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the arguments our parser did not consume (--runner, Dataflow/Flink options...)."""
    options = PipelineOptions(list(beam_args))
    # DoFns live in the installed package; nothing from __main__ needs pickling.
    options.view_as(SetupOptions).save_main_session = False
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


def build_report(_, base: dict, round_counts: Dict[int, int]) -> str:
    """The JSON report: privacy parameters, per-round noise/threshold and released counts (DP outputs).

    Nothing else about the data: exact input counts (e.g. skipped bad records) go to the opt-in
    NON-PRIVATE ``--diagnostics`` file only.
    """
    report = dict(base)
    rounds = []
    for r in report.pop("_rounds"):
        r = dict(r)
        r["released"] = int(round_counts.get(r["round"], 0))
        rounds.append(r)
    report["rounds"] = rounds
    report["released"] = sum(r["released"] for r in rounds)
    return json.dumps(report, indent=2, sort_keys=True)


def write_single_file(pcoll, path: str, label: str):
    """Writes a PCollection of strings to exactly ``path`` (one shard, no suffix)."""
    return pcoll | label >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)


def read_text(path: str) -> str:
    with FileSystems.open(path) as f:
        return f.read().decode("utf-8")


def count_output_lines(prefix: str) -> Tuple[int, List[str]]:
    """(lines, files) over the files starting with ``prefix`` (for the local summary only)."""
    matches = FileSystems.match([prefix + "*"])[0].metadata_list
    files = sorted(m.path for m in matches)
    n = 0
    for path in files:
        with FileSystems.open(path) as f:
            n += sum(1 for _ in f)
    return n, files


def input_error_message(exc: BaseException):
    """A one-line message for errors caused by the input (bad record, no file), else None."""
    from pipelines.io import BadRecordError, EmptyInputError

    msg = str(exc)
    if isinstance(exc, EmptyInputError):
        return msg.splitlines()[0].split(" [while running")[0]
    for line in msg.splitlines():
        if "EmptyInputError" in line:
            return line.split("EmptyInputError:", 1)[-1].strip().split(" [while running")[0]
    if isinstance(exc, BadRecordError):
        return "bad input record: " + msg.splitlines()[0].split(" [while running")[0]
    for line in msg.splitlines():
        if "BadRecordError" in line:
            return "bad input record: " + line.split("BadRecordError:", 1)[-1].strip()
    for line in msg.splitlines():  # the sequential policy algorithms' memory guard (transforms/policy.py)
        if "SequentialSizeError:" in line:
            return "input too large for a sequential algorithm: " + line.split("SequentialSizeError:")[-1].strip()
    if "Empty match for pattern" in msg:
        line = next(l for l in msg.splitlines() if "Empty match for pattern" in l)
        pattern = line.split("Empty match for pattern", 1)[1].split(". Disallowed")[0].strip()
        return f"input: no file matches {pattern}"
    return None


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


def run_main(parser: argparse.ArgumentParser, argv, make_params, build_pipeline, summarize) -> int:
    """The CLI skeleton shared by the pipelines.

    Parses ``argv`` (unknown arguments go to Beam), validates parameters (``ValueError`` -> exit 2
    with the message), runs the pipeline with a progress display, turns input errors into
    ``error: ...`` and exit code 3, and prints ``summarize(report, args, params)`` (or the output
    locations if the job was submitted without waiting or the report cannot be read yet). Then,
    if asked, NON-PRIVATE evaluation against the true data and plots (:mod:`pipelines.reporting`).
    """
    global last_result
    if "--diagnostics" not in parser._option_string_actions:  # a pipeline without add_input_args
        observability.add_args(parser)
    args, beam_args = parser.parse_known_args(argv)
    configure_logging(args.log_level)
    if args.evaluate_against and not hasattr(sys.modules[build_pipeline.__module__], "evaluation_pairs"):
        parser.error(f"--evaluate_against is not supported by {parser.prog} (no item-level evaluation defined)")
    try:
        params = make_params(args)
        options = pipeline_options(beam_args)
        pipeline = make_pipeline(options)
        build_pipeline(pipeline, args, params)
    except ValueError as e:
        parser.error(str(e))
    if getattr(args, "skip_bad_records", False):
        print(
            "warning: --skip_bad_records: malformed records are skipped; how many is data-dependent and "
            "only written with --diagnostics PATH (non-private)",
            file=sys.stderr,
        )
    wait = should_wait(options, args)
    outputs = [args.output, args.report]
    # Only a run we wait for can clean up after a failure; a submitted job writes its outputs later
    # (and listing gs:// paths from a Flex launcher or offline would need credentials).
    before = snapshot_outputs(outputs) if wait else {}
    try:
        with observability.ProgressDisplay(args.progress_interval if wait else 0, bool(args.diagnostics)):
            last_result = pipeline.run()
            if wait:
                last_result.wait_until_finish()
    except Exception as e:  # Beam wraps worker exceptions; show the root cause plainly.
        removed = remove_new_outputs(outputs, before) if wait else []  # a failed run leaves no partial output
        if removed:
            print(f"removed {len(removed)} partial output file(s) of the failed run", file=sys.stderr)
        message = input_error_message(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 3
    if not wait:
        print(f"submitted without waiting; output: {args.output}*  report: {args.report}")
        return 0
    try:
        report = json.loads(read_text(args.report))
    except Exception:  # a remote runner may not have finished writing yet (templates, async jobs)
        print(f"output: {args.output}*  report: {args.report}")
        return 0
    print(summarize(report, args, params))
    if args.diagnostics:
        print(f"NON-PRIVATE diagnostics (exact input counts, not DP; keep private): {args.diagnostics}")
    if args.plots or args.evaluate_against:
        from pipelines import reporting

        for path in reporting.produce(report, args, params, options, build_pipeline.__module__):
            print(f"wrote {path}")
    return 0


def is_local_path(path: str) -> bool:
    """True for a plain filesystem path (no ``scheme://``, or ``file://``)."""
    return "://" not in path or path.startswith("file://")


def _output_matches(prefixes: Sequence[str]) -> Dict[str, float]:
    """path -> last-modified time of every file starting with one of ``prefixes`` or in a beam-temp
    directory next to them (WriteToText stages shards in ``<dir>/beam-temp-<name>-<uuid>/``).

    Local paths only: remote outputs (``gs://``, ``s3://``, ...) are written by the runner's file
    sinks, which finalise atomically on the workers, and listing them from the launcher would need
    network access and credentials (and hangs in GCS client retries when there is none)."""
    patterns = []
    for prefix in prefixes:
        if not is_local_path(prefix):
            continue
        patterns.append(prefix + "*")
        directory, name = FileSystems.split(prefix)
        patterns.append(FileSystems.join(directory, f"beam-temp-{name}*", "*"))
    found: Dict[str, float] = {}
    if not patterns:
        return found
    for result in FileSystems.match(patterns):
        for m in result.metadata_list:
            found[m.path] = getattr(m, "last_updated_in_seconds", 0.0)
    return found


def snapshot_outputs(prefixes: Sequence[str]) -> Dict[str, float]:
    try:
        return _output_matches(prefixes)
    except Exception:  # pragma: no cover - an unreachable filesystem fails the run later anyway
        return {}


def remove_new_outputs(prefixes: Sequence[str], before: Dict[str, float]) -> List[str]:
    """Deletes the files a failed run created or rewrote (outputs, report, beam-temp staging), so a
    failed run leaves no partial output; files that were there before and untouched stay."""
    try:
        now = _output_matches(prefixes)
    except Exception:  # pragma: no cover
        return []
    stale = sorted(p for p, t in now.items() if p not in before or t != before[p])
    if stale:
        FileSystems.delete(stale)
    for prefix in prefixes:  # now-empty staging directories
        directory, name = FileSystems.split(prefix)
        if directory and FileSystems.exists(directory) and "://" not in directory:
            import glob
            import os

            for d in glob.glob(os.path.join(directory, f"beam-temp-{name}*")):
                if os.path.isdir(d) and not os.listdir(d):
                    os.rmdir(d)
    return stale


class InputErrorTracebackFilter(logging.Filter):
    """Drops Beam's ERROR log of a worker exception caused by the input (bad record, empty input):
    run_main prints those as one ``error: <file>:<line>: ...`` line instead of a Beam stack trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        from pipelines.io import BadRecordError, EmptyInputError

        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, (BadRecordError, EmptyInputError)):
                return False
            exc = exc.__cause__ or exc.__context__
        text = record.getMessage() if record.levelno >= logging.ERROR else ""
        return not ("BadRecordError" in text or "EmptyInputError" in text)


def configure_logging(level="WARNING") -> None:
    """Logging to stderr at ``level`` (a name; True/False for INFO/WARNING as before)."""
    if level is True:
        level = "INFO"
    elif level is False or level is None:
        level = "WARNING"
    numeric = getattr(logging, str(level))
    logging.basicConfig(level=numeric, format="%(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    if numeric < root.getEffectiveLevel():  # --log_level INFO after an earlier basicConfig; never raise it
        root.setLevel(numeric)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, InputErrorTracebackFilter) for f in handler.filters):
            handler.addFilter(InputErrorTracebackFilter())
    # e.g. "Processing [...(user, item)...]" in apache_beam.runners.worker.operations
    beam_logger = logging.getLogger("apache_beam")
    if beam_logger.level < logging.INFO:  # NOTSET or DEBUG
        beam_logger.setLevel(logging.INFO)
