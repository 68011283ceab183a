"""What the CLI's pipeline carries: MAD-SIPS's keep table only in the last round's two steps.

A keep table (docs/thresholding.md; 37,362 entries, ~340 KB pickled at epsilon 1, delta 1e-5, Delta_0 100) is
pickled with every DoFn that holds it, and Beam pickles, bz2-compresses and unpickles each DoFn several
times a run. It was in every step that held the rounds' plans (the statuses, tau, the cap's choice, the
report): 3.3 MB of pipeline, ~0.4 s of MAD-SIPS's 4M-pair run (docs/columnar.md, "Runner overhead").
"""

import pickle

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from dp_partition_beam.pipelines import outputs, select_partitions
from dp_partition_beam.privacy import selection


def _pardo_payload_sizes(args) -> dict:
    """unique name -> bytes of the pickled DoFn, for every ParDo of the CLI's pipeline built from ``args``."""
    parsed = select_partitions.build_parser().parse_args(args)
    pipeline = beam.Pipeline(options=PipelineOptions(["--no_pipeline_type_check"]))
    select_partitions.build_pipeline(pipeline, parsed, select_partitions.params_from_args(parsed))
    sizes = {}
    for t in pipeline.to_runner_api().components.transforms.values():
        if t.spec.urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            sizes[t.unique_name] = len(payload.do_fn.payload)
    return sizes


@pytest.mark.parametrize(
    "algorithm,flags,carriers",
    [
        # the default last round is a keep table of the weight cap 'auto' chooses: six candidate tables, built on
        # the workers from specs
        ("mad_sips", [], []),
        ("mad_sips", ["--weight_cap", "1"], ["KeepTable3", "TablePartials3"]),  # one table, carried
        ("mad2r", ["--threshold", "optimal"], ["ParDo(NoisyThresholdFn)", "R2TablePartials"]),
    ],
)
def test_only_the_last_rounds_steps_carry_the_keep_table(tmp_path, algorithm, flags, carriers):
    params = selection.SelectionParams(
        epsilon=1.0, delta=1e-5, max_contributions=100, threshold="optimal" if algorithm == "mad2r" else None
    )
    table = selection.plan(algorithm, params).rounds[-1].keep_table
    assert table is not None  # else this test checks nothing
    table_bytes = len(pickle.dumps(table))
    assert table_bytes > 100_000
    argv = ["--input", str(tmp_path / "in.tsv"), "--input_format", "tsv", "--algorithm", algorithm, *flags]
    argv += ["--epsilon", "1", "--delta", "1e-5", "--max_contributions", "100"]
    argv += ["--output", str(tmp_path / "items"), "--report", str(tmp_path / "report.json")]
    sizes = _pardo_payload_sizes(argv)
    heavy = sorted(name for name, size in sizes.items() if size > table_bytes // 2)
    assert sorted(name.split("/")[-1] for name in heavy) == sorted(carriers), heavy
    assert sum(sizes.values()) < 3 * table_bytes  # MAD-SIPS's was ~9 tables' worth (weight_cap auto's ~11)


def test_the_report_steps_plans_are_the_plans_reports():
    """The report step holds PlanReports, whose report of every (cap, weight cap) a run can choose is the plan's;
    with weight_cap 'auto' it holds specs, not tables, and builds only the chosen one."""
    params = selection.SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    auto = params.replace(weight_cap="auto")
    for algorithm, p in (("mad_sips", params), ("basic", params), ("mad_sips", auto)):
        plan = selection.plan(algorithm, p)
        reports = outputs.plan_reports(plan)
        caps = [None] if plan.cap is None else list(plan.cap.grid)
        weight_caps = [None] if plan.weight_caps is None else list(plan.weight_caps.candidates)
        assert list(reports.by_cap) == caps
        assert all(reports.report(c, w) == plan.as_report(c, w) for c in caps for w in weight_caps)
        assert len(pickle.dumps(reports)) < 50_000  # a few numbers per cap and round, not the keep table
