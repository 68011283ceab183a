"""Exploration behind MAD-SIPS's defaults (docs/mad_sips.md): released items, mean +- std over seeds.

    .venv/bin/python -m benchmarks.explore.explore_mad_sips --data higgs --seeds 5 \
        --config mad2r --config dp_sips:budget_split=0.05,0.15,0.8 \
        --config mad_sips:budget_split=0.1,0.2,0.7,c_ub=4

A config is ``algorithm[:field=value,...]`` over :class:`privacy.selection.SelectionParams` (epsilon 1,
delta 1e-5, Delta_0 100 unless overridden; ``budget_split`` takes comma-separated fractions up to the next
``field=``). Data: ``imdb``, ``higgs``, ``commits``, ``retail``, ``debian_b``, ``msnbc`` (the shared data
folder, read at run time and never copied), ``zipf`` (synthetic: 20,000 users, mean degree 30, Zipf 1.1
over 200,000 items) or
``zipf_heavy`` (20,000 users, mean degree 150: many users above Delta_0). Runs the in-memory reference
(equal to SelectPartitions under a seed) with seeds 0..seeds-1.
"""

from __future__ import annotations

import argparse
import gzip
import time

import numpy as np

from benchmarks.shared_data import shared_data_path
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.testing.synthetic import zipf_pairs

SHARED = {name: f"{name}.user_words.tsv.gz" for name in ("imdb", "higgs", "commits", "retail", "debian_b", "msnbc")}
SYNTHETIC = {
    "zipf": dict(n_chunks=4, users_per_chunk=5_000, mean_degree=30.0, n_items=200_000, exponent=1.1),
    "zipf_heavy": dict(n_chunks=4, users_per_chunk=5_000, mean_degree=150.0, n_items=200_000, exponent=1.1),
}


def load(name: str) -> dict:
    """dict user -> distinct items of a shared corpus or a synthetic dataset."""
    if name in SYNTHETIC:
        return reference.user_sets_from_pairs(zipf_pairs(**SYNTHETIC[name]))
    with gzip.open(shared_data_path(SHARED[name]), "rt", encoding="utf-8") as f:
        next(f)  # header
        return reference.user_sets_from_pairs(tuple(line.rstrip("\n").split("\t", 1)) for line in f)


def parse_config(text: str):
    """'algo:field=v,field=v1,v2' -> (algo, {field: value})."""
    algo, _, rest = text.partition(":")
    changes = {}
    key = None
    for tok in filter(None, rest.split(",")):
        if "=" in tok:
            key, value = tok.split("=", 1)
            changes[key] = [value] if key == "budget_split" else value
        elif key == "budget_split":
            changes[key].append(tok)
        else:
            raise ValueError(f"bad config {text!r}")
    out = {}
    for k, v in changes.items():
        if k == "budget_split":
            out[k] = tuple(float(x) for x in v)
        elif k in ("max_contributions", "d_max"):
            out[k] = int(v)
        elif k in ("accounting", "threshold") or (k == "weight_cap" and v == "auto"):
            out[k] = v
        elif k == "release_counts":
            out[k] = v.lower() in ("1", "true", "yes")
        else:
            out[k] = float(v)
    return algo, out


def split_noise_delta(q: float) -> None:
    """Patches the multi-round planner to give the noise q*delta and the thresholds (1 - q)*delta."""
    from dp_partition_beam.privacy import accounting, calibration, selection

    original = accounting.multi_round_calibration

    def patched(epsilon, delta, fractions, accounting_="gdp", max_contributions=100, h_per_round=None, sigma=None):
        if accounting_ != "gdp" or sigma is not None:
            raise ValueError("--noise_delta supports gdp accounting without counts only")
        sigma = calibration.analytic_gaussian_sigma(epsilon, q * delta)
        # the thresholds' delta_r = f_r * (passed delta) spend half of it: pass 2 (1 - q) delta
        return original(epsilon, 2.0 * (1.0 - q) * delta, fractions, "gdp", max_contributions, h_per_round, sigma)

    selection.accounting = type("PatchedAccounting", (), {"multi_round_calibration": staticmethod(patched)})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, choices=sorted(SHARED) + sorted(SYNTHETIC))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument(
        "--noise_delta",
        type=float,
        default=None,
        help="exploration only: the fraction q of delta spent by the Gaussian noise (sigma = AGM(eps, q delta)), "
        "the thresholds get (1 - q) delta (the planner's default is q = 1/2); multi-round shapes, no counts",
    )
    args = ap.parse_args(argv)
    if args.noise_delta is not None:
        split_noise_delta(args.noise_delta)
    t0 = time.time()
    sets = load(args.data)
    print(f"# {args.data}: {len(sets):,} users, {sum(map(len, sets.values())):,} pairs ({time.time() - t0:.0f} s)")
    base = SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    for text in args.config:
        algo, changes = parse_config(text)
        params = base.replace(**changes)
        t = time.time()
        sizes, caps, weight_caps = [], [], []
        for s in range(args.seeds):
            result = reference.release(sets, algo, params, seed=s)
            sizes.append(len(result.items))
            caps.append(result.cap)
            weight_caps.append(None if result.weight_cap is None else round(result.weight_cap, 3))
        per_run = (time.time() - t) / args.seeds
        chosen = f"  caps {caps}" if any(c is not None for c in caps) else ""  # mad_sips's adaptive cap
        if any(c is not None for c in weight_caps):  # weight_cap auto's choices
            chosen += f"  weight caps {weight_caps}"
        print(
            f"{text:60s} {np.mean(sizes):8.1f} +- {np.std(sizes):5.1f}  {sizes}{chosen}  ({per_run:.0f} s/run)",
            flush=True,
        )


if __name__ == "__main__":
    main()
