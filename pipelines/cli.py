"""The command-line skeleton every pipeline shares: arguments, the strict flag check, logging, errors.

A pipeline module (``pipelines.<name>``, listed in :mod:`pipelines.registry`) builds its parser from
:func:`add_input_args`, :func:`add_params_args` (the privacy flags, generated from the fields of its
parameter dataclass and their ``metadata["help"]``) and its own few execution flags, then hands
everything to :func:`run_main`. Running and waiting live in :mod:`pipelines.runner`, what a run writes
in :mod:`pipelines.outputs`; this module imports both, never the other way round.

Flags are strict (:class:`StrictParser`, :func:`check_unknown_args`): an argument that is neither one
of ours nor a Beam pipeline option, a flag given twice, or a flag the chosen algorithm does not read
stops the run before anything runs (exit 2, one line naming it and, for a typo, the closest known
flag), and our flags are never abbreviated (``allow_abbrev=False``): for a DP tool a privacy parameter
the user believes was set, but was silently dropped, overridden or taken for another flag, is a privacy
failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import importlib
import json
import logging
import os
import re
import signal
import sys
import threading
import typing
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

from dp_partition_beam.pipelines import flink_plan, observability, outputs, profiling, runner
from dp_partition_beam.pipelines.io import (
    DEFAULT_MAX_ITEM_LENGTH,
    DEFAULT_MAX_TEXT_LENGTH,
    INPUT_FORMATS,
)
from dp_partition_beam.transforms.core import text as tx

# The PipelineResult of the most recent run_main in this process (tests read its Beam metrics).
last_result = None

#: Documented errors of a run: each becomes one ``error: ...`` line and exit code 3, never a traceback.
#: Matched by class name too, because Beam re-raises worker exceptions wrapped in its own types.
DOCUMENTED_ERRORS = (
    "BadRecordError",
    "EmptyInputError",
    "InputFileError",
    "OutputWriteError",
    "SequentialSizeError",
    "TokenizerError",
)

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


def new_parser(prog: str, description: str, beam_options: bool = True) -> StrictParser:
    """A :class:`StrictParser`: no abbreviated flag (``--max_contribution`` is not ``--max_contributions``),
    no repeated flag, no unknown flag (``beam_options``: Beam pipeline options are known, and returned as
    the extra arguments), one-line errors."""
    return StrictParser(prog=prog, description=description, allow_abbrev=False, beam_options=beam_options)


def add_input_args(parser: argparse.ArgumentParser, value_column: str, input_flag: str = "input") -> None:
    """--<input_flag>, --input_format, --user_column, --<value>_column, --skip_bad_records,
    --max_<value>_length, --seed and the observability flags (--diagnostics, --profile, --progress_interval,
    --log_level, --no_wait, --plots, --evaluate_against, --overwrite; see :mod:`pipelines.observability`)."""
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
    parser: argparse.ArgumentParser, flag: str, choices: Sequence[str], default: str, summaries=None, uses=None
) -> None:
    """``--algorithm`` (or ``--mechanism``): its choices, and one help line per choice if given.

    ``uses``: which flags each choice reads (``{dest: privacy.validation.ParamUse}``, e.g.
    :data:`privacy.selection.FIELD_USE`; a flag absent from it is read by every choice). A flag given on
    the command line that the chosen algorithm does not read is an error (:class:`StrictParser`).
    Call it before :func:`add_params_args`, which makes a budget flag required where it is read.
    """
    text = f"default {default}"
    if summaries:
        text += "; " + "; ".join(f"{name}: {summaries[name]}" for name in choices)
    parser.add_argument(f"--{flag}", default=default, choices=tuple(choices), help=text)
    parser.algorithm_dest = flag
    parser.flag_use = dict(uses or {})


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
    parser: argparse.ArgumentParser,
    params_cls,
    exclude: Iterable[str] = (),
    title: str = "privacy parameters",
    required: Iterable[str] = (),
) -> None:
    """One flag ``--<field>`` per field of the parameter dataclass ``params_cls`` (minus ``exclude``).

    The help text is the field's ``metadata["help"]``, the choices its ``metadata["choices"]``, the argparse
    type its ``metadata["type"]`` if it has one (else from the type hint); a field
    without a default, or named in ``required`` (the privacy budget: no CLI default, whatever the
    dataclass's), is a required flag, a ``bool`` field a switch (that also takes ``=true|false``,
    for template launchers), a tuple field a comma-separated list. A ``required`` field that only some
    algorithms read (the parser's ``flag_use``, :func:`add_algorithm_arg`) is required with those and an
    error with the others (bayesian_ngrams' ``--delta``). The dataclass validates the values
    (:func:`params_from_args`), so the CLI, the Python API and the report share one definition of every
    parameter.
    """
    hints = typing.get_type_hints(params_cls)
    group = parser.add_argument_group(title)
    skip = set(exclude)
    budget = set(required)
    uses = getattr(parser, "flag_use", {})
    for f in dataclasses.fields(params_cls):
        if f.name in skip:
            continue
        if "help" not in f.metadata:
            raise TypeError(f"{params_cls.__name__}.{f.name} has no metadata['help'] (the CLI flag needs it)")
        kind, is_list = _flag_kind(hints[f.name])
        kind = f.metadata.get("type", kind)  # a field that takes a number or a word (weight_cap: 0.25 or auto)
        required = f.default is dataclasses.MISSING or f.name in budget
        help_text = f.metadata["help"]
        use = uses.get(f.name)
        if required and use is not None and (use.algorithms is not None or use.conditions):
            # required only where it is read: checked after parsing (StrictParser), no default here
            parser.required_where_used.append(f.name)
            users = ", ".join(use.algorithms or ())
            flag = getattr(parser, "algorithm_dest", "algorithm")
            group.add_argument(
                f"--{f.name}",
                default=None,
                type=kind,
                help=f"{help_text} (required with --{flag} {users}; an error with the others)",
            )
            continue
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
    """The parameter dataclass from the parsed flags of :func:`add_params_args` (validated by it). A flag
    left unset (None) whose field has a default takes that default (bayesian_ngrams' ``--delta`` with
    a Laplace mechanism, which takes none)."""
    hints = typing.get_type_hints(params_cls)
    kwargs = {}
    skip = set(exclude)
    for f in dataclasses.fields(params_cls):
        if f.name in skip or f.name in overrides:
            continue
        value = getattr(args, f.name)
        if value is None and f.default is not dataclasses.MISSING:
            continue
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
    where = (
        "neither a flag of this command nor a Beam pipeline option" if beam_options else "not a flag of this command"
    )
    message = f"unknown flag {name} ({where})"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean {close[0]}?"
    return message


def check_unknown_args(parser: argparse.ArgumentParser, extra: Sequence[str], beam_options: bool = True) -> None:
    """Exit 2 with one line if an argument is neither ours nor a known Beam pipeline option."""
    message = unknown_arg_message(parser, extra, beam_options)
    if message is not None:
        parser.exit(2, f"{parser.prog}: error: {message}\n")


#: The actions that keep one value, the last given: such a flag given twice is an error. Every other
#: action accumulates (``append``: ``--distribution``; Beam's ``--experiments a --experiments b``).
_ONE_VALUE = (argparse._StoreAction, argparse._StoreConstAction, argparse._StoreTrueAction, argparse._StoreFalseAction)


def _keeps_one_value(action: Optional[argparse.Action]) -> bool:
    return type(action) in _ONE_VALUE


def _shown_value(argv: Sequence[str], i: int, action: Optional[argparse.Action]) -> str:
    """The value of the flag at ``argv[i]`` as the user wrote it (a bare switch: the value it sets)."""
    name, eq, value = argv[i].partition("=")
    if eq:
        return value
    following = argv[i + 1] if i + 1 < len(argv) else None
    takes_value = following is not None and (not following.startswith("-") or _is_number(following))
    if action is not None and action.nargs == 0:  # --flag alone (store_true, ...)
        takes_value = False
    if takes_value:
        return following
    const = getattr(action, "const", None)
    return str(const).lower() if isinstance(const, bool) else "no value"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _join_values(values: Sequence[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


class StrictParser(argparse.ArgumentParser):
    """The parser of every CLI (:func:`new_parser`): argparse with the rules a privacy tool needs.

    :meth:`parse_known_args`, in this order, stops with one line and exit 2 (:meth:`error`: no usage
    block, that is for ``--help``) on

    1. a flag given twice (ours or a Beam option; ``append`` flags such as ``--experiments`` excepted):
       the last value would silently win;
    2. a bad value (argparse's own checks: type, choices);
    3. an unknown flag, naming the closest known one (:func:`unknown_arg_message`), before
    4. a missing required flag: ``--epsilonn 1`` is reported as the typo it is, not as a missing
       ``--epsilon``; a flag required only by some algorithms (``required_where_used``) is checked
       against the chosen one;
    5. a flag given on the command line that the chosen ``--algorithm``/``--mechanism`` does not read
       (``flag_use``, set by :func:`add_algorithm_arg` from the privacy tables).

    It returns ``(args, beam_args)``: the extra arguments are known Beam pipeline options only (none
    without ``beam_options``). Only flags present on the command line count as given: a Flex Template
    launch passes only the parameters the user set, so defaults never trip rule 5.
    """

    def __init__(self, *args, beam_options: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.beam_options = beam_options
        self.algorithm_dest: Optional[str] = None  # --algorithm / --mechanism (add_algorithm_arg)
        self.flag_use: dict = {}  # dest -> privacy.validation.ParamUse
        self.required_where_used: List[str] = []  # dests required by the algorithms that read them
        self._deferred: List[argparse.Action] = []  # required actions while parse_known_args runs

    def error(self, message: str):
        """One line, exit 2 (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        given = self._check_repeats(argv)  # dest of each of our flags on the command line, in order
        required = self._deferred = [a for a in self._actions if a.required]
        for action in required:  # checked below, after the unknown flags
            action.required = False
        try:
            namespace, extra = super().parse_known_args(argv, namespace)
        finally:
            self._restore_required()
        message = unknown_arg_message(self, extra, self.beam_options)
        if message is not None:
            self.error(message)
        missing = [a.option_strings[0] for a in required if a.dest not in given]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        message = self.unused_flag_message(namespace, given) or self._required_where_used(namespace, given)
        if message is not None:
            self.error(message)
        return namespace, extra

    def _restore_required(self) -> None:
        for action in self._deferred:
            action.required = True
        self._deferred = []

    def format_usage(self) -> str:
        self._restore_required()  # --help while parsing: show the required flags as required
        return super().format_usage()

    def format_help(self) -> str:
        self._restore_required()
        return super().format_help()

    def _check_repeats(self, argv: Sequence[str]) -> List[str]:
        """Stops on a flag given twice; returns the dests of our flags given, in command-line order."""
        ours: dict = {}
        others: dict = {}
        for i, token in enumerate(argv):
            if token == "--":
                break
            if not token.startswith("--"):
                continue
            name = token.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is not None:
                ours.setdefault(action.dest, []).append((name, i, action))
            else:
                others.setdefault(name, []).append((name, i, None))
        repeated = [v for v in ours.values() if len(v) > 1 and _keeps_one_value(v[0][2])]
        if not repeated and self.beam_options and any(len(v) > 1 for v in others.values()):
            beam_actions = beam_option_parser()._option_string_actions  # noqa: SLF001
            by_dest: dict = {}
            for name, seen in others.items():
                action = beam_actions.get(name)
                if _keeps_one_value(action):
                    by_dest.setdefault(action.dest, []).extend((n, i, action) for n, i, _ in seen)
            repeated = [v for v in by_dest.values() if len(v) > 1]
        if repeated:
            seen = min(repeated, key=lambda v: v[1][1])  # the first repetition on the command line
            names = sorted({n for n, _, _ in seen}, key=[n for n, _, _ in seen].index)
            values = [_shown_value(argv, i, action) for _, i, action in seen]
            times = "twice" if len(seen) == 2 else f"{len(seen)} times"
            self.error(f"{' / '.join(names)} given {times} ({_join_values(values)}); give each flag once")
        return list(ours)

    def unused_flag_message(self, args, given: Sequence[str]) -> Optional[str]:
        """The error for the first flag of ``given`` that the chosen algorithm does not read, else None."""
        if self.algorithm_dest is None:
            return None
        algorithm = getattr(args, self.algorithm_dest)
        chosen = f"--{self.algorithm_dest} {algorithm}"
        for dest in given:
            use = self.flag_use.get(dest)
            if use is None:
                continue
            if use.algorithms is not None and algorithm not in use.algorithms:
                return f"--{dest} is not used by {chosen} (it is used by: {', '.join(use.algorithms)})"
            unmet = use.unmet(args)
            if unmet is not None:
                return f"--{dest} is not used by {chosen} {_flag_text(unmet.unmet)}"
        return None

    def _required_where_used(self, args, given: Sequence[str]) -> Optional[str]:
        algorithm = getattr(args, self.algorithm_dest or "", None)
        for dest in self.required_where_used:
            if dest not in given and self.flag_use[dest].used(algorithm, args):
                return f"--{dest} is required with --{self.algorithm_dest} {algorithm}"
        return None


class _AsFlag(dict):
    def __missing__(self, key):
        return f"--{key}"


def _flag_text(text: str) -> str:
    """A privacy table's text with ``{name}`` written as the flag ``--name``."""
    return text.format_map(_AsFlag())


# --------------------------------------------------------------------------------------------------
# Errors and logging
# --------------------------------------------------------------------------------------------------


def _first_line(text: str) -> str:
    return text.splitlines()[0].split(" [while running")[0] if text else text


#: What run_main prints before the message of a documented error (none for the others).
ERROR_PREFIXES = {
    "BadRecordError": "bad input record: ",
    "SequentialSizeError": "input too large for a sequential algorithm: ",
}
#: Errors of the file system (full disk, no permission, a directory where a file was expected...)
#: met while reading or writing: one line naming the file, exit 3.
_OS_ERROR_TEXT = re.compile(
    r"\b(?:OSError|IOError|PermissionError|FileNotFoundError|IsADirectoryError|NotADirectoryError|"
    r"FileExistsError): \[Errno (\d+)\] ([^:\n\[]+?)(?:: '([^'\n]*)')?(?: \[while running|$)",
    re.MULTILINE,
)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def error_message(exc: BaseException) -> Optional[str]:
    """The one-line message of a documented error of a run, else None (a bug: the traceback shows).

    Documented: the classes named in :data:`DOCUMENTED_ERRORS` (bad record, empty input, a file that
    is truncated, corrupt or not of its format, ...; found in the exception chain, or in the text of
    the exception Beam re-raises from a worker), a glob that matches no file, and file-system errors
    (``OSError`` with an errno: full disk, no permission...), named with their file.
    """
    chain = list(_chain(exc))
    for e in chain:
        name = type(e).__name__
        if name in DOCUMENTED_ERRORS:
            return ERROR_PREFIXES.get(name, "") + _first_line(str(e))
    text = "\n".join(str(e) for e in chain)
    for line in text.splitlines():
        for name in DOCUMENTED_ERRORS:
            if f"{name}: " in line:
                return ERROR_PREFIXES.get(name, "") + line.split(f"{name}: ", 1)[1].strip().split(" [while running")[0]
    if "Empty match for pattern" in text:
        line = next(l for l in text.splitlines() if "Empty match for pattern" in l)
        pattern = line.split("Empty match for pattern", 1)[1].split(". Disallowed")[0].strip()
        return f"input: no file matches {pattern}"
    for e in chain:
        if isinstance(e, OSError) and e.errno is not None:
            where = f"{e.filename}: " if e.filename else ""
            return f"{where}{e.strerror or e}"
    found = _OS_ERROR_TEXT.search(text)
    if found:
        errno_, strerror, filename = found.groups()
        return f"{filename}: {strerror}" if filename else strerror
    return None


class DocumentedErrorFilter(logging.Filter):
    """Drops Beam's ERROR log (with its traceback) of a worker exception that is a documented error:
    run_main prints those as one ``error: ...`` line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (error_message(exc) is not None or interrupt_signal(exc) is not None):
            return False
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        if record.exc_text:
            text += record.exc_text
        if "Empty match for pattern" in text or _INTERRUPTED_TEXT.search(text):
            return False
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
    """:func:`run_pipeline_main` with SIGTERM/SIGINT turned into one line and exit 128 + signum: during
    the pipeline's run its files are removed first (see there); before it nothing was written, after
    it the report is there and the run complete."""
    try:
        with interruptible():
            return run_pipeline_main(parser, argv, make_params, build_pipeline, summarize, evaluation)
    except (KeyboardInterrupt, Interrupted) as e:
        signum = interrupt_signal(e)
        print(f"error: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + int(signum)


#: The path flags of the CLIs (local paths are made absolute: see :func:`absolute_local_paths`).
PATH_FLAGS = (
    "input",
    "output",
    "report",
    "diagnostics",
    "profile",
    "plots",
    "evaluate_against",
    "allowlist",
    "public",
    "private",
    "distribution",
)


def absolute_local_paths(args: argparse.Namespace, names: Sequence[str] = PATH_FLAGS) -> None:
    """Makes every local path among ``args.<names>`` absolute (in place; ``scheme://`` paths unchanged).

    Beam's file system matches a bare relative glob (``part-*.tsv``, and the release's own
    ``PREFIX-?????-of-?????``) against nothing: its match lists the pattern's directory, which for a bare
    name is ``''``. And an SDK worker of a cluster (a worker pool, a TaskManager's harness) runs in a
    directory of its own, so a relative path would name another file there than here.
    """
    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, str) and value and "://" not in value:
            absolute = os.path.abspath(value)
            # a trailing slash says "a directory" (refused where a file is wanted): abspath drops it
            setattr(args, name, absolute + os.sep if value.endswith(os.sep) and absolute != os.sep else absolute)


def run_pipeline_main(
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
    none) and plots. With ``--profile PATH``, last, the run's NON-PRIVATE timing
    (:mod:`pipelines.profiling`): a JSON file and a table on stderr.
    """
    global last_result
    clock = profiling.RunClock()
    if "--diagnostics" not in parser._option_string_actions:  # noqa: SLF001 (a pipeline without add_input_args)
        observability.add_args(parser)
    args, beam_args = parser.parse_known_args(argv)
    check_unknown_args(parser, beam_args)
    absolute_local_paths(args)
    configure_logging(args.log_level)
    if args.evaluate_against and evaluation is None:
        parser.error(f"--evaluate_against is not supported by {parser.prog} (no item-level evaluation defined)")
    paths = outputs.RunPaths.of(args)
    try:
        params = make_params(args)
        # The output contract, before anything is built or written (pipelines/outputs.py).
        stale = outputs.check_contract(paths, overwrite=bool(getattr(args, "overwrite", False)))
        options = runner.pipeline_options(beam_args)
        pipeline = runner.make_pipeline(options)
        build_pipeline(pipeline, args, params)
        clock.mark("built")
    except ValueError as e:
        message = error_message(e)  # a documented error met while building (e.g. a bad --public file)
        if message is not None:
            print(f"error: {message}", file=sys.stderr)
            return 3
        parser.error(str(e))
    try:
        created = outputs.prepare_outputs(paths, stale)  # --overwrite's deletions, a write check of each directory
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    if stale:
        print(f"--overwrite: removed {len(stale)} file(s) of an earlier run", file=sys.stderr)
    if getattr(args, "skip_bad_records", False):
        print(
            "warning: --skip_bad_records: malformed records are skipped; how many is data-dependent and "
            "only written with --diagnostics PATH (non-private)",
            file=sys.stderr,
        )
    wait = runner.should_wait(options, args)
    written = paths.written()
    # Only a run we wait for can clean up after a failure; a submitted job writes its outputs later
    # (and listing gs:// paths from a Flex launcher or offline would need credentials).
    before = outputs.snapshot_outputs(written) if wait else {}
    release = outputs.shard_pattern(args.output)
    clock.mark("prepared")
    flink_plan.warn_if_flink_may_not_start(pipeline)  # a warning only: the run goes on
    try:
        progress = observability.ProgressDisplay(args.progress_interval if wait else 0, bool(args.diagnostics))
        with progress:
            last_result = runner.run(pipeline)
            clock.mark("submitted")
            if wait:
                last_result.wait_until_finish()
                clock.mark("finished")
    except (Exception, KeyboardInterrupt, Interrupted) as e:  # Beam wraps worker exceptions: the root cause
        removed = outputs.remove_new_outputs(written, before) if wait else []  # a failed run leaves no partial output
        outputs.remove_created_dirs(created if wait else [])
        signum = interrupt_signal(e)
        if signum is not None:
            stop_worker_processes()  # multi_processing's SDK workers would outlive us
            note = f"; removed {len(removed)} partial output file(s)" if removed else ""
            print(f"error: interrupted by {signal.Signals(signum).name}{note}", file=sys.stderr)
            return 128 + int(signum)
        if removed:
            print(f"removed {len(removed)} partial output file(s) of the failed run", file=sys.stderr)
        message = error_message(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 3

    def finish(code: int) -> int:
        if getattr(args, "profile", None):
            write_profile(args.profile, clock, parser.prog, pipeline, options, last_result, wait)
        return code

    if not wait:
        print(f"submitted without waiting; release: {release}  report: {args.report} (complete once it exists)")
        return finish(0)
    try:
        report = json.loads(outputs.read_text(args.report))
    except Exception:  # a remote runner may not have finished writing yet (templates, async jobs)
        print(f"release: {release}  report: {args.report}")
        return finish(0)
    print(summarize(report, args, params))
    if args.diagnostics:
        print(f"NON-PRIVATE diagnostics (exact input counts, not DP; keep private): {args.diagnostics}")
    if args.plots or args.evaluate_against:
        from dp_partition_beam.pipelines import reporting  # matplotlib and the evaluation job only when asked for

        for path in reporting.produce(report, args, options, evaluation, parser.prog):
            print(f"wrote {path}")
    return finish(0)


def write_profile(path: str, clock, command: str, pipeline, options, result, waited: bool) -> None:
    """``--profile PATH`` after a finished (or submitted) run: the NON-PRIVATE timing JSON at ``path`` and a
    table on stderr. Never fails the run: a profile that cannot be built or written is one warning line."""
    clock.mark("end")
    try:
        name, parallel = profiling.describe_runner(pipeline, options)
        profile = profiling.build_profile(clock, command, result, waited, name, parallel)
        profiling.write_profile(path, profile)
    except Exception as e:  # noqa: BLE001 - the release is complete; the profile is best effort
        print(f"warning: --profile: no profile written to {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return
    print(profiling.format_table(profile), file=sys.stderr)
    print(f"NON-PRIVATE timing profile (keep with the operator): {path}", file=sys.stderr)


class Interrupted(BaseException):
    """SIGTERM or SIGINT during a run: a BaseException, so no ``except Exception`` inside Beam swallows
    it; run_main removes the run's files and exits 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_INTERRUPTED_TEXT = re.compile(r"\bInterrupted: (\d+)|\bKeyboardInterrupt\b")


def interrupt_signal(exc: BaseException) -> Optional[int]:
    """The signal number if ``exc`` is (or wraps: Beam re-raises a DoFn's exception as a RuntimeError
    holding its text) an interruption by SIGTERM or SIGINT, else None."""
    for e in _chain(exc):
        if isinstance(e, Interrupted):
            return e.signum
        if isinstance(e, KeyboardInterrupt):
            return int(signal.SIGINT)
    found = _INTERRUPTED_TEXT.search("\n".join(str(e) for e in _chain(exc)))
    if found:
        return int(found.group(1)) if found.group(1) else int(signal.SIGINT)
    return None


def _descendants(pid: int) -> List[int]:
    """Process ids below ``pid`` (Linux /proc; [] where there is none)."""
    children: dict = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_worker_processes() -> None:
    """SIGTERM to every process this one started (the DirectRunner's multi_processing SDK workers):
    after an interruption nothing of the run may go on writing or hold the launcher open."""
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def exit_with(code: int) -> None:
    """The console scripts' exit: after an interruption (130, 143) without waiting for the threads
    Beam's runner left (they would keep the process alive), else ``sys.exit``."""
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


_previous_excepthook = threading.excepthook


def _quiet_worker_exits(args) -> None:
    """threading.excepthook after an interruption: the runner threads' reports of the worker
    processes we stopped are dropped, anything else goes to the previous hook."""
    if isinstance(args.exc_value, RuntimeError) and "Worker subprocess exited" in str(args.exc_value):
        return
    _previous_excepthook(args)


@contextlib.contextmanager
def interruptible():
    """SIGTERM and SIGINT stop the run's worker processes and raise :class:`Interrupted` in the main
    thread while the run lasts (then the previous handlers are back). Elsewhere than the main thread
    signals cannot be handled: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    unwound = threading.Event()

    def keep_stopping_workers():
        # The runner may start a worker after the signal (its worker threads run on: seen in CI, a
        # second multi_processing worker started while the first was stopped, and Beam's clean-up then
        # joined it forever); so until the run has unwound, every new worker process is stopped too.
        while not unwound.wait(0.25):
            stop_worker_processes()

    def on_signal(signum, frame):
        # First the runner's worker processes (multi_processing): Beam's clean-up joins them, and a
        # worker nobody tells to stop would hold the launcher open. The runner's threads that watched
        # them then fail with "Worker subprocess exited": expected now, not printed.
        if threading.excepthook is not _quiet_worker_exits:
            global _previous_excepthook
            _previous_excepthook = threading.excepthook
            threading.excepthook = _quiet_worker_exits
        stop_worker_processes()
        if not any(t.name == "stop-workers" for t in threading.enumerate()):
            threading.Thread(target=keep_stopping_workers, name="stop-workers", daemon=True).start()
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        unwound.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_allowlist_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--allowlist",
        default=None,
        metavar="FILE",
        help=f"a PUBLIC list of candidate {what}s, one per line (UTF-8 text; a file or glob, local or gs://): "
        f"{what}s outside it are dropped before selection. It must be fixed without looking at the private "
        "data; it changes neither the noise nor the thresholds (docs/counts.md)",
    )
