"""Plots of the report (``--plots DIR``) and NON-PRIVATE offline evaluation (``--evaluate_against``).

Plots of the report only show DP outputs (released counts per round / per n-gram length) and public
parameters. The evaluation reads the TRUE data: coverage of items by frequency (the MAD paper's
Figure 1: released items vs all items, binned by the number of distinct users holding the item). It
is an exact function of the private data - an offline, NON-PRIVATE evaluation for whoever may see
the raw data anyway; its JSON says so at the top.

A pipeline opts into evaluation by passing an :class:`Evaluation` to ``pipelines.cli.run_main``: its
``pairs(pipeline, path, args)`` returns a PCollection of (user, item-line) where item-line has the
exact format of its output lines (select_partitions: the item; extract_ngrams: ``k<TAB>n-gram``) and
its ``group(line)`` names the chart series (e.g. the n-gram length).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dp_partition_beam.pipelines import outputs, runner

EVAL_WARNING = (
    "NON-PRIVATE evaluation: computed from the true data (exact item frequencies). Not "
    "differentially private; for offline evaluation by people allowed to see the raw data."
)


@dataclass(frozen=True)
class Evaluation:
    """The ``--evaluate_against`` hook of a pipeline (see the module docstring).

    pairs: ``(pipeline, path, args) -> PCollection of (user, item-line)`` read from the TRUE data.
    group: ``item-line -> series name`` of the coverage chart.
    """

    pairs: Callable[[Any, str, Any], Any]
    group: Callable[[str], Any]


def frequency_bin(users: int) -> Tuple[int, int]:
    """[2^j, 2^(j+1)) bin of a user count (1, 2-3, 4-7, ...)."""
    lo = 1 << (max(int(users), 1).bit_length() - 1)
    return lo, 2 * lo - 1


# --- Beam part: true frequencies joined with the released lines -----------------------------------


def _bin_key(element, group_fn):
    line, grouped = element
    freqs, released = grouped["freq"], grouped["released"]
    is_released = bool(released)
    if not freqs:  # released but absent from the true data (DPNE's spurious n-grams)
        return (str(group_fn(line)), -1, -1), (0, 1 if is_released else 0)
    lo, hi = frequency_bin(freqs[0])
    return (str(group_fn(line)), lo, hi), (1, 1 if is_released else 0)


def _sum_pairs(pairs: Iterable[Tuple[int, int]]) -> Tuple[int, int]:
    total = released = 0
    for a, b in pairs:
        total += a
        released += b
    return total, released


class CoverageByFrequency(beam.PTransform):
    """(user, line) true pairs + released lines -> ((group, lo, hi), (items, released)) per bin.

    Bin (group, -1, -1) holds released lines absent from the true data.
    """

    def __init__(self, released, group_fn):
        super().__init__()
        self._released = released
        self._group_fn = group_fn

    def expand(self, pairs):
        freq = (
            pairs
            | "DistinctPairs" >> beam.Distinct()  # (user, line)
            | "Lines" >> beam.Values()  # line, once per user
            | "UsersPerLine" >> beam.combiners.Count.PerElement()  # (line, users)
        )
        released = self._released | "KeyReleased" >> beam.Map(lambda line: (line, 1))  # (line, 1)
        return (
            {"freq": freq, "released": released}
            | "Join" >> beam.CoGroupByKey()  # (line, {freq: [users], released: [1]})
            | "Bin" >> beam.Map(_bin_key, self._group_fn)  # ((group, lo, hi), (1, released?))
            | "SumPerBin" >> beam.CombinePerKey(_sum_pairs)  # ((group, lo, hi), (items, released))
        )


def _bins_json(_, bins: List, meta: dict) -> str:
    rows = []
    spurious = {}
    for (group, lo, hi), (items, released) in sorted(bins):
        if lo < 0:
            spurious[group] = released
            continue
        rows.append(
            {
                "group": group,
                "min_users": lo,
                "max_users": hi,
                "items": items,
                "released": released,
                "coverage": released / items if items else 0.0,
            }
        )
    out = {"NON_PRIVATE_EVALUATION": True, "warning": EVAL_WARNING, "bins": rows, "released_not_in_true_data": spurious}
    out.update(meta)
    return json.dumps(out, indent=2, sort_keys=True)


def drop_count(line: str) -> str:
    """``item-line<TAB>count`` -> ``item-line`` (outputs of --release_counts)."""
    return line.rsplit("\t", 1)[0]


def evaluation_path(report_path: str) -> str:
    return report_path + ".evaluation.json"


def run_evaluation(evaluation: Evaluation, args, options) -> str:
    """Runs the evaluation job (same Beam options as the main run); returns the JSON's path."""
    path = evaluation_path(args.report)
    p = runner.make_pipeline(options)
    pairs = evaluation.pairs(p, args.evaluate_against, args)  # (user, line)
    released = p | "ReadReleased" >> beam.io.ReadFromText(outputs.shard_pattern(args.output))  # line
    if getattr(args, "release_counts", False):  # item<TAB>count: the item line is what the truth has
        released = released | "DropCounts" >> beam.Map(drop_count)  # line
    bins = pairs | "Coverage" >> CoverageByFrequency(released, evaluation.group)
    meta = {"true_data": args.evaluate_against, "released_output": outputs.shard_pattern(args.output)}
    text = p | "Seed" >> beam.Create([None]) | "ToJson" >> beam.Map(_bins_json, beam.pvalue.AsList(bins), meta)
    _ = text | "Write" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)
    p.run().wait_until_finish()
    return path


# --- plots (matplotlib, 'plots' extra) --------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plots needs matplotlib: pip install -e '.[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def released_series(report: dict) -> Tuple[str, List[str], List[int], str]:
    """(x label, x tick labels, released counts, title) of the report's per-round/per-level releases."""
    if "rounds" in report:
        rounds = report["rounds"]
        labels = [
            f"round {r['round']}\nrho={r['threshold']:.3g}\nsigma={r['noise_scale']:.3g}"
            if r.get("noise_scale") is not None
            else f"round {r['round']}\nW50={r['threshold']:.3g}\nkeep table"  # threshold 'optimal'
            for r in rounds
        ]
        return (
            "round",
            labels,
            [int(r["released"]) for r in rounds],
            f"{report.get('algorithm')}: released items per round "
            f"(epsilon={report.get('epsilon'):g}, delta={report.get('delta'):g})",
        )
    if "levels" in report:
        levels = report["levels"]
        labels = [str(d.get("k", d.get("run"))) for d in levels]
        return (
            "n-gram length k",
            labels,
            [int(d["released"]) for d in levels],
            f"{report.get('algorithm')}: released n-grams per length "
            f"(epsilon={report.get('epsilon'):g}, delta={report.get('delta'):g})",
        )
    raise ValueError("report has neither 'rounds' nor 'levels': no released-count chart is defined for it")


def plot_released(report: dict, out_dir: str) -> str:
    plt = _pyplot()
    xlabel, labels, counts, title = released_series(report)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2), 4.2))
    bars = ax.bar(range(len(labels)), counts, color="#3b6ea8")
    ax.bar_label(bars, labels=[str(c) for c in counts], padding=2)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("released (DP output)")
    ax.set_ylim(0, max(counts + [1]) * 1.15)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, "released.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_coverage(evaluation: dict, out_dir: str) -> str:
    """MAD paper Figure 1 style: all vs released items per frequency bin, and the coverage fraction."""
    plt = _pyplot()
    groups: Dict[str, list] = {}
    for row in evaluation["bins"]:
        groups.setdefault(row["group"], []).append(row)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for group, rows in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        rows.sort(key=lambda r: r["min_users"])
        x = [r["min_users"] for r in rows]
        name = "" if group == "all" else f"k={group} "
        line = ax1.plot(x, [r["items"] for r in rows], marker="o", label=f"{name}all items")[0]
        shown = [(xi, r["released"]) for xi, r in zip(x, rows) if r["released"] > 0]  # log scale: no zeros
        ax1.plot(
            [a for a, _ in shown],
            [b for _, b in shown],
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{name}released",
        )
        ax2.plot(x, [r["coverage"] for r in rows], marker="o", label=name.strip() or "coverage")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("item frequency (distinct users, bin lower edge)")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("items")
    ax1.set_title("items by frequency: all vs released", fontsize=10)
    ax1.legend(fontsize=7)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("fraction released")
    ax2.set_title("coverage by frequency (NON-PRIVATE evaluation)", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, "coverage.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def produce(report: dict, args, options, evaluation, name: str) -> List[str]:
    """Evaluation (if --evaluate_against; ``evaluation`` is the pipeline's :class:`Evaluation` or None)
    and plots (if --plots) after a finished run of the pipeline ``name``; the paths written."""
    written = []
    evaluated = None
    if args.evaluate_against:
        if evaluation is None:
            raise SystemExit(f"--evaluate_against is not supported by {name}")
        path = run_evaluation(evaluation, args, options)
        with FileSystems.open(path) as f:
            evaluated = json.loads(f.read().decode("utf-8"))
        written.append(path)
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        if "rounds" in report or "levels" in report:
            written.append(plot_released(report, args.plots))
        else:
            print(f"note: no released-count chart is defined for {name}'s report", file=sys.stderr)
        if evaluated is not None:
            written.append(plot_coverage(evaluated, args.plots))
    return written
