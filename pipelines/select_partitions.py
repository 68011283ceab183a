"""Release the items of (user, item) data under user-level (epsilon, delta)-DP.

    python -m pipelines.select_partitions --input 'data/*.tsv' --input_format tsv \\
        --output out/items --report out/report.json \\
        --algorithm mad2r --epsilon 1 --delta 1e-5 --max_contributions 100 \\
        [--runner DataflowRunner --project P --region R --temp_location gs://... --setup_file ./setup.py]

Every argument this parser does not know is passed to Beam (runner, Dataflow/Flink options,
``--direct_running_mode``, ``--direct_num_workers``...). Outputs: the released items, one per line
(UTF-8), in files starting with ``--output``; the JSON report at ``--report`` (privacy parameters,
per-round noise/threshold/released count; nothing else about the data).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

import apache_beam as beam

from pipelines import common, observability
from pipelines.io import FailIfEmpty, ReadRecords
from privacy.selection import ACCOUNTINGS, ALGORITHMS, SelectionParams
from transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS
from transforms.selection.select import SelectPartitions

_LOG = logging.getLogger(__name__)


def _fractions(text: str) -> List[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions like 0.1,0.9, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    d = SelectionParams(epsilon=1.0, delta=1e-5)  # defaults shown in --help come from the dataclass
    p = argparse.ArgumentParser(
        prog="python -m pipelines.select_partitions",
        description="User-level DP partition selection (Basic, Laplace/count baselines, MAD, MAD2R, DP-SIPS, "
        "sequential PolicyGaussian/PolicyLaplace) on Beam.",
    )
    common.add_input_args(p, "item")
    p.add_argument("--output", required=True, help="prefix of the output files (released items, one per line)")
    p.add_argument("--report", required=True, help="path of the JSON report")
    p.add_argument("--algorithm", default="basic", choices=tuple(ALGORITHMS))
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--max_contributions", type=int, default=d.max_contributions, help="Delta_0 (default %(default)s)")
    p.add_argument("--d_max", type=int, default=d.d_max, help="MAD maximum adaptive degree (default %(default)s)")
    p.add_argument("--beta", type=float, default=d.beta, help="MAD tau = rho + beta*sigma (default %(default)s)")
    p.add_argument("--b_min", type=float, default=d.b_min, help="MAD2R minimum bias (default %(default)s)")
    p.add_argument("--b_max", type=float, default=d.b_max, help="MAD2R maximum bias (default %(default)s)")
    p.add_argument("--c_lb", type=float, default=d.c_lb, help="MAD2R lower-bound constant (default %(default)s)")
    p.add_argument("--c_ub", type=float, default=d.c_ub, help="MAD2R upper-bound constant (default %(default)s)")
    p.add_argument(
        "--budget_split",
        type=_fractions,
        default=list(d.budget_split),
        help="fractions of (epsilon, delta) per round for mad2r/dp_sips (default 0.1,0.9)",
    )
    p.add_argument(
        "--accounting",
        default=d.accounting,
        choices=ACCOUNTINGS,
        help="multi-round accounting: gdp (exact Gaussian composition, default) or basic (paper)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=d.alpha,
        help="policy_gaussian/policy_laplace cutoff Gamma = rho + alpha*noise_scale "
        "(default %(default)s as in the DPSU paper's Table 2; the paper finds 2-6 best)",
    )
    p.add_argument(
        "--passes",
        type=int,
        default=d.passes,
        help="policy algorithms: passes over the users, each spending 1/passes of every "
        "user's budget (DPSU paper sec. 6.2.1; default %(default)s)",
    )
    p.add_argument(
        "--max_sequential_pairs",
        type=int,
        default=d.max_sequential_pairs,
        help="policy algorithms gather all user sets on one worker: fail before that if there are "
        "more (user, item) pairs after contribution bounding (default %(default)s, about "
        "250 bytes per pair on that worker)",
    )
    p.add_argument(
        "--max_broadcast_items",
        type=int,
        default=DEFAULT_MAX_BROADCAST_ITEMS,
        help="mad/mad2r: per-item values (excess fractions, round-2 biases) go to every worker as a "
        "side input when at most this many items have one, else through a sharded join; "
        "changes the cost, never the output (default %(default)s, a dict of that many "
        "entries per worker)",
    )
    p.add_argument(
        "--max_users_per_key",
        type=int,
        default=10_000,
        help="mad/mad2r sharded join: users per join key for hot items (default %(default)s)",
    )
    return p


def params_from_args(args) -> SelectionParams:
    return SelectionParams(
        epsilon=args.epsilon,
        delta=args.delta,
        max_contributions=args.max_contributions,
        d_max=args.d_max,
        beta=args.beta,
        b_min=args.b_min,
        b_max=args.b_max,
        c_lb=args.c_lb,
        c_ub=args.c_ub,
        budget_split=tuple(args.budget_split),
        accounting=args.accounting,
        alpha=args.alpha,
        passes=args.passes,
        max_sequential_pairs=args.max_sequential_pairs,
    )


def build_pipeline(pipeline: beam.Pipeline, args, params: SelectionParams) -> SelectPartitions:
    """Adds the whole job to ``pipeline``; returns the selection transform (for its plan)."""
    read = pipeline | "Read" >> ReadRecords(
        args.input,
        args.input_format,
        args.user_column,
        args.item_column,
        args.skip_bad_records,
        max_value_length=args.max_item_length,
    )
    _ = read.records | "FailIfEmpty" >> FailIfEmpty(args.input)  # fails the run on zero records
    records = observability.mark(read.records, "Read", args)  # (user, item)
    select = SelectPartitions(
        args.algorithm,
        params,
        seed=args.seed,
        output_rounds=True,
        max_users_per_key=args.max_users_per_key,
        max_broadcast_items=args.max_broadcast_items,
    )
    tagged = records | "Select" >> select  # (round, item)
    tagged = observability.mark(tagged, "Select", args)  # (round, item)
    items = tagged | "Items" >> beam.Values()  # item
    _ = items | "WriteItems" >> beam.io.WriteToText(args.output)
    round_counts = (
        tagged
        | "Rounds" >> beam.Keys()  # round
        | "CountPerRound" >> beam.combiners.Count.PerElement()  # (round, released)
    )
    observability.attach_diagnostics(pipeline, read, args, "select_partitions", params.max_contributions)
    base = {
        "algorithm": args.algorithm,
        "epsilon": params.epsilon,
        "delta": params.delta,
        "max_contributions": params.max_contributions,
        "accounting": params.accounting,
        "budget_split": list(params.budget_split),
        "d_max": params.d_max,
        "beta": params.beta,
        "b_min": params.b_min,
        "b_max": params.b_max,
        "c_lb": params.c_lb,
        "c_ub": params.c_ub,
        "alpha": params.alpha,
        "passes": params.passes,
        "max_sequential_pairs": params.max_sequential_pairs,
        "input_format": args.input_format,
        "skip_bad_records": bool(args.skip_bad_records),
        "seed": args.seed,
        "private": args.seed is None,
        "_rounds": [r.as_report() for r in select.rounds],
    }
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport" >> beam.Map(common.build_report, base, beam.pvalue.AsDict(round_counts))
    )
    common.write_single_file(report, args.report, "WriteReport")
    return select


def evaluation_pairs(pipeline: beam.Pipeline, path: str, args):
    """NON-PRIVATE evaluation input (``--evaluate_against``): (user, item) of the true data, read like --input."""
    read = pipeline | "ReadTrue" >> ReadRecords(
        path, args.input_format, args.user_column, args.item_column, args.skip_bad_records
    )
    return read.records  # (user, item)


def evaluation_group(line: str) -> str:
    """One coverage series for all items."""
    return "all"


def summarize(report: dict, args, params: SelectionParams) -> str:
    return (
        f"released {report['released']} items ({args.algorithm}, epsilon={params.epsilon:g}, "
        f"delta={params.delta:g}); items: {args.output}*  report: {args.report}"
    )


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters, 3 bad input)."""
    return common.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize)


def main():
    sys.exit(run())


if __name__ == "__main__":
    main()
