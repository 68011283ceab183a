"""Progress display, stage logs and opt-in NON-PRIVATE diagnostics for the pipelines.

What leaves a run by default (the privacy contract of docs/design.md): the stage names and the elapsed
time (progress display, INFO logs). Nothing data-dependent: no item, no count of records, users or
pairs, in logs, Beam metrics, progress lines or the report.

``--diagnostics PATH`` (an explicit operator choice) adds, and only then:
  * Beam metrics counters in namespace ``diagnostics_non_private``: ``records_read``,
    ``malformed_records``, ``users`` and (select_partitions) ``pairs_after_bounding`` =
    sum over users of min(distinct items, Delta_0) - the pairs the first round of every selector
    keeps (MAD paper Alg. 1 line 1) - and ``<stage>_elements`` for each marked stage;
  * element counts per stage in the progress display;
  * a JSON file at PATH with those exact counts, top-level ``"NON_PRIVATE_DIAGNOSTICS": true`` and a
    warning. These numbers are exact functions of the private input: they are NOT differentially
    private and must stay with the operator (never publish them next to the released items).

``--profile PATH`` (an explicit operator choice, :mod:`pipelines.profiling`) writes, after a run, only then:
  * a JSON file at PATH with the run's wall times: start-up (process start, parse/validate/build), the
    run, and seconds per stage group from Beam's per-transform execution-time counters, with top-level
    ``"NON_PRIVATE_TIMING": true`` and a warning; the slowest groups as a table on stderr.
    Stage names and the total elapsed time already leave every run (above); per-stage times only with
    --profile. Wall times depend on the private data (its size, what each round releases): they are
    not part of the private release and must stay with the operator (never publish them next to it).
    No item and no count is in it; the Beam counters it reads exist on every FnApiRunner run anyway
    (Beam's own ``beam`` namespace, in the runner's result), --profile only writes them down.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from typing import Dict, Optional

import apache_beam as beam
from apache_beam.metrics import Metrics

_LOG = logging.getLogger(__name__)

NAMESPACE = "diagnostics_non_private"
WARNING = (
    "NON-PRIVATE diagnostics: exact counts computed from the private input. They are not "
    "differentially private; keep them with the operator and never publish them."
)

# Per-process progress registry: stage -> {"started": t, "elements": n}. Filled by StageMarker in
# the process that runs it (the launcher itself for the in-memory DirectRunner).
_PROGRESS: Dict[str, dict] = {}
_PROGRESS_LOCK = threading.Lock()


def add_args(parser: argparse.ArgumentParser) -> None:
    """--diagnostics, --profile, --progress_interval, --log_level, --no_wait, --plots, --evaluate_against,
    --overwrite."""
    g = parser.add_argument_group("observability and evaluation")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the files of an earlier run at the output paths (release shards PREFIX-SSSSS-of-NNNNN, "
        "report, diagnostics, profile, plots) before running; without it such files stop the run (exit 2). Other "
        "files starting with the --output prefix are never deleted",
    )
    g.add_argument(
        "--diagnostics",
        default=None,
        metavar="PATH",
        help="write NON-PRIVATE diagnostics (exact records read, malformed records, users, "
        "pairs after bounding, elements per stage) as JSON to PATH and enable the "
        "matching Beam counters. Not differentially private: for the operator only",
    )
    g.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="after the run, write NON-PRIVATE wall times as JSON to PATH (start-up, the run, seconds per "
        "stage group from Beam's execution-time counters, the runner's overhead) and print the slowest "
        "stages to stderr. Times depend on the data's size: for the operator only, never published",
    )
    g.add_argument(
        "--progress_interval",
        type=float,
        default=10.0,
        help="seconds between progress lines on local runs (stages, elapsed time); 0 disables",
    )
    g.add_argument(
        "--log_level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="WARNING (default): our warnings, progress and summary; Beam's own logs only at ERROR. "
        "INFO: also each stage as it starts (never items or counts) and Beam's INFO logs. DEBUG: ours at "
        "DEBUG, Beam's never below INFO (its DEBUG logs print elements)",
    )
    g.add_argument(
        "--no_wait",
        action="store_true",
        help="submit and return without waiting for the job (remote runners); implied on "
        "Flex Template launches and classic template creation (--template_location)",
    )
    g.add_argument(
        "--plots",
        default=None,
        metavar="DIR",
        help="write PNG charts of the report to DIR (needs the 'plots' extra: matplotlib)",
    )
    g.add_argument(
        "--evaluate_against",
        default=None,
        metavar="TRUE_DATA",
        help="NON-PRIVATE offline evaluation: read TRUE_DATA (same format and columns as "
        "--input), write coverage of items by frequency next to the report "
        "(<report>.evaluation.json) and, with --plots, a coverage chart",
    )


class StageMarker(beam.DoFn):
    """Pass-through that records that ``stage`` runs (INFO log once per process, progress display).

    With ``count=True`` (only under --diagnostics) it also counts the elements passing through:
    Beam counter ``<stage>_elements`` in namespace ``diagnostics_non_private`` and the progress line.
    """

    def __init__(self, stage: str, count: bool):
        self._stage = stage
        self._count = count
        self._counter = Metrics.counter(NAMESPACE, f"{stage}_elements") if count else None

    def start_bundle(self):
        with _PROGRESS_LOCK:
            if self._stage not in _PROGRESS:
                _PROGRESS[self._stage] = {"started": time.time(), "elements": 0}
                _LOG.info("stage %s running", self._stage)

    def process(self, element):
        if self._count:
            n = getattr(element, "num_rows", None)  # an Arrow batch counts its rows
            n = 1 if n is None else int(n)
            self._counter.inc(n)
            with _PROGRESS_LOCK:
                _PROGRESS[self._stage]["elements"] += n
        yield element


def mark(pcoll, stage: str, args):
    """``pcoll`` unchanged, with a ``Progress<stage>`` marker step (see :class:`StageMarker`)."""
    return pcoll | f"Progress{stage}" >> beam.ParDo(StageMarker(stage, bool(getattr(args, "diagnostics", None))))


def progress_line(elapsed: float, show_counts: bool, progress: Optional[Dict[str, dict]] = None) -> str:
    """One progress line: elapsed time and the stages started so far (element counts if asked)."""
    progress = _PROGRESS if progress is None else progress
    with _PROGRESS_LOCK:
        stages = sorted(progress.items(), key=lambda kv: kv[1]["started"])
        parts = [f"{s} ({d['elements']} elements)" if show_counts else s for s, d in stages]
    return f"[progress] {elapsed:7.1f}s elapsed; stages started: {', '.join(parts) if parts else '-'}"


class ProgressDisplay:
    """Context manager printing :func:`progress_line` to stderr every ``interval`` seconds.

    Stage information comes from :class:`StageMarker` in this process, i.e. the in-memory
    DirectRunner; with multi-process or remote runners the line shows the elapsed time only.
    """

    def __init__(self, interval: float, show_counts: bool, stream=None):
        self._interval = interval
        self._show_counts = show_counts
        self._stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread = None
        self._t0 = 0.0

    def __enter__(self):
        with _PROGRESS_LOCK:
            _PROGRESS.clear()
        self._t0 = time.time()
        if self._interval > 0:
            self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self._interval):
            print(progress_line(time.time() - self._t0, self._show_counts), file=self._stream, flush=True)

    def __exit__(self, exc_type, exc, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            how = "finished" if exc_type is None else "stopped"
            print(
                progress_line(time.time() - self._t0, self._show_counts).replace("elapsed;", f"elapsed ({how});"),
                file=self._stream,
                flush=True,
            )
        return False


# --- NON-PRIVATE diagnostics branch (only built with --diagnostics) -------------------------------


class PublishCounter(beam.DoFn):
    """value -> value; adds it to the Beam counter ``name`` (namespace diagnostics_non_private)."""

    def __init__(self, name: str):
        self._name = name
        self._counter = Metrics.counter(NAMESPACE, name)

    def process(self, value):
        self._counter.inc(int(value))
        yield value


def _capped(user_degree, cap: int) -> int:
    return min(int(user_degree[1]), cap)


def _diagnostics_json(_, pipeline_name: str, extra: dict, **counts) -> str:
    report = {"NON_PRIVATE_DIAGNOSTICS": True, "warning": WARNING, "pipeline": pipeline_name}
    report.update(extra)
    report["counts"] = {k: int(v) for k, v in sorted(counts.items())}
    return json.dumps(report, indent=2, sort_keys=True)


def attach_diagnostics(
    pipeline: beam.Pipeline, read, args, pipeline_name: str, max_contributions: Optional[int] = None
):
    """Adds the NON-PRIVATE diagnostics branch when ``args.diagnostics`` is set; else nothing.

    ``read`` is a :class:`pipelines.io.RecordsRead` (``records``: (user, value), ``bad``: numbers
    of skipped records, summed here). ``max_contributions`` (Delta_0) adds pairs_after_bounding.
    """
    if not getattr(args, "diagnostics", None):
        return None
    records = read.records
    per_user = (
        records
        | "DiagDistinctPairs" >> beam.Distinct()  # (user, value), distinct
        | "DiagUsers" >> beam.Keys()  # user, once per distinct value
        | "DiagDegree" >> beam.combiners.Count.PerElement()  # (user, distinct values)
    )
    counts = {
        "records_read": records | "DiagCountRecords" >> beam.combiners.Count.Globally(),  # n
        "malformed_records": read.bad | "DiagCountBad" >> beam.CombineGlobally(sum),  # n
        "users": per_user | "DiagCountUsers" >> beam.combiners.Count.Globally(),  # n
    }
    extra = {}
    if max_contributions is not None:
        counts["pairs_after_bounding"] = (
            per_user
            | "DiagCap" >> beam.Map(_capped, int(max_contributions))  # min(d_u, Delta_0)
            | "DiagSumCapped" >> beam.CombineGlobally(sum)  # n
        )
        extra["max_contributions"] = int(max_contributions)
    published = {
        name: pc | f"DiagCounter_{name}" >> beam.ParDo(PublishCounter(name))  # n
        for name, pc in counts.items()
    }
    diag = (
        pipeline
        | "DiagSeed" >> beam.Create([None])
        | "DiagBuild"
        >> beam.Map(
            _diagnostics_json,
            pipeline_name,
            extra,
            **{name: beam.pvalue.AsSingleton(pc) for name, pc in published.items()},
        )
    )  # JSON text
    return diag | "DiagWrite" >> beam.io.WriteToText(args.diagnostics, shard_name_template="", num_shards=1)
