"""Long empirical privacy audit: audited epsilon lower bound next to the claimed epsilon.

    python -m benchmarks.privacy_audit [--runs 100000] [--cases basic/tip,mad/tip] [--confidence 1e-6]
    python -m benchmarks.privacy_audit --design basic/tip --runs 4000   # expected bound per holders k

Every run uses fresh OS-entropy randomness (the in-memory reference, unseeded); see
:mod:`transforms.testing.audit` for the worst-case neighbouring pairs and why B disjoint copies in one call
are B independent runs. The bound of each row holds with probability >= 1 - confidence/#rows.
"""

import argparse
import dataclasses
import sys
import time

from dp_partition_beam.privacy.audit import expected_epsilon_lower_bound
from dp_partition_beam.transforms.testing import audit


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100_000, help="runs per dataset (policy cases: runs/100)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--confidence", type=float, default=1e-6, help="total false-failure probability")
    p.add_argument("--design", default="", help="a case name: print the expected bound for holders k-3..k+3")
    args = p.parse_args(argv)
    cases = audit.standard_cases()
    if args.design:
        (case,) = [c for c in cases if c.name == args.design]
        print("| case | holders | Pr_D[E] | Pr_D'[E] | expected eps lb at --runs |")
        print("|---|---|---|---|---|")
        alpha = args.confidence / (4 * len(cases))
        for k in range(max(1, case.holders - 3), case.holders + 4):
            c = dataclasses.replace(case, holders=k)
            e0, e1 = audit.run_counts(c, min(args.runs, 4000))
            n = min(args.runs, 4000)
            lb = expected_epsilon_lower_bound(e0 / n, e1 / n, args.runs, case.delta, alpha)
            print(f"| {case.name} | {k} | {e0 / n:.4g} | {e1 / n:.4g} | {lb:.3f} |", flush=True)
        return 0
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.name in wanted]
    alpha = args.confidence / (4 * len(cases))
    print(
        f"runs per dataset: {args.runs} (policy: {max(1, args.runs // 100)}); "
        f"total false-failure probability {args.confidence:g}"
    )
    print("| algorithm / neighbouring pair | runs | events D | events D' | audited eps lb | claimed eps | delta | s |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0
    for case in cases:
        runs = max(1, args.runs // 100) if case.copies_per_call == 1 else args.runs
        t0 = time.time()
        r = audit.run_audit(case, runs, alpha)
        b = r.bound
        flag = "  **EXCEEDS CLAIM**" if b.epsilon_lb > case.claimed_epsilon else ""
        worst |= bool(flag)
        print(
            f"| {case.name} | {runs} | {b.events_base} | {b.events_neighbour} | {b.epsilon_lb:.3f} | "
            f"{case.claimed_epsilon:g} | {case.delta:g} | {time.time() - t0:.0f} |{flag}",
            flush=True,
        )
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
