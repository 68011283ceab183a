"""What a run writes: single-file outputs, the JSON report, and the clean-up of a failed run's files."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems


def params_report(params) -> Dict[str, Any]:
    """A params dataclass as the report prints it: every field (``dataclasses.asdict``), tuples as lists.

    The one place the report's parameter block comes from, so a new dataclass field is reported
    without touching the CLIs."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(params).items()}


def build_report(_, base: dict, round_counts: Dict[int, int], cap: Optional[int] = None) -> str:
    """The selection report: privacy parameters, per-round noise/threshold and released counts (DP outputs).

    With MAD-SIPS's adaptive cap (``cap``: the chosen cap, a DP output; ``base["_rounds_by_cap"]``: the
    rounds of every candidate cap) the report's ``cap`` and ``rounds`` are those of the run's cap.
    Nothing else about the data: exact input counts (e.g. skipped bad records) go to the opt-in
    NON-PRIVATE ``--diagnostics`` file only.
    """
    report = dict(base)
    by_cap = report.pop("_rounds_by_cap", None)
    planned = report.pop("_rounds")
    if by_cap is not None:
        planned = by_cap[int(cap)]
        report["cap"] = int(cap)
    rounds = []
    for r in planned:
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
