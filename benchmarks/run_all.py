"""All benchmarks in one command: utility, speed and scaling of every algorithm vs PipelineDP and OpenDP.

    .venv/bin/python -m benchmarks.run_all            # full run (see BENCHMARKS.md for its wall time)
    .venv/bin/python -m benchmarks.run_all --quick    # reduced sizes and seeds, a few minutes
    .venv/bin/python -m benchmarks.run_all --utility_only --docs   # utility part only (no timing)

Writes to ``--out`` (default benchmarks/results/): utility.csv, speed.csv, scaling.csv, summary.md
(every table, the targets of issue 8 and whether this run met them), coverage.png and scaling.png;
``--docs`` also rewrites BENCHMARKS.md from summary.md. Prints the tables as it goes.
``--utility_only`` re-measures only the utility part (released items and coverage; no wall times)
and rewrites utility.csv and coverage.png; summary.md (and BENCHMARKS.md) then combine it with the
speed and scaling tables of the last full run, read back from speed.csv and scaling.csv in ``--out``
and labelled with that run's date and command (run_info.json).

Every tool runs at the same (epsilon, delta) and per-user cap (our Delta_0 = PipelineDP's
max_partitions_contributed = the items the OpenDP peer keeps per user), on the same input. Ours and
PipelineDP run on the same Beam DirectRunner with a pinned running mode. The second peer,
``opendp_gaussian`` (benchmarks/peer_opendp.py), is OpenDP's Polars key release (Context API, user as
privacy unit, integer Gaussian noise and threshold, zCDP converted to (epsilon, delta)-DP): a fast
single process, no Beam (its mode column reads ``polars``). The peers need the ``bench`` extra
(``--no-peers`` runs without them).

Utility (released items, mean and std over seeds; coverage of items held by >= K users, the MAD
paper's Figure 1): our algorithms on the in-memory reference (transforms/reference.py releases
exactly what the Beam transforms release under the same seed: tests/transforms/*/test_*_beam.py), PipelineDP on
its LocalBackend (the same DPEngine code as on Beam; its noise is unseeded), OpenDP on the same pairs
as a Polars DataFrame (unseeded too). Datasets: the bundled
sample (debian_words: data/debian_words.tsv.gz, Debian changelogs), the full commits corpus
(commits_full: --corpus, default commits.user_words.tsv.gz of the shared data folder,
benchmarks/shared_data.py; 1.5M (user, word) pairs, read at run time, never bundled; the run fails
up front with a message naming the file if it is absent), the MAD paper's section 6.2 instance, Zipf data.

Speed (wall time, pairs/s, peak RSS): Zipf data generated inside the pipeline (bench_select), one
fresh subprocess per run so the peak RSS is that run's (max over the process and its children,
i.e. the largest single process for multi_processing). Ours run seeded so every mode's output is
checked against the reference ("== ref"). The OpenDP peer gets the same rows (zipf_table_of_chunk of
the same chunks), generated in its own subprocess (``python -m benchmarks.peer_opendp``, which imports
no Beam); its wall time covers generating them, OpenDP's parameter search and the query
(peer_opendp.zipf_run), like the Beam tools' covers generating their input and selecting.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks import bench_mad, bench_select
from benchmarks.peer_opendp import OPENDP_MODE, OPENDP_TOOL, own_peak_rss_kb  # (its runs import no Beam)
from benchmarks.peers import PEER_STRATEGIES
from benchmarks.shared_data import read_user_sets, shared_data_path
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.testing.synthetic import zipf_pair_count

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EPSILON, DELTA = 1.0, 1e-5
COVERAGE_K = (10, 20, 50, 100, 200)
CORPUS_FILE = "commits.user_words.tsv.gz"  # commits_full, in the shared data folder
# The parallel algorithms of the MAD paper (the l2-bounded ones the 2x-vs-PipelineDP target is about);
# the other algorithms of privacy.params.ALGORITHMS (DPSU baselines, sequential policies) are listed too.
PARALLEL = ("basic", "mad", "mad2r", "dp_sips")
# PipelineDP's weighted Gaussian calibrates per partition (~20 ms/item, benchmarks/peers.py): it
# runs only on datasets with few items.
SLOW_PEERS = {"pdp_weighted_gaussian": 5_000}
# The peers: PipelineDP's strategies (on our runner) and OpenDP's Polars key release (its own process).
PEERS = (*PEER_STRATEGIES, OPENDP_TOOL)
# Speed-only baseline: the same pipeline that only generates and counts the pairs (bench_select.ReadInputOnly),
# i.e. the per-element floor of the runner that every tool pays before doing anything.
READ_INPUT = "read_input"
FAILURES = []  # speed runs that failed (listed in the summary instead of aborting the whole run)

FULL = dict(
    seeds=5,
    utility=[
        ("debian_words", (1, 5, 20, 100)),
        ("section62", (100,)),
        ("commits_full", (20, 100)),
        ("zipf_1M", (100,)),
    ],
    # (pairs, tools, modes): 16M only for the scaling of basic, mad, mad2r and the peers' Gaussians. The
    # OpenDP peer runs once per size in its own mode (polars) whatever the Beam modes listed (tool_modes).
    speed=[
        (1e6, "all", ("reference", "in_memory")),
        (1e6, (READ_INPUT,), ("in_memory",)),
        (1e6, ("basic", "mad", "pdp_gaussian"), ("multi_processing",)),
        (4e6, ("basic", "mad", "mad2r", "pdp_gaussian", OPENDP_TOOL), ("reference", "in_memory")),
        (4e6, (READ_INPUT,), ("in_memory",)),
        (4e6, ("basic", "mad", "pdp_gaussian"), ("multi_processing",)),
        (16e6, ("basic", "mad", "mad2r", "pdp_gaussian", OPENDP_TOOL, READ_INPUT), ("in_memory",)),
    ],
    users_per_chunk=10_000,
    slow_peers=True,
    reps=3,
)
QUICK = dict(
    seeds=2,
    utility=[("debian_words", (5, 100)), ("section62", (100,))],
    speed=[
        (1e5, "all", ("reference", "in_memory")),
        (1e5, ("basic", "pdp_gaussian"), ("multi_processing",)),
        (2e5, ("basic", "mad", "mad2r", "pdp_gaussian", OPENDP_TOOL, READ_INPUT), ("in_memory",)),
        (4e5, ("basic", "pdp_gaussian", OPENDP_TOOL, READ_INPUT), ("in_memory",)),
    ],
    users_per_chunk=2_000,
    slow_peers=False,  # PipelineDP's weighted Gaussian alone takes ~30 s per seed on section62
)


def our_algorithms():
    return list(ALGORITHMS)


def is_parallel(algorithm):
    return algorithm in PARALLEL


def is_peer(tool):
    return tool in PEERS


# ----------------------------------------------------------------------------------------- datasets
def load_sets(name, corpus):
    """dict user -> [item] (distinct)."""
    if name in ("debian_words", "section62"):
        return bench_mad.load_dataset(name)
    if name == "commits_full":
        return read_user_sets(corpus)
    if name.startswith("zipf_"):
        n_chunks = max(1, round(_size(name[5:]) / (bench_select.USERS_PER_CHUNK * 10)))
        return reference.user_sets_from_pairs(bench_select.zipf_pairs(n_chunks, bench_select.USERS_PER_CHUNK))
    raise ValueError(f"unknown dataset {name!r}")


def _size(text):
    return float(text[:-1]) * {"k": 1e3, "M": 1e6}[text[-1]]


def user_counts(sets):
    counts = {}
    for items in sets.values():
        for i in items:
            counts[i] = counts.get(i, 0) + 1
    return counts


def coverage(released, counts, k):
    """Fraction of the items held by >= k users that were released (NaN if there are none)."""
    held = [i for i, c in counts.items() if c >= k]
    if not held:
        return float("nan")
    return sum(1 for i in held if i in released) / len(held)


# ------------------------------------------------------------------------------------------ utility
def released_items(tool, sets, pairs, k, seed):
    if tool == OPENDP_TOOL:
        from benchmarks.peer_opendp import release_keys

        return release_keys(pairs, EPSILON, DELTA, k)
    if tool.startswith("pdp_"):
        from benchmarks.peers import select_local

        return select_local(pairs, tool, EPSILON, DELTA, k)
    params = SelectionParams(epsilon=EPSILON, delta=DELTA, max_contributions=k)
    return reference.select(sets, tool, params, seed=seed)


def run_utility(cfg, corpus, tools, log):
    rows = []
    for name, ks in cfg["utility"]:
        sets = load_sets(name, corpus)
        pairs = [(u, i) for u, items in sets.items() for i in items]
        counts = user_counts(sets)
        for k in ks:
            for tool in tools:
                if tool in SLOW_PEERS and (not cfg["slow_peers"] or len(counts) > SLOW_PEERS[tool]):
                    continue
                t0 = time.perf_counter()
                sizes, covs = [], []
                for seed in range(cfg["seeds"]):
                    rel = released_items(tool, sets, pairs, k, seed)
                    sizes.append(len(rel))
                    covs.append([coverage(rel, counts, c) for c in COVERAGE_K])
                cov = np.nanmean(np.array(covs, dtype=float), axis=0) if covs else [float("nan")] * len(COVERAGE_K)
                row = dict(
                    dataset=name,
                    users=len(sets),
                    pairs=len(pairs),
                    items=len(counts),
                    max_contributions=k,
                    tool=tool,
                    seeds=cfg["seeds"],
                    released_mean=float(np.mean(sizes)),
                    released_std=float(np.std(sizes)),
                    **{f"coverage_k{c}": float(v) for c, v in zip(COVERAGE_K, cov)},
                )
                rows.append(row)
                log(
                    f"utility {name:15s} k={k:<4d} {tool:24s} {row['released_mean']:10.1f} +- "
                    f"{row['released_std']:7.1f}  ({time.perf_counter() - t0:.1f} s)"
                )
    return rows


# -------------------------------------------------------------------------------------------- speed
def _one_run(spec):
    """Runs one speed measurement in this (fresh) process; returns a JSON-able dict."""
    import logging

    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(logging.ERROR)
    tool, n_chunks, mode, upc = spec["tool"], spec["n_chunks"], spec["mode"], spec["users_per_chunk"]
    params = SelectionParams(epsilon=EPSILON, delta=DELTA, max_contributions=spec["max_contributions"])
    t0 = time.perf_counter()
    if mode == "reference":
        pairs = bench_select.zipf_pairs(n_chunks, upc)
        items = reference.select(reference.user_sets_from_pairs(pairs), tool, params, seed=spec["seed"])
        elapsed = time.perf_counter() - t0
    elif tool == READ_INPUT:
        elapsed, items = bench_select.run_beam_transform(bench_select.ReadInputOnly(), n_chunks, mode, upc)
    elif tool.startswith("pdp_"):
        from benchmarks.peers import PipelineDPSelect

        elapsed, items = bench_select.run_beam_transform(
            PipelineDPSelect(tool, EPSILON, DELTA, params.max_contributions), n_chunks, mode, upc
        )
    else:
        from dp_partition_beam.transforms.selection.select import SelectPartitions

        # ours read Arrow batches (what the CLIs' batched readers produce; the element API is also kept);
        # PipelineDP and read_input get one element per pair, their native input
        elapsed, items = bench_select.run_beam_transform(
            SelectPartitions(tool, params, seed=spec["seed"]), n_chunks, mode, upc, batched=spec.get("batched", True)
        )
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # Own peak from VmHWM: Linux carries ru_maxrss across fork/exec, so RUSAGE_SELF would report the
    # launching run_all process's peak (hundreds of MB after the utility datasets) for every run.
    # Children (multi_processing workers) can inherit at most this process's size, which the max covers.
    peak = max(own_peak_rss_kb(), kids.ru_maxrss)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime  # whole process, incl. imports
    digest = hashlib.sha256("\n".join(sorted(map(str, items))).encode()).hexdigest()
    return dict(wall_s=elapsed, cpu_s=cpu, released=len(items), peak_rss_mb=peak / 1024.0, digest=digest)


def tool_modes(tool, modes):
    """The modes ``tool`` is timed in for a speed entry listing ``modes``: ours in all of them; PipelineDP
    and read_input in the Beam ones (no in-memory reference); the OpenDP peer once, in its own process
    (OPENDP_MODE), whatever Beam modes are listed."""
    if tool == OPENDP_TOOL:
        return (OPENDP_MODE,)
    if is_peer(tool) or tool == READ_INPUT:
        return tuple(m for m in modes if m != "reference")
    return tuple(modes)


def speed_command(spec):
    """The command line of one speed run in a fresh process: ``run_all --one``, or for the OpenDP peer its
    own entry (benchmarks.peer_opendp imports no Beam, so the run's peak RSS is OpenDP's and Polars')."""
    if spec["tool"] == OPENDP_TOOL:
        peer = dict(
            n_chunks=spec["n_chunks"],
            users_per_chunk=spec["users_per_chunk"],
            epsilon=EPSILON,
            delta=DELTA,
            max_contributions=spec["max_contributions"],
        )
        return [sys.executable, "-m", "benchmarks.peer_opendp", "--zipf", json.dumps(peer)]
    return [sys.executable, "-m", "benchmarks.run_all", "--one", json.dumps(spec)]


def run_speed(cfg, tools, log, seed=1, max_contributions=100):
    upc = cfg["users_per_chunk"]
    rows = []
    timed = set()  # (tool, pairs, mode): the OpenDP peer's one mode may come up in several entries of a size
    for size, which, modes in cfg["speed"]:
        n_chunks = max(1, int(round(size / (upc * 10))))
        n_pairs = zipf_pair_count(n_chunks, upc)
        chosen = [t for t in tools if which == "all" or t in which] + [t for t in (READ_INPUT,) if t in which]
        for tool in chosen:
            if tool in SLOW_PEERS:
                continue
            ref_digest = None
            for mode in tool_modes(tool, modes):
                if (tool, n_pairs, mode) in timed:
                    continue
                timed.add((tool, n_pairs, mode))
                spec = dict(
                    tool=tool,
                    n_chunks=n_chunks,
                    mode=mode,
                    users_per_chunk=upc,
                    seed=seed,
                    max_contributions=max_contributions,
                )
                results = []
                for _ in range(1 if mode == "reference" else cfg.get("reps", 1)):
                    proc = subprocess.run(
                        speed_command(spec),
                        capture_output=True,
                        text=True,
                        cwd=REPO,
                    )
                    if proc.returncode != 0:
                        break
                    results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                if proc.returncode != 0:  # reported in the summary; the other runs go on
                    tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
                    FAILURES.append(f"{tool}, {n_pairs:,} pairs, {mode}: exit {proc.returncode}: {tail[0][:300]}")
                    log(
                        f"speed {tool:24s} {n_pairs:>11,d} {mode:17s} FAILED (exit {proc.returncode})\n"
                        f"{proc.stderr[-3000:]}"
                    )
                    continue
                res = sorted(results, key=lambda r: r["wall_s"])[len(results) // 2]  # median run (odd reps)
                if mode == "reference":
                    ref_digest = res["digest"]
                same = (
                    ""
                    if is_peer(tool) or tool == READ_INPUT or ref_digest is None
                    else ("yes" if res["digest"] == ref_digest else "NO")
                )
                rows.append(
                    dict(
                        tool=tool,
                        pairs=n_pairs,
                        mode=mode,
                        reps=len(results),
                        wall_s=res["wall_s"],
                        cpu_s=res["cpu_s"],
                        pairs_per_s=n_pairs / res["wall_s"],
                        peak_rss_mb=res["peak_rss_mb"],
                        released=res["released"],
                        equals_reference=same,
                    )
                )
                log(
                    f"speed {tool:24s} {n_pairs:>11,d} {mode:17s} {res['wall_s']:8.1f} s "
                    f"{n_pairs / res['wall_s']:>10,.0f} pairs/s {res['peak_rss_mb']:8.0f} MB {same}"
                )
    add_ratios(rows)
    return rows


def add_ratios(rows):
    """Ratios measured in one run: time / basic's time and pairs/s / PipelineDP Gaussian's (same size and
    mode), pairs/s / the OpenDP peer's (same size; it has one mode, its own process)."""
    index = {(r["tool"], r["pairs"], r["mode"]): r for r in rows}
    for r in rows:
        base = index.get(("basic", r["pairs"], r["mode"]))
        peer = index.get(("pdp_gaussian", r["pairs"], r["mode"]))
        opendp = index.get((OPENDP_TOOL, r["pairs"], OPENDP_MODE))
        r["time_vs_basic"] = r["wall_s"] / base["wall_s"] if base else float("nan")
        r["speed_vs_pdp_gaussian"] = r["pairs_per_s"] / peer["pairs_per_s"] if peer else float("nan")
        r["speed_vs_opendp_gaussian"] = r["pairs_per_s"] / opendp["pairs_per_s"] if opendp else float("nan")


def fit_scaling(rows):
    """Per (tool, mode) with >= 2 sizes: exponent b of wall_s ~ a * pairs^b (least squares in log-log)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["tool"], r["mode"]), []).append(r)
    out = []
    for (tool, mode), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["pairs"])
        if len(rs) < 2:
            continue
        x = np.log([r["pairs"] for r in rs])
        y = np.log([r["wall_s"] for r in rs])
        b = float(np.polyfit(x, y, 1)[0])
        out.append(
            dict(
                tool=tool,
                mode=mode,
                sizes=" / ".join(f"{r['pairs']:,}" for r in rs),
                wall_s=" / ".join(f"{r['wall_s']:.1f}" for r in rs),
                peak_rss_mb=" / ".join(f"{r['peak_rss_mb']:.0f}" for r in rs),
                exponent=b,
                rss_growth=rs[-1]["peak_rss_mb"] / rs[0]["peak_rss_mb"],
            )
        )
    return out


# ------------------------------------------------------------------------------------------ outputs
def write_csv(path, rows):
    if not rows:
        open(path, "w").close()
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def md_table(rows, cols, fmt=None):
    fmt = fmt or {}
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for label, key in cols:
            v = r[key]
            cells.append(fmt[key](v) if key in fmt else (f"{v:,}" if isinstance(v, int) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _f(digits):
    return lambda v: "n/a" if isinstance(v, float) and math.isnan(v) else f"{v:,.{digits}f}"


def targets(utility, speed, scaling):
    """The targets of issues 8 and 16, evaluated on this run's numbers: list of (target, measured, met)."""
    out = []
    idx = {(r["tool"], r["pairs"], r["mode"]): r for r in speed}
    sizes = sorted({r["pairs"] for r in speed if r["mode"] == "in_memory"})
    if sizes:
        n = min(sizes, key=lambda s: abs(s - 4e6))
        b, g = idx.get(("basic", n, "in_memory")), idx.get(("pdp_gaussian", n, "in_memory"))
        if b and g:
            ratio = b["pairs_per_s"] / g["pairs_per_s"]
            out.append(
                (
                    f"basic >= 5x PipelineDP Gaussian pairs/s ({n:,} pairs, in_memory)",
                    f"{b['pairs_per_s']:,.0f} vs {g['pairs_per_s']:,.0f} pairs/s = {ratio:.2f}x",
                    ratio >= 5,
                )
            )
        for size in sorted({n, max(sizes)}):
            bs, o = idx.get(("basic", size, "in_memory")), idx.get((OPENDP_TOOL, size, OPENDP_MODE))
            if bs and o:
                out.append(
                    (
                        f"(context) basic (in_memory) vs the OpenDP peer's pairs/s ({size:,} pairs; "
                        "OpenDP in one Polars process)",
                        f"{bs['pairs_per_s']:,.0f} vs {o['pairs_per_s']:,.0f} pairs/s = "
                        f"{bs['pairs_per_s'] / o['pairs_per_s']:.2f}x",
                        None,
                    )
                )
        floor = idx.get((READ_INPUT, n, "in_memory"))
        if b and g and floor:
            ours, theirs = b["wall_s"] - floor["wall_s"], g["wall_s"] - floor["wall_s"]
            out.append(
                (
                    f"(context) time above reading the input ({READ_INPUT}: {floor['wall_s']:.1f} s), "
                    f"basic vs PipelineDP Gaussian ({n:,} pairs, in_memory)",
                    f"{ours:.1f} s vs {theirs:.1f} s = PipelineDP takes {theirs / ours:.2f}x as long"
                    if ours > 0
                    else "n/a",
                    None,
                )
            )
        ref = idx.get(("basic", n, "reference"))
        if b and ref:
            out.append(
                (
                    f"basic on Beam faster than the in-memory reference ({n:,} pairs)",
                    f"{b['wall_s']:.1f} s vs {ref['wall_s']:.1f} s",
                    b["wall_s"] < ref["wall_s"],
                )
            )
        big = max(sizes)
        b16, g16 = idx.get(("basic", big, "in_memory")), idx.get(("pdp_gaussian", big, "in_memory"))
        if big != n and b16 and g16:
            r16 = b16["pairs_per_s"] / g16["pairs_per_s"]
            out.append(
                (
                    f"basic >= 5x PipelineDP Gaussian pairs/s ({big:,} pairs, in_memory)",
                    f"{b16['pairs_per_s']:,.0f} vs {g16['pairs_per_s']:,.0f} pairs/s = {r16:.2f}x",
                    r16 >= 5,
                )
            )
        if b16 and big >= 15e6:
            out.append(
                (
                    f"basic's peak memory at {big:,} pairs <= half of the per-element path's (~1.8 GB)",
                    f"{b16['peak_rss_mb']:,.0f} MB",
                    b16["peak_rss_mb"] <= 900,
                )
            )
        for alg, bound in (("mad", 2.0), ("mad2r", 4.0)):
            a = idx.get((alg, n, "in_memory"))
            if a and b:
                out.append(
                    (
                        f"{alg} <= {bound}x basic's wall time ({n:,} pairs, in_memory)",
                        f"{a['wall_s']:.1f} s vs {b['wall_s']:.1f} s = {a['time_vs_basic']:.2f}x",
                        a["time_vs_basic"] <= bound,
                    )
                )
    for s in scaling:
        if s["mode"] == "in_memory" and not is_peer(s["tool"]):
            largest = max(r["pairs"] for r in speed if r["tool"] == s["tool"] and r["mode"] == s["mode"])
            if largest < 1_000_000:  # below ~1M pairs the runner's fixed start-up cost dominates
                out.append(
                    (
                        f"{s['tool']}: time linear in pairs (exponent <= 1.1)",
                        f"not evaluated: largest size {largest:,} pairs < 1M (fixed costs dominate)",
                        None,
                    )
                )
                continue
            out.append(
                (
                    f"{s['tool']}: time linear in pairs (exponent <= 1.1)",
                    f"exponent {s['exponent']:.2f} over {s['sizes']}",
                    None if s["tool"] == READ_INPUT else s["exponent"] <= 1.1,
                )
            )
            if is_parallel(s["tool"]):
                out.append(
                    (
                        f"{s['tool']}: peak memory flat in pairs",
                        f"peak RSS {s['peak_rss_mb']} MB ({s['rss_growth']:.2f}x for {s['sizes']} pairs)",
                        s["rss_growth"] <= 1.5,
                    )
                )
    groups = {}
    for r in utility:
        groups.setdefault((r["dataset"], r["max_contributions"]), []).append(r)
    for (ds, k), rs in groups.items():
        if k < 20:
            continue
        peers = [r for r in rs if r["tool"].startswith("pdp_")]
        if not peers:
            continue
        best = max(peers, key=lambda r: r["released_mean"])
        for r in rs:
            if is_parallel(r["tool"]):
                ratio = r["released_mean"] / best["released_mean"] if best["released_mean"] > 0 else float("inf")
                out.append(
                    (
                        f"{ds}, max contributions {k}: {r['tool']} >= 2x PipelineDP's best ({best['tool']})",
                        f"{r['released_mean']:,.1f} vs {best['released_mean']:,.1f} = {ratio:.1f}x",
                        ratio >= 2,
                    )
                )
    return out


def run_line(args, wall, started):
    """Who measured what: date, command, duration, machine."""
    return (
        f"Measured {started} UTC by `{args.command_line}` in {wall / 60:.1f} min on "
        f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} cores."
    )


def summary_markdown(args, cfg, utility, speed, scaling, wall, started, speed_run=None):
    """speed_run: the run_line of the run that measured ``speed`` and ``scaling`` (--utility_only), else None."""
    mode = "quick" if args.quick else "full"
    if speed_run is None:
        head = run_line(args, wall, started)
    else:
        mode += ", utility part only"
        head = (
            f"Utility tables: {run_line(args, wall, started)} Speed and scaling tables (not re-measured): {speed_run}"
        )
    lines = [
        f"{head} epsilon = {EPSILON:g}, delta = {DELTA:g} for every tool; Delta_0 (= PipelineDP's "
        f"max_partitions_contributed) as listed. Mode: {mode}.",
        "",
    ]
    lines += [
        "## Utility: released items and coverage by item frequency",
        "",
        f"Mean +- std over {cfg['seeds']} seeds. coverage_kK = fraction of the items held by >= K users "
        "that were released (the MAD paper's Figure 1). Ours: in-memory reference (identical to Beam "
        "under a seed); PipelineDP: its LocalBackend, unseeded; opendp_gaussian: OpenDP's Polars key "
        "release (benchmarks/peer_opendp.py), unseeded.",
        "",
    ]
    ucols = [
        ("dataset", "dataset"),
        ("Delta_0", "max_contributions"),
        ("tool", "tool"),
        ("released", "released_mean"),
        ("std", "released_std"),
    ] + [(f"cov>={c}", f"coverage_k{c}") for c in COVERAGE_K]
    ufmt = {"released_mean": _f(1), "released_std": _f(1), **{f"coverage_k{c}": _f(3) for c in COVERAGE_K}}
    lines += [md_table(utility, ucols, ufmt), ""]
    lines += [
        "Datasets: "
        + "; ".join(
            sorted(
                {f"{r['dataset']} ({r['users']:,} users, {r['pairs']:,} pairs, {r['items']:,} items)" for r in utility}
            )
        ),
        "",
        "![coverage](coverage.png)",
        "",
    ]
    lines += [
        "## Speed",
        "",
        "Zipf(1.1) pairs generated inside the pipeline (10 per user on average), Delta_0 = 100. "
        "time / basic and pairs/s / pdp_gaussian are within the same size and mode of this run; "
        "pairs/s / opendp_gaussian is against the OpenDP peer at the same size: the same rows, generated "
        f"and released in one process by OpenDP's Polars API (mode {OPENDP_MODE}, no Beam; its time "
        "includes generating the rows and OpenDP's parameter search, a few seconds at any size). "
        "Peak RSS: the run's subprocess (its own VmHWM, or its largest child's peak if larger, e.g. a "
        "multi_processing worker). CPU s: user + sys time of "
        "that subprocess and its children, including ~3 s of imports (less sensitive than wall time "
        "to other load on the machine; for multi_processing the workers' CPU may not all be counted).",
        "",
    ]
    scols = [
        ("tool", "tool"),
        ("pairs", "pairs"),
        ("mode", "mode"),
        ("wall s", "wall_s"),
        ("CPU s", "cpu_s"),
        ("pairs/s", "pairs_per_s"),
        ("peak RSS MB", "peak_rss_mb"),
        ("released", "released"),
        ("== ref", "equals_reference"),
        ("time / basic", "time_vs_basic"),
        ("pairs/s / pdp_gaussian", "speed_vs_pdp_gaussian"),
        ("pairs/s / opendp_gaussian", "speed_vs_opendp_gaussian"),
    ]
    sfmt = {
        "wall_s": _f(1),
        "cpu_s": _f(1),
        "pairs_per_s": _f(0),
        "peak_rss_mb": _f(0),
        "time_vs_basic": _f(2),
        "speed_vs_pdp_gaussian": _f(2),
        "speed_vs_opendp_gaussian": _f(2),
    }
    lines += [md_table(speed, scols, sfmt), ""]
    lines += [
        "## Scaling",
        "",
        "Fitted exponent b of wall time ~ pairs^b (least squares on log-log).",
        "",
        md_table(
            scaling,
            [
                ("tool", "tool"),
                ("mode", "mode"),
                ("pairs", "sizes"),
                ("wall s", "wall_s"),
                ("peak RSS MB", "peak_rss_mb"),
                ("exponent", "exponent"),
            ],
            {"exponent": _f(2)},
        ),
        "",
        "![scaling](scaling.png)",
        "",
    ]
    if FAILURES:
        lines += ["## Failed runs", ""] + [f"- {f}" for f in FAILURES] + [""]
    lines += ["## Targets (issues 8 and 16), evaluated on this run", ""]
    if args.quick:
        lines += [
            "Quick mode: sizes far below the targets' 4M pairs, where start-up costs dominate; the "
            "speed and scaling rows are a smoke test, not a measurement of the targets.",
            "",
        ]
    lines += ["| target | measured | met |", "|---|---|---|"]
    lines += [
        f"| {t} | {m} | {'n/a' if ok is None else 'yes' if ok else '**no**'} |"
        for t, m, ok in targets(utility, speed, scaling)
    ]
    return "\n".join(lines) + "\n"


def plot(utility, scaling_rows, speed, out):
    plot_coverage(utility, out)
    plot_scaling(scaling_rows, speed, out)


def plot_coverage(utility, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["dataset"], r["max_contributions"]) for r in utility})
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 2.2, 3.8), squeeze=False)
        colors = {t: plt.cm.tab20(j % 20) for j, t in enumerate(dict.fromkeys(r["tool"] for r in utility))}
        for ax, (ds, k) in zip(axes[0], panels):
            for r in [r for r in utility if r["dataset"] == ds and r["max_contributions"] == k]:
                ys = [r[f"coverage_k{c}"] for c in COVERAGE_K]
                ax.plot(
                    COVERAGE_K,
                    ys,
                    marker="o",
                    linestyle="--" if is_peer(r["tool"]) else "-",
                    color=colors[r["tool"]],
                    label=r["tool"],
                )
            ax.set_xscale("log")
            ax.set_xticks(COVERAGE_K, [str(c) for c in COVERAGE_K])
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("K (items held by >= K users)")
            ax.set_ylabel("fraction released")
            ax.set_title(f"{ds}, Delta_0={k}", fontsize=9)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=7, loc="center right")
        fig.tight_layout(rect=(0, 0, 1 - 2.0 / (3.6 * len(panels) + 2.2), 1))
        fig.savefig(os.path.join(out, "coverage.png"), dpi=110)
        plt.close(fig)


def plot_scaling(scaling_rows, speed, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for j, s in enumerate(scaling_rows):
        rs = sorted([r for r in speed if r["tool"] == s["tool"] and r["mode"] == s["mode"]], key=lambda r: r["pairs"])
        ax.plot(
            [r["pairs"] for r in rs],
            [r["wall_s"] for r in rs],
            marker="o",
            linestyle="--" if is_peer(s["tool"]) else "-",
            color=plt.cm.tab20(j % 20),
            label=f"{s['tool']} {s['mode']} (b={s['exponent']:.2f})",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pairs")
    ax.set_ylabel("wall time (s)")
    ax.set_title("time vs data size (DirectRunner / reference)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced sizes and seeds (a few minutes)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument(
        "--corpus",
        help=f"user<TAB>word .tsv.gz for the commits_full dataset (default: {CORPUS_FILE} "
        "of the shared data folder, benchmarks/shared_data.py)",
    )
    ap.add_argument("--seeds", type=int, help="override the number of utility seeds")
    ap.add_argument("--sizes", type=float, nargs="+", help="override the speed sizes (pairs), run for every tool")
    ap.add_argument(
        "--modes", nargs="+", default=["in_memory"], help="modes for --sizes (reference, in_memory, multi_processing)"
    )
    ap.add_argument(
        "--tools", nargs="+", help=f"override the tools (our algorithm names, pdp_* peers and {OPENDP_TOOL})"
    )
    ap.add_argument("--reps", type=int, help="runs per (tool, size, Beam mode); the median is reported (default 1)")
    ap.add_argument("--utility", nargs="+", help="override the utility datasets (name:k1,k2 ...)")
    ap.add_argument("--no-peers", action="store_true", help="skip PipelineDP and OpenDP (bench extra not installed)")
    ap.add_argument("--docs", action="store_true", help="also rewrite BENCHMARKS.md from this run")
    ap.add_argument(
        "--utility_only",
        action="store_true",
        help="measure only the utility part; keep the speed/scaling results of the last run in --out",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one_run(json.loads(args.one))))
        return 0
    args.command_line = "python -m benchmarks.run_all " + " ".join(argv if argv is not None else sys.argv[1:])
    cfg = dict(QUICK if args.quick else FULL)
    if args.seeds:
        cfg["seeds"] = args.seeds
    if args.reps:
        cfg["reps"] = args.reps
    if args.sizes:
        cfg["speed"] = [(s, "all", tuple(args.modes)) for s in args.sizes]
    if args.utility:
        cfg["utility"] = [(u.split(":")[0], tuple(int(k) for k in u.split(":")[1].split(","))) for u in args.utility]
    tools = our_algorithms() + ([] if args.no_peers else list(PEERS))
    if args.tools:
        unknown = [t for t in args.tools if t not in tools]
        if unknown:
            ap.error(f"--tools: unknown {unknown}; choose from {tools}")
        tools = args.tools
    if any(name == "commits_full" for name, _ in cfg["utility"]) and not args.corpus:
        args.corpus = shared_data_path(CORPUS_FILE)  # fails here, before any work, if it is absent
    speed_run = None
    if args.utility_only:
        speed, scaling, speed_run = read_speed_results(args.out)  # fails before any work if there are none
        with open(os.path.join(args.out, RUN_INFO), "w") as f:  # kept for the next --utility_only run
            json.dump({"speed_run": speed_run}, f, indent=1)
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    t0 = time.perf_counter()

    def log(msg):
        print(msg, flush=True)

    import logging

    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(logging.ERROR)  # seeded-run warnings
    utility = run_utility(cfg, args.corpus, tools, log)
    write_csv(os.path.join(args.out, "utility.csv"), utility)
    if args.utility_only:
        plot_coverage(utility, args.out)
    else:
        speed = run_speed(cfg, tools, log)
        scaling = fit_scaling(speed)
        write_csv(os.path.join(args.out, "speed.csv"), speed)
        write_csv(os.path.join(args.out, "scaling.csv"), scaling)
        plot(utility, scaling, speed, args.out)
        with open(os.path.join(args.out, RUN_INFO), "w") as f:
            json.dump({"speed_run": run_line(args, time.perf_counter() - t0, started)}, f, indent=1)
    md = summary_markdown(args, cfg, utility, speed, scaling, time.perf_counter() - t0, started, speed_run)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(md)
    if args.docs:
        write_benchmarks_md(md, args.out)
    print("\n" + md)
    return 1 if FAILURES else 0  # outputs are written either way; a failed run is an error


RUN_INFO = "run_info.json"  # {"speed_run": run_line of the run that measured speed.csv and scaling.csv}


def _cell(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_speed_results(out):
    """(speed rows, scaling rows, run line) of the last full run in ``out``, typed as run_speed made them."""

    def rows(name):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            raise SystemExit(f"error: --utility_only needs the speed results of an earlier full run: {path} is missing")
        with open(path, newline="") as f:
            return [{k: _cell(v) for k, v in r.items()} for r in csv.DictReader(f)]

    speed, scaling = rows("speed.csv"), rows("scaling.csv")
    for r in speed:  # a run from before the OpenDP peer joined has no column for it
        r.setdefault("speed_vs_opendp_gaussian", float("nan"))
    info = os.path.join(out, RUN_INFO)
    if os.path.exists(info):
        with open(info) as f:
            return speed, scaling, json.load(f)["speed_run"]
    # results written before run_info.json existed: summary.md's first sentence is that run's line
    with open(os.path.join(out, "summary.md")) as f:
        first = f.readline()
    if not first.startswith("Measured "):
        raise SystemExit(f"error: cannot tell which run measured {out}/speed.csv (no {RUN_INFO})")
    return speed, scaling, first[: first.index(" cores.") + len(" cores.")]


def write_benchmarks_md(summary, out):
    rel = os.path.relpath(out, REPO)
    body = summary.replace("](coverage.png)", f"]({rel}/coverage.png)").replace(
        "](scaling.png)", f"]({rel}/scaling.png)"
    )
    head = open(os.path.join(REPO, "benchmarks", "BENCHMARKS_HEAD.md")).read()
    with open(os.path.join(REPO, "BENCHMARKS.md"), "w") as f:
        f.write(head + "\n" + body)


if __name__ == "__main__":
    sys.exit(main())
