"""KL(private || released) vs epsilon for the Bayesian mechanism and the Laplace baselines (paper Fig. 1).

    python -m benchmarks.bench_bayesian [--V 2000] [--users 20000] [--repeats 3] [--tau 0.8 --noise 0.5] \\
        [--plot docs/bayesian_kl.png]
    python -m benchmarks.bench_bayesian --corpus bundled --W 100 --epsilons 0.5,1,2,4,8
    python -m benchmarks.bench_bayesian --corpus debian_b --W 100 --epsilons 0.5,1,2,4,8

Corpora (``--corpus``):

* ``synthetic`` (default; :func:`transforms.testing.bayesian_synthetic.synthetic_corpus`): a Zipf(1.1)
  distribution over V n-grams, users drawing 10 occurrences on average, and a related public corpus of
  1M occurrences drawn from ``p ** tau * exp(noise * N(0, 1))``;
* ``bundled``: the demo's private sample ``data/debian_text.jsonl.gz`` (1,000 users) with its public
  trigrams ``data/bayesian_public_trigrams.tsv.gz`` (754 other users of the same corpus);
* ``debian_b``: all 1,754 users of the shared Debian changelog corpus, with a public prior from another
  corpus: the ``--V`` most frequent trigrams of the shared ``commits`` corpus (26,522 users), counted
  here with the package's tokenizer (read from ``../shared/data`` at run time, never written anywhere).

Mechanisms run in memory (:mod:`transforms.bayesian.reference`, equal to the Beam transform under a
seed). Every table has a **ceiling** row: per epsilon, the best (S, rho) of a fine grid chosen with the
true private distribution (``pipelines.bayesian_eval.ceiling``; NOT private, what no private choice can
beat on average). Prints a table (mean KL in nats over the seeds, per epsilon) and saves a log-scale
plot (needs the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from typing import Dict, List, Sequence

from benchmarks.shared_data import shared_data_path
from dp_partition_beam.pipelines.bayesian_eval import ceiling, evaluate, private_distribution, read_user_texts
from dp_partition_beam.pipelines.io import load_public_counts
from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.reference import user_counts_from_texts
from dp_partition_beam.transforms.testing.bayesian_synthetic import SyntheticCorpus, synthetic_corpus

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_jsonl_texts(path: str) -> Dict[str, List[str]]:
    """user -> texts of a ``{"user", "text"}`` .jsonl.gz, with the pipelines' strict reader."""
    return read_user_texts(path, "jsonl", "user", "text")


def top_ngram_prior(texts: Dict[str, List[str]], n: int, V: int) -> K.PublicPrior:
    """The ``V`` most frequent n-grams of a corpus (ties by string) with their counts, as a public prior."""
    counts: collections.Counter = collections.Counter()
    for docs in texts.values():
        for text in docs:
            counts.update(K.text_ngram_counts(text, n))
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:V]
    return K.PublicPrior.from_counts({g: float(k) for g, k in top})


def real_corpus(private_texts: Dict[str, List[str]], prior: K.PublicPrior, C: int, W: int, seed: int):
    params = BayesianParams(n=3, C=C, W=W)
    users = user_counts_from_texts(private_texts, prior, params, seed, None)
    return SyntheticCorpus(prior, users, private_distribution(private_texts, prior, 3))


def load_corpus(args) -> SyntheticCorpus:
    """The corpus of ``--corpus``: prior, clamped users and the true private distribution."""
    if args.corpus == "bundled":
        texts = read_jsonl_texts(os.path.join(REPO, "data", "debian_text.jsonl.gz"))
        prior = load_public_counts(os.path.join(REPO, "data", "bayesian_public_trigrams.tsv.gz"), 3)
        return real_corpus(texts, prior, args.C, args.W, args.seed)
    if args.corpus == "debian_b":
        prior = top_ngram_prior(read_jsonl_texts(shared_data_path("commits.jsonl.gz")), 3, args.V)
        return real_corpus(read_jsonl_texts(shared_data_path("debian_b.jsonl.gz")), prior, args.C, args.W, args.seed)
    return synthetic_corpus(
        V=args.V,
        users=args.users,
        public_size=args.public_size,
        tau=args.tau,
        noise=args.noise,
        C=args.C,
        W=args.W,
        seed=args.seed,
    )


def series(args, sc: SyntheticCorpus, epsilons: Sequence[float]) -> Dict[str, Dict[float, float]]:
    base = BayesianParams(C=args.C, W=args.W, sensitivity=args.sensitivity)
    dd = "bayesian_data_dependent"
    runs = [
        ("bayesian default (worst-case DP)", base, ["bayesian"]),
        ("bayesian (S=0.001, rho=0.1)", base.replace(S=1e-3, rho=0.1), ["bayesian"]),
        ("data-dependent: private choice (old dflt)", base, [dd]),
        ("data-dependent (S=0.001, rho=0.1)", base.replace(S=1e-3, rho=0.1), [dd]),
        ("data-dependent tuned (Alg. 2, paper grid)", base.replace(tune=True), [dd]),
        (
            "data-dependent tuned (Alg. 2, small grid)",
            base.replace(tune=True, S_grid=(1e-3, 1e-2), rho_grid=(0.05, 0.1, 0.3)),
            [dd],
        ),
        ("laplace", base, ["laplace"]),
        ("laplace_public (data-dependent)", base, ["laplace_public"]),
    ]
    out: Dict[str, Dict[float, float]] = {}
    refs: Dict[str, float] = {}
    for name, params, mechs in runs:
        t = time.perf_counter()
        rows = evaluate(sc.users, sc.p_private, sc.prior, params, epsilons, mechs, args.repeats, args.seed)
        print(f"  {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
        for r in rows:
            if r["epsilon"] is None:
                refs[r["mechanism"]] = r["kl_mean"]
            else:
                out.setdefault(name, {})[r["epsilon"]] = r["kl_mean"]
    t = time.perf_counter()
    best = ceiling(sc.users, sc.p_private, sc.prior, base, epsilons, args.repeats, args.seed)
    print(f"  ceiling: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    out["ceiling (data-dependent Alg. 1, NOT private)"] = {r["epsilon"]: r["kl_mean"] for r in best}
    out["  its S"] = {r["epsilon"]: r["S"] for r in best}
    out["  its rho"] = {r["epsilon"]: r["rho"] for r in best}
    for name, v in refs.items():
        out[f"{name} (no private data)" if name == "public" else name] = {e: v for e in epsilons}
    return out


def format_table(data: Dict[str, Dict[float, float]], epsilons: Sequence[float]) -> str:
    head = f"{'mechanism':<46}" + "".join(f"{'eps=' + format(e, 'g'):>10}" for e in epsilons)
    lines = [head, "-" * len(head)]
    for name, row in data.items():
        fmt = "{:>10g}" if name.startswith("  its") else "{:>10.4f}"
        lines.append(f"{name:<46}" + "".join(fmt.format(row[e]) for e in epsilons))
    return "\n".join(lines)


def plot(data: Dict[str, Dict[float, float]], path: str, title: str, epsilons: Sequence[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8))
    for name, row in data.items():
        if name.startswith("  its"):
            continue
        style = "--" if name in ("uniform", "public (no private data)") else "-o"
        ax.plot(epsilons, [row[e] for e in epsilons], style, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(epsilons)
    ax.set_xticklabels([f"{e:g}" for e in epsilons])
    ax.set_xlabel("epsilon")
    ax.set_ylabel("KL(private || released), nats")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_bayesian", description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="synthetic", choices=("synthetic", "bundled", "debian_b"))
    p.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS), help="comma-separated")
    p.add_argument("--V", type=int, default=None, help="vocabulary size (synthetic: 2000; debian_b's prior: 5000)")
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
    if args.V is None:
        args.V = 5000 if args.corpus == "debian_b" else 2000
    epsilons = [float(e) for e in args.epsilons.split(",") if e.strip()]
    t = time.perf_counter()
    sc = load_corpus(args)
    data = series(args, sc, epsilons)
    if args.corpus == "synthetic":
        title = (
            f"Synthetic Zipf corpus: |V|={args.V}, {args.users} users, C={args.C}, W={args.W},\n"
            f"public ~ p^{args.tau:g}*exp({args.noise:g}N); {args.repeats} seeds, {args.sensitivity}"
        )
    else:
        mass = sum(int(cnt.sum()) for _, cnt in sc.users.values())
        title = (
            f"Corpus {args.corpus}: |V|={sc.prior.size}, {len(sc.users)} users with a public n-gram, "
            f"clamped private mass {mass:,}, C={args.C}, W={args.W},\n{args.repeats} seeds, {args.sensitivity}"
        )
    print(title.replace("\n", " "))
    print(format_table(data, epsilons))
    print(f"total {time.perf_counter() - t:.0f} s")
    if args.plot:
        plot(data, args.plot, title, epsilons)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
