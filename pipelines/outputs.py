"""What a run writes: the output contract, single-file outputs, the JSON report (written last, listing
the release's shards), and the clean-up of a failed or interrupted run's files."""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import hashlib
import json
import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems


def params_report(params) -> Dict[str, Any]:
    """A params dataclass as the report prints it: every field (``dataclasses.asdict``), tuples as lists.

    The one place the report's parameter block comes from, so a new dataclass field is reported
    without touching the CLIs."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(params).items()}


@dataclasses.dataclass(frozen=True)
class PlanReports:
    """The plan's part of the report for every (cap, weight cap) a run can choose, without the plan itself
    (a keep table is ~340 KB pickled, docs/columnar.md): the report step holds this.

    Attributes:
      by_cap: {cap: :meth:`SelectionPlan.as_report`} for every value of the adaptive cap's grid (else
        {None: ...}); with ``weight_cap='auto'``, the reports of the candidate 1 (no cap).
      weight_caps: ``weight_cap='auto'``'s ``privacy.cap.WeightCapPlan`` without tables, or None. The report of
        the chosen weight cap swaps in its last round (:meth:`report`), whose table is built from the
        candidate's spec where the report is made: the tables of the candidates not chosen are never built.
    """

    by_cap: Dict[Optional[int], dict]
    weight_caps: Optional[Any] = None

    def report(self, cap=None, weight_cap=None) -> dict:
        """:meth:`SelectionPlan.as_report` of ``cap`` and ``weight_cap`` (None where the plan has no choice)."""
        report = dict(self.by_cap[None if cap is None else int(cap)])
        if self.weight_caps is not None:  # as SelectionPlan.rounds_for: the chosen candidate's last round
            report["rounds"] = report["rounds"][:-1] + [self.weight_caps.last_round(weight_cap).as_report()]
            report["chosen_weight_cap"] = float(weight_cap)
        return report


def plan_reports(plan) -> PlanReports:
    """The :class:`PlanReports` of a :class:`privacy.selection.SelectionPlan`, computed before the run."""
    caps = (None,) if plan.cap is None else tuple(plan.cap.grid)
    if plan.weight_caps is None:
        return PlanReports({cap: plan.as_report(cap) for cap in caps})
    one = max(plan.weight_caps.candidates)  # the plan's own last round (no cap): no table is built here
    return PlanReports({cap: plan.as_report(cap, one) for cap in caps}, plan.weight_caps.without_tables())


def build_report(
    _,
    base: dict,
    reports: PlanReports,
    round_counts: Dict[int, int],
    cap=None,
    weight_cap=None,
) -> str:
    """The selection report: privacy parameters, per-round noise/threshold and released counts (DP outputs).

    ``reports`` is :func:`plan_reports` of the run's :class:`privacy.selection.SelectionPlan`: for ``cap``
    and ``weight_cap`` (the choices of the noisy degree histogram, DP outputs, when the plan has an adaptive
    cap or ``weight_cap='auto'``; else None) the rounds, the count release's plan and the histogram's. Nothing
    else about the data: exact input counts (e.g. skipped bad records) go to the opt-in NON-PRIVATE
    ``--diagnostics`` file only.
    """
    report = {**base, **reports.report(cap, weight_cap)}
    rounds = []
    for r in report["rounds"]:
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
            for d in glob.glob(os.path.join(directory, f"beam-temp-{name}*")):
                if os.path.isdir(d) and not os.listdir(d):
                    os.rmdir(d)
    return stale


# --------------------------------------------------------------------------------------------------
# The output contract (issue 27): checked before the pipeline is built
# --------------------------------------------------------------------------------------------------

#: Beam's default shard names: ``PREFIX-00000-of-00003`` (WriteToText's ``-SSSSS-of-NNNNN``).
SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}")
#: The glob of a prefix's shards (what a consumer reads; never ``PREFIX*``, which takes any file).
SHARD_GLOB = "-?????-of-?????"


class OutputContractError(ValueError):
    """An output path breaks the output contract (a directory, empty, overlapping an input or another
    output, or files of an earlier run in the way): the run stops before anything runs (exit 2)."""


class OutputWriteError(OSError):
    """An output location cannot be written (no permission, not a directory, disk full): exit 3."""


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Every path a run reads or writes, by role: what the output contract is checked on.

    ``inputs``: {flag: path or glob} of what the run reads; ``prefix``: (flag, prefix) of the sharded
    release; ``files``: {flag: path} of single-file outputs (report, diagnostics, profile, evaluation);
    ``plots``: a directory the charts go to (or None) and ``plot_files`` the names written there.
    """

    inputs: Dict[str, str]
    prefix: Tuple[str, str]
    files: Dict[str, str]
    plots: Optional[str] = None
    plot_files: Tuple[str, ...] = ("released.png", "coverage.png")

    @classmethod
    def of(cls, args) -> "RunPaths":
        """The paths of a parsed command line (the flags every release CLI shares)."""
        inputs = {
            f"--{flag}": getattr(args, flag)
            for flag in ("input", "private", "allowlist", "public", "evaluate_against")
            if getattr(args, flag, None)
        }
        files = {"--report": args.report}
        if getattr(args, "diagnostics", None) is not None:
            files["--diagnostics"] = args.diagnostics
        if getattr(args, "profile", None) is not None:
            files["--profile"] = args.profile
        if getattr(args, "evaluate_against", None) and args.report:
            files["evaluation"] = args.report + ".evaluation.json"
        return cls(inputs, ("--output", args.output), files, getattr(args, "plots", None))

    def written(self) -> List[str]:
        """Prefixes of everything the pipeline writes (for the clean-up of a failed run)."""
        return [self.prefix[1], *self.files.values()]

    def own_files(self) -> List[str]:
        """The fixed paths this run writes (the prefix's shards aside)."""
        out = list(self.files.values())
        if self.plots:
            out += [os.path.join(self.plots, name) for name in self.plot_files]
        return out


def shard_pattern(prefix: str) -> str:
    """The glob of a release's shards: ``PREFIX-?????-of-?????``."""
    return prefix + SHARD_GLOB


def _is_shard_of(path: str, prefix: str) -> bool:
    """``path`` is ``prefix-SSSSS-of-NNNNN`` (a shard of the release at ``prefix``, of any count)."""
    rest = path[len(prefix) :]
    return path.startswith(prefix) and rest.startswith("-") and bool(SHARD_SUFFIX.fullmatch(rest))


def _norm(path: str) -> str:
    """A comparable form of a path: absolute and with symlinks resolved for local paths."""
    if is_local_path(path):
        path = path[len("file://") :] if path.startswith("file://") else path
        return os.path.realpath(path)
    return path


def _ends_in_separator(path: str) -> bool:
    return path.endswith("/") or path.endswith(os.sep)


def _local_matches(pattern: str) -> List[str]:
    """Existing local files matching a path or glob (realpaths); [] for remote patterns."""
    if not is_local_path(pattern):
        return []
    pattern = pattern[len("file://") :] if pattern.startswith("file://") else pattern
    return sorted({os.path.realpath(p) for p in glob.glob(pattern)})


def check_contract(paths: RunPaths, overwrite: bool = False) -> List[str]:
    """Checks the output contract before anything runs; returns the files ``overwrite`` removes.

    Raises :class:`OutputContractError` (one line, naming the flag and the path) when:
      * a single-file output (``--report``, ``--diagnostics``, ``--profile``) is empty, ends in ``/`` or is an
        existing directory (Beam's file sink would delete the directory, recursively);
      * ``--output`` is empty or ends in ``/`` (it is a file-name prefix: ``out/items``);
      * an output equals or overlaps an input: a single-file output is an input file or matches an
        input glob; an input file starts with the ``--output`` prefix; the release's shards would
        match an input glob (a later run would read the release as input);
      * two outputs overlap: equal single-file outputs, or one named like a shard of the release
        (``PREFIX-SSSSS-of-NNNNN``: it would be read as part of the release);
      * files are in the way (local paths): a file starting with the ``--output`` prefix, or an
        existing report/diagnostics/profile/plot file. With ``overwrite`` the run's own kinds of file (shards
        ``PREFIX-SSSSS-of-NNNNN``, the report, diagnostics, profile, evaluation and plot files) are returned to
        be removed; any other file starting with the prefix stays an error.

    Remote paths (``gs://``, ...) get the string checks only: listing them from the launcher would
    need credentials (and hangs offline), so a remote run relies on the report, which lists the shards
    it belongs to (:func:`list_shards`).
    """
    flag, prefix = paths.prefix
    if not prefix or not prefix.strip():
        raise OutputContractError(f"{flag} must not be empty (a file-name prefix such as out/items)")
    if _ends_in_separator(prefix):
        raise OutputContractError(
            f"{flag} {prefix!r} ends in '/': it is a file-name prefix such as {prefix.rstrip('/')}/items, "
            "not a directory"
        )
    for name, path in paths.files.items():
        if path is None or not path.strip():
            raise OutputContractError(f"{name} must not be empty (a file path such as out/report.json)")
        if _ends_in_separator(path):
            raise OutputContractError(f"{name} {path!r} ends in '/': it must be a file path, not a directory")
        if is_local_path(path) and os.path.isdir(_norm(path)):
            raise OutputContractError(
                f"{name} {path!r} is an existing directory: it must be a file path (the run would replace "
                "the directory and everything in it)"
            )
    if paths.plots is not None:
        if not paths.plots.strip():
            raise OutputContractError("--plots must not be empty (a directory such as out/plots)")
        if is_local_path(paths.plots) and os.path.exists(_norm(paths.plots)) and not os.path.isdir(_norm(paths.plots)):
            raise OutputContractError(f"--plots {paths.plots!r} is an existing file: it must be a directory")
    # outputs against each other
    singles = [(name, path) for name, path in paths.files.items()]
    singles += [("--plots", os.path.join(paths.plots, f)) for f in paths.plot_files] if paths.plots else []
    seen: Dict[str, str] = {}
    norm_prefix = _norm(prefix)
    for name, path in singles:
        n = _norm(path)
        if n in seen:
            raise OutputContractError(f"{name} and {seen[n]} name the same file {path!r}")
        seen[n] = name
        if _is_shard_of(n, norm_prefix):
            raise OutputContractError(
                f"{name} {path!r} is named like a shard of the release ({flag} {prefix!r}: "
                f"{shard_pattern(prefix)}); it would be read as part of it"
            )
    # outputs against inputs
    shards = shard_pattern(prefix)
    for in_flag, pattern in paths.inputs.items():
        matched = _local_matches(pattern)
        for name, path in [*singles, (flag, shards)]:
            n = _norm(path)
            if n == _norm(pattern) or n in matched or (name != flag and fnmatch.fnmatch(n, _norm(pattern))):
                raise OutputContractError(
                    f"{name} {path!r} is an input ({in_flag} {pattern!r}): it would be overwritten"
                )
            if name == flag and fnmatch.fnmatch(_norm(prefix) + "-00000-of-00001", _norm(pattern)):
                raise OutputContractError(
                    f"{flag} {prefix!r}: the release's files would match {in_flag} {pattern!r} (a later run "
                    "would read the release as input); write it elsewhere"
                )
        inside = [m for m in matched if m.startswith(norm_prefix)]
        if inside:
            raise OutputContractError(
                f"{in_flag} file {inside[0]!r} starts with the {flag} prefix {prefix!r}: it would be read as "
                "part of the release; choose another prefix"
            )
    # files in the way (local paths only)
    remove: List[str] = []
    foreign: List[str] = []
    if is_local_path(prefix):
        own = {_norm(p) for p in paths.own_files() if is_local_path(p)}
        for path in _local_matches(glob.escape(_norm(prefix)) + "*"):
            if os.path.isdir(path):
                foreign.append(path)
            elif _is_shard_of(path, norm_prefix):
                remove.append(path)
            elif path not in own:  # e.g. --report out/items_report.json: this run's own, checked below
                foreign.append(path)
    for path in paths.own_files():
        if is_local_path(path) and os.path.isfile(_norm(path)):
            remove.append(_norm(path))
    if foreign:
        raise OutputContractError(
            f"{flag} {prefix!r}: {_listing(foreign)} start(s) with the prefix but is not a release shard of this "
            "command (it would be read as part of the release); move it or choose another prefix"
        )
    if remove and not overwrite:
        raise OutputContractError(
            f"output files of an earlier run are in the way: {_listing(sorted(remove))}; remove them, choose "
            "other output paths, or pass --overwrite to delete them before the run"
        )
    return sorted(set(remove))


def _listing(paths: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def prepare_outputs(paths: RunPaths, remove: Sequence[str]) -> List[str]:
    """Removes ``remove`` (the earlier run's files, ``--overwrite``) and checks that every local output
    directory can be created and written (one line, :class:`OutputWriteError`, before anything runs).

    Returns the directories it created (parents first), for :func:`remove_created_dirs` after a run
    that failed or was interrupted."""
    for path in remove:
        os.remove(path)
    directories = {
        os.path.dirname(_norm(p)) or "." for p in [paths.prefix[1], *paths.files.values()] if is_local_path(p)
    }
    if paths.plots and is_local_path(paths.plots):
        directories.add(_norm(paths.plots))
    created: List[str] = []
    for directory in sorted(directories):
        missing, d = [], directory
        while d and not os.path.exists(d):
            missing.append(d)
            d = os.path.dirname(d)
        try:
            os.makedirs(directory, exist_ok=True)
            created += [m for m in reversed(missing) if m not in created]
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".dp-write-check-"):
                pass
        except OSError as e:
            remove_created_dirs(created)
            blocker = next((a for a in _ancestors(directory) if os.path.exists(a) and not os.path.isdir(a)), None)
            why = f"{blocker} is a file, not a directory" if blocker else (e.strerror or str(e))
            raise OutputWriteError(f"cannot write to {directory}: {why}") from None
    return created


def _ancestors(path: str) -> List[str]:
    """``path`` and its parents, outermost first."""
    out = [path]
    while os.path.dirname(out[-1]) not in ("", out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out[::-1]


def remove_created_dirs(created: Sequence[str]) -> None:
    """Removes the directories :func:`prepare_outputs` created, deepest first, where they are empty."""
    for d in sorted(created, key=len, reverse=True):
        try:
            os.rmdir(d)
        except OSError:  # not empty (or gone): it stays
            pass


def list_shards(_, prefix: str, *written) -> List[dict]:
    """The shards of the release at ``prefix`` once they are final: ``[{path, bytes, sha256}]``.

    ``written`` are side inputs (the file names each write step finalised) that make the report step
    wait for every output; the listing is by :func:`shard_pattern` (a retried finalisation does not
    re-emit the shards it had already renamed). Every shard ``0..N-1`` of one ``-of-N`` must be there.
    """
    found = sorted(m.path for r in FileSystems.match([shard_pattern(prefix)]) for m in r.metadata_list)
    totals = {int(p[-5:]) for p in found}
    if len(totals) != 1 or len(found) != next(iter(totals)):
        raise OutputWriteError(f"the release's shards {shard_pattern(prefix)} are incomplete or mixed: {found}")
    shards = []
    for path in found:
        digest, size = hashlib.sha256(), 0
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        shards.append({"path": path, "bytes": size, "sha256": digest.hexdigest()})
    return shards


def add_outputs(report_text: str, shards: List[dict], prefix: str) -> str:
    """The report with its ``outputs`` block: the release's shard pattern and every shard (path,
    bytes, sha256). Written last, atomically: a report that exists marks a complete run."""
    report = json.loads(report_text)
    report["outputs"] = {
        "release": shard_pattern(prefix),
        "num_shards": len(shards),
        "shards": shards,
        "complete": True,
    }
    return json.dumps(report, indent=2, sort_keys=True)


def write_report(report, args, written: Sequence) -> None:
    """Writes the report (a one-element PCollection of JSON text) to ``args.report`` after everything in
    ``written`` (the results of the run's write steps, e.g. ``WriteToText``'s finalised file names) is
    final, with the ``outputs`` block of :func:`add_outputs`.

    Beam's file sink renames the finished file into place, so the report appears whole or not at all;
    it depends on the release's shards (side inputs), so it is the last output of the run. On any
    runner: no launcher-side step is needed, so a submitted job (``--no_wait``, templates) gets it too.
    """
    waits = [beam.pvalue.AsList(w) for w in written if w is not None]
    shards = (
        report.pipeline
        | "ShardsSeed" >> beam.Create([None])
        | "ListShards" >> beam.Map(list_shards, args.output, *waits)  # [{path, bytes, sha256}]
    )
    final = report | "AddOutputs" >> beam.Map(add_outputs, beam.pvalue.AsSingleton(shards), args.output)  # JSON
    write_single_file(final, args.report, "WriteReport")
