"""benchmarks/flink_plan_paths.py: the visits of a walk that never remembers a node double per diamond."""

import apache_beam as beam

from benchmarks.flink_plan_paths import leaf_graph, unmemoised_visits


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
