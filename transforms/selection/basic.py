"""Basic (non-adaptive) weightings as a Beam stage: each user adds the same weight to its items."""

from __future__ import annotations

from typing import Dict

import apache_beam as beam

from privacy.validation import check_choice, check_int
from transforms.core.combiners import ExactSumFn, FixedPointSumFn, to_fixed_point
from transforms.core.dofns import BundleDictFn, is_batch
from transforms.selection.basic_kernels import WEIGHTINGS, per_item_weight, user_item_weights


class EmitUserWeightsFn(beam.DoFn):
    """(user, [item]) -> (item, w) for each of the user's items; w = weighting(d)."""

    def __init__(self, weighting: str):
        self._weighting = check_choice("weighting", weighting, WEIGHTINGS)

    def process(self, element):
        _, items = element
        yield from user_item_weights(self._weighting, items)


class BundleWeightSumsFn(BundleDictFn):
    """(user, [item]) -> (item, exact fixed-point partial sum of the weights) per bundle.

    Pre-aggregates inside the bundle (a dict update per pair instead of a Beam element per pair):
    the partial sums are exact integers (:func:`transforms.core.combiners.to_fixed_point`), so how
    users fall into bundles does not change a bit of the final per-item sum. Emits when the bundle
    ends, or when ``max_keys`` distinct items are buffered (bounded memory). Global window only
    (:class:`UserSetWeights` checks).
    """

    def __init__(self, weighting: str, max_keys: int = 100_000):
        super().__init__(check_int("max_keys", max_keys, 1))
        self._weighting = check_choice("weighting", weighting, WEIGHTINGS)
        self._fixed_of_degree: Dict[int, int] = {}  # d -> fixed-point weight(d)

    def process(self, element):
        _, items = element
        if not isinstance(items, list):
            items = list(items)
        d = len(items)
        f = self._fixed_of_degree.get(d)
        if f is None:
            f = self._fixed_of_degree[d] = to_fixed_point(per_item_weight(self._weighting, d))
        acc = self._acc
        for item in items:
            acc[item] = acc.get(item, 0) + f
        yield from self._flush_if_full()


class UserSetWeights(beam.PTransform):
    """(user, [item]) -> (item, total weight), the weighted histogram of the DPSU paper.

    weighting: 'weighted_gaussian' (1/sqrt(d), Basic), 'weighted_laplace' (1/d) or 'count' (1).
    The per-item sum is exact (correctly rounded, order independent; see transforms.core.combiners).
    In the global window (batch) the weights are pre-summed per bundle (:class:`BundleWeightSumsFn`);
    in other windowings every (item, weight) is emitted and summed by the combiner.
    """

    def __init__(self, weighting: str = "weighted_gaussian", label=None):
        super().__init__(label)
        self._weighting = check_choice("weighting", weighting, WEIGHTINGS)

    def expand(self, user_sets):
        if is_batch(user_sets):
            return (
                user_sets
                | "BundleSums" >> beam.ParDo(BundleWeightSumsFn(self._weighting))  # (item, fixed-point part)
                | "SumPerItem" >> beam.CombinePerKey(FixedPointSumFn())  # (item, w)
            )
        return (
            user_sets
            | "UserWeights" >> beam.ParDo(EmitUserWeightsFn(self._weighting))  # (item, w_u(item))
            | "SumPerItem" >> beam.CombinePerKey(ExactSumFn())  # (item, w)
        )
