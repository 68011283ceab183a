"""In-memory reference implementations: the test oracle of every Beam transform and the fast path
for small data.

Same parameters, same calibration plans and the same randomness contract as the Beam transforms, so
under a seed each function returns exactly what its transform releases:

  select / select_rounds      :class:`transforms.SelectPartitions`  (transforms/selection/reference.py)
  select_counts / release     ... with ``release_counts`` (the noisy counts; the whole result)
  dpne_reference              :class:`transforms.DPNE`              (transforms/dpne/reference.py)
  bayesian_release            :class:`transforms.BayesianNgrams`    (transforms/bayesian/reference.py)

Everything here holds the whole dataset in memory; use the Beam transforms beyond a few million pairs.
"""

from dp_partition_beam.transforms.bayesian.reference import release as bayesian_release
from dp_partition_beam.transforms.dpne.reference import DPNEResult, dpne_reference, user_kgrams
from dp_partition_beam.transforms.selection.reference import (
    add_noise,
    basic_weights,
    bound_contributions,
    mad_weights,
    noisy_threshold,
    release,
    restrict_to_allowlist,
    select,
    select_counts,
    select_rounds,
    user_sets_from_pairs,
)

__all__ = [
    "select",
    "select_rounds",
    "select_counts",
    "release",
    "restrict_to_allowlist",
    "user_sets_from_pairs",
    "bound_contributions",
    "basic_weights",
    "mad_weights",
    "add_noise",
    "noisy_threshold",
    "dpne_reference",
    "DPNEResult",
    "user_kgrams",
    "bayesian_release",
]
