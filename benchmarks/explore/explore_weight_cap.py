"""Exploration (docs/mad_sips.md, "Weight cap"): MAD-SIPS's keep-table round with the users' weights capped.

Runs MAD-SIPS's rounds 1..R-1 with the in-memory reference (``--epsilon``, default 1, delta 1e-5, Delta_0 100,
cap fixed at Delta_0, one seed), then for each weight cap c computes the EXPECTED number of items the last round
releases (exact sums of the table's keep probabilities over the round's totals, no sampling error): Algorithm 2's
biased weights rounded down onto the grid 2^(-k/16) at or below c (``--fill``: the mass above c first
water-filled onto the user's other items, still <= c; the library does not do this), and the table of the
plan with that cap (the one a run uses: calibrated for that grid, composed in RDP with the earlier rounds).

    .venv/bin/python -m benchmarks.explore.explore_weight_cap --data imdb --caps 1,0.5,0.25 [--epsilon 1] [--fill]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.explore.explore_table_last_round import rounds_to_last
from benchmarks.shared_data import read_user_sets, shared_data_path
from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.selection import plan
from dp_partition_beam.transforms.selection import mad_kernels as K


def water_filled(w: np.ndarray, c: float) -> np.ndarray:
    """min(c, lam w) with lam >= 1 the largest keeping sum <= 1 (all c if d c^2 <= 1)."""
    if len(w) * c * c <= 1.0:
        return np.full(len(w), c)
    lo, hi = 1.0, c / float(w.min())
    for _ in range(60):
        lam = (lo + hi) / 2
        lo, hi = (lo, lam) if np.sum(np.minimum(c, lam * w) ** 2) > 1.0 else (lam, hi)
    return np.minimum(c, lo * w)


def last_round_users(user_sets, seed: int, epsilon: float = 1.0):
    """(params, plans, |U_<R|, [(items, Algorithm 2 weights)] of the last round's users)."""
    prm, plans, earlier, capped, biases, _ = rounds_to_last(user_sets, seed, epsilon)
    users = [
        (its, K.user_weights(np.array([biases.get(i, 1.0) for i in its]), prm.b_min, prm.b_max))
        for its in capped.values()
        if len(its)
    ]
    return prm, plans, earlier, users


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="debian_b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--caps", default="1,0.5,0.35,0.25,0.2,0.15,0.1")
    ap.add_argument("--fill", action="store_true", help="water-fill the mass above c (not what the library does)")
    args = ap.parse_args(argv)
    t0 = time.time()
    sets = read_user_sets(shared_data_path(f"{args.data}.user_words.tsv.gz"))
    prm, _, earlier, users = last_round_users(sets, args.seed, args.epsilon)
    print("| data | epsilon | seed | rounds 1..R-1 | weight cap | W50 | last round: expected items |")
    print("|---|---|---|---|---|---|---|")
    for c in (float(x) for x in args.caps.split(",")):
        table = plan("mad_sips", prm.replace(weight_cap=c)).rounds[-1].keep_table  # the run's own table for c
        cs = table.contributions
        totals = {}
        for items, w in users:
            for item, x in zip(items, T.round_down(water_filled(w, c) if args.fill else w, cs)):
                totals[item] = totals.get(item, 0.0) + float(x)
        kept = float(np.sum(table.keep_probability(np.array(list(totals.values())))))
        w50 = table.weight_for(0.5)
        print(f"| {args.data} | {prm.epsilon:g} | {args.seed} | {earlier} | {c:g} | {w50:.2f} | {kept:,.1f} |")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
