"""Small DoFns used by the test-suite to observe where work ran (multi-process checks).

They live in the package because DirectRunner's multi_processing workers import DoFns by module
name and cannot import test modules.
"""
from __future__ import annotations

import os

import apache_beam as beam


class TagWithPidFn(beam.DoFn):
    """x -> (os.getpid(), x): which worker process handled each element."""

    def process(self, element):
        yield os.getpid(), element


def format_tsv(element) -> str:
    """(a, b) -> 'a<TAB>b' with repr-free formatting for floats (17 significant digits)."""
    a, b = element
    if isinstance(b, float):
        b = repr(b)
    return f"{a}\t{b}"


def zero_weight(item):
    return item, 0.0
