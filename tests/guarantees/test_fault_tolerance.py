"""Fault tolerance (issue 9, point 5): retried bundles cannot change the seeded result; failed runs
leave no partial output.

What is proven, precisely:
* The embedded DirectRunner modes (FnApiRunner: in_memory, multi_processing) do NOT retry a failed
  bundle: the run fails (``test_fnapi_direct_runner_does_not_retry``). Beam's
  ``BundleBasedDirectRunner`` retries a failed bundle up to 4 times and discards the failed
  attempt's output, like Dataflow/Flink. So the retry tests run there: every DoFn class of the
  package (subsampling, noise, MAD kernels, joins, DPNE) is patched to fail the first attempt of
  every bundle after doing its work, and the seeded output must equal the clean run and the
  reference, bit for bit. Marker files count the injected failures (the test checks there were).
* Re-execution of a bundle on a fresh worker (what a runner does after a worker dies): a DoFn
  unpickled anew and given the same elements produces the same output under a seed
  (``test_reexecuted_dofns_reproduce_their_output``). Unseeded noise re-drawn on re-execution is
  different, which is why stages with two consumers are checkpointed
  (tests/transforms/selection/test_multiprocessing.py).
* A run that fails after writing some output removes it (outputs, report and beam-temp staging).
"""

import glob
import importlib
import inspect
import os
import pkgutil
import random

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions

from dp_partition_beam import transforms
from dp_partition_beam.pipelines import outputs, select_partitions
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.core.bounding import CapUserItemsFn
from dp_partition_beam.transforms.core.engine import CapFn
from dp_partition_beam.transforms.core.noise import AddNoiseFn
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.dpne.reference import dpne_reference
from dp_partition_beam.transforms.selection.select import SelectPartitions
from dp_partition_beam.transforms.testing import beam as testing

from tests.support.beam_helpers import is_package_dofn

RND = random.Random(3)
PAIRS = [(f"u{u}", f"i{min(int(RND.paretovariate(1.0)), 300)}") for u in range(300) for _ in range(RND.randint(1, 12))]
PARAMS = SelectionParams(1.0, 1e-5, max_contributions=5)
TEXTS = [(f"u{u}", " ".join(RND.choice("abcdefgh") for _ in range(6))) for u in range(200)]


def package_dofn_classes():
    """Every beam.DoFn subclass defined in the transforms package (except the test helpers)."""
    classes = []
    for mod in pkgutil.walk_packages(transforms.__path__, "dp_partition_beam.transforms."):
        if mod.ispkg or mod.name.startswith("dp_partition_beam.transforms.testing"):
            continue
        module = importlib.import_module(mod.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if is_package_dofn(obj, module.__name__):  # every concrete DoFn (not abstract bases: PerUserFn)
                classes.append(obj)
    return classes


def _run(build, runner, out_dir):
    args = [f"--runner={runner}"] + (["--direct_running_mode=in_memory"] if runner == "DirectRunner" else [])
    with beam.Pipeline(options=PipelineOptions(args)) as p:
        _ = build(p) | beam.Map(str) | beam.io.WriteToText(os.path.join(out_dir, "out"))
    return sorted(l.rstrip("\n") for f in glob.glob(os.path.join(out_dir, "out*")) for l in open(f, encoding="utf-8"))


def _with_failures(build, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    undo = [testing.inject_bundle_failures(c, str(markers)) for c in package_dofn_classes()]
    try:
        out = _run(build, "BundleBasedDirectRunner", str(tmp_path / "faulty"))
    finally:
        for u in undo:
            u()
    return out, len(os.listdir(markers))


def test_package_dofns_are_found():
    names = {c.__name__ for c in package_dofn_classes()}
    assert {"CapUserItemsFn", "AddNoiseFn"} <= names and len(names) >= 6


@pytest.mark.parametrize("algorithm", ["basic", "mad", "mad2r", "dp_sips", "mad_sips"])
def test_bundle_retries_do_not_change_the_seeded_selection(tmp_path, algorithm):
    def build(p):
        return p | beam.Create(PAIRS) | SelectPartitions(algorithm, PARAMS, seed=11)

    clean = _run(build, "BundleBasedDirectRunner", str(tmp_path / "clean"))
    faulty, failures = _with_failures(build, tmp_path)
    assert failures >= 2  # failures were injected (and retried: the run succeeded)
    assert faulty == clean
    want = reference.select(reference.user_sets_from_pairs(PAIRS), algorithm, PARAMS, seed=11)
    assert set(clean) == {str(i) for i in want} and len(clean) == len(want) > 0


def test_bundle_retries_do_not_change_seeded_dpne(tmp_path):
    params = DPNEParams(epsilon=4.0, delta=1e-5, max_n=3, max_contributions=4)

    def build(p):
        return (p | beam.Create(TEXTS) | DPNE("dpne", params, seed=5))["ngrams"]

    clean = _run(build, "BundleBasedDirectRunner", str(tmp_path / "clean"))
    faulty, failures = _with_failures(build, tmp_path)
    assert failures >= 2 and faulty == clean
    want = dpne_reference(TEXTS, "dpne", params, seed=5).ngrams
    assert set(clean) == {str((k, g)) for k, gs in want.items() for g in gs} and clean


def test_fnapi_direct_runner_does_not_retry(tmp_path):
    markers = tmp_path / "m"
    markers.mkdir()
    undo = testing.inject_bundle_failures(CapFn, str(markers))  # the columnar path's capping
    try:
        with pytest.raises(Exception, match="injected failure"):
            _run(
                lambda p: p | beam.Create(PAIRS) | SelectPartitions("basic", PARAMS, seed=1),
                "DirectRunner",
                str(tmp_path / "o"),
            )
    finally:
        undo()


def test_reexecuted_dofns_reproduce_their_output():
    grouped = [(u, sorted(set(i for v, i in PAIRS if v == u))) for u in sorted({u for u, _ in PAIRS})]
    weights = [(f"i{j}", float(j)) for j in range(200)]

    def execute(fn, elements):
        worker = pickler.loads(pickler.dumps(fn))  # a fresh worker's copy of the DoFn
        worker.setup()
        worker.start_bundle()
        return [out for e in elements for out in worker.process(e)]

    for fn, elements in ((CapUserItemsFn(3, 7, 0), grouped), (AddNoiseFn("gaussian", 2.0, 7, 1), weights)):
        assert execute(fn, elements) == execute(fn, elements)
    # Unseeded: a re-executed draw differs (so a stage read twice must be checkpointed).
    assert execute(AddNoiseFn("laplace", 2.0, None, 1), weights) != execute(
        AddNoiseFn("laplace", 2.0, None, 1), weights
    )


# --- atomic output ---------------------------------------------------------------------------------


def test_failed_run_leaves_no_partial_output(tmp_path, monkeypatch, capsys):
    # The report stage fails after the items may already be written: everything the run wrote goes.
    def broken_report(*_):
        raise RuntimeError("report stage failed")

    monkeypatch.setattr(outputs, "build_report", broken_report)
    src = tmp_path / "in.tsv"
    src.write_text("".join(f"u{j}\ta\n" for j in range(60)), encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(Exception, match="report stage failed"):
        select_partitions.run(
            [
                "--input",
                str(src),
                "--input_format",
                "tsv",
                "--output",
                str(out / "items"),
                "--report",
                str(out / "report.json"),
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--direct_running_mode",
                "in_memory",
            ]
        )
    assert not out.exists() or os.listdir(out) == []


def test_failed_input_leaves_no_output_and_keeps_earlier_files(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    unrelated = (
        out / "notes-from-last-week.txt"
    )  # (a file starting with the prefix stops the run: test_output_contract)
    unrelated.write_text("keep me\n")
    src = tmp_path / "in.tsv"
    src.write_text("".join(f"u{j}\ta\n" for j in range(60)) + "bad line\n", encoding="utf-8")
    code = select_partitions.run(
        [
            "--input",
            str(src),
            "--input_format",
            "tsv",
            "--output",
            str(out / "items"),
            "--report",
            str(out / "report.json"),
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--direct_running_mode",
            "in_memory",
        ]
    )
    assert code == 3
    assert sorted(os.listdir(out)) == ["notes-from-last-week.txt"] and unrelated.read_text() == "keep me\n"


def test_remove_new_outputs_deletes_only_what_the_run_wrote(tmp_path):
    old = tmp_path / "items-00000-of-00001"
    old.write_text("old\n")
    before = outputs.snapshot_outputs([str(tmp_path / "items"), str(tmp_path / "report.json")])
    staging = tmp_path / "beam-temp-items-1234"
    staging.mkdir()
    (staging / "shard").write_text("partial\n")
    new = tmp_path / "items-00000-of-00002"
    new.write_text("new\n")
    other = tmp_path / "unrelated.txt"
    other.write_text("x")
    removed = outputs.remove_new_outputs([str(tmp_path / "items"), str(tmp_path / "report.json")], before)
    assert sorted(os.path.basename(p) for p in removed) == ["items-00000-of-00002", "shard"]
    assert old.exists() and other.exists() and not new.exists() and not staging.exists()
