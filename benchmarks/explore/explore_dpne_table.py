"""How many more n-grams DPNE's levels would release as keep tables: an estimate, not a mechanism.

    python -m benchmarks.explore.explore_dpne_table [--seeds 2] [--epsilon 1]

Issue 30's DPNE target (MSNBC, Table 5 setting: >= 8,500 n-grams with the default settings) is met today only
by ``--selection mad_sips``, whose level graph Flink cannot compile at ``--max_n`` >= 3 (docs/engines.md).
A level k >= 2 works on a known domain V_k: its Gaussian histogram and threshold rho_k release one bit per
n-gram (kept or not), and the threshold only trades size against spurious n-grams (docs/dpne.md). A keep
table (docs/thresholding.md) releases that bit directly: F(0) = q_k (the level's spurious rate, so the same
expected spurious n-grams) and every step F[j] -> F[j + m_c] within (alpha, eps_R c^2)-RDP (pure, no
delta: F(0) > 0), built by ``thresholding.keep_table(..., unseen=q_k)``. The levels then compose
in RDP and convert to (epsilon, delta) once.

Built since: DPNE's ``threshold='optimal'`` (the default, privacy.dpne.plan_tables; 8,741 n-grams with level 1
as a table too). This script is the record of the estimate that led there, made before any of it was built: every
level k >= 2 of the in-memory reference
keeps each n-gram of weight W with probability F(W) (the table of its q_k at one order alpha, each level an
equal share eps_R = (epsilon - conversion(alpha, delta / 2)) / T of the budget) instead of Gaussian noise
and rho_k; spurious n-grams are drawn as today (rate q_k). Level 1 stays the Gaussian DPSU. Approximations:
level 1's Gaussian is not charged in RDP unless ``--level1_sigma`` charges it (its sigma is not changed: on
MSNBC every unigram is far above any level-1 threshold), the order alpha is the one that minimises W50 at
q = 1e-3, and no search over the split. It prints, per level, W50 = the weight
kept half the time (table) against rho_k (Gaussian) and the released n-grams of both.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.stats import norm

from benchmarks.bench_dpne import read_jsonl
from benchmarks.shared_data import shared_data_path
from dp_partition_beam.privacy import thresholding as th
from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.dpne import reference
from dp_partition_beam.transforms.dpne.reference import dpne_reference, user_kgrams

GRID_BITS = 6


def known_domain_table(q: float, alpha: float, eps_r: float, contributions) -> th.KeepTable:
    """The pointwise-largest pure-RDP table of a known domain, F[0] = q (th.keep_table, unseen=q)."""
    return th.keep_table(alpha, eps_r, 0.0, contributions, GRID_BITS, unseen=q)


def conversion(alpha: float, delta: float) -> float:
    return th.rdp_to_dp_epsilon(0.0, alpha, delta)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--msnbc", default=None)
    ap.add_argument(
        "--level1_sigma",
        type=float,
        default=None,
        help="charge level 1 as a Gaussian of this sigma in RDP (alpha / (2 sigma^2)) and split the rest over "
        "levels 2..T; default: not charged, each level (epsilon - conversion) / T",
    )
    args = ap.parse_args(argv)
    T, delta, d0 = 6, 1e-7, 10
    # the Gaussian levels (their noisy_release is what the estimate swaps out; the default is now the tables)
    params = DPNEParams(
        epsilon=args.epsilon, delta=delta, max_n=T, max_contributions=d0, eta=0.01, threshold="gaussian"
    )
    contributions = th.basic_contributions(d0)
    sigma_k = analytic_gaussian_sigma(args.epsilon, delta / 2) * math.sqrt(T)
    t0 = time.perf_counter()
    ug = user_kgrams(read_jsonl(args.msnbc or shared_data_path("msnbc.jsonl.gz")), T)
    print(f"MSNBC read in {time.perf_counter() - t0:.0f} s; sigma_k {sigma_k:.2f}")

    q0 = 1e-3
    alphas = np.geomspace(2, 200, 25)
    share = [(args.epsilon - conversion(a, delta / 2)) / T for a in alphas]
    # orders whose conversion alone costs epsilon get no table
    scores = [
        known_domain_table(q0, a, e, contributions).weight_for(0.5) if e > 0 else math.inf
        for a, e in zip(alphas, share)
    ]
    alpha = float(alphas[int(np.argmin(scores))])
    eps_r = (args.epsilon - conversion(alpha, delta / 2)) / T
    if args.level1_sigma is not None:  # level 1's 17 unigrams need little: its RDP, the rest to levels 2..T
        eps_r = (args.epsilon - conversion(alpha, delta / 2) - alpha / (2 * args.level1_sigma**2)) / (T - 1)
    print(f"alpha {alpha:.1f}, eps_R per level {eps_r:.4f}")
    tables, seen = {}, []
    gaussian_release = reference.noisy_release

    def table_release(hist, sigma, rho, round_, seed, rng):
        if round_ == 1 or not math.isfinite(rho):
            return gaussian_release(hist, sigma, rho, round_, seed, rng)
        q = float(norm.sf(rho / sigma))
        if q not in tables:
            tables[q] = known_domain_table(q, alpha, eps_r, contributions)
        table = tables[q]
        items = sorted(hist)
        f = table.keep_probability([hist[g] for g in items])
        u = randomness.keyed_generator(seed, "explore_keep", round_, 0).random(len(items))  # an estimate's draws
        seen.append((round_, rho, table.weight_for(0.5)))
        return {g for g, x, y in zip(items, f, u) if y < x}

    def gaussian_rescaled(hist, sigma, rho, round_, seed, rng):
        # the same level-1 share for the Gaussian: levels 2..T get 1/sigma^2 = (1/sigma*^2 - 1/sigma_1^2)/(T-1)
        # (GDP), and rho_k = sigma_k PhiInv(1 - q_k) scales with sigma_k (the same spurious rate)
        if round_ == 1 or not math.isfinite(rho):
            return gaussian_release(hist, sigma, rho, round_, seed, rng)
        scale = 1.0 / math.sqrt((T - sigma_k**2 / args.level1_sigma**2) / (T - 1))
        return gaussian_release(hist, sigma * scale, rho * scale, round_, seed, rng)

    rows = [("gaussian (today)", gaussian_release), ("keep tables", table_release)]
    if args.level1_sigma is not None:
        rows.insert(1, (f"gaussian, level 1 at sigma {args.level1_sigma:g}", gaussian_rescaled))
    for label, release in rows:
        reference.noisy_release = release
        totals = []
        for s in range(args.seeds):
            seen.clear()
            r = dpne_reference(None, "dpne", params, seed=s, user_grams=ug)
            counts = [len(r.ngrams.get(k, ())) for k in range(1, T + 1)]
            totals.append(sum(counts))
            print(f"  {label}, seed {s}: {counts} total {sum(counts):,}", flush=True)
            for k, rho, w in seen:
                print(f"    level {k}: rho_k {rho:.2f}, table W50 {w:.2f} ({w / rho:.3f} of rho_k)")
        print(f"{label}: mean {np.mean(totals):,.0f} n-grams over {args.seeds} seeds")
    reference.noisy_release = gaussian_release


if __name__ == "__main__":
    main()
