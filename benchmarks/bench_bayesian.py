"""KL(private || released) vs epsilon for the Bayesian mechanism and the Laplace baselines (paper Fig. 1).

    python -m benchmarks.bench_bayesian [--V 2000] [--users 20000] [--repeats 3] [--tau 0.8 --noise 0.5] \\
        [--plot docs/bayesian_kl.png]

Synthetic corpus (:func:`transforms.testing.bayesian_synthetic.synthetic_corpus`): a Zipf(1.1) distribution
over V n-grams, users drawing 10 occurrences on average, and a related public corpus of 1M
occurrences drawn from ``p ** tau * exp(noise * N(0, 1))``. Mechanisms run in memory
(:mod:`transforms.bayesian.reference`, equal to the Beam transform under a seed). Prints a table
(mean KL in nats over the seeds, per epsilon) and saves a log-scale plot (needs the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List

from dp_partition_beam.pipelines.bayesian_eval import evaluate
from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.transforms.testing.bayesian_synthetic import synthetic_corpus

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0)


def series(args) -> Dict[str, Dict[float, float]]:
    sc = synthetic_corpus(
        V=args.V,
        users=args.users,
        public_size=args.public_size,
        tau=args.tau,
        noise=args.noise,
        C=args.C,
        W=args.W,
        seed=args.seed,
    )
    base = BayesianParams(C=args.C, W=args.W, sensitivity=args.sensitivity)
    runs = [
        (f"bayesian (S={base.S:g}, rho={base.rho:g})", base, ["bayesian"]),
        ("bayesian tuned (Alg. 2, paper grid)", base.replace(tune=True), ["bayesian"]),
        (
            "bayesian tuned (Alg. 2, small grid)",
            base.replace(tune=True, S_grid=(1e-3, 1e-2), rho_grid=(0.05, 0.1, 0.3)),
            ["bayesian"],
        ),
        ("bayesian (S=1, rho=0.5)", base.replace(S=1.0, rho=0.5), ["bayesian"]),
        ("laplace", base, ["laplace"]),
        ("laplace_public", base, ["laplace_public"]),
    ]
    out: Dict[str, Dict[float, float]] = {}
    refs: Dict[str, float] = {}
    for name, params, mechs in runs:
        t = time.perf_counter()
        rows = evaluate(sc.users, sc.p_private, sc.prior, params, EPSILONS, mechs, args.repeats, args.seed)
        print(f"  {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
        for r in rows:
            if r["epsilon"] is None:
                refs[r["mechanism"]] = r["kl_mean"]
            else:
                out.setdefault(name, {})[r["epsilon"]] = r["kl_mean"]
    for name, v in refs.items():
        out[f"{name} (no private data)" if name == "public" else name] = {e: v for e in EPSILONS}
    return out


def format_table(data: Dict[str, Dict[float, float]]) -> str:
    head = f"{'mechanism':<38}" + "".join(f"{'eps=' + format(e, 'g'):>10}" for e in EPSILONS)
    lines = [head, "-" * len(head)]
    for name, row in data.items():
        lines.append(f"{name:<38}" + "".join(f"{row[e]:>10.4f}" for e in EPSILONS))
    return "\n".join(lines)


def plot(data: Dict[str, Dict[float, float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8))
    for name, row in data.items():
        style = "--" if name in ("uniform", "public (no private data)") else "-o"
        ax.plot(EPSILONS, [row[e] for e in EPSILONS], style, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(EPSILONS)
    ax.set_xticklabels([f"{e:g}" for e in EPSILONS])
    ax.set_xlabel("epsilon")
    ax.set_ylabel("KL(private || released), nats")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_bayesian", description=__doc__.splitlines()[0])
    p.add_argument("--V", type=int, default=2000)
    p.add_argument("--users", type=int, default=20000)
    p.add_argument("--public_size", type=int, default=1_000_000)
    p.add_argument("--tau", type=float, default=0.8)
    p.add_argument("--noise", type=float, default=0.5)
    p.add_argument("--C", type=int, default=1)
    p.add_argument("--W", type=int, default=20)
    p.add_argument("--sensitivity", default="brute_force", choices=("brute_force", "bound"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="PNG path (needs matplotlib, the 'plots' extra)")
    args = p.parse_args(argv)
    t = time.perf_counter()
    data = series(args)
    title = (
        f"Synthetic Zipf corpus: |V|={args.V}, {args.users} users, C={args.C}, W={args.W},\n"
        f"public ~ p^{args.tau:g}*exp({args.noise:g}N); {args.repeats} seeds, {args.sensitivity}"
    )
    print(title.replace("\n", " "))
    print(format_table(data))
    print(f"total {time.perf_counter() - t:.0f} s")
    if args.plot:
        plot(data, args.plot, title)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
