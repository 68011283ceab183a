"""Several CLI runs as branches of one Beam job (the engine suite's seeded cases, tests/engines/test_engines.py).

Every pipeline module's ``build_pipeline(pipeline, args, params)`` adds a whole job to ``pipeline`` with
``pipeline | "Label" >> ...``. :class:`CaseBranch` makes one CLI run's job a composite: its flags are parsed,
checked and turned into parameters as :func:`pipelines.cli.run_pipeline_main` does, and ``expand`` calls the
module's ``build_pipeline`` on the composite's input. Beam labels a transform applied inside a composite's
``expand`` ``<composite label>/<label>`` (whether it is applied to the ``PBegin`` or to the pipeline itself,
as ``outputs.write_report`` does with ``report.pipeline``), so each branch, applied under its case's name,
has labels of its own, and a failing step's label names its case. Each branch reads its own inputs and
writes its own release, report and diagnostics, exactly the files its CLI run writes.

    python -m tests.support.merged_job SPEC.json [BEAM OPTIONS]

runs the branches of ``SPEC.json`` (``{"case": ["pipeline module", [CLI arguments]], ...}``) as one job with
the Beam options given (the runner's: a job server, an environment) and waits for it; exit 0 once the job is
DONE. Nothing here is imported by the package's code.
"""

from __future__ import annotations

import importlib
import json
import sys

import apache_beam as beam
from apache_beam.runners.runner import PipelineState

from dp_partition_beam.pipelines import cli, outputs, runner


class CaseBranch(beam.PTransform):
    """One CLI run (``python -m dp_partition_beam.pipelines.<pipeline> ARGV``) as a composite transform of a
    bigger pipeline: the flags parsed strictly, local paths made absolute, the parameters validated and the
    output contract checked as the CLI does before it builds; ``expand`` builds the CLI's job."""

    def __init__(self, pipeline: str, argv):
        super().__init__()
        self.module = importlib.import_module(f"dp_partition_beam.pipelines.{pipeline}")
        parser = self.module.build_parser()
        args, extra = parser.parse_known_args(list(argv))
        cli.check_unknown_args(parser, extra)
        if extra:  # runner options belong to the job, not to one of its branches
            raise ValueError(f"{pipeline}: Beam options {extra} in a branch's arguments")
        cli.absolute_local_paths(args)
        self.args = args
        self.params = self.module.params_from_args(args)
        self.paths = outputs.RunPaths.of(args)
        outputs.check_contract(self.paths)

    def expand(self, pbegin):
        self.module.build_pipeline(pbegin, self.args, self.params)
        return beam.pvalue.PDone(pbegin.pipeline)


def build(spec: dict, beam_args) -> beam.Pipeline:
    """A pipeline with one :class:`CaseBranch` per case of ``spec``, each under the case's name, and its
    output directories prepared (created, checked writable), as the CLI prepares them."""
    pipeline = runner.make_pipeline(runner.pipeline_options(list(beam_args)))
    for name, (module, argv) in spec.items():
        branch = CaseBranch(module, argv)
        _ = pipeline | name >> branch
        outputs.prepare_outputs(branch.paths, [])
    return pipeline


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    cli.configure_logging("WARNING")
    pipeline = build(spec, argv[1:])
    result = runner.run(pipeline)
    state = result.wait_until_finish()
    if state != PipelineState.DONE:
        print(f"the job of {', '.join(spec)} ended in state {state}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
