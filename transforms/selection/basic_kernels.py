"""Per-user weightings of the weight-and-threshold template (pure functions, no Beam).

Each maps a user's degree d = |S_u| (after capping to Delta_0) to the weight the user adds to each of
its d items:

  weighted_gaussian  1/sqrt(d)  l2 norm 1 per user         (MAD paper Basic; DPSU Alg. 8)
  weighted_laplace   1/d        l1 norm 1 per user         (DPSU Alg. 7)
  count              1          l2 norm sqrt(d) <= sqrt(Delta_0), l1 norm d <= Delta_0
                                (the noise scale carries the sensitivity; DPSU section 1.1)
"""

from __future__ import annotations

import math
from typing import Any, Iterable, List, Tuple

import numpy as np
import pyarrow as pa

from dp_partition_beam.privacy.validation import check_choice
from dp_partition_beam.transforms.core.batches import ITEM
from dp_partition_beam.transforms.core.tables import limb_table, sum_by_item

WEIGHTINGS = ("weighted_gaussian", "weighted_laplace", "count")


def per_item_weight(weighting: str, degree: int) -> float:
    """The weight a user of degree ``degree`` adds to each of its items."""
    if degree <= 0:
        return 0.0
    if weighting == "weighted_gaussian":
        return 1.0 / math.sqrt(degree)
    if weighting == "weighted_laplace":
        return 1.0 / degree
    if weighting == "count":
        return 1.0
    check_choice("weighting", weighting, WEIGHTINGS)
    raise AssertionError("unreachable")


def user_item_weights(weighting: str, items: Iterable[Any]) -> List[Tuple[Any, float]]:
    """``[(item, weight)]`` for one user's (capped, distinct) item list."""
    items = list(items)
    w = per_item_weight(weighting, len(items))
    return [(item, w) for item in items]


# --------------------------------------------------------------------------------------------------
# Vectorised over the rows of a capped table (the Beam path, :mod:`transforms.selection.basic`)
# --------------------------------------------------------------------------------------------------


def per_item_weights(weighting: str, degree: np.ndarray) -> np.ndarray:
    """Basic weightings per row (bit-identical to :func:`transforms.selection.basic_kernels.per_item_weight`)."""
    check_choice("weighting", weighting, WEIGHTINGS)
    d = np.asarray(degree, dtype=np.float64)
    if weighting == "weighted_gaussian":
        return 1.0 / np.sqrt(d)
    if weighting == "weighted_laplace":
        return 1.0 / d
    return np.ones_like(d)


def basic_partials(capped: pa.Table, weighting: str) -> pa.Table:
    """Table(item, hi, mid, lo, holders): per item, the exact fixed-point sum of its holders' weights
    ``w(d)`` (:func:`per_item_weights`) and the number of holders, over the rows of ``capped``."""
    w = per_item_weights(weighting, capped.column("degree").to_numpy())
    return sum_by_item(limb_table(capped.column(ITEM), w))
