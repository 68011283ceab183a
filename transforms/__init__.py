"""Beam transforms of user-level differentially private key and n-gram release.

The public API (everything else is internal and may change)::

    from transforms import SelectPartitions, DPNE, BayesianNgrams, PublicPrior, reference

    items = pairs | SelectPartitions("mad2r", SelectionParams(epsilon=1, delta=1e-5))  # (user, item) -> item

Building blocks for custom pipelines: :class:`BoundContributions`, :class:`UserSetWeights`,
:class:`MADWeights`, :class:`AddNoise`, :class:`NoisyThreshold`, :class:`JoinValuesToSets`,
:class:`ReleaseCounts` (DP counts of released items, exact discrete Gaussian noise).

Layout: one subpackage per family - ``core`` (randomness contract, exact sums, bounding, noise,
joins, text), ``selection``, ``dpne``, ``bayesian`` - each with pure kernels (``*_kernels.py``), Beam
transforms and an in-memory ``reference.py``; ``testing`` holds test/benchmark support (not API).
"""

from transforms import reference
from transforms.bayesian.bayesian import BayesianNgrams
from transforms.bayesian.bayesian_kernels import PublicPrior
from transforms.core.bounding import BoundContributions
from transforms.core.joins import JoinValuesToSets
from transforms.core.noise import AddNoise, NoisyThreshold
from transforms.dpne.dpne import DPNE
from transforms.selection.basic import UserSetWeights
from transforms.selection.counts import ReleaseCounts
from transforms.selection.mad import MADWeights
from transforms.selection.select import SelectPartitions

__all__ = [
    "SelectPartitions",
    "DPNE",
    "BayesianNgrams",
    "PublicPrior",
    "reference",
    "BoundContributions",
    "UserSetWeights",
    "MADWeights",
    "AddNoise",
    "NoisyThreshold",
    "JoinValuesToSets",
    "ReleaseCounts",
]
