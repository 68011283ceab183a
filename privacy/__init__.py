"""Privacy parameters, calibration and accounting: pure math, no Beam.

The public API::

    from dp_partition_beam.privacy import SelectionParams, DPNEParams, BayesianParams, PrivacyBudget, ALGORITHMS

One module per family holds its validated, frozen parameter class and its calibration plan
(``selection.py``, ``dpne.py``, ``bayesian.py``); ``calibration.py`` (analytic Gaussian mechanism,
thresholds) and ``accounting.py`` (budget splits, Gaussian-DP composition) are shared;
``validation.py`` holds the validators every parameter class uses; ``counts.py`` the sensitivity,
accounting and budget split of the released counts (docs/counts.md); ``audit.py`` the statistics of
the empirical privacy audit.
"""

from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.privacy.counts import CountPlan
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import (
    ALGORITHMS,
    AlgorithmSpec,
    RoundPlan,
    SelectionParams,
    plan_counts,
    plan_rounds,
)
from dp_partition_beam.privacy.validation import PrivacyBudget

__all__ = [
    "SelectionParams",
    "DPNEParams",
    "BayesianParams",
    "PrivacyBudget",
    "ALGORITHMS",
    "AlgorithmSpec",
    "RoundPlan",
    "plan_rounds",
    "plan_counts",
    "CountPlan",
]
