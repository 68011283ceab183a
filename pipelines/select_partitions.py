"""Release the items of (user, item) data under user-level (epsilon, delta)-DP.

    python -m dp_partition_beam.pipelines.select_partitions --input 'data/*.tsv' --input_format tsv \\
        --output out/items --report out/report.json \\
        --algorithm mad2r --epsilon 1 --delta 1e-5 --max_contributions 100 \\
        [--runner DataflowRunner --project P --region R --temp_location gs://... --setup_file ./setup.py]

(or ``dp-select-partitions ...`` once the package is installed). The privacy flags are the fields of
:class:`privacy.selection.SelectionParams`; ``--algorithm`` is a key of
:data:`privacy.selection.ALGORITHMS`. Every other argument must be a Beam pipeline option (runner,
Dataflow/Flink options, ``--direct_running_mode``, ``--direct_num_workers``...): anything else stops the
run. Outputs: the released items, one per line (UTF-8), in files starting with ``--output``
(``item<TAB>count`` with ``--release_counts``: the noisy count of users, an integer); the JSON report at
``--report`` (privacy parameters, per-round noise/threshold/released count, the counts' noise scale and
95% error bound; nothing else about the data). ``--allowlist FILE``: a public list of candidate items.
"""

from __future__ import annotations

import argparse
from typing import List, Optional

import apache_beam as beam

from dp_partition_beam.pipelines import cli, io, observability, outputs
from dp_partition_beam.pipelines.io import FailIfEmpty, ReadRecordBatches, RecordsRead, batch_records
from dp_partition_beam.pipelines.reporting import Evaluation
from dp_partition_beam.privacy.selection import ALGORITHMS, FIELD_USE, SEQUENTIAL_ALGORITHMS, SelectionParams
from dp_partition_beam.privacy.validation import ParamUse, needs
from dp_partition_beam.transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS
from dp_partition_beam.transforms.selection.select import SelectPartitions


def build_parser() -> argparse.ArgumentParser:
    p = cli.new_parser(
        "dp-select-partitions",
        "User-level DP partition selection (Basic, Laplace/count baselines, MAD, MAD2R, DP-SIPS, "
        "sequential PolicyGaussian/PolicyLaplace) on Beam.",
    )
    cli.add_input_args(p, "item")
    p.add_argument(
        "--output",
        required=True,
        help="prefix of the output files (released items, one per line; item<TAB>count with --release_counts)",
    )
    p.add_argument("--report", required=True, help="path of the JSON report")
    summaries = {name: spec.summary for name, spec in ALGORITHMS.items()}
    cli.add_algorithm_arg(p, "algorithm", tuple(ALGORITHMS), "mad_sips", summaries, {**FIELD_USE, **EXECUTION_USE})
    cli.add_params_args(p, SelectionParams)
    cli.add_allowlist_arg(p, "item")
    g = p.add_argument_group("execution options (change the cost, never the output)")
    g.add_argument(
        "--max_broadcast_items",
        type=int,
        default=DEFAULT_MAX_BROADCAST_ITEMS,
        help="policy_gaussian/policy_laplace with --release_counts: the released items go to every worker "
        "as a side input when there are at most this many, else through a sharded join "
        "(default %(default)s, a dict of that many entries per worker)",
    )
    g.add_argument(
        "--max_users_per_key",
        type=int,
        default=10_000,
        help="policy_gaussian/policy_laplace with --release_counts, sharded join: users per join key for "
        "hot items (default %(default)s)",
    )
    return p


#: The execution flags' entries in the table of the flags each algorithm reads (privacy.selection.FIELD_USE
#: for the SelectionParams fields): the joins they tune are those of the sequential policies' count
#: release (transforms/selection/select.py); the columnar algorithms have no such join.
EXECUTION_USE = {
    name: ParamUse(SEQUENTIAL_ALGORITHMS, (needs("release_counts", True),))
    for name in ("max_broadcast_items", "max_users_per_key")
}


def join_options(args, params) -> dict:
    """The execution flags for SelectPartitions, where its count join reads them (else none: they would
    change nothing, and the strict flag check has already refused them when given)."""
    if args.algorithm in SEQUENTIAL_ALGORITHMS and params.release_counts:
        return {"max_users_per_key": args.max_users_per_key, "max_broadcast_items": args.max_broadcast_items}
    return {}


def format_count(element) -> str:
    """(item, noisy_count) -> ``item<TAB>count``."""
    item, count = element
    return f"{item}\t{count}"


def params_from_args(args) -> SelectionParams:
    return cli.params_from_args(SelectionParams, args)


def build_pipeline(pipeline: beam.Pipeline, args, params: SelectionParams) -> SelectPartitions:
    """Adds the whole job to ``pipeline``; returns the selection transform (for its plan)."""
    batches = pipeline | "Read" >> ReadRecordBatches(
        args.input,
        args.input_format,
        args.user_column,
        args.item_column,
        args.skip_bad_records,
        max_value_length=args.max_item_length,
        value_name="item",
    )  # records: pa.RecordBatch (user, item); bad: skipped records per work item
    _ = batches.records | "FailIfEmpty" >> FailIfEmpty(args.input)  # fails the run on zero records
    records = observability.mark(batches.records, "Read", args)  # pa.RecordBatch (user, item)
    allowlist = io.read_allowlist(pipeline, args.allowlist) if args.allowlist else None
    select = SelectPartitions(
        args.algorithm,
        params,
        seed=args.seed,
        output_rounds=True,
        allowlist=allowlist,
        **join_options(args, params),
    )
    tagged = records | "Select" >> select  # (round, item), or (round, (item, noisy_count)) with counts
    tagged = observability.mark(tagged, "Select", args)
    items = tagged | "Items" >> beam.Values()  # item, or (item, noisy_count)
    if params.release_counts:
        items = items | "FormatCounts" >> beam.Map(format_count)  # item<TAB>count
    written = items | "WriteItems" >> beam.io.WriteToText(args.output)  # shard file names, once final
    round_counts = (
        tagged
        | "Rounds" >> beam.Keys()  # round
        | "CountPerRound" >> beam.combiners.Count.PerElement()  # (round, released)
    )
    diag = None
    if getattr(args, "diagnostics", None):  # NON-PRIVATE, opt-in: counts per (user, item) element
        read = RecordsRead(batches.records | "BatchRecords" >> beam.FlatMap(batch_records), batches.bad)
        diag = observability.attach_diagnostics(pipeline, read, args, "select_partitions", params.max_contributions)
    base = {
        "algorithm": args.algorithm,
        **outputs.params_report(select.params),  # every SelectionParams field, the algorithm's defaults filled in
        "input_format": args.input_format,
        "skip_bad_records": bool(args.skip_bad_records),
        "seed": args.seed,
        "private": args.seed is None,
        "allowlist": args.allowlist,
    }
    # the rounds, the count release's plan and the adaptive cap come from select.plan (SelectionPlan.as_report,
    # for the cap and the weight cap the run chose when the plan has them)
    cap = None if select.cap is None else beam.pvalue.AsSingleton(select.cap)
    weight_cap = None if select.weight_cap is None else beam.pvalue.AsSingleton(select.weight_cap)
    reports = outputs.plan_reports(select.plan)
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport"
        >> beam.Map(outputs.build_report, base, reports, beam.pvalue.AsDict(round_counts), cap, weight_cap)
    )
    outputs.write_report(report, args, [written, diag])  # last: lists the shards it belongs to
    return select


def evaluation_pairs(pipeline: beam.Pipeline, path: str, args):
    """NON-PRIVATE evaluation input (``--evaluate_against``): (user, item) of the true data, read like --input."""
    read = pipeline | "ReadTrue" >> ReadRecordBatches(
        path, args.input_format, args.user_column, args.item_column, args.skip_bad_records, value_name="item"
    )  # records: pa.RecordBatch (user, item)
    return read.records | "TrueRecords" >> beam.FlatMap(batch_records)  # (user, item)


def evaluation_group(line: str) -> str:
    """One coverage series for all items."""
    return "all"


#: The ``--evaluate_against`` hook (run_main's ``evaluation`` argument).
EVALUATION = Evaluation(evaluation_pairs, evaluation_group)


def summarize(report: dict, args, params: SelectionParams) -> str:
    counts = ""
    if report.get("counts"):
        c = report["counts"]
        counts = f" with counts (noise std {c['noise_std']:.3g}, 95% within +-{c['error_bound_95']})"
    cap = f", cap {report['cap']} of Delta_0 {params.max_contributions}" if "cap" in report else ""
    return (
        f"released {report['released']} items{counts}{cap} ({args.algorithm}, epsilon={params.epsilon:g}, "
        f"delta={params.delta:g}); items: {outputs.shard_pattern(args.output)}  report: {args.report}"
    )


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters or unknown flag, 3 bad input)."""
    return cli.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize, evaluation=EVALUATION)


def main():
    cli.exit_with(run())


if __name__ == "__main__":
    # `python -m` runs this file as __main__: run the package module's main instead, so that the functions
    # the pipeline pickles belong to dp_partition_beam.pipelines.select_partitions (an SDK worker in another process
    # cannot import __main__; Beam 2.62's dill sent them by value without their globals, and extract_ngrams'
    # build_report failed with "NameError: name 'json' is not defined" on the standalone Flink cluster).
    from dp_partition_beam.pipelines.select_partitions import main as package_main

    package_main()
