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

from dp_partition_beam.privacy.validation import check_choice

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
