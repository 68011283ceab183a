"""Release the n-grams of user-level text under user-level (epsilon, delta)-DP (DPNE and baselines).

    python -m dp_partition_beam.pipelines.extract_ngrams --input data/debian_text.jsonl.gz --input_format jsonl \\
        --output out/ngrams --report out/ngrams_report.json \\
        --max_n 9 --epsilon 4 --delta 1e-7 --max_contributions 300 \\
        [--algorithm dpne|dpsu_all|dpsu_even|dpsu_single] [--weighting weighted_gaussian|mad] \\
        [--pruning both|single] [--eta 0.01] [--sigma_decay 1.0] [--vk_method exact|sample] \\
        [--runner DataflowRunner --project P --region R --temp_location gs://... --setup_file ./setup.py]

Input: user-level text. ``jsonl``: ``{"user": ..., "text": ...}`` per line (a user may have many
lines; ``\\n`` inside a text separates segments); ``tsv``: ``user<TAB>text``; ``parquet``: columns
``user`` and ``text``. An n-gram never crosses a line break. Installed, the command is also
``dp-extract-ngrams``. The privacy flags are the fields of :class:`privacy.dpne.DPNEParams`; every
other argument must be a Beam pipeline option: anything else stops the run. Outputs: one released
n-gram per line, ``k<TAB>n-gram`` (words joined by single spaces), in files starting with
``--output`` (``k<TAB>n-gram<TAB>count`` with ``--release_counts``: the noisy count of users, an
integer); the JSON report at ``--report`` (privacy parameters, per-level sigma_k, rho_k, |S_{k-1}|,
|V_k|, expected-spurious bound and released count, the counts' noise scale and 95% error bound - all
functions of released output and public parameters; nothing else about the data). ``--allowlist
FILE``: a public list of candidate n-grams.
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional

import apache_beam as beam

from dp_partition_beam.pipelines import cli, io, observability, outputs
from dp_partition_beam.pipelines.io import FailIfEmpty, ReadRecordBatches, RecordsRead, batch_records
from dp_partition_beam.pipelines.reporting import Evaluation
from dp_partition_beam.privacy.dpne import DPNE_ALGORITHMS, FIELD_USE, DPNEParams, release_privacy
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.dpne.dpne import DPNE


def build_parser() -> argparse.ArgumentParser:
    p = cli.new_parser(
        "dp-extract-ngrams",
        "User-level DP n-gram extraction (DPNE; DPSU-all/-even/-single baselines) on Beam.",
    )
    cli.add_input_args(p, "text")
    p.add_argument(
        "--output",
        required=True,
        help="prefix of the output files (k<TAB>n-gram per line; k<TAB>n-gram<TAB>count with --release_counts)",
    )
    p.add_argument("--report", required=True, help="path of the JSON report")
    cli.add_algorithm_arg(
        p,
        "algorithm",
        DPNE_ALGORITHMS,
        "dpne",
        {
            "dpne": "the paper's Algorithm 1 (level by level, pruned to valid k-grams)",
            "dpsu_all": "one DP set union over the n-grams of all lengths",
            "dpsu_even": "one DP set union per length, budget split evenly",
            "dpsu_single": "all budget on one length (--dpsu_single_length)",
        },
        FIELD_USE,
    )
    cli.add_params_args(p, DPNEParams, required=("epsilon", "delta"))
    cli.add_allowlist_arg(p, "n-gram")
    p.add_argument(
        "--tokenizer", default=None, help="module:function replacing the default tokenizer (NFKC, lowercase, word runs)"
    )
    p.add_argument("--num_shards", type=int, default=8, help=argparse.SUPPRESS)
    return p


def params_from_args(args) -> DPNEParams:
    return cli.params_from_args(DPNEParams, args)


def format_ngram(element) -> str:
    k, gram = element
    return f"{k}\t{gram}"


def format_ngram_count(element) -> str:
    k, (gram, count) = element
    return f"{k}\t{gram}\t{count}"


def build_report(_, base: dict, levels: list, kept=None) -> str:
    report = dict(base)
    if kept is not None:  # with counts: the n-grams written, i.e. kept by min_users (all if 0)
        report["counts"] = dict(report["counts"], released_with_counts=int(kept))
    levels = sorted(levels, key=lambda d: (d.get("k", 0), d.get("lengths", [0])))
    report["levels"] = levels
    report["released"] = int(sum(d["released"] for d in levels))
    report["expected_spurious_bound_total"] = float(sum(d.get("expected_spurious_bound", 0.0) for d in levels))
    return json.dumps(report, indent=2, sort_keys=True)


def build_pipeline(pipeline: beam.Pipeline, args, params: DPNEParams) -> DPNE:
    batches = pipeline | "Read" >> ReadRecordBatches(
        args.input,
        args.input_format,
        args.user_column,
        args.text_column,
        args.skip_bad_records,
        allow_newlines=True,
        max_value_length=args.max_text_length,
        value_name="text",
    )  # records: pa.RecordBatch (user, text); bad: skipped records per work item
    _ = batches.records | "FailIfEmpty" >> FailIfEmpty(args.input)  # fails the run on zero records
    dpne = DPNE(
        args.algorithm,
        params,
        seed=args.seed,
        tokenizer=cli.load_tokenizer(args.tokenizer),
        num_shards=args.num_shards,
        allowlist=io.read_allowlist(pipeline, args.allowlist) if args.allowlist else None,
    )
    records = observability.mark(batches.records, "Read", args)  # pa.RecordBatch (user, text)
    out = records | "DPNE" >> dpne  # {'ngrams': (k, n-gram), 'levels': dict[, 'counts': (k, (n-gram, count))]}
    if dpne.counts is None:
        released = observability.mark(out["ngrams"], "DPNE", args)  # (k, n-gram)
        lines = released | "Format" >> beam.Map(format_ngram)  # k<TAB>n-gram
    else:
        released = observability.mark(out["counts"], "DPNE", args)  # (k, (n-gram, count))
        lines = released | "Format" >> beam.Map(format_ngram_count)  # k<TAB>n-gram<TAB>count
    written = lines | "WriteNgrams" >> beam.io.WriteToText(args.output)  # shard file names, once final
    diag = None
    if getattr(args, "diagnostics", None):  # NON-PRIVATE, opt-in: counts per (user, text) element
        read = RecordsRead(batches.records | "BatchRecords" >> beam.FlatMap(batch_records), batches.bad)
        diag = observability.attach_diagnostics(pipeline, read, args, "extract_ngrams")
    summary = {
        "params": outputs.params_report(params),  # every DPNEParams field
        "algorithm": args.algorithm,
        "epsilon": params.epsilon,
        "delta": params.delta,
        "sigma_star": dpne.sigma_star,
        "input_format": args.input_format,
        "seed": args.seed,
        "private": args.seed is None,
        "allowlist": args.allowlist,
    }
    summary["params"]["max_contributions"] = list(params.deltas)
    if dpne.counts is not None:  # the counts' noise scale and 95% error bound (docs/counts.md)
        summary["counts"] = dict(
            dpne.counts.as_report(), min_users=params.min_users, min_users_cost="none (post-processing)"
        )
    # Theorem 2.1 recomputed from the noise levels actually used (GDP composition of all runs and the counts);
    # with keep tables the RDP composition of the levels (and counts) converted once (privacy.dpne.TablePlan)
    comp = release_privacy(dpne.runs, params, dpne.counts)
    summary["threshold"] = dpne.threshold
    summary["composed_sigma"] = comp["sigma_composed"]
    summary["total_delta_bound"] = comp["total_delta"]
    if dpne.threshold == "optimal":
        summary["rdp"] = {k: comp[k] for k in ("alpha", "epsilon_rdp", "delta_level_1", "delta_conversion")}
        summary["epsilon_bound"] = comp["epsilon_at_delta"]
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport" >> beam.Map(build_report, summary, beam.pvalue.AsList(out["levels"]), *_kept_count(out, dpne))
    )
    outputs.write_report(report, args, [written, diag])  # last: lists the shards it belongs to
    return dpne


def _kept_count(out, dpne) -> list:
    """[side input of the number of n-grams written] with counts, else []."""
    if dpne.counts is None:
        return []
    return [beam.pvalue.AsSingleton(out["counts"] | "CountKept" >> beam.combiners.Count.Globally())]


def true_ngram_lines(record, max_n: int, tokenizer):
    """(user, text) -> (user, ``k<TAB>n-gram``) for every k-gram, k <= max_n, of the text (output format)."""
    user, text = record
    for k, grams in tx.text_all_kgrams(text, max_n, tokenizer).items():
        for gram in grams:
            yield user, f"{k}\t{gram}"


def evaluation_pairs(pipeline: beam.Pipeline, path: str, args):
    """NON-PRIVATE evaluation input (``--evaluate_against``): (user, ``k<TAB>n-gram``) of the true data."""
    read = pipeline | "ReadTrue" >> ReadRecordBatches(
        path,
        args.input_format,
        args.user_column,
        args.text_column,
        args.skip_bad_records,
        allow_newlines=True,
        value_name="text",
    )  # records: pa.RecordBatch (user, text)
    records = read.records | "TrueRecords" >> beam.FlatMap(batch_records)  # (user, text)
    return records | "TrueNgrams" >> beam.FlatMap(
        true_ngram_lines, args.max_n, cli.load_tokenizer(args.tokenizer)
    )  # (user, k<TAB>n-gram)


def evaluation_group(line: str) -> int:
    """One coverage series per n-gram length k."""
    return int(line.split("\t", 1)[0])


#: The ``--evaluate_against`` hook (run_main's ``evaluation`` argument).
EVALUATION = Evaluation(evaluation_pairs, evaluation_group)


def summarize(report: dict, args, params) -> str:
    per_k = {d.get("k", d.get("run")): d["released"] for d in report["levels"]}
    counts = ""
    if report.get("counts"):
        c = report["counts"]
        counts = (
            f"; {c['released_with_counts']} written with counts (noise std {c['noise_std']:.3g}, "
            f"95% within +-{c['error_bound_95']})"
        )
    return (
        f"released {report['released']} n-grams ({args.algorithm}, epsilon={params.epsilon:g}, "
        f"delta={params.delta:g}) {per_k}{counts}; n-grams: {outputs.shard_pattern(args.output)}  report: {args.report}"
    )


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters or unknown flag, 3 bad input)."""
    return cli.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize, evaluation=EVALUATION)


def main():
    cli.exit_with(run())


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the package module's main instead, so that the functions
    # the pipeline pickles belong to dp_partition_beam.pipelines.extract_ngrams (an SDK worker in another process
    # cannot import __main__; Beam 2.62's dill sent them by value without their globals, and extract_ngrams'
    # build_report failed with "NameError: name 'json' is not defined" on the standalone Flink cluster).
    from dp_partition_beam.pipelines.extract_ngrams import main as package_main

    package_main()
