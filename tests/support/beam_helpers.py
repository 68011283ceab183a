"""Helpers to run small Beam pipelines in tests with a pinned DirectRunner mode (no Prism download)."""

import glob
import os
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline

from dp_partition_beam.transforms.testing.beam import format_tsv


def options(mode="in_memory", workers=None):
    args = ["--runner=DirectRunner", f"--direct_running_mode={mode}"]
    if workers:
        args.append(f"--direct_num_workers={workers}")
    return PipelineOptions(args)


def make_test_pipeline(mode="in_memory", workers=None):
    return TestPipeline(options=options(mode, workers))


def collect(build, mode="in_memory", workers=None, fmt=str):
    """Runs ``build(pipeline) -> PCollection`` and returns its elements (as written by ``fmt``).

    Elements go through text files, which works in every running mode (matchers in
    multi_processing mode would run in worker processes).
    """
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "out")
        with beam.Pipeline(options=options(mode, workers)) as p:
            pcoll = build(p)
            _ = pcoll | "Format" >> beam.Map(fmt) | "Write" >> beam.io.WriteToText(prefix)
        lines = []
        for path in sorted(glob.glob(prefix + "*")):
            with open(path, encoding="utf-8") as f:
                lines.extend(line.rstrip("\n") for line in f)
        return lines


def collect_branches(builds, mode="in_memory", workers=None, fmt=str):
    """Runs several cases as labelled branches of ONE pipeline and returns ``{name: [elements]}``.

    ``builds`` maps a case name to ``build(pbegin) -> PCollection``; each branch is applied under its
    name as a label prefix (``pipeline | name >> ...`` inside), so the cases share one pipeline's fixed
    cost (a DirectRunner pipeline has seconds of it) and a failing case is still reported by its name.
    Elements go through one text file set per branch (written by ``fmt``), as in :func:`collect`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        prefixes = {}
        with beam.Pipeline(options=options(mode, workers)) as p:
            for i, (name, build) in enumerate(builds.items()):
                prefixes[name] = os.path.join(tmp, f"b{i}", "out")
                pcoll = build(_Labelled(p, str(name)))
                _ = pcoll | f"{name}/Format" >> beam.Map(fmt) | f"{name}/Write" >> beam.io.WriteToText(prefixes[name])
        out = {}
        for name, prefix in prefixes.items():
            lines = []
            for path in sorted(glob.glob(prefix + "*")):
                with open(path, encoding="utf-8") as f:
                    lines.extend(line.rstrip("\n") for line in f)
            out[name] = lines
        return out


class _Labelled:
    """A pipeline stand-in whose ``|`` prefixes every label with a branch name: ``p | "Create" >> t``
    becomes ``p | "name/Create" >> t``; an unlabelled transform gets ``name/<its default label>``."""

    def __init__(self, pipeline, name):
        self.pipeline, self._name = pipeline, name

    def __or__(self, ptransform):
        label = getattr(ptransform, "label", None) or type(ptransform).__name__
        return self.pipeline | f"{self._name}/{label}" >> ptransform

    def apply(self, ptransform, *args, **kwargs):
        return self.__or__(ptransform)


class Scoped(beam.PTransform):
    """``build(pbegin) -> PCollection`` as one composite: every label inside it is nested under the label the
    composite is applied with (a branch of :func:`collect_branches` whose steps reuse short labels)."""

    def __init__(self, build):
        super().__init__()
        self._build = build

    def expand(self, pbegin):
        return self._build(pbegin)


def collect_pairs(build, mode="in_memory", workers=None):
    """Like :func:`collect` for (key, float) pairs; returns a list of (key, float)."""
    out = []
    for line in collect(build, mode, workers, fmt=format_tsv):
        k, v = line.split("\t")
        out.append((k, float(v)))
    return out


def is_package_dofn(obj, module_name: str) -> bool:
    """``obj`` is a concrete beam.DoFn class defined in ``module_name`` whose process is the package's (its
    own, or a package base's such as PerUserFn's): the DoFns a runner executes. Abstract bases (PerUserFn)
    and DoFns with Beam's process only are not."""
    import inspect

    import apache_beam as beam

    return (
        inspect.isclass(obj)
        and issubclass(obj, beam.DoFn)
        and obj.__module__ == module_name
        and not inspect.isabstract(obj)
        and any("process" in c.__dict__ for c in obj.__mro__ if c.__module__.startswith("dp_partition_beam"))
    )
