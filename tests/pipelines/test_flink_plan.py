"""pipelines/flink_plan.py: the paths Flink's batch optimizer walks, and the warning before a run that may not start."""

import io

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam.pipelines import flink_plan
from dp_partition_beam.pipelines.flink_plan import leaf_graph, unmemoised_visits


def test_a_chain_of_diamonds_doubles_the_visits():
    # a -> (b, c) -> d -> (e, f) -> g: from g, 1 + 2 (e, f) + 2 (d twice) + 4 (b, c twice) + 4 (a four times)
    inputs = {"a": set(), "b": {"a"}, "c": {"a"}, "d": {"b", "c"}, "e": {"d"}, "f": {"d"}, "g": {"e", "f"}}
    assert unmemoised_visits(inputs) == 13
    assert unmemoised_visits({"a": set(), "b": {"a"}, "c": {"b"}}) == 3  # a chain: each node once


def test_side_inputs_are_edges_of_the_leaf_graph():
    p = beam.Pipeline()
    xs = p | "Create" >> beam.Create([1, 2])
    total = xs | "Sum" >> beam.CombineGlobally(sum)
    _ = xs | "Scale" >> beam.Map(lambda x, t: x / t, beam.pvalue.AsSingleton(total))
    proto = p.to_runner_api()
    inputs = leaf_graph(proto)
    names = {k: proto.components.transforms[k].unique_name for k in inputs}
    scale = next(k for k, n in names.items() if n == "Scale")
    assert {names[i].split("/")[0] for i in inputs[scale]} == {"Create", "Sum"}


def _diamonds(runner: str, n: int) -> beam.Pipeline:
    """A chain of n diamonds: 2^n paths and more."""
    p = beam.Pipeline(options=PipelineOptions([f"--runner={runner}", "--job_endpoint=localhost:1"]))
    xs = p | "Create" >> beam.Create([1])
    for i in range(n):
        left = xs | f"L{i}" >> beam.Map(abs)
        right = xs | f"R{i}" >> beam.Map(abs)
        xs = (left, right) | f"F{i}" >> beam.Flatten()
    return p


def test_a_flink_capable_run_with_a_huge_plan_is_warned_about(monkeypatch):
    monkeypatch.setattr(flink_plan, "WARN_PATHS", 1000)
    for runner in ("FlinkRunner", "PortableRunner"):
        out = io.StringIO()
        paths = flink_plan.warn_if_flink_may_not_start(_diamonds(runner, 12), file=out)
        assert paths >= 2**12
        assert "sink-to-source paths" in out.getvalue() and "Flink's plan optimizer" in out.getvalue()
        assert "-Xss16m" in out.getvalue() and "may never start" not in out.getvalue()  # 4,096 paths < NEVER_PATHS
        out = io.StringIO()  # a small plan: counted, not warned about
        assert 0 < flink_plan.warn_if_flink_may_not_start(_diamonds(runner, 2), file=out) < 1000
        assert out.getvalue() == ""


def test_only_a_plan_past_never_paths_is_said_never_to_start(monkeypatch):
    monkeypatch.setattr(flink_plan, "WARN_PATHS", 1000)
    monkeypatch.setattr(flink_plan, "NEVER_PATHS", 2**12)
    out = io.StringIO()
    assert flink_plan.warn_if_flink_may_not_start(_diamonds("FlinkRunner", 12), file=out) >= 2**12
    assert "the job may never start" in out.getvalue()


def test_a_plan_that_cannot_be_counted_is_left_to_the_run(monkeypatch):
    """The check runs before the CLI's run and its cleanup: it must never raise."""

    def broken(pipeline):
        raise RuntimeError("to_runner_api failed")

    monkeypatch.setattr(flink_plan, "plan_paths", broken)
    out = io.StringIO()
    assert flink_plan.warn_if_flink_may_not_start(_diamonds("FlinkRunner", 3), file=out) == 0
    assert out.getvalue() == ""


def test_other_runners_pay_nothing():
    out = io.StringIO()
    assert flink_plan.warn_if_flink_may_not_start(_diamonds("SparkRunner", 20), file=out) == 0
    assert flink_plan.warn_if_flink_may_not_start(_diamonds("DirectRunner", 20), file=out) == 0
    assert out.getvalue() == ""


def _dpne_paths(*flags) -> int:
    """The plan paths of extract_ngrams on the bundled sample (built, not run)."""
    from dp_partition_beam.pipelines import extract_ngrams

    argv = ["--input", "data/debian_text.jsonl.gz", "--input_format", "jsonl", "--output", "o", "--report", "r"]
    argv += ["--epsilon", "4", "--delta", "1e-6", "--max_contributions", "30", "--seed", "11", *flags]
    args = extract_ngrams.build_parser().parse_args(argv)
    pipeline = beam.Pipeline(options=PipelineOptions(["--no_pipeline_type_check"]))
    extract_ngrams.build_pipeline(pipeline, args, extract_ngrams.params_from_args(args))
    return flink_plan.plan_paths(pipeline)


def test_a_dpne_level_multiplies_the_paths_by_at_most_six():
    """Each DPNE level reads the previous level's release along few routes that meet again (level sizes,
    capping, the spurious step's one singleton and keyed join), so the paper's default --max_n 9 compiles on
    Flink (1.4e8 paths since the spurious draws read the plan alone; 5.8e8 before, 8.3e12 before that, which
    never started: docs/engines.md). A diamond added to a level
    (e.g. a singleton of S_{k-1} read by two steps that meet again) raises the ratio past 6."""
    six, seven = _dpne_paths("--max_n", "6"), _dpne_paths("--max_n", "7")
    assert seven / six < 6.0
    assert _dpne_paths("--max_n", "9") < 10**9


def test_a_mad_sips_level_is_one_chain_and_multiplies_the_paths_by_at_most_three():
    """With --selection mad_sips a level's rounds are one chain of GroupByKeys whose elements carry the rounds,
    and only its first step and its spurious draws read the level's plan (S_{k-1}): ~x2 a level, 2.7e6 paths at
    the default --max_n 9 (the rounds reading side inputs computed inside the level gave x430 and 7.7e9 at
    --max_n 3, which Flink never started: docs/engines.md). A side input read by a second step of the chain, or
    a round's output flattened with a later one, raises the ratio past 3."""
    six, seven = (
        _dpne_paths("--selection", "mad_sips", "--max_n", "6"),
        _dpne_paths("--selection", "mad_sips", "--max_n", "7"),
    )
    assert seven / six < 3.0
    assert _dpne_paths("--selection", "mad_sips", "--max_n", "9") < 10**8


def _max_consumers(*flags) -> int:
    """The most steps that read one step's output (main or side input) in extract_ngrams' graph (unseeded)."""
    from dp_partition_beam.pipelines import extract_ngrams

    argv = ["--input", "data/debian_text.jsonl.gz", "--input_format", "jsonl", "--output", "o", "--report", "r"]
    argv += ["--epsilon", "4", "--delta", "1e-6", "--max_contributions", "30", *flags]
    args = extract_ngrams.build_parser().parse_args(argv)
    pipeline = beam.Pipeline(options=PipelineOptions(["--no_pipeline_type_check"]))
    extract_ngrams.build_pipeline(pipeline, args, extract_ngrams.params_from_args(args))
    consumers = {}
    for inputs in leaf_graph(pipeline.to_runner_api()).values():
        for producer in inputs:
            consumers[producer] = consumers.get(producer, 0) + 1
    return max(consumers.values())


def test_no_step_feeds_more_than_flinks_64_outputs():
    """Flink's optimizer refuses a node with more than 64 outputs ("Cannot currently handle nodes with more than
    64 outputs", 2026-12-02: the number of shards, a singleton, read by every step of MAD-SIPS's rounds at
    --max_n 9). The level chain carries it in its elements; the first step and the spurious draws read it."""
    for selection in ("single", "mad_sips"):
        assert _max_consumers("--selection", selection, "--max_n", "9") <= 40
