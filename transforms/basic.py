"""Basic (non-adaptive) weightings as a Beam stage: each user adds the same weight to its items."""
from __future__ import annotations

import apache_beam as beam

from transforms.combiners import ExactSumFn
from transforms.weights import WEIGHTINGS, user_item_weights
from privacy.params import check_choice


class EmitUserWeightsFn(beam.DoFn):
    """(user, [item]) -> (item, w) for each of the user's items; w = weighting(d)."""

    def __init__(self, weighting: str):
        self._weighting = check_choice("weighting", weighting, WEIGHTINGS)

    def process(self, element):
        _, items = element
        yield from user_item_weights(self._weighting, items)


class UserSetWeights(beam.PTransform):
    """(user, [item]) -> (item, total weight), the weighted histogram of the DPSU paper.

    weighting: 'weighted_gaussian' (1/sqrt(d), Basic), 'weighted_laplace' (1/d) or 'count' (1).
    The per-item sum is exact (correctly rounded, order independent; see transforms.combiners).
    """

    def __init__(self, weighting: str = "weighted_gaussian", label=None):
        super().__init__(label)
        self._weighting = check_choice("weighting", weighting, WEIGHTINGS)

    def expand(self, user_sets):
        return (
            user_sets
            | "UserWeights" >> beam.ParDo(EmitUserWeightsFn(self._weighting))  # (item, w_u(item))
            | "SumPerItem" >> beam.CombinePerKey(ExactSumFn())  # (item, w)
        )
