"""Release an n-gram probability distribution over a public vocabulary (Bayesian DP paper, Alg. 1-2).

    python -m pipelines.bayesian_ngrams --private data/debian_text.jsonl.gz --input_format jsonl \\
        --public data/bayesian_public_trigrams.tsv.gz --output out/trigram_probs --report out/bayes.json \\
        [--n 3] [--mechanism bayesian|laplace|laplace_public] [--epsilon 1] [--delta 1e-5] \\
        [--C 1] [--W 100] [--S 1 --rho 0.5 | --tune [--S_grid ...] [--rho_grid ...] \\
        [--tune_epsilon_fraction 0.3333]] [--sensitivity brute_force|bound] [--seed N] \\
        [--runner DataflowRunner ... --setup_file ./setup.py]

Inputs: ``--private`` user-level text as in ``pipelines.extract_ngrams`` (jsonl ``{"user", "text"}``,
tsv ``user<TAB>text``, parquet columns); ``--public`` public n-gram counts, ``n-gram<TAB>count`` per
line (words joined by single spaces, tokenised like the private text: NFKC, lowercase), read by the
launcher (the vocabulary is public and bounded). Output: ``n-gram<TAB>probability`` for every public
n-gram, in files starting with ``--output``; the probabilities sum to 1. Report: JSON at ``--report``.

Privacy: the Bayesian mechanism's noise is calibrated to a sensitivity computed from the private
data (brute force or Claim 1): a data-dependent (local) sensitivity. The report says so
(``"sensitivity": "data-dependent"``) and docs/bayesian_ngrams.md explains what that does and does not
guarantee. ``--mechanism laplace`` is the only option with a standard, data-independent guarantee.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines import common, observability
from pipelines.extract_ngrams import load_tokenizer
from pipelines.io import DEFAULT_MAX_TEXT_LENGTH, INPUT_FORMATS, ReadRecords
from privacy.bayesian_params import MECHANISMS, SENSITIVITIES, BayesianParams
from transforms.bayesian import BayesianNgrams
from transforms.bayesian_kernels import PublicPrior

GUARANTEE = {
    "data-dependent": (
        "The noise is calibrated to a sensitivity computed from the private data itself (the users' "
        "counts N_i and totals c_i): a local sensitivity at this dataset. For this dataset and any "
        "neighbour obtained by removing one user, the released sample's density ratio is bounded as a "
        "Gaussian mechanism with the stated (epsilon, delta) would be IF the neighbour were released with "
        "the same noise scale; but the neighbour's own run would compute a different scale, and the scale "
        "itself depends on the data. This is NOT a worst-case (epsilon, delta)-DP guarantee over all "
        "neighbouring datasets. Use --mechanism laplace for a standard guarantee."
    ),
    "data-independent": (
        "Standard user-level pure epsilon-DP: each user contributes at most W counts in total, the l1 "
        "sensitivity W does not depend on the data, and Laplace noise of scale W/epsilon is added."
    ),
}


def _float_list(text: str) -> List[float]:
    try:
        vals = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not vals:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    d = BayesianParams()
    p = argparse.ArgumentParser(
        prog="python -m pipelines.bayesian_ngrams",
        description="DP n-gram probability distribution over a public vocabulary with a public prior "
                    "(Bayesian DP, Laplace baselines) on Beam.",
    )
    p.add_argument("--private", required=True, help="private user-level text: path or glob (local, gs://, ...)")
    p.add_argument("--input_format", required=True, choices=INPUT_FORMATS)
    p.add_argument("--user_column", default="user", help="name of the user column/key (default: user)")
    p.add_argument("--text_column", default="text", help="name of the text column/key (default: text)")
    p.add_argument("--skip_bad_records", action="store_true",
                   help="skip malformed private records (default: fail); how many is data-dependent and "
                        "only written with --diagnostics PATH (non-private)")
    p.add_argument("--max_text_length", type=int, default=DEFAULT_MAX_TEXT_LENGTH,
                   help="longest accepted private text, in characters (default %(default)s); longer ones are "
                        "bad records (read in bounded chunks)")
    p.add_argument("--public", required=True, help="public n-gram counts, n-gram<TAB>count per line")
    p.add_argument("--output", required=True, help="prefix of the output files (n-gram<TAB>probability)")
    p.add_argument("--report", required=True, help="path of the JSON report")
    p.add_argument("--n", type=int, default=d.n, help="n-gram length (default %(default)s)")
    p.add_argument("--mechanism", default=d.mechanism, choices=MECHANISMS)
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="total epsilon (default %(default)s)")
    p.add_argument("--delta", type=float, default=d.delta, help="delta of the Gaussian (default %(default)s)")
    p.add_argument("--C", type=int, default=d.C, help="max count of one n-gram per user (default %(default)s)")
    p.add_argument("--W", type=int, default=d.W, help="max total count per user (default %(default)s)")
    p.add_argument("--S", type=float, default=d.S, help="decay S of w = min(1, S*N/C) (default %(default)s)")
    p.add_argument("--rho", type=float, default=d.rho, help="posterior weight rho (default %(default)s)")
    p.add_argument("--tune", action="store_true",
                   help="choose (S, rho) privately on a grid (Algorithm 2) instead of --S/--rho")
    p.add_argument("--S_grid", type=_float_list, default=list(d.S_grid), help="S candidates (comma-separated)")
    p.add_argument("--rho_grid", type=_float_list, default=list(d.rho_grid), help="rho candidates")
    p.add_argument("--tune_epsilon_fraction", type=float, default=d.tune_epsilon_fraction,
                   help="share of epsilon spent on tuning (paper: 1/3)")
    p.add_argument("--validation_fraction", type=float, default=d.validation_fraction,
                   help="share of users in the scoring set of Algorithm 2 (paper: 0.1)")
    p.add_argument("--sensitivity", default=d.sensitivity, choices=SENSITIVITIES,
                   help="brute_force (exact max over users) or bound (Claim 1); both data-dependent")
    p.add_argument("--seed", type=int, default=None,
                   help="reproducible mode: every random draw is a function of the seed. NOT private "
                        "against anyone who knows the seed; for tests and demos only")
    p.add_argument("--tokenizer", default=None,
                   help="module:function replacing the default tokenizer (NFKC, lowercase, word runs)")
    observability.add_args(p)  # --diagnostics, --progress_interval, --log_level, --no_wait, --plots
    return p


def params_from_args(args) -> BayesianParams:
    return BayesianParams(
        epsilon=args.epsilon, delta=args.delta, n=args.n, mechanism=args.mechanism, C=args.C, W=args.W,
        S=args.S, rho=args.rho, sensitivity=args.sensitivity, tune=bool(args.tune),
        S_grid=tuple(args.S_grid), rho_grid=tuple(args.rho_grid),
        tune_epsilon_fraction=args.tune_epsilon_fraction, validation_fraction=args.validation_fraction,
    )


def load_public_counts(path: str, n: int) -> PublicPrior:
    """Reads ``n-gram<TAB>count`` lines (gzip etc. by extension). Errors name the file and line."""
    counts = {}
    try:
        f = FileSystems.open(path)
    except Exception as e:  # noqa: BLE001  (any filesystem's "not found")
        raise ValueError(f"--public: cannot open {path!r}: {e}") from None
    with f:
        for line_no, raw in enumerate(iter(f.readline, b""), 1):
            try:
                line = raw.decode("utf-8").rstrip("\n").rstrip("\r")
            except UnicodeDecodeError:
                raise ValueError(f"--public {path}:{line_no}: not valid UTF-8") from None
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise ValueError(f"--public {path}:{line_no}: expected n-gram<TAB>count")
            gram, value = parts
            if gram != " ".join(gram.split()) or len(gram.split()) != n:
                raise ValueError(f"--public {path}:{line_no}: expected an n-gram of {n} words joined by single "
                                 f"spaces, got {gram!r}")
            try:
                count = float(value)
            except ValueError:
                raise ValueError(f"--public {path}:{line_no}: count must be a number, got {value!r}") from None
            if not math.isfinite(count) or count < 0:
                raise ValueError(f"--public {path}:{line_no}: count must be finite and >= 0, got {value!r}")
            if gram in counts:
                raise ValueError(f"--public {path}:{line_no}: duplicate n-gram {gram!r}")
            counts[gram] = count
    if not counts:
        raise ValueError(f"--public {path}: no n-grams (the public vocabulary must not be empty)")
    return PublicPrior.from_counts(counts)


def format_probability(element) -> str:
    gram, p = element
    return f"{gram}\t{p!r}"


def build_report(_, base: dict, infos: list) -> str:
    report = dict(base)
    for info in infos:  # exactly one
        report.update(info)
    report["guarantee"] = GUARANTEE[report["sensitivity"]]
    return json.dumps(report, indent=2, sort_keys=True)


def build_pipeline(pipeline: beam.Pipeline, args, params: BayesianParams):
    prior = load_public_counts(args.public, params.n)
    tokenizer = load_tokenizer(args.tokenizer)
    read = pipeline | "ReadPrivate" >> ReadRecords(
        args.private, args.input_format, args.user_column, args.text_column, args.skip_bad_records,
        allow_newlines=True, max_value_length=args.max_text_length,
    )  # records: (user, text)
    records = observability.mark(read.records, "Read", args)  # (user, text)
    out = records | "Bayesian" >> BayesianNgrams(prior, params, seed=args.seed, tokenizer=tokenizer)
    _ = (out["distribution"]  # (n-gram, probability)
         | "Format" >> beam.Map(format_probability)
         | "WriteDistribution" >> beam.io.WriteToText(args.output))
    observability.attach_diagnostics(pipeline, read, args, "bayesian_ngrams")  # only with --diagnostics
    summary = {
        "params": params.as_dict(),
        "epsilon": params.epsilon,
        "delta": params.delta if params.mechanism == "bayesian" else 0.0,
        "epsilon_release": params.epsilon_release,
        "epsilon_tune": params.epsilon_tune,
        "input_format": args.input_format,
        "seed": args.seed,
        "private": args.seed is None,
        "out_of_vocabulary": "private n-grams outside the public vocabulary are dropped",
    }
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport" >> beam.Map(build_report, summary, beam.pvalue.AsList(out["info"]))
    )
    common.write_single_file(report, args.report, "WriteReport")


def summarize(report: dict, args, params) -> str:
    extra = f", S={report['S']:g}, rho={report['rho']:g}" if "S" in report else ""
    return (f"released a distribution over {report['vocabulary_size']} public {params.n}-grams "
            f"({params.mechanism}{extra}, epsilon={params.epsilon:g}, sensitivity {report['sensitivity']}); "
            f"probabilities: {args.output}*  report: {args.report}")


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters, 3 bad input)."""
    return common.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize)


def main():
    sys.exit(run())


if __name__ == "__main__":
    main()
