"""Offline evaluation: KL(private || released) of each mechanism vs epsilon (paper Figures 1-3).

    python -m dp_partition_beam.pipelines.bayesian_eval --private data/debian_text.jsonl.gz --input_format jsonl \\
        --public data/bayesian_public_trigrams.tsv.gz [--epsilons 0.1,0.2,0.5,1,2] [--repeats 5] \\
        [--mechanisms bayesian,bayesian_data_dependent,laplace,laplace_public] [--C 1 --W 100] \\
        [--S 1 --rho 0.5 | --tune (bayesian_data_dependent only)] \\
        [--distribution NAME=PATH ...] [--seed 0] [--ceiling]

Installed, the command is also ``dp-bayesian-eval``. NOT a private computation: it reads the true
private counts to score the mechanisms, for offline evaluation of parameters only. The private
distribution is the users' (unclamped) n-gram counts over the public vocabulary, normalised.
Mechanisms run in memory (:mod:`transforms.bayesian.reference`, identical to the Beam pipeline under
a seed); ``--distribution NAME=PATH`` also scores released ``n-gram<TAB>probability`` files (e.g.
the pipeline's output). Rows "public" (the prior alone, ``softmax(mu_p)``) and "uniform" are
references; ``--ceiling`` adds per epsilon the best (S, rho) of a fine grid for the paper's Algorithm 1
(``bayesian_data_dependent``), chosen with the true private distribution (:func:`ceiling`). The
data-dependent mechanisms run here without ``--acknowledge_data_dependent``: nothing is released. KL is
in nats, the released distribution mixed with 1e-9 of the uniform one so that zeros of the Laplace
baselines stay finite.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
from apache_beam.io.filesystems import FileSystems

from dp_partition_beam.pipelines import cli, outputs
from dp_partition_beam.pipelines.io import INPUT_FORMATS, InputFileError, ParseFileFn, load_public_counts, open_input
from dp_partition_beam.privacy.bayesian import DATA_DEPENDENT, MECHANISMS, BayesianParams
from dp_partition_beam.transforms.bayesian import bayesian_kernels as K
from dp_partition_beam.transforms.bayesian.reference import release_from_user_counts, user_counts_from_texts
from dp_partition_beam.transforms.core import randomness


def read_user_texts(pattern: str, input_format: str, user_column: str, text_column: str) -> Dict[str, List[str]]:
    """user -> texts, with the pipelines' strict record parser (bad records raise)."""
    fn = ParseFileFn(input_format, user_column, text_column, skip_bad_records=False, allow_newlines=True)
    out: Dict[str, List[str]] = {}
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputFileError(f"--private: no file matches {pattern}")
    for meta in matches:
        for user, text in fn.process(meta):
            out.setdefault(user, []).append(text)
    return out


def private_distribution(texts: Mapping[Any, Sequence[str]], prior: K.PublicPrior, n: int) -> np.ndarray:
    """The users' unclamped n-gram counts over the public vocabulary, normalised (the evaluation target)."""
    index = prior.index()
    c = np.zeros(prior.size)
    for docs in texts.values():
        for text in docs:
            for g, k in K.text_ngram_counts(text, n).items():
                i = index.get(g)
                if i is not None:
                    c[i] += k
    if c.sum() == 0:
        raise ValueError("the private data has no n-gram of the public vocabulary: nothing to evaluate")
    return c / c.sum()


def evaluate(
    users: Mapping[Any, K.UserCounts],
    p_private: np.ndarray,
    prior: K.PublicPrior,
    base: BayesianParams,
    epsilons: Sequence[float],
    mechanisms: Sequence[str],
    repeats: int,
    seed: int,
) -> List[Dict[str, Any]]:
    """Mean and standard deviation of KL(p_private || released) over ``repeats`` seeds per (mechanism, eps).

    Reference rows: ``public`` (softmax(mu_p), no private data) and ``uniform``."""
    rows = [
        {
            "mechanism": "public",
            "epsilon": None,
            "kl_mean": K.kl_divergence(p_private, K.softmax(K.mu_prior(prior.alpha))),
            "kl_std": 0.0,
        },
        {
            "mechanism": "uniform",
            "epsilon": None,
            "kl_mean": K.kl_divergence(p_private, np.full(prior.size, 1.0 / prior.size)),
            "kl_std": 0.0,
        },
    ]
    for mech in mechanisms:
        for eps in epsilons:
            # an offline evaluation (it reads p_private: NOT private) may run the data-dependent mechanisms
            # without the acknowledgement a release needs; tune is bayesian_data_dependent's only
            params = base.replace(
                epsilon=eps,
                tune=base.tune and mech == "bayesian_data_dependent",
                acknowledge_data_dependent=mech in DATA_DEPENDENT,
            )
            kls = []
            for r in range(repeats):
                theta, _ = release_from_user_counts(users, mech, prior, params, seed=seed + r)
                kls.append(K.kl_divergence(p_private, theta))
            rows.append(
                {"mechanism": mech, "epsilon": eps, "kl_mean": float(np.mean(kls)), "kl_std": float(np.std(kls))}
            )
    return rows


#: The ceiling's grid (issue 33): S on a 1-2-5 series from 1e-4 to 1 (w = min(1, S N / C) is 1 for every
#: held n-gram once S >= C, so larger S only repeat S = C; times C below), rho from 0.01 to 1.
CEILING_S = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0)
CEILING_RHO = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def grid_kl(
    users: Mapping[Any, K.UserCounts],
    p_private: np.ndarray,
    prior: K.PublicPrior,
    base: BayesianParams,
    epsilon: float,
    S_values: Sequence[float],
    rho_values: Sequence[float],
    repeats: int,
    seed: int,
) -> np.ndarray:
    """Mean KL(p_private || released) of Algorithm 1 for every (S, rho) of a grid, over ``repeats`` seeds:
    an array of shape (len(S_values), len(rho_values)). NOT private (it reads ``p_private``).

    Each cell is what :func:`transforms.bayesian.reference.release_from_user_counts` releases with that
    (S, rho) and seed, bit for bit (the same kernels; the test checks it): the totals, the sensitivities
    (one per S, ``base.sensitivity``) and the unit noise of each seed are computed once for the grid."""
    order = sorted(users, key=lambda u: str(u))
    c, N = K.accumulate((users[u] for u in order), prior.size)
    ctx = K.SensitivityContext.build(c, N, tuple(S_values), base.C)
    gammas = K.sensitivities(base.sensitivity, ctx, (users[u] for u in order))
    mu_p, xh = K.mu_prior(prior.alpha), K.x_hat(c)
    noise = [K.standard_noise("gaussian", prior.vocab, K.PURPOSE_GAUSSIAN, seed + r, None) for r in range(repeats)]
    out = np.empty((len(S_values), len(rho_values)))
    for a, S in enumerate(S_values):
        w = K.decay_weights(N, S, base.C)
        for b, rho in enumerate(rho_values):
            mu_ps = K.posterior_mean(xh, w, mu_p, rho)
            sigma = K.sigma_ps(float(gammas[a]), rho, epsilon, base.delta)
            out[a, b] = np.mean([K.kl_divergence(p_private, K.sample_posterior(mu_ps, sigma, z)) for z in noise])
    return out


def ceiling(
    users: Mapping[Any, K.UserCounts],
    p_private: np.ndarray,
    prior: K.PublicPrior,
    base: BayesianParams,
    epsilons: Sequence[float],
    repeats: int,
    seed: int,
    S_values: Sequence[float] = CEILING_S,
    rho_values: Sequence[float] = CEILING_RHO,
) -> List[Dict[str, Any]]:
    """Per epsilon, the best (S, rho) of the grid for Algorithm 1, chosen with the true private
    distribution: an offline ceiling for any private choice of the prior's weight, NOT private.

    S values are multiples of ``base.C`` (``CEILING_S`` x C). One row per epsilon, like :func:`evaluate`'s,
    with the chosen ``S`` and ``rho``; ``kl_std`` is 0 (the cell's mean over the seeds is what is minimised)."""
    S_values = tuple(S * base.C for S in S_values)
    rows = []
    for eps in epsilons:
        kl = grid_kl(users, p_private, prior, base, eps, S_values, rho_values, repeats, seed)
        a, b = np.unravel_index(int(np.argmin(kl)), kl.shape)
        rows.append(
            {
                "mechanism": "ceiling",
                "epsilon": eps,
                "kl_mean": float(kl[a, b]),
                "kl_std": 0.0,
                "S": S_values[a],
                "rho": rho_values[b],
            }
        )
    return rows


def format_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["mechanism                epsilon   KL mean    KL std", "-" * 52]
    for r in rows:
        eps = "-" if r["epsilon"] is None else f"{r['epsilon']:g}"
        line = f"{r['mechanism']:<24} {eps:>7} {r['kl_mean']:>9.4f} {r['kl_std']:>9.4f}"
        if "S" in r:
            line += f"   S={r['S']:g}, rho={r['rho']:g}"
        lines.append(line)
    return "\n".join(lines)


def read_distribution(path: str, prior: K.PublicPrior) -> np.ndarray:
    """A released ``n-gram<TAB>probability`` file set (prefix or glob) as a vector over the vocabulary."""
    index = prior.index()
    q = np.zeros(prior.size)
    # a prefix means the release's shards (PREFIX-?????-of-?????), never whatever else starts with it
    pattern = path if any(ch in path for ch in "*?[") else outputs.shard_pattern(path)
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputFileError(f"--distribution: no file matches {pattern}")
    for meta in matches:
        with open_input(meta.path) as f:  # a truncated or corrupt compressed file raises InputFileError
            for line_no, raw in enumerate(iter(f.readline, b""), 1):
                try:
                    line = raw.decode("utf-8").rstrip("\n")
                except UnicodeDecodeError:
                    raise InputFileError(f"{meta.path}:{line_no}: not UTF-8 text") from None
                if not line:
                    continue
                gram, _, value = line.rpartition("\t")
                if gram not in index:
                    raise InputFileError(f"{meta.path}:{line_no}: n-gram {gram!r} is not in the public vocabulary")
                try:
                    q[index[gram]] = float(value)
                except ValueError:
                    raise InputFileError(
                        f"{meta.path}:{line_no}: expected n-gram<TAB>probability, got a probability of {value[:40]!r}"
                    ) from None
    return q


def build_parser() -> argparse.ArgumentParser:
    p = cli.new_parser(
        "dp-bayesian-eval",
        "KL(private || mechanism) vs epsilon (offline, NOT private).",
        beam_options=False,  # in memory: no Beam option applies
    )
    p.add_argument("--private", required=True, help="private user-level text, as for pipelines.bayesian_ngrams")
    p.add_argument("--input_format", required=True, choices=INPUT_FORMATS)
    p.add_argument("--user_column", default="user", help="name of the user column/key (default: user)")
    p.add_argument("--text_column", default="text", help="name of the text column/key (default: text)")
    p.add_argument("--public", required=True, help="public n-gram counts, n-gram<TAB>count per line")
    p.add_argument(
        "--epsilons",
        type=cli.float_list,
        default=[0.1, 0.2, 0.5, 1.0, 2.0],
        help="the epsilons to evaluate (default 0.1,0.2,0.5,1,2)",
    )
    p.add_argument(
        "--mechanisms", default=",".join(MECHANISMS), help="comma-separated subset of " + ", ".join(MECHANISMS)
    )
    cli.add_params_args(p, BayesianParams, exclude=("epsilon",))
    p.add_argument("--repeats", type=int, default=5, help="seeds per (mechanism, epsilon) (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first seed of the repeats (default 0)")
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="also print, per epsilon, the best (S, rho) of a fine grid for the Bayesian mechanism, chosen "
        "with the true private distribution (an offline ceiling, NOT private)",
    )
    p.add_argument(
        "--distribution",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also score a released distribution (pipeline output prefix or glob)",
    )
    return p


def run(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    cli.check_unknown_args(parser, extra, beam_options=False)  # in memory: no Beam option applies
    cli.absolute_local_paths(args)
    cli.configure_logging("WARNING")
    try:
        mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
        for m in mechanisms:
            if m not in MECHANISMS:
                raise ValueError(f"mechanisms: unknown mechanism {m!r} (allowed: {', '.join(MECHANISMS)})")
        if args.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {args.repeats}")
        base = cli.params_from_args(BayesianParams, args, exclude=("epsilon",))  # epsilon: one per row
        prior = load_public_counts(args.public, args.n)
        texts = read_user_texts(args.private, args.input_format, args.user_column, args.text_column)
        p_private = private_distribution(texts, prior, args.n)
        named = []
        for spec in args.distribution:
            if "=" not in spec:
                raise ValueError(f"--distribution must be NAME=PATH, got {spec!r}")
            name, path = spec.split("=", 1)
            named.append((name, read_distribution(path, prior)))
    except ValueError as e:
        message = cli.error_message(e)  # a documented data error (a damaged --public or --private file): exit 3
        if message is not None:
            print(f"error: {message}", file=sys.stderr)
            return 3
        parser.error(str(e))
    except OSError as e:  # a file that cannot be read
        print(f"error: {cli.error_message(e) or e}", file=sys.stderr)
        return 3
    randomness.warn_if_seeded(args.seed)  # once; the repeats use seed, seed + 1, ...
    users = user_counts_from_texts(texts, prior, base, seed=args.seed, rng=None)
    rows = evaluate(users, p_private, prior, base, args.epsilons, mechanisms, args.repeats, args.seed)
    if args.ceiling:
        rows += ceiling(users, p_private, prior, base, args.epsilons, args.repeats, args.seed)
    for name, q in named:
        rows.append({"mechanism": name, "epsilon": None, "kl_mean": K.kl_divergence(p_private, q), "kl_std": 0.0})
    print(
        f"KL(private || released), nats; {len(users)} users with an n-gram of the public vocabulary, "
        f"|V| = {prior.size}, C={base.C}, W={base.W}, {args.repeats} seeds (offline evaluation, NOT private)"
    )
    print(format_table(rows))
    return 0


def main():
    sys.exit(run())


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the package module's main instead, so that the functions
    # the pipeline pickles belong to dp_partition_beam.pipelines.bayesian_eval (an SDK worker in another process
    # cannot import __main__; Beam 2.62's dill sent them by value without their globals, and extract_ngrams'
    # build_report failed with "NameError: name 'json' is not defined" on the standalone Flink cluster).
    from dp_partition_beam.pipelines.bayesian_eval import main as package_main

    package_main()
