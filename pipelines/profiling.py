"""``--profile PATH``: where a run's wall time went (opt-in, NON-PRIVATE timing for the operator).

What is measured, and how:

* **Start-up** (:class:`RunClock`): from the process's start (Linux ``/proc/self/stat``, 10 ms ticks) to the
  CLI's entry - the interpreter and the imports when run as a command, everything the process did before
  in a longer-lived one (tests, notebooks) - then parsing, validation, the output contract and building the
  pipeline (``time.perf_counter``), and the outputs' preparation (``--overwrite``'s deletions, the write
  check of each directory).
* **The run**: ``pipeline.run()`` and ``wait_until_finish()`` (wall clock).
* **Stages**: Beam's own per-transform execution time, the monitoring counter
  ``beam:metric:ptransform_execution_time:total_msecs:v1`` (start, process and finish of a bundle, exclusive
  of the transforms downstream). Beam's FnApiRunner (the DirectRunner's ``in_memory``, ``multi_threading``
  and ``multi_processing`` modes) reports it from its state sampler, which samples the step each bundle is
  in (every 1 ms at a bundle's start, up to every 5 ms with our package loaded, Beam's own 200 ms without:
  transforms/core/harness.shorten_state_sampling): short steps are estimates, and the time after a
  bundle's last sample is attributed to no step. Groups of transforms (:func:`stage_group`) are summed; the
  run's wall minus their sum is ``runner_overhead_s``: time in no transform (fusion-stage boundaries,
  shuffles, encoding, scheduling, the unsampled ends of bundles). With parallel workers the stage sum is
  summed worker time and can exceed the wall; a note says so.
* **After the run**: the summary, evaluation and plots.

A runner that reports no such counter (Beam's portable job service, ``--runner PortableRunner``, forwards
none; a portable runner's ``metrics()`` are read in case its job service does) or a run not waited for
(``--no_wait``, templates) gives a profile with no stages and a note saying why. Nothing here can fail
a run: a profile that cannot be written is one warning line.

Privacy: wall times depend on the private data (its size, the number of released items of each round),
so the file is labelled ``"NON_PRIVATE_TIMING": true`` like ``--diagnostics``' counts and must stay with the
operator (never published next to the release). It holds times and Beam's step names only: no item, no
count of records or users.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Dict, List, Optional, Tuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

#: Beam's per-transform execution time (msecs): a monitoring counter in namespace "beam".
EXECUTION_TIME = "metric:ptransform_execution_time:total_msecs:v1"
BEAM_NAMESPACE = "beam"

#: Path components kept in a stage group (see :func:`stage_group`).
DEFAULT_DEPTH = 3
#: Groups printed in the stderr table (the JSON has them all).
TABLE_ROWS = 12

WARNING = (
    "NON-PRIVATE timing: wall times depend on the private input (its size, what each round releases). "
    "Not part of the differentially private release: keep it with the operator and never publish it."
)
#: The group of the FnApiRunner's own steps: a PCollection written and read between two fused stages.
BETWEEN_STAGES = "(runner: data between fused stages)"
OVERHEAD_LABEL = "no transform (runner overhead)"
OVERHEAD_NOTE = (
    "run wall minus the stage sum: time in no transform (fusion-stage boundaries, shuffles, encoding, "
    "scheduling, the unsampled ends of bundles), clamped at 0"
)
SAMPLING_NOTE = (
    "stage times are Beam's ptransform_execution_time counters, from a state sampler that samples the "
    "step each bundle is in every 1-5 ms (Beam's default 2-200 ms; transforms/core/harness.py): short steps "
    "are estimates; time after a bundle's last sample "
    "counts as runner overhead"
)

_NUMBERED = re.compile(r"[A-Za-z_]+?(\d+)[A-Za-z_]*")


# --------------------------------------------------------------------------------------------------
# Clock
# --------------------------------------------------------------------------------------------------


def process_age_s() -> Optional[float]:
    """Seconds since this process started (Linux: /proc/self/stat's start time in clock ticks since boot),
    or None where that is not available."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after "(comm)": field 3 onwards
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class RunClock:
    """Wall-clock marks of one CLI run (``time.perf_counter``), taken at the CLI's entry and after each
    phase: ``built`` (parsed, validated, pipeline built), ``prepared`` (outputs prepared), ``submitted``
    (``pipeline.run()`` returned), ``finished`` (waited for), ``end`` (summary, evaluation, plots done)."""

    def __init__(self):
        self.process_age_at_entry = process_age_s()
        self.entry = time.perf_counter()
        self.marks: Dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()

    def between(self, start: Optional[str], end: str) -> Optional[float]:
        """Seconds from mark ``start`` (None: the entry) to mark ``end``; None if either is missing."""
        t0 = self.entry if start is None else self.marks.get(start)
        t1 = self.marks.get(end)
        return None if t0 is None or t1 is None else max(0.0, t1 - t0)


# --------------------------------------------------------------------------------------------------
# Beam's counters, grouped
# --------------------------------------------------------------------------------------------------


def transform_msecs(result) -> Tuple[Optional[Dict[str, int]], Optional[str]]:
    """({full transform label: msecs}, None) from the run's counters, or (None, why) when the runner reports
    no execution-time counter.

    The FnApiRunner's result has them in ``monitoring_metrics()`` (its ``metrics()`` are the user's only);
    a portable runner's ``metrics()`` hold every metric its job service forwards, so those are read when
    there is no ``monitoring_metrics`` (Beam's own Python job service forwards none)."""
    query = getattr(result, "monitoring_metrics", None) or getattr(result, "metrics", None)
    kind = "monitoring metrics" if getattr(result, "monitoring_metrics", None) is not None else "metrics"
    if query is None:
        return None, f"the runner's result ({type(result).__name__}) has no metrics"
    try:
        counters = query().query()["counters"]
    except Exception as e:  # noqa: BLE001 - a runner's metrics are best effort here
        return None, f"the runner's {kind} could not be read ({type(e).__name__})"
    msecs: Dict[str, int] = {}
    for c in counters:
        name = c.key.metric
        if name.namespace != BEAM_NAMESPACE or name.name != EXECUTION_TIME or not c.key.step:
            continue
        value = c.committed if c.committed is not None else c.attempted
        msecs[c.key.step] = msecs.get(c.key.step, 0) + int(value or 0)
    if not msecs:
        return None, f"the runner's {kind} ({type(result).__name__}) hold no {EXECUTION_TIME} counters"
    return msecs, None


def stage_group(step: str, depth: int = DEFAULT_DEPTH) -> str:
    """The group of a transform label: its first ``depth`` path components, cut after the first numbered
    step below the top, which stands for all the steps of its parent carrying the same number.

    ``Select/MAD_SIPS/Users/ShardUsers`` -> ``Select/MAD_SIPS/Users``; ``Select/MAD_SIPS/Sets2Group/Read``,
    ``Select/MAD_SIPS/MADWeights2/Contrib`` and ``Select/MAD_SIPS/Status2`` -> ``Select/MAD_SIPS/*2*``
    (a selection's round 2); ``DPNE/L2/Run`` -> ``DPNE/*2*`` (DPNE's level 2). A numbered step is a word
    followed by a number (``Sets2``, ``L2``, ``Checkpoint2Pack``), not Beam's ``Write/0`` or
    ``Map(<lambda at core.py:4094>)``. The FnApiRunner's own steps (``ref_PCollection_.../Write``: data
    between fused stages) are one group, :data:`BETWEEN_STAGES`.
    """
    parts = step.split("/")
    if parts[0].startswith("ref_"):
        return BETWEEN_STAGES
    kept: List[str] = []
    for part in parts[: max(1, int(depth))]:
        numbered = _NUMBERED.fullmatch(part)
        if numbered and kept:
            kept.append(f"*{numbered.group(1)}*")
            break
        kept.append(part)
    return "/".join(kept)


def _seconds(msecs: float) -> float:
    return round(msecs / 1000.0, 3)


def group_stages(msecs: Dict[str, float], run_s: Optional[float], depth: int = DEFAULT_DEPTH) -> dict:
    """The profile's stage part from {transform label: msecs}: ``stages`` (groups, most time first, with
    their share of the run's wall), ``transforms`` (every label, most time first), ``stages_total_s`` and
    ``runner_overhead_s`` (run wall minus the stage sum, clamped at 0), and ``notes``.

    Regrouping a written profile at another depth::

        group_stages({t["step"]: 1000 * t["seconds"] for t in profile["transforms"]}, profile["run_s"], depth=2)
    """
    groups: Dict[str, List[float]] = {}
    for step, ms in msecs.items():
        groups.setdefault(stage_group(step, depth), []).append(float(ms))
    total_ms = sum(float(ms) for ms in msecs.values())

    def share(ms):
        return round(ms / 1000.0 / run_s, 4) if run_s else None

    stages = [
        {"group": g, "seconds": _seconds(sum(v)), "share_of_run": share(sum(v)), "transforms": len(v)}
        for g, v in groups.items()
    ]
    stages.sort(key=lambda s: (-s["seconds"], s["group"]))
    transforms = [{"step": step, "seconds": _seconds(ms)} for step, ms in msecs.items()]
    transforms.sort(key=lambda t: (-t["seconds"], t["step"]))
    notes = [SAMPLING_NOTE]
    overhead = None
    if run_s is not None:
        overhead = round(max(0.0, run_s - total_ms / 1000.0), 3)
        if total_ms / 1000.0 > run_s:
            notes.append(
                f"the stage sum ({_seconds(total_ms)} s) exceeds the run's wall ({round(run_s, 3)} s): it is "
                "summed over parallel workers (worker time, not wall time), so runner_overhead_s is clamped to 0"
            )
    return {
        "stages": stages,
        "stages_total_s": _seconds(total_ms),
        "runner_overhead_s": overhead,
        "runner_overhead_note": OVERHEAD_NOTE,
        "transforms": transforms,
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------------------------------


def describe_runner(pipeline, options) -> Tuple[str, bool]:
    """(the runner as the profile names it, whether its workers run in parallel)."""
    from apache_beam.options.pipeline_options import DirectOptions

    name = type(getattr(pipeline, "runner", None)).__name__
    if "Direct" not in name:
        return name, True  # remote or portable runners: several workers
    direct = options.view_as(DirectOptions)
    workers = direct.direct_num_workers
    return f"{name} ({direct.direct_running_mode}, direct_num_workers={workers})", workers != 1


def _r(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def build_profile(
    clock: RunClock,
    command: str,
    result=None,
    waited: bool = True,
    runner: Optional[str] = None,
    parallel: bool = False,
    depth: int = DEFAULT_DEPTH,
) -> dict:
    """The profile of a finished CLI run (``clock`` with its marks, ``result`` the PipelineResult)."""
    run_s = clock.between("prepared", "finished") if waited else None
    total = clock.between(None, "end")
    startup = {
        "process_start_to_cli_s": _r(clock.process_age_at_entry),
        "parse_validate_build_s": _r(clock.between(None, "built")),
        "prepare_outputs_s": _r(clock.between("built", "prepared")),
    }
    profile = {
        "NON_PRIVATE_TIMING": True,
        "warning": WARNING,
        "command": command,
        "runner": runner,
        "result": None if result is None else type(result).__name__,
        "waited": bool(waited),
        "startup": startup,
        "startup_note": "process_start_to_cli_s: from the process's start (/proc/self/stat) to the CLI's "
        "entry: interpreter start-up and imports for a command, everything the process did before in a "
        "longer-lived one (tests, notebooks); None where /proc is not available",
        "submit_s": _r(clock.between("prepared", "submitted")),
        "run_s": _r(run_s),
        "after_run_s": _r(clock.between("finished" if waited else "submitted", "end")),
        "total_wall_s": _r(total),
        "total_from_process_start_s": _r(
            None if clock.process_age_at_entry is None or total is None else clock.process_age_at_entry + total
        ),
        "grouping": {
            "depth": int(depth),
            "rule": "the first `depth` components of a transform's label, cut after the first numbered step "
            "below the top, which stands for all its parent's steps with that number (Select/MAD_SIPS/Sets2/..., "
            ".../MADWeights2/..., .../Status2 -> Select/MAD_SIPS/*2*: round 2; DPNE/L2/... -> DPNE/*2*: level 2); "
            f"the runner's ref_PCollection_* steps -> {BETWEEN_STAGES}",
        },
    }
    why = None
    msecs = None
    if not waited:
        why = "the run was not waited for (--no_wait, template launch): its stages ran after this launcher returned"
    elif result is not None:
        msecs, why = transform_msecs(result)
    else:
        why = "no pipeline result"
    if msecs is None:
        profile.update(
            stages=[],
            stages_total_s=None,
            runner_overhead_s=None,
            runner_overhead_note=OVERHEAD_NOTE,
            transforms=[],
            notes=[f"no stage times: {why}"],
        )
    else:
        profile.update(group_stages(msecs, run_s, depth))
        if parallel:
            profile["notes"].append(
                "parallel workers: the stage times are summed worker time, so the stage sum can exceed the "
                "run's wall and runner_overhead_s understates the time in no transform"
            )
    return profile


def format_table(profile: dict, rows: int = TABLE_ROWS) -> str:
    """A short text table of ``profile``: the start-up, the run, the top stage groups with their seconds and
    share of the run's wall, the rest summed, the runner overhead."""
    run_s = profile.get("run_s")
    st = profile["startup"]
    lines = [f"profile (NON-PRIVATE timing; keep with the operator): {profile['command']}, runner {profile['runner']}"]
    age = st.get("process_start_to_cli_s")
    head = f"  total {_fmt(profile.get('total_wall_s'))} s from the CLI's entry"
    if age is not None:
        head += f" (+ {_fmt(age)} s from the process's start: interpreter, imports)"
    lines.append(head)
    lines.append(
        f"  start-up {_fmt(st.get('parse_validate_build_s'))} s (parse, validate, build) + "
        f"{_fmt(st.get('prepare_outputs_s'))} s (prepare outputs); run {_fmt(run_s)} s; "
        f"after the run {_fmt(profile.get('after_run_s'))} s (summary, evaluation, plots)"
    )
    stages = profile.get("stages") or []
    if not stages:
        lines.extend(f"  {n}" for n in profile.get("notes", []))
        return "\n".join(lines)
    width = max(len(OVERHEAD_LABEL), *(len(s["group"]) for s in stages[:rows]))
    lines.append(f"  {'stage group':<{width}}  {'seconds':>8}  {'of run':>7}")

    def row(label, seconds):
        share = f"{100.0 * seconds / run_s:6.1f}%" if run_s else "      -"
        return f"  {label:<{width}}  {seconds:8.3f}  {share}"

    shown = [s for s in stages if s["seconds"] > 0][:rows]  # most time first; groups under 0.5 ms are summed
    for s in shown:
        lines.append(row(s["group"], s["seconds"]))
    rest = stages[len(shown) :]
    if rest:
        lines.append(row(f"({len(rest)} more groups)", round(sum(s["seconds"] for s in rest), 3)))
    if profile.get("runner_overhead_s") is not None:
        lines.append(row(OVERHEAD_LABEL, profile["runner_overhead_s"]))
    lines.extend(f"  note: {n}" for n in profile.get("notes", [])[1:])  # the first: the sampling, in the docs
    return "\n".join(lines)


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_profile(path: str, profile: dict) -> None:
    """Writes the profile as JSON to ``path`` (local or any Beam file system). A local file is written next
    to its destination and renamed into place, so it appears whole or not at all; an object store makes
    an object visible once it is complete."""
    text = json.dumps(profile, indent=2, sort_keys=True) + "\n"
    local = "://" not in path or path.startswith("file://")
    if local:
        target = path[len("file://") :] if path.startswith("file://") else path
        directory, name = os.path.split(target)
        tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(text.encode("utf-8"))
