"""The command-line skeleton every pipeline shares: arguments, the strict flag check, logging, errors.

A pipeline module (``pipelines.<name>``, listed in :mod:`pipelines.registry`) builds its parser from
:func:`add_input_args`, :func:`add_params_args` (the privacy flags, generated from the fields of its
parameter dataclass and their ``metadata["help"]``) and its own few execution flags, then hands
everything to :func:`run_main`. Running and waiting live in :mod:`pipelines.runner`, what a run writes
in :mod:`pipelines.outputs`; this module imports both, never the other way round.

Flags are strict (:func:`check_unknown_args`): an argument that is neither one of ours nor a Beam
pipeline option stops the run before anything runs (exit 2, one line naming it and the closest known
flag), and our flags are never abbreviated (``allow_abbrev=False``): for a DP tool a privacy parameter
the user believes was set, but was silently dropped or taken for another flag, is a privacy failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import json
import logging
import sys
import typing
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

from pipelines import observability, outputs, runner
from pipelines.io import (
    DEFAULT_MAX_ITEM_LENGTH,
    DEFAULT_MAX_TEXT_LENGTH,
    INPUT_FORMATS,
    BadRecordError,
    EmptyInputError,
)
from transforms.core import text as tx

# The PipelineResult of the most recent run_main in this process (tests read its Beam metrics).
last_result = None

#: Documented errors of a run: each becomes one ``error: ...`` line and exit code 3, never a traceback.
#: Matched by class name too, because Beam re-raises worker exceptions wrapped in its own types.
DOCUMENTED_ERRORS = ("BadRecordError", "EmptyInputError", "SequentialSizeError", "TokenizerError")

#: Modules of runners that define their own PipelineOptions subclass (imported when installed, so
#: their flags count as known); every other runner's options live in apache_beam.options.
RUNNER_OPTION_MODULES = ("apache_beam.runners.render", "apache_beam.runners.dask.dask_runner")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


# --------------------------------------------------------------------------------------------------
# Argument types
# --------------------------------------------------------------------------------------------------


def _numbers(text: str, kind, what: str) -> list:
    try:
        vals = [kind(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return vals


def float_list(text: str) -> List[float]:
    """``0.1,0.9`` -> [0.1, 0.9] (commas or spaces)."""
    return _numbers(text, float, "comma-separated numbers like 0.1,0.9")


def int_list(text: str) -> List[int]:
    """``300`` or ``300,200,100`` -> list of ints."""
    return _numbers(text, int, "an integer or comma-separated integers")


def switch_value(text: str) -> bool:
    """The value of a boolean switch given as ``--flag=VALUE``: true/false (also 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


#: The comma-separated list types (the template metadata regexes of such flags are checked as lists).
LIST_TYPES = (float_list, int_list)


def load_tokenizer(spec: Optional[str]):
    """``module:function`` -> the function (must be a picklable top-level function ``str -> list[str]``)."""
    if not spec:
        return tx.default_tokenize
    if ":" not in spec:
        raise ValueError(f"tokenizer must be 'module:function', got {spec!r}")
    mod, fn = spec.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"tokenizer {spec!r} cannot be imported: {e}") from None


# --------------------------------------------------------------------------------------------------
# Parsers
# --------------------------------------------------------------------------------------------------


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An ArgumentParser that never abbreviates a flag (``--max_contribution`` is not ``--max_contributions``)."""
    return argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)


def add_input_args(parser: argparse.ArgumentParser, value_column: str, input_flag: str = "input") -> None:
    """--<input_flag>, --input_format, --user_column, --<value>_column, --skip_bad_records,
    --max_<value>_length, --seed and the observability flags (--diagnostics, --progress_interval,
    --log_level, --no_wait, --plots, --evaluate_against; see :mod:`pipelines.observability`)."""
    what = "private user-level text" if value_column == "text" else "(user, item) records"
    parser.add_argument(f"--{input_flag}", required=True, help=f"{what}: file path or glob (local, gs://, ...)")
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


def add_algorithm_arg(
    parser: argparse.ArgumentParser, flag: str, choices: Sequence[str], default: str, summaries=None
) -> None:
    """``--algorithm`` (or ``--mechanism``): its choices, and one help line per choice if given."""
    text = f"default {default}"
    if summaries:
        text += "; " + "; ".join(f"{name}: {summaries[name]}" for name in choices)
    parser.add_argument(f"--{flag}", default=default, choices=tuple(choices), help=text)


def _flag_kind(hint) -> Tuple[Any, bool]:
    """(argparse type, is_list) of a dataclass field's resolved type hint."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Union:  # Optional[int], Union[int, Tuple[int, ...]]
        non_none = [a for a in args if a is not type(None)]
        if any(typing.get_origin(a) is tuple for a in non_none):
            (tup,) = [a for a in non_none if typing.get_origin(a) is tuple]
            return _flag_kind(tup)
        return _flag_kind(non_none[0])
    if origin is tuple:
        return (int_list if args[0] is int else float_list), True
    return hint, False


def add_params_args(
    parser: argparse.ArgumentParser, params_cls, exclude: Iterable[str] = (), title: str = "privacy parameters"
) -> None:
    """One flag ``--<field>`` per field of the parameter dataclass ``params_cls`` (minus ``exclude``).

    The help text is the field's ``metadata["help"]``, the choices its ``metadata["choices"]``; a field
    without a default is a required flag, a ``bool`` field a switch (that also takes ``=true|false``,
    for template launchers), a tuple field a comma-separated list. The dataclass validates the values
    (:func:`params_from_args`), so the CLI, the Python API and the report share one definition of every
    parameter.
    """
    hints = typing.get_type_hints(params_cls)
    group = parser.add_argument_group(title)
    skip = set(exclude)
    for f in dataclasses.fields(params_cls):
        if f.name in skip:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{params_cls.__name__}.{f.name} has no metadata['help'] (the CLI flag needs it)")
        kind, is_list = _flag_kind(hints[f.name])
        required = f.default is dataclasses.MISSING
        help_text = f.metadata["help"]
        if kind is bool:
            # a switch (--flag) that also takes a value (--flag=true|false): what a template launcher
            # passes, since it can only pass --name=value
            group.add_argument(
                f"--{f.name}",
                nargs="?",
                const=True,
                default=bool(f.default),
                type=switch_value,
                metavar="true|false",
                help=f"{help_text} (a switch; --{f.name}=true|false also works)",
            )
            continue
        kwargs = {"help": help_text}
        if required:
            kwargs["required"] = True
        else:
            default = f.default
            if is_list and default is not None:
                default = list(default) if isinstance(default, tuple) else [default]
            kwargs["default"] = default
            shown = ",".join(map(str, default)) if isinstance(default, list) else default
            if shown is not None:
                kwargs["help"] = f"{help_text} (default {shown})"
        if "choices" in f.metadata:
            kwargs["choices"] = tuple(f.metadata["choices"])
        elif kind is not str:
            kwargs["type"] = kind
        group.add_argument(f"--{f.name}", **kwargs)


def params_from_args(params_cls, args, exclude: Iterable[str] = (), **overrides):
    """The parameter dataclass from the parsed flags of :func:`add_params_args` (validated by it)."""
    hints = typing.get_type_hints(params_cls)
    kwargs = {}
    skip = set(exclude)
    for f in dataclasses.fields(params_cls):
        if f.name in skip or f.name in overrides:
            continue
        value = getattr(args, f.name)
        if isinstance(value, list):
            hint = hints[f.name]
            takes_scalar = typing.get_origin(hint) is typing.Union and int in typing.get_args(hint)
            value = value[0] if takes_scalar and len(value) == 1 else tuple(value)
        kwargs[f.name] = value
    kwargs.update(overrides)
    return params_cls(**kwargs)


# --------------------------------------------------------------------------------------------------
# Strict flags (issue 20)
# --------------------------------------------------------------------------------------------------


def beam_option_parser() -> argparse.ArgumentParser:
    """A parser of every Beam pipeline option this installation knows, collected the way
    ``PipelineOptions.get_all_options`` collects them (each ``PipelineOptions`` subclass adds its
    arguments, no abbreviations), after importing the option classes of installed runners."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    for module in RUNNER_OPTION_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:  # that runner is not installed: its options are not known here
            pass
    parser = _BeamArgumentParser(allow_abbrev=False, exit_on_error=False)
    subset = {}
    for cls in PipelineOptions.__subclasses__():
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - the classes' own registration hook
    return parser


def _flags_of(parser: argparse.ArgumentParser) -> List[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]  # noqa: SLF001


def unknown_arg_message(parser: argparse.ArgumentParser, extra: Sequence[str], beam_options: bool = True):
    """None if every argument of ``extra`` (what our parser did not consume) is a Beam pipeline option,
    else the one-line message naming the first unknown one and the closest known flag."""
    if not extra:
        return None
    known = _flags_of(parser)
    if beam_options:
        beam_parser = beam_option_parser()
        try:
            _, unknown = beam_parser.parse_known_args(list(extra))
        except argparse.ArgumentError as e:  # a Beam option with a bad value, e.g. --direct_num_workers x
            return str(e)
        known += _flags_of(beam_parser)
    else:
        unknown = list(extra)
    if not unknown:
        return None
    flags = [a for a in unknown if a.startswith("-")]
    if not flags:
        return f"unexpected argument {unknown[0]!r} (every value must follow its --flag)"
    name = flags[0].split("=", 1)[0]
    where = "of this command nor a Beam pipeline option" if beam_options else "of this command"
    message = f"unknown flag {name} (neither a flag {where})"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {close[0]}?"
    return message


def check_unknown_args(parser: argparse.ArgumentParser, extra: Sequence[str], beam_options: bool = True) -> None:
    """Exit 2 with one line if an argument is neither ours nor a known Beam pipeline option."""
    message = unknown_arg_message(parser, extra, beam_options)
    if message is not None:
        parser.exit(2, f"{parser.prog}: error: {message}\n")


# --------------------------------------------------------------------------------------------------
# Errors and logging
# --------------------------------------------------------------------------------------------------


def _first_line(text: str) -> str:
    return text.splitlines()[0].split(" [while running")[0] if text else text


def input_error_message(exc: BaseException):
    """A one-line message for the documented errors of a run (bad record, no input, too large for a
    sequential algorithm, no file), else None."""
    msg = str(exc)
    if isinstance(exc, EmptyInputError):
        return _first_line(msg)
    for line in msg.splitlines():
        if "EmptyInputError" in line:
            return line.split("EmptyInputError:", 1)[-1].strip().split(" [while running")[0]
    if isinstance(exc, BadRecordError):
        return "bad input record: " + _first_line(msg)
    for line in msg.splitlines():
        if "BadRecordError" in line:
            return "bad input record: " + line.split("BadRecordError:", 1)[-1].strip()
    for line in msg.splitlines():  # the sequential policy algorithms' memory guard (transforms/selection/policy.py)
        if "SequentialSizeError:" in line:
            return "input too large for a sequential algorithm: " + line.split("SequentialSizeError:")[-1].strip()
    if "Empty match for pattern" in msg:
        line = next(l for l in msg.splitlines() if "Empty match for pattern" in l)
        pattern = line.split("Empty match for pattern", 1)[1].split(". Disallowed")[0].strip()
        return f"input: no file matches {pattern}"
    return None


class DocumentedErrorFilter(logging.Filter):
    """Drops Beam's ERROR log (with its traceback) of a worker exception that is a documented error:
    run_main prints those as one ``error: ...`` line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if type(exc).__name__ in DOCUMENTED_ERRORS:
                return False
            exc = exc.__cause__ or exc.__context__
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        if record.exc_text:
            text += record.exc_text
        return not any(name in text for name in DOCUMENTED_ERRORS)


def configure_logging(level: str = "WARNING") -> None:
    """Logging to stderr.

    ``level`` is that of our own loggers. Beam's loggers (``apache_beam.*``) are quiet by default
    (ERROR: its INFO chatter and warnings are not for a newcomer); ``--log_level INFO`` or ``DEBUG``
    brings them back at INFO, never below: Beam's DEBUG logs print elements (``Processing [...(user,
    item)...]``), which would put private data in the logs.
    """
    numeric = getattr(logging, str(level))
    logging.basicConfig(level=numeric, format="%(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    if numeric < root.getEffectiveLevel():  # --log_level INFO after an earlier basicConfig; never raise it
        root.setLevel(numeric)
    for handler in root.handlers:
        if not any(isinstance(f, DocumentedErrorFilter) for f in handler.filters):
            handler.addFilter(DocumentedErrorFilter())
    beam_logger = logging.getLogger("apache_beam")
    beam_logger.setLevel(logging.INFO if numeric <= logging.INFO else logging.ERROR)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def run_main(
    parser: argparse.ArgumentParser,
    argv,
    make_params: Callable,
    build_pipeline: Callable,
    summarize: Callable,
    evaluation=None,
) -> int:
    """The CLI skeleton shared by the pipelines.

    Parses ``argv``: an argument that is neither ours nor a Beam pipeline option stops here (exit 2);
    the rest goes to Beam. Validates parameters (``ValueError`` -> exit 2 with the message), runs the
    pipeline with a progress display, turns the documented run errors into ``error: ...`` and exit
    code 3, and prints ``summarize(report, args, params)`` (or the output locations if the job was
    submitted without waiting or the report cannot be read yet). Then, if asked, NON-PRIVATE
    evaluation (``evaluation``: a :class:`pipelines.reporting.Evaluation`, None if the pipeline has
    none) and plots.
    """
    global last_result
    if "--diagnostics" not in parser._option_string_actions:  # noqa: SLF001 (a pipeline without add_input_args)
        observability.add_args(parser)
    args, beam_args = parser.parse_known_args(argv)
    check_unknown_args(parser, beam_args)
    configure_logging(args.log_level)
    if args.evaluate_against and evaluation is None:
        parser.error(f"--evaluate_against is not supported by {parser.prog} (no item-level evaluation defined)")
    try:
        params = make_params(args)
        options = runner.pipeline_options(beam_args)
        pipeline = runner.make_pipeline(options)
        build_pipeline(pipeline, args, params)
    except ValueError as e:
        parser.error(str(e))
    if getattr(args, "skip_bad_records", False):
        print(
            "warning: --skip_bad_records: malformed records are skipped; how many is data-dependent and "
            "only written with --diagnostics PATH (non-private)",
            file=sys.stderr,
        )
    wait = runner.should_wait(options, args)
    written = [args.output, args.report]
    # Only a run we wait for can clean up after a failure; a submitted job writes its outputs later
    # (and listing gs:// paths from a Flex launcher or offline would need credentials).
    before = outputs.snapshot_outputs(written) if wait else {}
    try:
        with observability.ProgressDisplay(args.progress_interval if wait else 0, bool(args.diagnostics)):
            last_result = pipeline.run()
            if wait:
                last_result.wait_until_finish()
    except Exception as e:  # Beam wraps worker exceptions; show the root cause plainly.
        removed = outputs.remove_new_outputs(written, before) if wait else []  # a failed run leaves no partial output
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
        report = json.loads(outputs.read_text(args.report))
    except Exception:  # a remote runner may not have finished writing yet (templates, async jobs)
        print(f"output: {args.output}*  report: {args.report}")
        return 0
    print(summarize(report, args, params))
    if args.diagnostics:
        print(f"NON-PRIVATE diagnostics (exact input counts, not DP; keep private): {args.diagnostics}")
    if args.plots or args.evaluate_against:
        from pipelines import reporting  # matplotlib and the evaluation job only when asked for

        for path in reporting.produce(report, args, options, evaluation, parser.prog):
            print(f"wrote {path}")
    return 0


def add_allowlist_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--allowlist",
        default=None,
        metavar="FILE",
        help=f"a PUBLIC list of candidate {what}s, one per line (UTF-8 text; a file or glob, local or gs://): "
        f"{what}s outside it are dropped before selection. It must be fixed without looking at the private "
        "data; it changes neither the noise nor the thresholds (docs/counts.md)",
    )
