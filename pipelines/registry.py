"""The runnable pipelines, in one list: templates, submission tests and docs iterate over it.

Adding a pipeline = one ``PipelineSpec`` here + ``templates/<name>/metadata.json`` + a console
script in setup.py. The module ``pipelines.<name>`` must offer ``build_parser()``,
``params_from_args(args)``, ``build_pipeline(pipeline, args, params)``, ``run(argv)`` and ``main()``
(the CLI skeleton in :func:`pipelines.cli.run_main`) and ``EVALUATION``: its ``--evaluate_against``
hook (a :class:`pipelines.reporting.Evaluation`, or None), which ``run`` passes to ``run_main``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class PipelineSpec:
    """One runnable pipeline.

    name:         module ``pipelines.<name>`` and template directory ``templates/<name>/``.
    stages:       labels of the top-level stages every run of the pipeline has (checked in the
                  Dataflow job graph).
    sample_input: a bundled sample file (``data/...``) in ``input_format``; tests cut it down.
    sample_args:  the privacy/algorithm arguments of a small seeded demo run on that sample
                  (paths under data/ are relative to the repository root).
    input_flag:   the flag of the private input files (``input``; ``private`` for bayesian_ngrams).
    """

    name: str
    stages: Tuple[str, ...]
    sample_input: str
    input_format: str
    sample_args: Tuple[str, ...]
    input_flag: str = "input"  # the flag naming the private input files

    def module(self):
        return importlib.import_module(f"dp_partition_beam.pipelines.{self.name}")


PIPELINES: Tuple[PipelineSpec, ...] = (
    PipelineSpec(
        name="select_partitions",
        stages=("Read", "Select", "Items", "WriteItems", "CountPerRound", "BuildReport", "WriteReport"),
        sample_input="data/debian_words.tsv.gz",
        input_format="tsv",
        sample_args=("--algorithm", "mad2r", "--epsilon", "2", "--delta", "1e-4", "--max_contributions", "20"),
    ),
    PipelineSpec(
        name="extract_ngrams",
        stages=("Read", "DPNE", "Format", "WriteNgrams", "BuildReport", "WriteReport"),
        sample_input="data/debian_text.jsonl.gz",
        input_format="jsonl",
        sample_args=("--max_n", "3", "--epsilon", "4", "--delta", "1e-6", "--max_contributions", "30"),
    ),
    PipelineSpec(
        name="bayesian_ngrams",
        stages=("ReadPrivate", "Bayesian", "Format", "WriteDistribution", "BuildReport", "WriteReport"),
        sample_input="data/debian_text.jsonl.gz",
        input_format="jsonl",
        sample_args=(
            "--public",
            "data/bayesian_public_trigrams.tsv.gz",
            "--n",
            "3",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--C",
            "1",
            "--W",
            "100",
        ),
        input_flag="private",
    ),
)

NAMES = tuple(p.name for p in PIPELINES)


def get(name: str) -> PipelineSpec:
    for p in PIPELINES:
        if p.name == name:
            return p
    raise ValueError(f"unknown pipeline {name!r}; known: {', '.join(NAMES)}")
