"""The MAD paper's Table 2 on the real datasets, with its settings, next to the paper's numbers.

    .venv/bin/python -m benchmarks.bench_table2                       # imdb, higgs, commits; 5 seeds
    .venv/bin/python -m benchmarks.bench_table2 --datasets higgs --seeds 10 --algorithms basic mad
    .venv/bin/python -m benchmarks.bench_table2 --seeds 3 --only weight_cap

Every configuration of :data:`CONFIGS` (the paper's section 7.2 settings: epsilon = 1, delta = 1e-5,
Delta_0 = 100; d_max 50 and beta 2 for MAD and MAD2R; MAD2R split [0.1, 0.9], b_min 0.5, b_max 2,
C_lb 1, C_ub 3; DP-SIPS splits [0.1, 0.9] and [0.05, 0.15, 0.8], both reported; PolicyGaussian with
its cutoff 4 noise standard deviations above the threshold, alpha = 4) runs on the in-memory reference
(``transforms.selection.reference.release``, which releases exactly what the Beam transforms release
under the same seed) with seeds 0..seeds-1. Multi-round algorithms (those whose registry entry reads
``accounting``) run under both accountings: ``basic`` (the paper's budget split) and ``gdp`` (our
default, exact Gaussian composition); for single-round algorithms the accounting does not apply
("n/a").

Reported per configuration: mean and sample std (ddof = 1) of the number of released items, the
paper's Table 2 number where it has one, and the coverage by item frequency (the paper's Figure 1):
coverage_kK = fraction of the items held by >= K users that were released, averaged over the seeds.

Datasets (read at run time from the shared data folder, benchmarks/shared_data.py; never copied into
the repository): ``imdb`` and ``higgs`` (the paper's Table 1 datasets, rebuilt: the folder's
README.mad_datasets.md) and ``commits`` (the full commits corpus, not in the paper).

Writes ``--out``/table2_<date>.md and .csv (default benchmarks/results/) and prints the markdown.
A new algorithm is one more line of :data:`CONFIGS` (and of :data:`PAPER` if the paper has it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import sys
import time

import numpy as np

from benchmarks.run_all import _f, coverage, md_table, user_counts, write_csv
from benchmarks.shared_data import read_user_sets, shared_data_path
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams
from dp_partition_beam.transforms.selection import reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EPSILON, DELTA, DELTA_0 = 1.0, 1e-5, 100
COVERAGE_K = (10, 20, 50, 100, 200, 500, 1000)
ACCOUNTINGS = ("basic", "gdp")  # the paper's budget split first, then ours

#: (label, algorithm, the SelectionParams fields that differ from the defaults). The paper's settings
#: are our defaults (d_max 50, beta 2, b_min 0.5, b_max 2, c_lb 1, c_ub 3, split [0.1, 0.9]); they are
#: written out here so that the table does not change if a default does.
MAD = dict(d_max=50, beta=2.0)
#: the papers' Gaussian rounds (keep rules are the default of mad, mad2r, dp_sips, mad_sips and policy_gaussian since
#: issue 30)
GAUSSIAN = dict(threshold="gaussian")
#: MAD-SIPS's settings with its default keep-table last round (and with it no adaptive cap)
MAD_SIPS_TABLE = dict(
    MAD, budget_split=(0.03, 0.07, 0.9), b_min=0.5, b_max=2.0, c_lb=1.0, c_ub=1.5, threshold="optimal", cap_quantile=1.0
)
CONFIGS = [
    ("basic", "basic", {}),
    ("mad", "mad", dict(MAD, **GAUSSIAN)),
    # issue 30: MAD's l2 keep rule, read with 128 bits (its default since 2026-12-01; docs/thresholding.md)
    ("mad l2 rule", "mad", dict(MAD, threshold="optimal")),
    ("mad2r", "mad2r", dict(MAD, budget_split=(0.1, 0.9), b_min=0.5, b_max=2.0, c_lb=1.0, c_ub=3.0, **GAUSSIAN)),
    ("dp_sips [0.1,0.9]", "dp_sips", dict(budget_split=(0.1, 0.9), **GAUSSIAN)),
    ("dp_sips [0.05,0.15,0.8]", "dp_sips", dict(budget_split=(0.05, 0.15, 0.8), **GAUSSIAN)),
    ("policy_gaussian (alpha 4)", "policy_gaussian", dict(alpha=4.0, **GAUSSIAN)),
    # issue 30: Policy Gaussian's l2 keep rule (its default since 2026-12-01; docs/thresholding.md, "The l2 rule")
    ("policy_gaussian l2 rule (alpha 4)", "policy_gaussian", dict(alpha=4.0, threshold="optimal")),
    # ours (issue 17, docs/mad_sips.md): its defaults of issue 17 (Gaussian rounds; the adaptive cap under gdp),
    # MAD2R's other settings
    (
        "mad_sips [0.03,0.07,0.9]",
        "mad_sips",
        dict(MAD, budget_split=(0.03, 0.07, 0.9), b_min=0.5, b_max=2.0, c_lb=1.0, c_ub=1.5, **GAUSSIAN),
    ),
    # issue 30: the last round as a keep table (docs/mad_sips.md, "The last round as a keep table"); RDP
    # accounting over the gdp plan's Gaussian rounds, so these run under 'gdp' only
    (
        "mad2r threshold optimal",
        "mad2r",
        dict(MAD, budget_split=(0.1, 0.9), b_min=0.5, b_max=2.0, c_lb=1.0, c_ub=3.0, threshold="optimal"),
    ),
    ("dp_sips [0.1,0.9] threshold optimal", "dp_sips", dict(budget_split=(0.1, 0.9), threshold="optimal")),
    # MAD-SIPS's defaults of issue 30 before the automatic weight cap: the table, no adaptive cap, no weight cap
    ("mad_sips [0.03,0.07,0.9] threshold optimal", "mad_sips", dict(MAD_SIPS_TABLE, weight_cap=1.0)),
    # the same with a weight cap (docs/mad_sips.md, "Weight cap"): a user setting, chosen from the data's users
    # (about 1.5 / sqrt(median degree): IMDb's is 126), so it loses on Higgs (users of 1-3 items)
    ("mad_sips threshold optimal, weight_cap 0.25", "mad_sips", dict(MAD_SIPS_TABLE, weight_cap=0.25)),
    # MAD-SIPS's defaults: the weight cap chosen from a noisy degree histogram (weight_cap 'auto', cap_budget
    # 0.002; docs/mad_sips.md, "Automatic weight cap")
    ("mad_sips threshold optimal, weight_cap auto (defaults)", "mad_sips", MAD_SIPS_TABLE),
]

#: file of each dataset in the shared data folder
DATASETS = {
    "imdb": "imdb.user_words.tsv.gz",
    "higgs": "higgs.user_words.tsv.gz",
    "commits": "commits.user_words.tsv.gz",
}

#: the paper's Table 2 (mean of 5 trials, std): {dataset: {algorithm: (mean, std)}}. DP-SIPS there is
#: the better of its two splits; we print it next to both of ours.
PAPER = {
    "imdb": {
        "mad": (2516, 12),
        "mad2r": (3369, 19),
        "basic": (2504, 7),
        "dp_sips": (3076, 16),
        "policy_gaussian": (3578, 19),
    },
    "higgs": {
        "mad": (1807, 13),
        "mad2r": (1767, 15),
        "basic": (1791, 18),
        "dp_sips": (1743, 8),
        "policy_gaussian": (1923, 18),
    },
}


def accountings(algorithm, extra=None):
    """The accountings to run ``algorithm`` under: both if it reads ``accounting``, else ('n/a',); 'gdp'
    only for a keep-table last round (``threshold='optimal'``, whose RDP plan starts from the gdp rounds)."""
    if "accounting" not in ALGORITHMS[algorithm].options:
        return ("n/a",)
    return ("gdp",) if (extra or {}).get("threshold") == "optimal" else ACCOUNTINGS


def params_for(extra, accounting):
    base = SelectionParams(epsilon=EPSILON, delta=DELTA, max_contributions=DELTA_0)
    return base.replace(**extra) if accounting == "n/a" else base.replace(accounting=accounting, **extra)


@contextlib.contextmanager
def reuse_bounding():
    """Within the block, seeded ``reference.bound_contributions`` calls return the earlier result of the
    same (max_contributions, seed, round) when the input equals (==) that call's input.

    Under a seed the capped sets are a function of exactly those, so the releases do not change
    (tests/benchmarks/test_bench_table2.py compares with direct calls); it only spares recomputing them: the
    contribution bounding is ~85% of Basic's time on these datasets, and Basic, MAD, MAD2R, the policy
    and DP-SIPS's first round all bound the same sets in the same round under one seed. Yields the memo,
    to be cleared between seeds (it holds one entry per round).
    """
    original = reference.bound_contributions
    memo = {}

    def bound_contributions(user_sets, max_contributions, seed=None, round_=0, rng=None):
        if seed is None:
            return original(user_sets, max_contributions, seed, round_, rng)
        key = (max_contributions, seed, round_)
        hit = memo.get(key)
        if hit is not None and (hit[0] is user_sets or hit[0] == user_sets):
            return hit[1]
        out = original(user_sets, max_contributions, seed, round_, rng)
        memo[key] = (user_sets, out)
        return out

    reference.bound_contributions = bound_contributions
    try:
        yield memo
    finally:
        reference.bound_contributions = original


def run_dataset(name, sets, configs, seeds, log=print, coverage_k=COVERAGE_K):
    """One row per (configuration, accounting): released-item mean and std over ``seeds`` (a list of
    seeds), the paper's number, and the mean coverage of the items held by >= K users."""
    counts = user_counts(sets)
    paper = PAPER.get(name, {})
    cells = [
        (label, algorithm, extra, acct) for label, algorithm, extra in configs for acct in accountings(algorithm, extra)
    ]
    sizes = [[] for _ in cells]
    covs = [[] for _ in cells]
    seconds = [0.0] * len(cells)
    with reuse_bounding() as memo:
        for seed in seeds:  # seeds outside: the configurations of one seed share its capped sets
            memo.clear()
            for j, (label, algorithm, extra, acct) in enumerate(cells):
                t0 = time.perf_counter()
                released = reference.release(sets, algorithm, params_for(extra, acct), seed=seed).items
                sizes[j].append(len(released))
                covs[j].append([coverage(released, counts, k) for k in coverage_k])
                seconds[j] += time.perf_counter() - t0
                log(f"{name:8s} seed {seed} {label:28s} {acct:5s} {len(released):7d} ({seconds[j]:.1f} s so far)")
    rows = []
    for j, (label, algorithm, extra, acct) in enumerate(cells):
        mean_cov = np.nanmean(np.array(covs[j], dtype=float), axis=0) if covs[j] else [math.nan] * len(coverage_k)
        pm = paper.get(algorithm)
        rows.append(
            dict(
                dataset=name,
                algorithm=label,
                accounting=acct,
                split=",".join(f"{f:g}" for f in extra["budget_split"]) if "budget_split" in extra else "",
                paper=pm[0] if pm else "",
                paper_std=pm[1] if pm else "",
                mean=float(np.mean(sizes[j])) if sizes[j] else math.nan,
                std=float(np.std(sizes[j], ddof=1)) if len(sizes[j]) > 1 else math.nan,
                seeds=len(sizes[j]),
                seconds=seconds[j],
                **{f"coverage_k{k}": float(v) for k, v in zip(coverage_k, mean_cov)},
            )
        )
    return rows


def markdown(rows, info, command, started, coverage_k=COVERAGE_K):
    """The result tables as markdown: released items next to the paper, then the coverage."""

    def pm(r, key, std_key):
        if r[key] == "":
            return ""
        std = r[std_key]
        return f"{r[key]:,.0f} +- {std:,.0f}" if not (isinstance(std, float) and math.isnan(std)) else f"{r[key]:,.0f}"

    table = [
        dict(r, paper_pm=pm(r, "paper", "paper_std"), ours_pm=pm(r, "mean", "std"), delta_sd=_dev(r)) for r in rows
    ]
    lines = [
        f"Measured {started} UTC by `{command}` on {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores. epsilon = {EPSILON:g}, delta = {DELTA:g}, Delta_0 = {DELTA_0}; in-memory "
        "reference, seeds 0..n-1; mean +- sample std (ddof 1) of the released items. paper: the MAD paper's "
        "Table 2 (mean +- std of 5 trials; DP-SIPS: the better of its two splits). accounting: basic = the "
        "paper's budget split, gdp = ours (exact Gaussian composition), n/a = single round.",
        "",
        "Datasets: "
        + "; ".join(
            f"{n} ({u:,} users, {p:,} pairs, {i:,} items; read in {r:.0f} s, all runs {t / 60:.1f} min)"
            for n, u, p, i, r, t in info
        ),
        "",
        md_table(
            table,
            [
                ("dataset", "dataset"),
                ("algorithm", "algorithm"),
                ("accounting", "accounting"),
                ("split", "split"),
                ("paper", "paper_pm"),
                ("ours", "ours_pm"),
                ("(ours - paper) / paper std", "delta_sd"),
                ("seeds", "seeds"),
                ("s", "seconds"),
            ],
            {"seconds": _f(0)},
        ),
        "",
        "Coverage by item frequency (the paper's Figure 1): fraction of the items held by >= K users that "
        "were released, mean over the seeds.",
        "",
        md_table(
            rows,
            [("dataset", "dataset"), ("algorithm", "algorithm"), ("accounting", "accounting")]
            + [(f">= {k}", f"coverage_k{k}") for k in coverage_k],
            {f"coverage_k{k}": _f(3) for k in coverage_k},
        ),
    ]
    return "\n".join(lines) + "\n"


def _dev(r):
    """(ours - paper) in units of the paper's std, or '' without a paper number."""
    if r["paper"] == "" or not r["paper_std"]:
        return ""
    return f"{(r['mean'] - r['paper']) / r['paper_std']:+.1f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per configuration (default 5)")
    labels = [c[0] for c in CONFIGS]
    algorithms = sorted({c[1] for c in CONFIGS})
    ap.add_argument(
        "--algorithms", nargs="+", choices=algorithms, help=f"restrict to these algorithms (default: all of {labels})"
    )
    ap.add_argument("--only", help="restrict to the configurations whose label contains this text, e.g. weight_cap")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"), help="folder of the md and csv")
    args = ap.parse_args(argv)
    command = "python -m benchmarks.bench_table2 " + " ".join(argv if argv is not None else sys.argv[1:])
    configs = [c for c in CONFIGS if not args.algorithms or c[1] in args.algorithms]
    configs = [c for c in configs if not args.only or args.only in c[0]]
    if not configs:
        ap.error(f"no configuration matches --algorithms {args.algorithms} --only {args.only!r}")
    paths = {name: shared_data_path(DATASETS[name]) for name in args.datasets}  # fails before any work
    import logging

    logging.getLogger("dp_partition_beam.transforms.core.randomness").setLevel(logging.ERROR)  # seeded-run warnings
    now = datetime.datetime.now(datetime.timezone.utc)
    started = now.strftime("%Y-%m-%d %H:%M")
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"table2_{now.strftime('%Y-%m-%d')}")
    rows, info = [], []
    for name in args.datasets:
        t0 = time.perf_counter()
        sets = read_user_sets(paths[name])
        read_s = time.perf_counter() - t0
        n_pairs = sum(len(v) for v in sets.values())
        n_items = len({i for v in sets.values() for i in v})
        print(f"{name}: {len(sets):,} users, {n_pairs:,} pairs, {n_items:,} items, read in {read_s:.0f} s", flush=True)
        rows += run_dataset(name, sets, configs, list(range(args.seeds)), log=lambda m: print(m, flush=True))
        info.append((name, len(sets), n_pairs, n_items, read_s, time.perf_counter() - t0))
        print(f"{name}: done in {info[-1][-1]:.0f} s", flush=True)
        del sets
        md = markdown(rows, info, command, started)  # written after every dataset: a long run keeps what it has
        with open(stem + ".md", "w") as f:
            f.write(md)
        write_csv(stem + ".csv", rows)
    print("\n" + md)
    print(f"wrote {stem}.md and {stem}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
