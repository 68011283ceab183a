"""Branch builds for :func:`tests.support.beam_helpers.collect_branches` whose transforms keep short labels.

``collect_branches`` prefixes only the first label of a branch (the one applied to the pipeline); the labels
applied to the PCollections after it are global, so two branches that both say ``| "Select" >> ...`` clash.
:func:`scoped` wraps a whole chain in one composite transform, so every label inside is scoped under the
branch's name.
"""

from tests.support.beam_helpers import Scoped


def scoped(build):
    """``build(pbegin) -> PCollection`` as a branch build whose inner labels live under the branch's name."""
    return lambda p: p | "Case" >> Scoped(build)
