"""Release an n-gram probability distribution over a public vocabulary (Bayesian DP paper, Alg. 1-2).

    python -m dp_partition_beam.pipelines.bayesian_ngrams --private data/debian_text.jsonl.gz --input_format jsonl \\
        --public data/bayesian_public_trigrams.tsv.gz --output out/trigram_probs --report out/bayes.json \\
        --epsilon 1 --delta 1e-5 [--n 3] [--C 1] [--W 100] [--S 1 --rho 0.5] [--seed N] \\
        [--mechanism bayesian|laplace | --acknowledge_data_dependent --mechanism
         bayesian_data_dependent [--tune ...] [--sensitivity brute_force|bound] | laplace_public] \\
        [--runner DataflowRunner ... --setup_file ./setup.py]

Inputs: ``--private`` user-level text as in ``pipelines.extract_ngrams`` (jsonl ``{"user", "text"}``,
tsv ``user<TAB>text``, parquet columns); ``--public`` public n-gram counts, ``n-gram<TAB>count`` per
line (words joined by single spaces, tokenised like the private text: NFKC, lowercase), read by the
launcher (the vocabulary is public and bounded). Output: ``n-gram<TAB>probability`` for every public
n-gram, in files starting with ``--output``; the probabilities sum to 1. Report: JSON at ``--report``.

Privacy (docs/bayesian_ngrams.md): the default ``--mechanism bayesian`` is worst-case user-level
(epsilon, delta)-DP: the clamped counts get exact discrete Gaussian noise calibrated to their
data-independent l2 sensitivity, and the posterior and the choice of S and rho are post-processing of
those noisy counts and the public prior (``"guarantee_kind": "worst-case (epsilon, delta)-DP"``;
``"private": true`` unless seeded); so is ``--mechanism laplace`` (pure epsilon-DP). The paper's mechanism
(``bayesian_data_dependent``) and ``laplace_public`` calibrate to sensitivities computed from the private
data: NOT worst-case DP (one outlier user is detectable). They run only with
``--acknowledge_data_dependent``; their report says ``"guarantee_kind": "data-dependent"``, names its
budget fields ``data_dependent_epsilon`` etc., and every such run prints a warning line to stderr.

Installed, the command is also ``dp-bayesian-ngrams``. The privacy flags are the fields of
:class:`privacy.bayesian.BayesianParams`; every other argument must be a Beam pipeline option:
anything else stops the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import apache_beam as beam

from dp_partition_beam.pipelines import cli, observability, outputs
from dp_partition_beam.pipelines.io import (
    FailIfEmpty,
    ReadRecordBatches,
    RecordsRead,
    batch_records,
    load_public_counts,
)
from dp_partition_beam.privacy.bayesian import DATA_DEPENDENT, FIELD_USE, MECHANISMS, BayesianParams
from dp_partition_beam.transforms.bayesian.bayesian import BayesianNgrams

GUARANTEE = {
    "bayesian": (
        "Worst-case user-level (epsilon, delta)-DP: each user contributes at most C to an n-gram and W in "
        "total, so the clamped count vector has the data-independent l2 sensitivity sqrt(q C^2 + r^2) "
        "(q, r = divmod(W, C)); it is released with exact discrete Gaussian noise calibrated to (epsilon, "
        "delta) (the analytic Gaussian mechanism plus the kernel lemma of docs/counts.md). The posterior, "
        "and the choice of S and rho, are computed from those noisy counts, the public prior and public "
        "randomness only: post-processing, no further budget."
    ),
    "bayesian_data_dependent": (
        "The noise is calibrated to a sensitivity computed from the private data itself (the users' "
        "counts N_i and totals c_i): a local sensitivity at this dataset. For this dataset and any "
        "neighbour obtained by removing one user, the released sample's density ratio is bounded as a "
        "Gaussian mechanism with the stated (epsilon, delta) would be IF the neighbour were released with "
        "the same noise scale; but the neighbour's own run would compute a different scale, and the scale "
        "itself depends on the data. This is NOT a worst-case (epsilon, delta)-DP guarantee over all "
        "neighbouring datasets. The default private choice of S and rho (epsilon_choice) calibrates its "
        "selection the same way: to the largest change of its scores when one user of this dataset is "
        "removed: one outlier user can be detected (docs/bayesian_ngrams.md). Use the default --mechanism "
        "bayesian for a worst-case guarantee."
    ),
    "laplace": (
        "Standard user-level pure epsilon-DP: each user contributes at most W counts in total, the l1 "
        "sensitivity W does not depend on the data, and Laplace noise of scale W/epsilon is added."
    ),
}

GUARANTEE["laplace_public"] = (  # its Laplace scale min(2, 2W/(T-W))/epsilon reads the private total T
    "The Laplace noise scale min(2, 2W/(T-W))/epsilon depends on T, the private total of the users' counts: "
    "a data-dependent sensitivity, and the scale itself reveals something about T. This is NOT a worst-case "
    "(epsilon, delta)-DP guarantee over all neighbouring datasets. Use the default --mechanism bayesian (or "
    "laplace) for a worst-case guarantee."
)

#: The report's ``guarantee_kind`` per ``sensitivity``: only a data-independent sensitivity gives
#: worst-case DP (for ``laplace`` pure epsilon-DP, delta = 0).
GUARANTEE_KIND = {
    "data-independent": "worst-case (epsilon, delta)-DP",
    "data-dependent": "data-dependent",
}

#: The sensitivity of each mechanism (what the release's ``info`` reports; the warning needs it before the run).
SENSITIVITY = {m: "data-dependent" if m in DATA_DEPENDENT else "data-independent" for m in MECHANISMS}

#: What a data-dependent run's report calls its budget: these keys get the prefix ``data_dependent_``,
#: so that no field name suggests a worst-case (epsilon, delta).
BUDGET_KEYS = (
    "epsilon",
    "delta",
    "epsilon_choice",
    "epsilon_tune",
    "epsilon_release",
    "choice_epsilon",
    "tune_epsilon",
)


def data_dependent_warning(mechanism: str) -> Optional[str]:
    """The stderr warning line of a mechanism whose guarantee is data-dependent (None for the others)."""
    if SENSITIVITY[mechanism] != "data-dependent":
        return None
    return (
        f"warning: --mechanism {mechanism} calibrates its noise to a data-dependent sensitivity: NOT a "
        "worst-case (epsilon, delta)-DP guarantee, one outlier user can be detected (docs/bayesian_ngrams.md); "
        "the default --mechanism bayesian gives one"
    )


def build_parser() -> argparse.ArgumentParser:
    p = cli.new_parser(
        "dp-bayesian-ngrams",
        "DP n-gram probability distribution over a public vocabulary with a public prior "
        "(Bayesian DP, Laplace baselines) on Beam.",
    )
    cli.add_input_args(p, "text", input_flag="private")
    p.add_argument("--public", required=True, help="public n-gram counts, n-gram<TAB>count per line")
    p.add_argument("--output", required=True, help="prefix of the output files (n-gram<TAB>probability)")
    p.add_argument("--report", required=True, help="path of the JSON report")
    cli.add_algorithm_arg(
        p,
        "mechanism",
        MECHANISMS,
        "bayesian",
        {
            "bayesian": "noisy counts (discrete Gaussian), then the posterior: worst-case (epsilon, delta)-DP",
            "bayesian_data_dependent": "the paper's Algorithm 1 (Algorithm 2 with --tune): data-dependent, "
            "NOT worst-case DP (needs --acknowledge_data_dependent)",
            "laplace": "Laplace counts (sec. 4.2 baseline 1), standard pure epsilon-DP",
            "laplace_public": "Laplace with the public total (sec. 4.2 baseline 2): data-dependent, NOT "
            "worst-case DP (needs --acknowledge_data_dependent)",
        },
        FIELD_USE,
    )
    cli.add_params_args(p, BayesianParams, required=("epsilon", "delta"))  # delta: the two Gaussian mechanisms
    p.add_argument(
        "--tokenizer", default=None, help="module:function replacing the default tokenizer (NFKC, lowercase, word runs)"
    )
    return p


def params_from_args(args) -> BayesianParams:
    return cli.params_from_args(BayesianParams, args)


def format_probability(element) -> str:
    gram, p = element
    return f"{gram}\t{p!r}"


def build_report(_, base: dict, infos: list) -> str:
    """The report JSON. ``guarantee_kind`` says whether the release is worst-case DP; ``private`` is true
    only for an unseeded run of a mechanism with a worst-case guarantee (``bayesian``, ``laplace``): a seeded
    run is reproducible by anyone who knows the seed, a data-dependent one is not worst-case DP. A
    data-dependent run's budget fields are named ``data_dependent_epsilon`` etc. (:data:`BUDGET_KEYS`)."""
    report = dict(base)
    for info in infos:  # exactly one
        report.update(info)
    kind = report["sensitivity"]  # as the release computed it
    if kind == "data-dependent":
        report = {f"data_dependent_{k}" if k in BUDGET_KEYS else k: v for k, v in report.items()}
    report["guarantee"] = GUARANTEE[report["mechanism"]]
    report["guarantee_kind"] = GUARANTEE_KIND[kind]
    report["private"] = report["seed"] is None and kind == "data-independent"
    return json.dumps(report, indent=2, sort_keys=True)


def build_pipeline(pipeline: beam.Pipeline, args, params: BayesianParams):
    prior = load_public_counts(args.public, params.n)
    tokenizer = cli.load_tokenizer(args.tokenizer)
    warning = data_dependent_warning(args.mechanism)
    if warning:  # every run of bayesian_data_dependent / laplace_public, before it starts
        print(warning, file=sys.stderr)
    batches = pipeline | "ReadPrivate" >> ReadRecordBatches(
        args.private,
        args.input_format,
        args.user_column,
        args.text_column,
        args.skip_bad_records,
        allow_newlines=True,
        max_value_length=args.max_text_length,
        value_name="text",
    )  # records: pa.RecordBatch (user, text); bad: skipped records per work item
    # (user, text) elements until the Bayesian transform takes batches
    read = RecordsRead(batches.records | "BatchRecords" >> beam.FlatMap(batch_records), batches.bad)
    _ = read.records | "FailIfEmpty" >> FailIfEmpty(args.private)  # fails the run on zero records
    records = observability.mark(read.records, "Read", args)  # (user, text)
    out = records | "Bayesian" >> BayesianNgrams(args.mechanism, prior, params, seed=args.seed, tokenizer=tokenizer)
    written = (
        out["distribution"]  # (n-gram, probability)
        | "Format" >> beam.Map(format_probability)  # n-gram<TAB>probability
        | "WriteDistribution" >> beam.io.WriteToText(args.output)
    )  # shard file names, once final
    diag = observability.attach_diagnostics(pipeline, read, args, "bayesian_ngrams")  # only with --diagnostics
    summary = {
        "params": outputs.params_report(params),  # every BayesianParams field
        "epsilon": params.epsilon,
        "delta": params.delta if args.mechanism in FIELD_USE["delta"].algorithms else 0.0,  # the Gaussian ones
        **params.budget(args.mechanism),  # epsilon_choice + epsilon_tune + epsilon_release = epsilon
        "input_format": args.input_format,
        "seed": args.seed,
        "private": args.seed is None and SENSITIVITY[args.mechanism] == "data-independent",  # (build_report)
        "out_of_vocabulary": "private n-grams outside the public vocabulary are dropped",
    }
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport" >> beam.Map(build_report, summary, beam.pvalue.AsList(out["info"]))
    )
    outputs.write_report(report, args, [written, diag])  # last: lists the shards it belongs to


#: No ``--evaluate_against`` hook: the release is a distribution, not a set of items (see bayesian_eval).
EVALUATION = None


def summarize(report: dict, args, params) -> str:
    """The one-line summary. A data-dependent run's says "NOT worst-case DP" where a worst-case run's
    states its (epsilon, delta)."""
    if report.get("prior_alone"):
        extra = ", chose the public prior alone"
    elif report.get("S") is not None:
        if "choice" in report:
            chosen = " (chosen from the noisy counts)"
        elif "data_dependent_choice_epsilon" in report:
            chosen = " (chosen with a data-dependent sensitivity)"
        else:
            chosen = ""
        extra = f", S={report['S']:g}, rho={report['rho']:g}{chosen}"
    else:
        extra = ""
    if report["sensitivity"] == "data-dependent":
        guarantee = f"data-dependent, NOT worst-case DP (parameter epsilon={params.epsilon:g})"
    elif args.mechanism == "laplace":
        guarantee = f"worst-case epsilon-DP, epsilon={params.epsilon:g}"
    else:
        guarantee = f"worst-case (epsilon, delta)-DP, epsilon={params.epsilon:g}, delta={params.delta:g}"
    return (
        f"released a distribution over {report['vocabulary_size']} public {params.n}-grams "
        f"({args.mechanism}{extra}; {guarantee}); "
        f"probabilities: {outputs.shard_pattern(args.output)}  report: {args.report}"
    )


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters or unknown flag, 3 bad input)."""
    return cli.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize, evaluation=EVALUATION)


def main():
    cli.exit_with(run())


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the package module's main instead, so that the functions
    # the pipeline pickles belong to dp_partition_beam.pipelines.bayesian_ngrams (an SDK worker in another process
    # cannot import __main__; Beam 2.62's dill sent them by value without their globals, and extract_ngrams'
    # build_report failed with "NameError: name 'json' is not defined" on the standalone Flink cluster).
    from dp_partition_beam.pipelines.bayesian_ngrams import main as package_main

    package_main()
