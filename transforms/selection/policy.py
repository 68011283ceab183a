"""``SequentialPolicy``: POLICY LAPLACE / POLICY GAUSSIAN (DPSU paper Algorithms 1-6) on Beam.

Each user's update depends on every earlier user's, so the histogram cannot be built in parallel:
the bounded user sets are gathered on ONE worker (the accepted sequential fallback of docs/design.md),
ordered by a keyed hash of the user ids whose key is secret per run, and fed to the l1/l2-descent
policy (transforms/policy_kernels.py). Noise and threshold then run in parallel again.

Before anything is gathered, the number of (user, item) pairs after contribution bounding is counted
and compared with ``max_sequential_pairs``; above it the job fails with
:class:`SequentialSizeError` (naming the limit and the flag, suggesting mad2r) instead of running
the single worker out of memory.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam

from dp_partition_beam.privacy.selection import RoundPlan, SelectionParams, algorithm_spec
from dp_partition_beam.transforms.core.bounding import BoundContributions
from dp_partition_beam.transforms.core.noise import KeepByTable, NoisyThreshold
from dp_partition_beam.transforms.selection import policy_kernels
from dp_partition_beam.transforms.selection.policy_kernels import (  # noqa: F401  (re-exported: the Beam side's names)
    BYTES_PER_PAIR,
    SequentialSizeError,
    size_error_message,
)


def count_items(element) -> int:
    return len(element[1])


class GuardAndKeyToOneFn(beam.DoFn):
    """(user, [item]) -> (0, (user, [item])) once the total pair count is known to be within the limit.

    The total arrives as a side input, so no element reaches the single-key GroupByKey (the gather)
    before the check; past the limit the first element raises :class:`SequentialSizeError`.
    """

    def __init__(self, algorithm: str, limit: int):
        self._algorithm = algorithm
        self._limit = int(limit)

    def process(self, element, total_pairs):
        policy_kernels.check_sequential_size(self._algorithm, total_pairs, self._limit)
        yield 0, element


class BuildPolicyHistogramFn(beam.DoFn):
    """(0, iterable[(user, [item])]) -> (item, weight): Algorithm 2 with l1/l2-descent.

    Draws the secret order key here, on the worker, from OS entropy (or derives it from the seed in
    reproducible mode): it never travels in the pipeline graph. Holds the bounded user sets (without
    the user ids, once hashed) and the histogram: nothing else.
    """

    def __init__(self, policy: str, gamma: float, passes: int, seed: Optional[int]):
        self._policy = policy
        self._gamma = float(gamma)
        self._passes = int(passes)
        self._seed = seed

    def process(self, element):
        _, user_sets = element
        hist = policy_kernels.policy_histogram(user_sets, self._policy, self._gamma, self._passes, self._seed)
        yield from hist.items()


class SequentialPolicy(beam.PTransform):
    """(user, item) pairs -> items released by POLICY LAPLACE or POLICY GAUSSIAN.

    Stages:
      BoundContributions  (user, [item])     distinct, uniformly subsampled to Delta_0 (Alg. 2 lines 5-9)
      CountPairs          int                pairs after bounding (memory guard)
      GuardAndKeyToOne    (0, (user, [item])) fails past max_sequential_pairs, before the gather
      GatherOnOneWorker   (0, [(user, [item])])
      PolicyHistogram     (item, weight)     secret keyed-hash order, l1/l2-descent (Alg. 2-3, 5)
      NoisyThreshold      item               Lap(1/eps) / N(0, sigma^2), keep >= rho (Alg. 1)

    Args:
      algorithm: 'policy_laplace' or 'policy_gaussian'.
      plan: the single :class:`privacy.selection.RoundPlan` (noise, scale, rho, cutoff Gamma).
      params: :class:`SelectionParams` (max_contributions, passes, max_sequential_pairs).
      seed: None (OS entropy) or the reproducible-mode seed.
      with_user_sets: output ``(released items, capped (user, [item]) sets)`` (the count release's input).
    """

    def __init__(
        self,
        algorithm: str,
        plan: RoundPlan,
        params: SelectionParams,
        seed: Optional[int] = None,
        with_user_sets: bool = False,
        label=None,
    ):
        super().__init__(label)
        self._with_user_sets = with_user_sets
        self._policy = algorithm_spec(algorithm).weighting  # l1_descent | l2_descent
        self._algorithm, self._plan, self._params, self._seed = algorithm, plan, params, seed

    def expand(self, pairs):
        rnd, prm = self._plan, self._params
        user_sets = pairs | "BoundContributions" >> BoundContributions(
            prm.max_contributions, self._seed, round_=0
        )  # (user, [item]) |.| <= D0
        total = (
            user_sets
            | "PairsPerUser" >> beam.Map(count_items)  # int
            | "CountPairs" >> beam.CombineGlobally(sum)  # int (one element, 0 if empty)
        )
        weights = (
            user_sets
            | "GuardAndKeyToOne"
            >> beam.ParDo(
                GuardAndKeyToOneFn(self._algorithm, prm.max_sequential_pairs), beam.pvalue.AsSingleton(total)
            )  # (0, (user, [item]))
            | "GatherOnOneWorker" >> beam.GroupByKey()  # (0, [(user, [item])])
            | "PolicyHistogram"
            >> beam.ParDo(BuildPolicyHistogramFn(self._policy, rnd.cutoff, prm.passes, self._seed))  # (item, weight)
        )
        if rnd.keep_table is not None:  # threshold 'optimal': the l1 curve (docs/thresholding.md)
            released = weights | "KeepByCurve" >> KeepByTable(rnd.keep_table, self._seed, rnd.index)  # item
        else:
            released = weights | "NoisyThreshold" >> NoisyThreshold(
                rnd.noise, rnd.noise_scale, rnd.threshold, self._seed, rnd.index
            )  # item
        return (released, user_sets) if self._with_user_sets else released
