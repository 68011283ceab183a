"""DPNE benchmarks: the paper's Table 5 on MSNBC, the bundled Debian sample, a synthetic Markov corpus.

    python -m benchmarks.bench_dpne msnbc  [--msnbc /path/to/msnbc.jsonl.gz] [--seeds 3]
    python -m benchmarks.bench_dpne sample [--input data/debian_text.jsonl.gz]
    python -m benchmarks.bench_dpne synthetic
    python -m benchmarks.bench_dpne all

MSNBC is read from the shared data folder (``benchmarks/shared_data.py``: ``$DP_SHARED_DATA``, else
``../shared/data``) unless ``--msnbc`` names the file.

Uses the in-memory reference (:func:`transforms.dpne.dpne.dpne.reference.dpne_reference`), which is equal to
the Beam transform under a seed (tests/transforms/dpne/test_dpne_beam.py); it runs in production mode with a numpy
generator seeded per repetition (``rng=default_rng(seed)``: fast vectorised draws instead of
keyed hashes; the keyed seeded mode gives the same distribution). Prints tables: mean +- std of the
released n-grams per length over the seeds, the paper's numbers where there are some, the fraction
of n-grams used by >= K users that is released (the paper's Figure 4 comparison), wall time per level.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import sys
import time
from typing import Dict, Sequence

import numpy as np

from benchmarks.shared_data import shared_data_path
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.dpne.reference import dpne_reference, ngram_user_counts, user_kgrams
from dp_partition_beam.transforms.testing.synthetic import markov_corpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Paper Table 5 (MSNBC, Delta_0 = 10, eps = 1, delta = 1e-7, eta = 0.01), lengths 1..6.
PAPER_TABLE5 = {
    "dpne": [17, 254, 1273, 1954, 2221, 2020],
    "dpsu_all": [17, 249, 930, 1145, 1007, 768],
    "dpsu_even": [17, 246, 899, 1107, 996, 766],
    "dpsu_single": [17, 260, 1483, 2180, 2210, 1819],
}


def read_jsonl(path: str):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            yield r["user"], r["text"]


def run_config(ug, algorithm: str, params: DPNEParams, seeds: Sequence[int]):
    """{'counts': array seeds x T, 'seconds': {run: mean s}, 'outputs': [per-seed {k: set}]}."""
    T = params.max_n
    counts, outputs, secs = [], [], {}
    for s in seeds:
        if algorithm == "dpsu_single":
            row, out = [], {}
            for L in range(1, T + 1):
                r = dpne_reference(
                    None,
                    algorithm,
                    params.replace(dpsu_single_length=L),
                    rng=np.random.default_rng(s),
                    user_grams=ug,
                )
                row.append(len(r.ngrams[L]))
                out[L] = r.ngrams[L]
                for name, t in r.seconds.items():
                    secs[name] = secs.get(name, 0.0) + t / len(seeds)
            counts.append(row)
            outputs.append(out)
        else:
            r = dpne_reference(None, algorithm, params, rng=np.random.default_rng(s), user_grams=ug)
            counts.append([len(r.ngrams.get(k, ())) for k in range(1, T + 1)])
            outputs.append(r.ngrams)
            for name, t in r.seconds.items():
                secs[name] = secs.get(name, 0.0) + t / len(seeds)
    return {"counts": np.array(counts, dtype=float), "seconds": secs, "outputs": outputs}


def fmt_cell(mean, std):
    return f"{mean:,.0f}+-{std:,.0f}" if std > 0 else f"{mean:,.0f}"


def print_counts(title, results: Dict[str, dict], T: int, paper=None):
    print(f"\n### {title}\n")
    head = "| algorithm | " + " | ".join(str(k) for k in range(1, T + 1)) + " | total |"
    print(head)
    print("|" + "---|" * (T + 2))
    for name, res in results.items():
        c = res["counts"]
        m, sd = c.mean(axis=0), c.std(axis=0, ddof=1) if len(c) > 1 else np.zeros(T)
        tot = c.sum(axis=1)
        total = "-" if name.startswith("dpsu_single") else fmt_cell(tot.mean(), tot.std(ddof=1) if len(c) > 1 else 0)
        print(f"| {name} | " + " | ".join(fmt_cell(a, b) for a, b in zip(m, sd)) + f" | {total} |")
        if paper and name in paper:
            p = paper[name]
            print(
                f"| {name} (paper) | "
                + " | ".join(f"{x:,}" for x in p)
                + " | "
                + ("-" if name == "dpsu_single" else f"{sum(p):,}")
                + " |"
            )
            gaps = [(k + 1, (m[k] - p[k]) / p[k]) for k in range(T) if p[k] and abs(m[k] - p[k]) / p[k] > 0.10]
            if gaps:
                print("|  gap > 10% | " + ", ".join(f"k={k}: {g:+.0%}" for k, g in gaps) + " |")


def print_seconds(results: Dict[str, dict]):
    print("\nwall time per level/run (s, mean over seeds, reference implementation):\n")
    for name, res in results.items():
        print(f"- {name}: " + ", ".join(f"{k}={v:.2f}" for k, v in res["seconds"].items()))


def print_recovery(results: Dict[str, dict], truth: Dict[int, Dict[str, int]], T: int, Ks: Sequence[int]):
    """Fraction of the k-grams used by >= K users that is released (mean over seeds)."""
    print("\nfraction of n-grams used by >= K users that is released (mean over seeds; n = number of such n-grams):\n")
    print("| algorithm | K | " + " | ".join(f"k={k}" for k in range(1, T + 1)) + " |")
    print("|" + "---|" * (T + 2))
    for K in Ks:
        pops = {k: {g for g, c in truth[k].items() if c >= K} for k in range(1, T + 1)}
        print(f"| (n) | {K} | " + " | ".join(str(len(pops[k])) for k in range(1, T + 1)) + " |")
        for name, res in results.items():
            cells = []
            for k in range(1, T + 1):
                if not pops[k]:
                    cells.append("-")
                    continue
                fr = [len(pops[k] & out.get(k, set())) / len(pops[k]) for out in res["outputs"]]
                cells.append(f"{np.mean(fr):.2f}")
            print(f"| {name} | {K} | " + " | ".join(cells) + " |")


def print_spurious(results: Dict[str, dict], truth: Dict[int, Dict[str, int]], T: int):
    print("\nspurious n-grams (released but used by no user), mean over seeds, and fraction of output:\n")
    for name, res in results.items():
        sp = [sum(len(out.get(k, set()) - set(truth[k])) for k in range(1, T + 1)) for out in res["outputs"]]
        tot = [sum(len(v) for v in out.values()) for out in res["outputs"]]
        print(f"- {name}: {np.mean(sp):.1f} spurious of {np.mean(tot):.0f} ({np.mean(sp) / max(1, np.mean(tot)):.4f})")


#: MSNBC's rows: name -> (algorithm, DPNEParams changes). 'dpne' is the paper's (one weighted-Gaussian round
#: per level); 'dpne tables' keeps each level's n-grams by a keep table (the default since issue 30); 'dpne
#: mad_sips' runs MAD-SIPS's rounds inside every level (docs/dpne.md).
MSNBC_ROWS = {
    "dpne": ("dpne", {"selection": "single", "threshold": "gaussian"}),
    "dpne tables": ("dpne", {"selection": "single", "threshold": "optimal"}),
    "dpne mad_sips": ("dpne", {"selection": "mad_sips"}),
    "dpsu_all": ("dpsu_all", {}),
    "dpsu_even": ("dpsu_even", {}),
    "dpsu_single": ("dpsu_single", {}),
}


def bench_msnbc(path: str, seeds: Sequence[int], epsilon: float = 1.0, rows: Sequence[str] = tuple(MSNBC_ROWS)):
    T = 6
    t0 = time.perf_counter()
    ug = user_kgrams(read_jsonl(path), T)
    print(f"\nMSNBC: {len(ug[1]):,} users with text; user k-grams built in {time.perf_counter() - t0:.1f}s")
    base = DPNEParams(epsilon=epsilon, delta=1e-7, max_n=T, max_contributions=10, eta=0.01)
    results = {}
    for name in rows:
        alg, changes = MSNBC_ROWS[name]
        t = time.perf_counter()
        results[name] = run_config(ug, alg, base.replace(**changes), seeds)
        print(f"  {name}: {time.perf_counter() - t:.0f}s for {len(seeds)} seeds", flush=True)
    print_counts(
        f"MSNBC, Table 5 setting (Delta_0=10, eps={epsilon:g}, delta=1e-7, eta=0.01), {len(seeds)} seeds",
        results,
        T,
        PAPER_TABLE5 if epsilon == 1.0 else None,
    )
    print_spurious(results, ngram_user_counts(ug), T)
    print_seconds(results)
    return results


def bench_corpus(title, records, params: DPNEParams, seeds, Ks):
    T = params.max_n
    ug = user_kgrams(records, T)
    truth = ngram_user_counts(ug)
    results = {}
    single = params.replace(selection="single", threshold="gaussian")  # the paper's levels
    for label, alg, prm in [
        ("dpne (weighted_gaussian)", "dpne", single),
        ("dpne (keep tables, default)", "dpne", single.replace(threshold="optimal")),
        ("dpne (mad)", "dpne", single.replace(weighting="mad")),
        ("dpne (mad_sips)", "dpne", params.replace(selection="mad_sips")),
        ("dpne single-side pruning", "dpne", single.replace(pruning="single")),
        ("dpsu_all", "dpsu_all", params),
        ("dpsu_even", "dpsu_even", params),
        ("dpsu_single", "dpsu_single", params),
    ]:
        results[label] = run_config(ug, alg, prm, seeds)
    print_counts(
        f"{title} ({len(ug[1]):,} users; eps={params.epsilon:g}, delta={params.delta:g}, "
        f"Delta_0={params.max_contributions}, eta={params.eta:g}, T={T}), {len(seeds)} seeds",
        results,
        T,
    )
    print_recovery(results, truth, T, Ks)
    print_spurious(results, truth, T)
    print_seconds(results)
    return results


def bench_beam(path: str, mode: str = "in_memory"):
    """Wall time of the Beam transform (DirectRunner) on the bundled sample, and equality with the reference."""
    import tempfile

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from dp_partition_beam.pipelines.extract_ngrams import format_ngram
    from dp_partition_beam.transforms.dpne.dpne import DPNE

    recs = list(read_jsonl(path))
    prm = DPNEParams(epsilon=4.0, delta=1e-7, max_n=6, max_contributions=100, eta=0.01)
    print(f"\n### Beam DPNE on {os.path.relpath(path, REPO)} (DirectRunner {mode}, seed 1)\n")
    configs = {  # the paper's levels with each weighting, the default (keep tables) and MAD-SIPS inside the levels
        "single, weighted_gaussian": {"selection": "single", "weighting": "weighted_gaussian", "threshold": "gaussian"},
        "single, keep tables (default)": {"selection": "single", "threshold": "optimal"},
        "single, mad": {"selection": "single", "weighting": "mad"},
        "mad_sips": {"selection": "mad_sips"},
    }
    for name, changes in configs.items():
        p = prm.replace(**changes)
        t = time.perf_counter()
        want = dpne_reference(recs, "dpne", p, seed=1)
        t_ref = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            try:
                with beam.Pipeline(
                    options=PipelineOptions(["--runner=DirectRunner", f"--direct_running_mode={mode}"])
                ) as pl:
                    out = pl | beam.Create(recs) | DPNE("dpne", p, seed=1)
                    _ = out["ngrams"] | beam.Map(format_ngram) | beam.io.WriteToText(os.path.join(tmp, "ng"))
            except Exception as e:  # noqa: BLE001 - report and continue
                print(f"- {name}: Beam run failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            t_beam = time.perf_counter() - t
            got = sorted(l.rstrip("\n") for f in os.listdir(tmp) for l in open(os.path.join(tmp, f)))
        print(
            f"- {name}: Beam {t_beam:.1f}s, reference (seeded) {t_ref:.1f}s, "
            f"{len(got)} n-grams, identical to reference: {got == want.lines()}"
        )


def main(argv=None):
    logging.getLogger().setLevel(logging.ERROR)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_dpne")
    ap.add_argument("what", choices=["msnbc", "sample", "synthetic", "beam", "all"])
    ap.add_argument("--msnbc", help="msnbc.jsonl.gz (default: the shared data folder's, benchmarks/shared_data.py)")
    ap.add_argument("--input", default=os.path.join(REPO, "data", "debian_text.jsonl.gz"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=1.0, help="msnbc: epsilon (the paper's Table 5: 1)")
    ap.add_argument("--rows", default=",".join(MSNBC_ROWS), help="msnbc: comma-separated rows of MSNBC_ROWS")
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    if args.what in ("msnbc", "all"):
        rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        unknown = sorted(set(rows) - set(MSNBC_ROWS))
        if unknown:
            ap.error(f"--rows: unknown {unknown}; choose from {list(MSNBC_ROWS)}")
        bench_msnbc(args.msnbc or shared_data_path("msnbc.jsonl.gz"), seeds, args.epsilon, rows)
    if args.what in ("sample", "all"):
        prm = DPNEParams(epsilon=4.0, delta=1e-7, max_n=6, max_contributions=100, eta=0.01)
        bench_corpus(
            f"Bundled sample {os.path.relpath(args.input, REPO)}",
            list(read_jsonl(args.input)),
            prm,
            seeds,
            Ks=(50, 100, 200),
        )
    if args.what in ("beam", "all"):
        bench_beam(args.input)
    if args.what in ("synthetic", "all"):
        recs = markov_corpus(20000, vocab=300, branching=4, seed=11)
        prm = DPNEParams(epsilon=4.0, delta=1e-7, max_n=8, max_contributions=50, eta=0.01)
        bench_corpus("Synthetic Markov corpus (vocab 300, branching 4)", recs, prm, seeds, Ks=(20, 50, 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
