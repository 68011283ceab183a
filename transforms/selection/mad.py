"""MAD weights (MAD paper Alg. 3) as a per-element Beam building block: (user, [item]) -> (item, w).

SelectPartitions and DPNE's MAD levels run MAD and MAD2R on the columnar path
(:mod:`transforms.selection.columnar`); this transform is a building block for custom pipelines whose
data are already per-user sets (exported as ``transforms.MADWeights``; same bits as the columnar path).

The per-user and per-item arithmetic is in :mod:`transforms.selection.mad_kernels` (shared with the
in-memory reference); this module only moves data between those kernels.

MAD as stages (Alg. 3 line numbers):
  user_sets                (user, [item]) or (user, [(item, b)])   capped; b = bias (MAD2R round 2)
  InitWeights     l.3-5    (item, w_init part)          adaptive users send 1/d
  SumInit                  (item, w_init)               exact sums
  Truncated       l.8      (item, min(w_init, tau))
  Excess          l.6      (item, r) for r > 0 only     r = (w_init - tau) / w_init
  AttachExcess    l.10     (user, (S_u, [(item, r)]))   r(i) of the user's items with r > 0
  UserContrib     l.11-17  (item, alpha*e_u/d_max + w_b(i) - 1/d)   or w_b(i) for non-adaptive users
  SumWeights      l.12     (item, w) = w_trunc + sum of user contributions

Batch (global window) pipelines pre-sum InitWeights and UserContrib per bundle in exact fixed point
(BENCHMARKS_HEAD.md, "MAD path optimisation"): fewer Beam elements, identical bits.

Reroute join choice (:class:`transforms.core.joins.JoinValuesToSets`): items with r > 0 are exactly the
heavy items (w_init > tau > 1), at most n_adaptive / tau of them and in practice few, so by default
they reach the users as a side-input dict (no shuffle of pairs; the capped sets go straight from
BoundContributions to UserContrib). Only when more than ``max_broadcast_items`` items have r > 0
(possible at billions of users) the run switches, at run time, to the join of (user, item) pairs
keyed by (item, shard(user)) of :class:`transforms.core.joins.AttachItemValues`, where items held by more
than ``max_users_per_key`` users get several shards (a plain item-keyed join would put e.g. all
holders of "the" on one worker). Both modes give the same bits. MAD2R's round-2 biases use the same
transform.
"""

from __future__ import annotations

import apache_beam as beam

from transforms.core.combiners import ExactSumFn, FixedPointCache, FixedPointSumFn, to_fixed_point
from transforms.core.dofns import BundleDictFn, is_batch
from transforms.core.fixed64 import exact_sum64
from transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS, JoinValuesToSets, set_items
from transforms.core.randomness import sort_key
from transforms.selection import mad_kernels as K


class BundleInitWeightsFn(BundleDictFn):
    """(user, S_u) -> (item, fixed-point sum of 1/d over the bundle's adaptive holders)  (Alg. 3 l.3-5).

    Summed in exact fixed point inside the bundle (one dict update per pair instead of one Beam
    element per pair): integer sums are exact, so the per-item w_init is bit-identical however
    users fall into bundles. Global window only; emits early once ``max_keys`` items are buffered.
    S_u is [item], or [(item, b)] when ``biased``.
    """

    def __init__(self, d_max: int, b_min: float, biased: bool, max_keys: int = 100_000):
        super().__init__(max_keys)
        self._d_max, self._b_min, self._biased = d_max, b_min, biased
        self._fixed_of_degree: dict = {}  # d -> fixed-point 1/d (adaptive) or 0

    def process(self, element):
        user_set = element[1]
        d = len(user_set)
        f = self._fixed_of_degree.get(d)
        if f is None:
            w = K.initial_weight(d) if K.is_adaptive(d, self._b_min, self._d_max) else 0.0  # Alg. 3 l.3-5
            f = self._fixed_of_degree[d] = to_fixed_point(w)
        if f != 0:  # a non-adaptive user adds nothing to w_init
            acc = self._acc
            for item in set_items(user_set, self._biased):
                acc[item] = acc.get(item, 0) + f
            yield from self._flush_if_full()


class EmitInitWeightsFn(beam.DoFn):
    """(user, S_u) -> (item, 1/d) for adaptive users  (Alg. 3 lines 3-5); any windowing."""

    def __init__(self, d_max: int, b_min: float, biased: bool):
        self._d_max, self._b_min, self._biased = d_max, b_min, biased

    def process(self, element):
        user_set = element[1]
        d = len(user_set)
        if K.is_adaptive(d, self._b_min, self._d_max):  # Alg. 3 line 3
            w = K.initial_weight(d)  # Alg. 3 line 5
            for item in set_items(user_set, self._biased):
                yield item, w


def truncated_weight(element, tau):
    """(item, w_init) -> (item, min(w_init, tau))  (Alg. 3 line 8)."""
    item, w_init = element
    return item, float(K.truncate(w_init, tau))


def positive_excess(element, tau):
    """(item, w_init) -> (item, r) if r > 0  (Alg. 3 line 6, with the erratum's max)."""
    item, w_init = element
    r = float(K.excess_fraction(w_init, tau))
    if r > 0.0:
        yield item, r


class AdaptiveSet:
    """Predicate on a user's set ([item] or [(item, b)]): is the user adaptive (only adaptive users reroute)?"""

    def __init__(self, d_max, b_min):
        self._d_max, self._b_min = d_max, b_min

    def __call__(self, user_set):
        return K.is_adaptive(len(user_set), self._b_min, self._d_max)


class UserContributionFn(beam.DoFn):
    """(user, (S_u, [(item, r)])) -> (item, contribution)  (Alg. 3 lines 10-17); any windowing.

    S_u is [item] (unbiased MAD) or [(item, b)] (``biased``, MAD2R round 2). The second list holds
    r(i) > 0 of the user's hot items (:class:`transforms.core.joins.JoinValuesToSets`); r is 0 for the
    user's other items. ``tau`` arrives as a process argument (a constant or a side input); the
    parameters are validated once per tau value, not per user.
    """

    def __init__(self, d_max, b_min, b_max, biased: bool):
        self._d_max, self._b_min, self._b_max, self._biased = d_max, b_min, b_max, biased
        self._checked_tau = None

    def _check(self, tau):
        if tau != self._checked_tau:
            K.check_mad_params(tau, self._d_max, self._b_min, self._b_max)
            self._checked_tau = tau

    def user_contributions(self, element, tau):
        """(degree, contribution) for an unbiased user (one value for all its items), else [(item, c)]."""
        _, (user_set, excess) = element
        if not user_set:
            return 0, 0.0
        if not self._biased:
            # Scalar kernel, bit-identical to mad_user_contributions(biases=None) (tests/test_mad_kernels.py).
            excess_sum = exact_sum64(r for _, r in excess)  # Alg. 3 line 10 (r = 0 for the other items)
            return len(user_set), K.unbiased_user_contribution(len(user_set), excess_sum, self._d_max, self._b_min)
        items = sorted(user_set, key=lambda e: sort_key(e[0]))  # canonical order, as the reference
        r_of = dict(excess)
        return K.mad_user_contributions(
            [i for i, _ in items],
            [r_of.get(i, 0.0) for i, _ in items],
            [b for _, b in items],
            tau,
            self._d_max,
            self._b_min,
            self._b_max,
            require_proof_conditions=False,
        )

    def process(self, element, tau):
        self._check(tau)
        got = self.user_contributions(element, tau)
        if self._biased:
            yield from got
        else:
            _, c = got
            for item in element[1][0]:
                yield item, c


class BundleUserContributionFn(BundleDictFn, UserContributionFn):
    """As :class:`UserContributionFn`, but (item, exact fixed-point sum of contributions) per bundle.

    Same per-user kernels; the contributions are summed as exact integers inside the bundle (global
    window only), so the per-item sum is bit-identical to summing every contribution with
    :class:`transforms.core.combiners.ExactSumFn`. Emits early once ``max_keys`` items are buffered.
    """

    def __init__(self, d_max, b_min, b_max, biased: bool, max_keys: int = 100_000):
        BundleDictFn.__init__(self, max_keys)
        UserContributionFn.__init__(self, d_max, b_min, b_max, biased)
        self._fixed = FixedPointCache()

    def process(self, element, tau):
        self._check(tau)
        acc = self._acc
        got = self.user_contributions(element, tau)
        if self._biased:
            for item, c in got:
                acc[item] = acc.get(item, 0) + self._fixed(c)
        elif got[0]:
            f = self._fixed(got[1])
            for item in element[1][0]:
                acc[item] = acc.get(item, 0) + f
        yield from self._flush_if_full()


def fixed_point_value(element):
    """(item, float) -> (item, exact fixed-point int)."""
    item, x = element
    return item, to_fixed_point(x)


class MADWeights(beam.PTransform):
    """(user, [item]) (or (user, [(item, bias)]) with ``biased=True``) -> (item, MAD weight w(i)).

    Args:
      tau: adaptive threshold rho + beta * sigma (>= 1 for the privacy proof): a float, or a
        singleton side input (``beam.pvalue.AsSingleton``) when it is known only at run time
        (DPNE, where rho_k depends on the released S_{k-1}).
      d_max: maximum adaptive degree (>= 4).
      b_min, b_max: bias bounds (1, 1 for unbiased MAD; MAD2R round 2 uses the params').
      max_users_per_key: shard size of the hot-item join.
      max_broadcast_items: the excess fractions r(i) > 0 go to the users as a side-input dict when
        there are at most this many items with r > 0 (usual: they are the heavy items), else by the
        sharded join (:class:`transforms.core.joins.JoinValuesToSets`; same output either way).
    """

    def __init__(
        self,
        tau: float,
        d_max: int,
        b_min: float = 1.0,
        b_max: float = 1.0,
        biased: bool = False,
        max_users_per_key: int = 10_000,
        max_broadcast_items: int = DEFAULT_MAX_BROADCAST_ITEMS,
        label=None,
    ):
        super().__init__(label)
        self._tau = tau if isinstance(tau, beam.pvalue.AsSideInput) else float(tau)
        self._d_max, self._b_min, self._b_max = int(d_max), float(b_min), float(b_max)
        self._biased = biased
        self._max_users_per_key = max_users_per_key
        self._max_broadcast_items = max_broadcast_items

    def expand(self, user_sets):
        tau, biased = self._tau, self._biased
        d_max, b_min, b_max = self._d_max, self._b_min, self._b_max
        # In the global window (batch) the per-item sums are pre-summed per bundle in exact fixed point
        # (same bits, far fewer Beam elements); other windowings emit one element per pair.
        batch = is_batch(user_sets)
        if batch:
            w_init = (
                user_sets
                | "InitWeights" >> beam.ParDo(BundleInitWeightsFn(d_max, b_min, biased))  # (item, fixed part)
                | "SumInit" >> beam.CombinePerKey(FixedPointSumFn())  # (item, w_init > 0)
            )
        else:
            w_init = (
                user_sets
                | "InitWeights" >> beam.ParDo(EmitInitWeightsFn(d_max, b_min, biased))  # (item, 1/d)
                | "SumInit" >> beam.CombinePerKey(ExactSumFn())  # (item, w_init > 0)
            )
        # Items held only by non-adaptive users have w_init = 0: no truncated part and r = 0 (lines 6, 8).
        truncated = w_init | "Truncated" >> beam.Map(truncated_weight, tau)  # (item, w_trunc)
        excess = w_init | "Excess" >> beam.FlatMap(positive_excess, tau)  # (item, r > 0)
        joined = user_sets | "AttachExcess" >> JoinValuesToSets(
            excess,
            pair_items=biased,
            wants_values=AdaptiveSet(d_max, b_min),
            max_users_per_key=self._max_users_per_key,
            max_broadcast_items=self._max_broadcast_items,
        )
        # (user, (S_u, [(item, r)]))  (Alg. 3 line 10)
        if batch:
            contributions = joined | "UserContrib" >> beam.ParDo(
                BundleUserContributionFn(d_max, b_min, b_max, biased), tau
            )  # (item, fixed sum of c)
            truncated = truncated | "TruncatedFixed" >> beam.Map(fixed_point_value)  # (item, fixed w_trunc)
            sum_fn = FixedPointSumFn()
        else:
            contributions = joined | "UserContrib" >> beam.ParDo(
                UserContributionFn(d_max, b_min, b_max, biased), tau
            )  # (item, c)
            sum_fn = ExactSumFn()
        return (
            (truncated, contributions)
            | "AllParts" >> beam.Flatten()  # (item, part)
            | "SumWeights" >> beam.CombinePerKey(sum_fn)  # (item, w) = w_trunc + sum of contributions
        )
