"""How hard a pipeline graph is for Flink's batch (DataSet) optimizer: the paths from its sinks to its sources.

    python -m benchmarks.flink_plan_paths "--selection single --max_n 3" "--selection mad_sips --max_n 2" ...

Each argument is a set of extract_ngrams flags added to the engines sample's (``--epsilon 4 --delta 1e-6
--max_contributions 30 --seed 11``); the pipeline is built (not run) and its leaf transforms counted.

Why (docs/engines.md, "Flink's plan optimizer"): Beam's Flink runner translates a batch pipeline into a Flink
DataSet plan (a fused stage per operator, side inputs as broadcast sets) and Flink compiles it before the job
starts. One pass of that compiler (``UnionParallelismAndForwardEnforcer``, Flink 1.19's ``Optimizer.compile``)
walks the plan from every sink through every input and broadcast input *without remembering visited
operators*: its cost is the number of paths, which doubles with every diamond (a PCollection read by two
steps whose outputs meet again) in a chain of them. ``visits`` below is that number on the leaf-transform
graph (main and side inputs), an upper bound of Flink's (fusion merges chains, not diamonds).
"""

from __future__ import annotations

import argparse
import os

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.pipelines import extract_ngrams
from dp_partition_beam.pipelines.flink_plan import leaf_graph, unmemoised_visits

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SAMPLE = ("--epsilon", "4", "--delta", "1e-6", "--max_contributions", "30", "--seed", "11")


def measure(flags: list, input_path: str) -> dict:
    argv = ["--input", input_path, "--input_format", "jsonl", "--output", os.devnull, "--report", os.devnull]
    args = extract_ngrams.build_parser().parse_args([*argv, *SAMPLE, *flags])
    pipeline = beam.Pipeline(options=PipelineOptions([]))
    extract_ngrams.build_pipeline(pipeline, args, extract_ngrams.params_from_args(args))
    proto = pipeline.to_runner_api()
    inputs = leaf_graph(proto)
    gbk = "beam:transform:group_by_key:v1"
    return {
        "leaf transforms": len(inputs),
        "GroupByKeys": sum(proto.components.transforms[k].spec.urn == gbk for k in inputs),
        "visits": unmemoised_visits(inputs),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("flags", nargs="+", help='extract_ngrams flags, one quoted set per pipeline ("--max_n 3")')
    p.add_argument("--input", default=os.path.join(REPO, "data", "debian_text.jsonl.gz"))
    args = p.parse_args()
    for flags in args.flags:
        m = measure(flags.split(), args.input)
        print(f"{flags:40s} " + "  ".join(f"{k} {v:,}" for k, v in m.items()), flush=True)


if __name__ == "__main__":
    main()
