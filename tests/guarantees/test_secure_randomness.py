"""Secure randomness (issue 9, point 2): fresh noise without a seed, nothing random in the graph.

* Without a seed, two runs (Beam and reference) draw different noise.
* The pipeline graph (the runner-API proto every runner receives, with its pickled DoFns and
  CombineFns) of an unseeded pipeline carries no seed and no RNG state (numpy Generator /
  BitGenerator / RandomState, ``random.Random``): generators are created in ``DoFn.setup`` on the
  worker. A seeded pipeline carries its seed in the DoFns (that is what makes it reproducible - and
  why it is not private against anyone who can read the job); the same scan finds it there, which
  shows the scan can see what it looks for.
* Seeded runs log the "NOT differentially private" warning.
"""

import logging
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from dp_partition_beam.privacy import BayesianParams
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams
from dp_partition_beam.transforms import BayesianNgrams, PublicPrior, reference
from dp_partition_beam.transforms.core.noise import AddNoise, AddNoiseFn
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect_pairs

SEED = 918_273_645_546  # distinctive, so a scan for it has no false positives
WEIGHTS = [(f"item{i}", 1.0) for i in range(50)]
RNG_TYPES = (np.random.Generator, np.random.BitGenerator, np.random.RandomState, random.Random)


def _noisy(seed):
    return dict(collect_pairs(lambda p: p | beam.Create(WEIGHTS) | AddNoise("gaussian", 1.0, seed=seed)))


def test_unseeded_beam_runs_draw_different_noise():
    a, b = _noisy(None), _noisy(None)
    assert set(a) == set(b) == {k for k, _ in WEIGHTS}
    assert all(a[k] != b[k] for k in a)  # continuous noise: a tie has probability 0
    assert len(set(a.values())) == len(a)  # and no two items share a draw within a run


def test_seeded_beam_runs_repeat_exactly():
    assert _noisy(7) == _noisy(7)


def test_unseeded_reference_runs_draw_different_noise():
    w = dict(WEIGHTS)
    a = reference.add_noise(w, "laplace", 1.0)
    b = reference.add_noise(w, "laplace", 1.0)
    assert all(a[k] != b[k] for k in w)


def test_each_worker_dofn_instance_gets_its_own_generator_state():
    # What a runner does with the graph: unpickle the DoFn on every worker and call setup().
    payload = pickler.dumps(AddNoiseFn("gaussian", 1.0, None, 1))
    fns = [pickler.loads(payload) for _ in range(2)]
    for fn in fns:
        fn.setup()
    draws = [fn._draw("x") for fn in fns]
    assert draws[0] != draws[1]


# --- the pipeline graph ----------------------------------------------------------------------------


def _walk(obj, seen, depth=0):
    """Yields every object reachable from ``obj`` through containers, attributes and closures."""
    if id(obj) in seen or depth > 25:
        return
    seen.add(id(obj))
    yield obj
    if isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
        return
    children = []
    if isinstance(obj, dict):
        children = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    else:
        if hasattr(obj, "__dict__") and not isinstance(obj, type(logging)):
            children.extend(vars(obj).values())
        for name in getattr(type(obj), "__slots__", ()) or ():
            if hasattr(obj, name):
                children.append(getattr(obj, name))
        if callable(obj):
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    children.append(cell.cell_contents)
                except ValueError:
                    pass
            for attr in ("args", "keywords", "func", "__defaults__"):
                if hasattr(obj, attr):
                    children.append(getattr(obj, attr))
    for child in children:
        yield from _walk(child, seen, depth + 1)


def _graph_objects(pipeline):
    """Every object unpickled from the pipeline's runner-API proto (DoFns, CombineFns, ...)."""
    proto = pipeline.to_runner_api()
    payloads = []
    for t in proto.components.transforms.values():
        urn = t.spec.urn
        if urn == common_urns.primitives.PAR_DO.urn:
            payloads.append(beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload).do_fn.payload)
        elif urn in (
            common_urns.composites.COMBINE_PER_KEY.urn,
            common_urns.combine_components.COMBINE_GROUPED_VALUES.urn,
        ):
            payloads.append(beam_runner_api_pb2.CombinePayload.FromString(t.spec.payload).combine_fn.payload)
        elif urn == "beam:transform:pickled_python:v1" and t.spec.payload:
            payloads.append(t.spec.payload)
    objects, seen = [], set()
    for payload in payloads:
        try:
            root = pickler.loads(payload)
        except Exception:  # not every payload is a pickle (e.g. plain urns); those carry no objects
            continue
        objects.extend(_walk(root, seen))
    return proto, objects, len(payloads)


def _scan(pipeline):
    proto, objects, n_payloads = _graph_objects(pipeline)
    rngs = [type(o).__name__ for o in objects if isinstance(o, RNG_TYPES)]
    seeds = [o for o in objects if isinstance(o, int) and not isinstance(o, bool) and o == SEED]
    raw = proto.SerializeToString()
    return rngs, seeds, n_payloads, raw


def _selection_pipeline(algorithm, seed):
    p = beam.Pipeline()
    _ = (
        p
        | beam.Create([("u1", "a"), ("u2", "a")])
        | SelectPartitions(algorithm, SelectionParams(1.0, 1e-5, max_contributions=4), seed=seed)
    )
    return p


def _dpne_pipeline(seed):
    p = beam.Pipeline()
    _ = p | beam.Create([("u1", "a b c")]) | DPNE("dpne", DPNEParams(max_n=3, max_contributions=4), seed=seed)
    return p


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_unseeded_selection_graph_has_no_seed_and_no_rng_state(algorithm):
    rngs, seeds, n_payloads, raw = _scan(_selection_pipeline(algorithm, None))
    assert n_payloads > 5  # the scan really looked at the pickled DoFns
    assert rngs == [] and seeds == []
    seeded_rngs, seeded_seeds, _, seeded_raw = _scan(_selection_pipeline(algorithm, SEED))
    assert seeded_rngs == []  # even seeded: draws are keyed functions, generators are built on workers
    assert seeded_seeds, "the seeded graph must carry its seed (scan sanity check)"


def test_unseeded_dpne_graph_has_no_seed_and_no_rng_state():
    rngs, seeds, _, _ = _scan(_dpne_pipeline(None))
    assert rngs == [] and seeds == []
    _, seeded_seeds, _, _ = _scan(_dpne_pipeline(SEED))
    assert seeded_seeds


# --- the seeded warning ----------------------------------------------------------------------------


def test_seeded_modes_log_the_warning(caplog):
    with caplog.at_level(logging.WARNING):
        reference.select({"u": ["a"]}, "basic", SelectionParams(1.0, 1e-5), seed=3)
    assert "NOT differentially private" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _selection_pipeline("mad", 3)
    assert "NOT differentially private" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reference.select({"u": ["a"]}, "basic", SelectionParams(1.0, 1e-5))
        _selection_pipeline("mad", None)
    assert "NOT differentially private" not in caplog.text


_WARNING = "NOT differentially private"


def _entry_points(seed):
    """The three public entry points, built the same way: (algorithm, [prior,] params, *, seed=...)."""
    prior = PublicPrior.from_counts({"a b": 1.0, "b c": 2.0})
    return {
        "SelectPartitions": SelectPartitions("mad", SelectionParams(1.0, 1e-5, max_contributions=4), seed=seed),
        "DPNE": DPNE("dpne", DPNEParams(max_n=2, max_contributions=4), seed=seed),
        "BayesianNgrams": BayesianNgrams("bayesian", prior, BayesianParams(n=2), seed=seed),
    }


@pytest.mark.parametrize("name", ["SelectPartitions", "DPNE", "BayesianNgrams"])
def test_every_entry_point_warns_on_a_seed_when_applied(name, caplog):
    """All three warn in ``expand`` (when applied to a pipeline), not when the transform is built."""
    with caplog.at_level(logging.WARNING):
        transform = _entry_points(4)[name]
    assert _WARNING not in caplog.text  # building it is not running it
    with caplog.at_level(logging.WARNING):
        _ = beam.Pipeline() | beam.Create([("u1", "a b c")]) | transform
    assert _WARNING in caplog.text and "(4)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _ = beam.Pipeline() | beam.Create([("u1", "a b c")]) | _entry_points(None)[name]
    assert _WARNING not in caplog.text


def test_every_reference_warns_on_a_seed(caplog):
    prior = PublicPrior.from_counts({"a b": 1.0, "b c": 2.0})
    calls = {
        "select": lambda seed: reference.select({"u": ["a"]}, "basic", SelectionParams(1.0, 1e-5), seed=seed),
        "dpne_reference": lambda seed: reference.dpne_reference(
            {"u": "a b c"}, "dpne", DPNEParams(max_n=2, max_contributions=4), seed=seed
        ),
        "bayesian_release": lambda seed: reference.bayesian_release(
            {"u": ["a b c"]}, "bayesian", prior, BayesianParams(n=2), seed=seed
        ),
    }
    for name, call in calls.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            call(5)
        assert _WARNING in caplog.text, name
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            call(None)
        assert _WARNING not in caplog.text, name


def test_cli_with_seed_prints_the_warning(tmp_path):
    # A real process: the CLI's own logging setup must put the warning on stderr. --algorithm basic: the
    # warning comes from the seed, whatever the selection (the default MAD-SIPS calibrates its keep tables in
    # the subprocess, outside the test calibration cache, for nothing this test reads).
    import os
    import subprocess
    import sys

    src = tmp_path / "in.tsv"
    src.write_text("u1\ta\nu2\ta\n", encoding="utf-8")
    argv = [
        sys.executable,
        "-m",
        "dp_partition_beam.pipelines.select_partitions",
        "--input",
        str(src),
        "--input_format",
        "tsv",
        "--algorithm",
        "basic",
        "--output",
        str(tmp_path / "o"),
        "--report",
        str(tmp_path / "r.json"),
        "--epsilon",
        "1",
        "--delta",
        "1e-5",
        "--direct_running_mode",
        "in_memory",
        "--seed",
        "4",
    ]
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    proc = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "NOT differentially private" in proc.stderr
