"""DPNE cases as labelled branches of one Beam pipeline (with :func:`tests.support.beam_helpers.collect_branches`).

A DirectRunner pipeline has seconds of fixed cost, and a seeded DPNE run is a long chain of stages: the test
files that compare Beam DPNE with its reference build every case as one branch of one pipeline and compare each
branch with its own reference result. :func:`branch` wraps a case's ``build(pbegin)`` in a composite, so the
case's transforms are labelled under the branch name whatever labels they use (``"Create"``, ``"DPNE"`` in
every branch); :func:`outputs` writes the DPNE outputs a test compares as one tagged text PCollection and
:func:`untag` reads it back per output, so one branch carries n-grams, levels and counts together.
"""

import json

import apache_beam as beam

from tests.support.beam_helpers import Scoped

FORMATS = {
    "ngrams": lambda kg: f"{kg[0]}\t{kg[1]}",  # extract_ngrams.format_ngram
    "counts": lambda kgc: f"{kgc[0]}\t{kgc[1][0]}\t{kgc[1][1]}",  # extract_ngrams.format_ngram_count
    "levels": lambda level: json.dumps(level, sort_keys=True),
    "distribution": lambda kv: f"{kv[0]}\t{kv[1]!r}",  # BayesianNgrams
}


_Case = Scoped


def branch(build):
    """``build(pbegin) -> PCollection`` as a branch for ``collect_branches``: applied as one composite under the
    branch's name, so the case's own labels never clash with another branch's."""
    return lambda p: p | "Case" >> _Case(build)


def outputs(out, names=("ngrams", "levels")):
    """The DPNE (or BayesianNgrams) output dict ``out`` -> one PCollection of ``"<name>\\t<formatted element>"``
    lines for each output in ``names`` (formatted by :data:`FORMATS`)."""
    tagged = [out[n] | f"Tag-{n}" >> beam.Map(lambda x, n=n: f"{n}\t{FORMATS[n](x)}") for n in names]
    return tuple(tagged) | "Tagged" >> beam.Flatten()


def untag(lines, names=("ngrams", "levels")):
    """The lines of :func:`outputs` -> ``{name: sorted lines}`` (levels: the parsed dicts, in
    ``(k, run)`` order), every name of ``names`` present (an output with no element is an empty list)."""
    got = {n: [] for n in names}
    for line in lines:
        name, text = line.split("\t", 1)
        got[name].append(text)
    for name in got:
        got[name].sort()
    if "levels" in got:
        got["levels"] = sorted((json.loads(t) for t in got["levels"]), key=level_key)
    return got


def level_key(level):
    """A level dict's sort key: (k, run name) (DPNE levels have ``k``, the DPSU baselines' runs ``run``)."""
    return level.get("k", 0), level.get("run", "")
