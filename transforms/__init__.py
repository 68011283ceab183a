"""Beam transforms of user-level differentially private key and n-gram release.

The public API (everything else is internal and may change)::

    from dp_partition_beam.transforms import SelectPartitions, DPNE, BayesianNgrams, PublicPrior, reference

    items = pairs | SelectPartitions("mad2r", SelectionParams(epsilon=1, delta=1e-5))  # (user, item) -> item

Each selection algorithm has one Beam path: the parallel ones run columnar (Arrow tables through user
and item shards, :mod:`transforms.core.engine`; docs/columnar.md lists the stages with their
table shapes), the sequential policies per element on one worker (:mod:`transforms.selection.policy`).
The stages inside the entry points are internal; ``reference`` holds the same algorithms in memory
(the test oracle).

Layout: one subpackage per family - ``core`` (randomness contract, exact sums, Arrow batches and
shards, bounding, noise and threshold, joins, text), ``selection``, ``dpne``, ``bayesian`` - each with
pure kernels (``*_kernels.py``), Beam transforms and an in-memory ``reference.py``; ``testing`` holds
test/benchmark support (not API).
"""

from dp_partition_beam.transforms import reference
from dp_partition_beam.transforms.bayesian.bayesian import BayesianNgrams
from dp_partition_beam.transforms.bayesian.bayesian_kernels import PublicPrior
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.selection.select import SelectPartitions

__all__ = [
    "SelectPartitions",
    "DPNE",
    "BayesianNgrams",
    "PublicPrior",
    "reference",
]
