"""Release the n-grams of user-level text under user-level (epsilon, delta)-DP (DPNE and baselines).

    python -m pipelines.extract_ngrams --input data/debian_text.jsonl.gz --input_format jsonl \\
        --output out/ngrams --report out/ngrams_report.json \\
        --max_n 9 --epsilon 4 --delta 1e-7 --max_contributions 300 \\
        [--algorithm dpne|dpsu_all|dpsu_even|dpsu_single] [--weighting weighted_gaussian|mad] \\
        [--pruning both|single] [--eta 0.01] [--sigma_decay 1.0] [--vk_method exact|sample] \\
        [--runner DataflowRunner --project P --region R --temp_location gs://... --setup_file ./setup.py]

Input: user-level text. ``jsonl``: ``{"user": ..., "text": ...}`` per line (a user may have many
lines; ``\\n`` inside a text separates segments); ``tsv``: ``user<TAB>text``; ``parquet``: columns
``user`` and ``text``. An n-gram never crosses a line break. Every argument this parser does not know
is passed to Beam. Outputs: one released n-gram per line, ``k<TAB>n-gram`` (words joined by single
spaces), in files starting with ``--output``; the JSON report at ``--report`` (privacy parameters,
per-level sigma_k, rho_k, |S_{k-1}|, |V_k|, expected-spurious bound and released count - all functions
of released output and public parameters; nothing else about the data).
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from typing import List, Optional

import apache_beam as beam

from pipelines import common, observability
from pipelines.io import FailIfEmpty, ReadRecords
from privacy.dpne_accounting import (
    DPNE_ALGORITHMS,
    DPNE_WEIGHTINGS,
    PRUNINGS,
    VK_METHODS,
    DPNEParams,
    dpne_composed_privacy,
)
from transforms import ngrams
from transforms.dpne import DPNE

_LOG = logging.getLogger(__name__)


def _int_list(text: str) -> List[int]:
    try:
        vals = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or comma-separated integers, got {text!r}")
    if not vals:
        raise argparse.ArgumentTypeError(f"expected an integer or comma-separated integers, got {text!r}")
    return vals


def load_tokenizer(spec: Optional[str]):
    """``module:function`` -> the function (must be a picklable top-level function ``str -> list[str]``)."""
    if not spec:
        return ngrams.default_tokenize
    if ":" not in spec:
        raise ValueError(f"tokenizer must be 'module:function', got {spec!r}")
    mod, fn = spec.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"tokenizer {spec!r} cannot be imported: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    d = DPNEParams()
    p = argparse.ArgumentParser(
        prog="python -m pipelines.extract_ngrams",
        description="User-level DP n-gram extraction (DPNE; DPSU-all/-even/-single baselines) on Beam.",
    )
    common.add_input_args(p, "text")
    p.add_argument("--output", required=True, help="prefix of the output files (k<TAB>n-gram per line)")
    p.add_argument("--report", required=True, help="path of the JSON report")
    p.add_argument("--algorithm", default=d.algorithm, choices=DPNE_ALGORITHMS)
    p.add_argument("--max_n", type=int, default=d.max_n, help="T, longest n-gram length (default %(default)s)")
    p.add_argument("--epsilon", type=float, default=d.epsilon, help="(default %(default)s)")
    p.add_argument("--delta", type=float, default=d.delta, help="(default %(default)s)")
    p.add_argument("--max_contributions", type=_int_list, default=[d.max_contributions],
                   help="Delta_k: one integer for every length or T comma-separated integers (default 300)")
    p.add_argument("--eta", type=float, default=d.eta, help="spurious fraction target (default %(default)s)")
    p.add_argument("--sigma_decay", type=float, default=d.sigma_decay,
                   help="c in sigma_k = c * sigma_{k-1} (default %(default)s)")
    p.add_argument("--pruning", default=d.pruning, choices=PRUNINGS)
    p.add_argument("--weighting", default=d.weighting, choices=DPNE_WEIGHTINGS)
    p.add_argument("--vk_method", default=d.vk_method, choices=VK_METHODS,
                   help="|V_k|: exact sum_y L(y)R(y) (default) or the paper's sampling estimator")
    p.add_argument("--sample_rate", type=float, default=d.sample_rate, help="p of --vk_method sample")
    p.add_argument("--dpsu_single_length", type=int, default=None, help="length L of dpsu_single (default T)")
    p.add_argument("--beta", type=float, default=d.beta, help="MAD tau_k = rho_k + beta*sigma_k (default 2)")
    p.add_argument("--d_max", type=int, default=d.d_max, help="MAD maximum adaptive degree (default 50)")
    p.add_argument("--tokenizer", default=None,
                   help="module:function replacing the default tokenizer (NFKC, lowercase, word runs)")
    p.add_argument("--num_shards", type=int, default=8, help=argparse.SUPPRESS)
    return p


def params_from_args(args) -> DPNEParams:
    mc = args.max_contributions
    return DPNEParams(
        epsilon=args.epsilon, delta=args.delta, max_n=args.max_n,
        max_contributions=mc[0] if len(mc) == 1 else tuple(mc), eta=args.eta, sigma_decay=args.sigma_decay,
        pruning=args.pruning, weighting=args.weighting, algorithm=args.algorithm, vk_method=args.vk_method,
        sample_rate=args.sample_rate, dpsu_single_length=args.dpsu_single_length, beta=args.beta,
        d_max=args.d_max,
    )


def format_ngram(element) -> str:
    k, gram = element
    return f"{k}\t{gram}"


def build_report(_, base: dict, levels: list) -> str:
    report = dict(base)
    levels = sorted(levels, key=lambda d: (d.get("k", 0), d.get("lengths", [0])))
    report["levels"] = levels
    report["released"] = int(sum(d["released"] for d in levels))
    report["expected_spurious_bound_total"] = float(sum(d.get("expected_spurious_bound", 0.0) for d in levels))
    return json.dumps(report, indent=2, sort_keys=True)


def build_pipeline(pipeline: beam.Pipeline, args, params: DPNEParams) -> DPNE:
    read = pipeline | "Read" >> ReadRecords(
        args.input, args.input_format, args.user_column, args.text_column, args.skip_bad_records,
        allow_newlines=True, max_value_length=args.max_text_length,
    )
    _ = read.records | "FailIfEmpty" >> FailIfEmpty(args.input)  # fails the run on zero records
    dpne = DPNE(params, seed=args.seed, tokenizer=load_tokenizer(args.tokenizer), num_shards=args.num_shards)
    records = observability.mark(read.records, "Read", args)  # (user, text)
    out = records | "DPNE" >> dpne  # {'ngrams': (k, n-gram), 'levels': dict}
    released = observability.mark(out["ngrams"], "DPNE", args)  # (k, n-gram)
    _ = released | "Format" >> beam.Map(format_ngram) | "WriteNgrams" >> beam.io.WriteToText(args.output)
    observability.attach_diagnostics(pipeline, read, args, "extract_ngrams")
    summary = {
        "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(params).items()},
        "algorithm": params.algorithm,
        "epsilon": params.epsilon,
        "delta": params.delta,
        "sigma_star": dpne.sigma_star,
        "input_format": args.input_format,
        "seed": args.seed,
        "private": args.seed is None,
    }
    summary["params"]["max_contributions"] = list(params.deltas)
    # Theorem 2.1 recomputed from the noise levels actually used (GDP composition of all runs).
    comp = dpne_composed_privacy([r.sigma for r in dpne.runs], params.epsilon, params.delta)
    summary["composed_sigma"] = comp["sigma_composed"]
    summary["total_delta_bound"] = comp["total_delta"]
    report = (
        pipeline
        | "ReportSeed" >> beam.Create([None])
        | "BuildReport" >> beam.Map(
            build_report, summary, beam.pvalue.AsList(out["levels"]))
    )
    common.write_single_file(report, args.report, "WriteReport")
    return dpne


def true_ngram_lines(record, max_n: int, tokenizer):
    """(user, text) -> (user, ``k<TAB>n-gram``) for every k-gram, k <= max_n, of the text (output format)."""
    user, text = record
    for k, grams in ngrams.text_all_kgrams(text, max_n, tokenizer).items():
        for gram in grams:
            yield user, f"{k}\t{gram}"


def evaluation_pairs(pipeline: beam.Pipeline, path: str, args):
    """NON-PRIVATE evaluation input (``--evaluate_against``): (user, ``k<TAB>n-gram``) of the true data."""
    read = pipeline | "ReadTrue" >> ReadRecords(
        path, args.input_format, args.user_column, args.text_column, args.skip_bad_records, allow_newlines=True)
    return read.records | "TrueNgrams" >> beam.FlatMap(
        true_ngram_lines, args.max_n, load_tokenizer(args.tokenizer))  # (user, k<TAB>n-gram)


def evaluation_group(line: str) -> int:
    """One coverage series per n-gram length k."""
    return int(line.split("\t", 1)[0])


def summarize(report: dict, args, params) -> str:
    per_k = {d.get("k", d.get("run")): d["released"] for d in report["levels"]}
    return (f"released {report['released']} n-grams ({params.algorithm}, epsilon={params.epsilon:g}, "
            f"delta={params.delta:g}) {per_k}; n-grams: {args.output}*  report: {args.report}")


def run(argv: Optional[List[str]] = None) -> int:
    """Runs the CLI; returns the exit code (0 ok, 2 bad parameters, 3 bad input)."""
    return common.run_main(build_parser(), argv, params_from_args, build_pipeline, summarize)


def main():
    sys.exit(run())


if __name__ == "__main__":
    main()
