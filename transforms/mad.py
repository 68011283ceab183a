"""MAD (MaxAdaptiveDegree) and MAD2R as Beam composite transforms (MAD paper Alg. 3 and 4).

The per-user and per-item arithmetic is in :mod:`transforms.mad_kernels` (shared with the
in-memory reference); this module only moves data between those kernels.

MAD as stages (Alg. 3 line numbers):
  user_sets                (user, [(item, b)])          capped, b = bias (1.0 = unbiased)
  InitWeights     l.3-5    (item, (w_init part, 1))     adaptive users send 1/d, everyone counts 1
  ItemStats                (item, (w_init, n_users))    exact sums
  Truncated       l.8      (item, min(w_init, tau))
  Excess          l.6      (item, r) for r > 0 only     r = (w_init - tau) / w_init
  ExcessToUsers   l.10     (user, (item, r(i)))         hot-item-safe join (transforms.joins)
  JoinUserExcess  l.10     (user, {set, excess})        e_u = mean of r over the user's items
  UserContrib     l.11-17  (item, alpha*e_u/d_max + w_b(i) - 1/d)   or w_b(i) for non-adaptive users
  SumWeights      l.12     (item, w) = w_trunc + sum of user contributions

Batch (global window) pipelines pre-sum InitWeights and UserContrib per bundle in exact fixed point
and batch the join's elements per bundle (BENCHMARKS_HEAD.md, "MAD path optimisation"): fewer Beam
elements, identical bits.

Reroute join choice: the excess fractions r(i) are joined back to (user, item) pairs with
:class:`transforms.joins.AttachItemValues`, keyed by (item, shard(user)), where only items held by
more than ``max_users_per_key`` users get several shards. Items with r > 0 are exactly the heavy
items (w_init > tau), i.e. the hot keys, so a plain item-keyed join would put e.g. all holders of
"the" on one worker. We shard rather than side-input r because the number of items with r > 0 is
bounded only by n_adaptive / tau, which at billions of users is too large to broadcast; the side
input here is just the names of items held by > max_users_per_key users (<= pairs / 10,000).
"""
from __future__ import annotations

from typing import Optional

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from transforms import mad_kernels as K
from transforms.mad2r_kernels import round2_bias
from transforms.randomness import sort_key
from transforms.combiners import BundleDictFn, ExactSumFn, FixedPointSumFn, from_fixed_point, to_fixed_point
from transforms.joins import AttachItemValues
from transforms.threshold import AddNoise


def _with_unit_biases(element):
    user, items = element
    return user, [(item, 1.0) for item in items]


class InitStatsFn(beam.CombineFn):
    """Sums (w_init part, holder count) per item; w_init exactly (order independent)."""

    def __init__(self):
        self._sum = ExactSumFn()

    def create_accumulator(self):
        return self._sum.create_accumulator(), 0

    def add_input(self, acc, x):
        partial, n = acc
        return self._sum.add_input(partial, x[0]), n + x[1]

    def merge_accumulators(self, accs):
        accs = list(accs)
        return self._sum.merge_accumulators([a[0] for a in accs]), sum(a[1] for a in accs)

    def extract_output(self, acc):
        return self._sum.extract_output(acc[0]), acc[1]


class FixedInitStatsFn(beam.CombineFn):
    """Sums (fixed-point w_init part, holder count) per item; outputs (w_init, n) as InitStatsFn."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, x):
        return acc[0] + x[0], acc[1] + x[1]

    def merge_accumulators(self, accs):
        total, n = 0, 0
        for a, m in accs:
            total += a
            n += m
        return total, n

    def extract_output(self, acc):
        return from_fixed_point(acc[0]), acc[1]


class BundleInitStatsFn(BundleDictFn):
    """(user, [(item, b)]) -> (item, (fixed-point sum of 1/d, n_holders)) pre-summed per bundle.

    Alg. 3 lines 3-5 as :class:`EmitInitWeightsFn`, but summed in exact fixed point inside the
    bundle (one dict update per pair instead of one Beam element per pair): integer sums are exact,
    so the per-item result is bit-identical however users fall into bundles. Global window only;
    emits early once ``max_keys`` items are buffered (bounded memory).
    """

    def __init__(self, d_max: int, b_min: float, max_keys: int = 100_000):
        super().__init__(max_keys)
        self._d_max, self._b_min = d_max, b_min
        self._fixed: dict = {}

    def process(self, element):
        _, items = element
        d = len(items)
        f = self._fixed.get(d)
        if f is None:
            w = 1.0 / d if K.is_adaptive(d, self._b_min, self._d_max) else 0.0  # Alg. 3 lines 3-5
            f = self._fixed[d] = to_fixed_point(w)
        acc = self._acc
        for item, _ in items:
            s = acc.get(item)
            acc[item] = (f, 1) if s is None else (s[0] + f, s[1] + 1)
        yield from self._flush_if_full()


class EmitInitWeightsFn(beam.DoFn):
    """(user, [(item, b)]) -> (item, (1/d if adaptive else 0.0, 1))  (Alg. 3 lines 3-5)."""

    def __init__(self, d_max: int, b_min: float):
        self._d_max, self._b_min = d_max, b_min

    def process(self, element):
        _, items = element
        d = len(items)
        w = 1.0 / d if K.is_adaptive(d, self._b_min, self._d_max) else 0.0
        for item, _ in items:
            yield item, (w, 1)


def truncated_weight(element, tau):
    """(item, (w_init, n)) -> (item, min(w_init, tau))  (Alg. 3 line 8)."""
    item, (w_init, _) = element
    return item, float(K.truncate(w_init, tau))


def positive_excess(element, tau):
    """(item, (w_init, n)) -> (item, r) if r > 0  (Alg. 3 line 6, with the erratum's max)."""
    item, (w_init, _) = element
    r = float(K.excess_fraction(w_init, tau))
    if r > 0.0:
        yield item, r


def holder_count(element):
    item, (_, n) = element
    return item, n


def adaptive_pairs(element, d_max, b_min):
    """(user, [(item, b)]) -> (user, item) for adaptive users only (only they reroute)."""
    user, items = element
    if K.is_adaptive(len(items), b_min, d_max):
        for item, _ in items:
            yield user, item




class UserContributionFn(beam.DoFn):
    """(user, {'set': [[(item, b)]], 'excess': [[(item, r)]]}) -> (item, contribution)  (Alg. 3 l.10-17).

    ``tau`` arrives as a process argument (a constant or a side input).
    """

    def __init__(self, d_max, b_min, b_max):
        self._d_max, self._b_min, self._b_max = d_max, b_min, b_max

    def process(self, element, tau):
        _, grouped = element
        sets = list(grouped["set"])
        if not sets:
            return
        if len(sets) != 1:
            raise ValueError("UserContributionFn: a user must have exactly one capped set")
        items = sorted(sets[0], key=lambda e: sort_key(e[0]))  # canonical order, as the reference
        # r(i) > 0 of the user's hot items (lists from AttachItemValues(per_user_lists)); 0 for the others
        r_of = {item: r for part in grouped["excess"] for item, r in part}
        yield from K.mad_user_contributions(
            [i for i, _ in items], [r_of.get(i, 0.0) for i, _ in items], [b for _, b in items],
            tau, self._d_max, self._b_min, self._b_max,
        )


class BundleUserContributionFn(BundleDictFn, UserContributionFn):
    """As :class:`UserContributionFn`, but (item, exact fixed-point sum of contributions) per bundle.

    Same per-user kernel; the contributions are summed as exact integers inside the bundle (global
    window only), so the per-item sum is bit-identical to summing every contribution with
    :class:`transforms.combiners.ExactSumFn`. Emits early once ``max_keys`` items are buffered.
    """

    def __init__(self, d_max, b_min, b_max, max_keys: int = 100_000):
        BundleDictFn.__init__(self, max_keys)
        UserContributionFn.__init__(self, d_max, b_min, b_max)
        self._cache: dict = {}

    def process(self, element, tau):
        acc, cache = self._acc, self._cache
        for item, c in UserContributionFn.process(self, element, tau):
            f = cache.get(c)
            if f is None:
                if len(cache) >= 65_536:
                    cache.clear()
                f = cache[c] = to_fixed_point(c)
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
    """

    def __init__(self, tau: float, d_max: int, b_min: float = 1.0, b_max: float = 1.0,
                 biased: bool = False, max_users_per_key: int = 10_000, label=None):
        super().__init__(label)
        self._tau = tau if isinstance(tau, beam.pvalue.AsSideInput) else float(tau)
        self._d_max, self._b_min, self._b_max = int(d_max), float(b_min), float(b_max)
        self._biased = biased
        self._max_users_per_key = max_users_per_key

    def expand(self, user_sets):
        tau = self._tau
        if not self._biased:
            user_sets = user_sets | "UnitBiases" >> beam.Map(_with_unit_biases)  # (user, [(item, 1.0)])
        # In the global window (batch) the per-item sums are pre-summed per bundle in exact fixed point
        # (same bits, far fewer Beam elements); other windowings emit one element per pair.
        batch = isinstance(user_sets.windowing.windowfn, GlobalWindows)
        if batch:
            stats = (
                user_sets
                | "InitWeights" >> beam.ParDo(BundleInitStatsFn(self._d_max, self._b_min))  # (item, (fixed, n))
                | "ItemStats" >> beam.CombinePerKey(FixedInitStatsFn())  # (item, (w_init, n_holders))
            )
        else:
            stats = (
                user_sets
                | "InitWeights" >> beam.ParDo(EmitInitWeightsFn(self._d_max, self._b_min))  # (item, (1/d|0, 1))
                | "ItemStats" >> beam.CombinePerKey(InitStatsFn())  # (item, (w_init, n_holders))
            )
        truncated = stats | "Truncated" >> beam.Map(truncated_weight, tau)  # (item, w_trunc)
        excess = stats | "Excess" >> beam.FlatMap(positive_excess, tau)  # (item, r > 0)
        counts = stats | "HolderCounts" >> beam.Map(holder_count)  # (item, n_holders)
        user_excess = (
            user_sets
            | "AdaptivePairs" >> beam.FlatMap(adaptive_pairs, self._d_max, self._b_min)  # (user, item)
            | "ExcessToUsers" >> AttachItemValues(excess, counts, self._max_users_per_key, per_user_lists=True)
            # (user, [(item, r)])
        )
        joined = {"set": user_sets, "excess": user_excess} | "JoinUserExcess" >> beam.CoGroupByKey()
        # (user, {set: [[(item, b)]], excess: [[(item, r)]]})
        if batch:
            contributions = joined | "UserContrib" >> beam.ParDo(
                BundleUserContributionFn(self._d_max, self._b_min, self._b_max), tau)  # (item, fixed sum of c)
            truncated = truncated | "TruncatedFixed" >> beam.Map(fixed_point_value)  # (item, fixed w_trunc)
            sum_fn = FixedPointSumFn()
        else:
            contributions = joined | "UserContrib" >> beam.ParDo(
                UserContributionFn(self._d_max, self._b_min, self._b_max), tau)  # (item, c)
            sum_fn = ExactSumFn()
        return (
            (truncated, contributions)
            | "AllParts" >> beam.Flatten()  # (item, part)
            | "SumWeights" >> beam.CombinePerKey(sum_fn)  # (item, w) = w_trunc + sum of contributions
        )


class BundleHolderCountsFn(BundleDictFn):
    """(user, [item]) -> (item, number of the bundle's users holding it), counted per bundle.

    Global window only; emits early once ``max_keys`` items are buffered (bounded memory).
    """

    def process(self, element):
        acc = self._acc
        for item in element[1]:
            acc[item] = acc.get(item, 0) + 1
        yield from self._flush_if_full()


def round1_status(element, rho1, rho2, sigma1, c_lb, c_ub):
    """(item, noisy w1) -> (item, b) for items kept in round 2 (Alg. 4 lines 10-14)."""
    item, w1 = element
    if w1 >= rho1:  # released in round 1 (line 7): removed (line 13)
        return
    status = round2_bias(w1, rho2, sigma1, c_lb, c_ub)
    if status is not None:
        yield item, status


def released_item(element, rho):
    item, w = element
    if w >= rho:
        yield item


def to_pair_list(element):
    user, items = element
    return [(user, item) for item in items]


def tag_round(item, round_):
    return round_, item


class MAD2R(beam.PTransform):
    """MAD in two rounds (MAD paper Alg. 4): (user, item) pairs -> (round, item).

    Round 1 runs unbiased MAD; its noisy weights are checkpointed (one draw per item) and joined onto
    items inside the pipeline - they are never written out. Round 2 drops items released in round 1
    and items whose upper bound w1 + C_ub*sigma_1 < rho_2, and runs MAD with biases
    b(i) = min(1, rho_2 / max(0, w1 - C_lb*sigma_1)) and h(t) = b_max/sqrt(t). Users are subsampled
    once (Alg. 4 line 1).
    """

    def __init__(self, rounds, params, seed: Optional[int], label=None):
        super().__init__(label)
        self._r1, self._r2 = rounds
        self._params, self._seed = params, seed

    def expand(self, pairs):
        # Imported here to avoid a cycle (bounding does not depend on MAD).
        from transforms.bounding import BoundContributions

        p, r1, r2 = self._params, self._r1, self._r2
        user_sets = pairs | "BoundContributions" >> BoundContributions(p.max_contributions, self._seed, round_=0)
        # (user, [item]) |.| <= D0 (Alg. 4 line 1)
        noisy1 = (
            user_sets
            | "R1MADWeights" >> MADWeights(r1.tau, p.d_max)  # (item, w1)
            | "R1AddNoise" >> AddNoise(r1.noise, r1.noise_scale, self._seed, r1.index, checkpoint=True)  # (item, ~w1)
        )
        released1 = noisy1 | "R1Threshold" >> beam.FlatMap(released_item, r1.threshold)  # item in U1
        kept = noisy1 | "R2Status" >> beam.FlatMap(
            round1_status, r1.threshold, r2.threshold, r1.noise_scale, p.c_lb, p.c_ub
        )  # (item, b) for items neither released nor hopeless
        pair_list = user_sets | "Pairs" >> beam.FlatMap(to_pair_list)  # (user, item)
        if isinstance(user_sets.windowing.windowfn, GlobalWindows):
            counts = (
                user_sets
                | "BundleHolderCounts" >> beam.ParDo(BundleHolderCountsFn())  # (item, partial count)
                | "HolderCounts" >> beam.CombinePerKey(sum)  # (item, n_holders)
            )
        else:
            counts = pair_list | "PairItems" >> beam.Values() | "HolderCounts" >> beam.combiners.Count.PerElement()
            # (item, n_holders)
        round2_sets = (
            pair_list
            | "AttachBiases" >> AttachItemValues(kept, counts, per_user_lists=True)  # (user, [(item, b)])
            | "GroupByUser" >> beam.GroupByKey()  # (user, [[(item, b)]]): union = S_u \ (U1 u U_low)  (line 13)
            | "Materialise" >> beam.MapTuple(_materialise)
        )
        released2 = (
            round2_sets
            | "R2MADWeights" >> MADWeights(r2.tau, p.d_max, p.b_min, p.b_max, biased=True)  # (item, w2)
            | "R2AddNoise" >> AddNoise(r2.noise, r2.noise_scale, self._seed, r2.index)  # (item, ~w2)
            | "R2Threshold" >> beam.FlatMap(released_item, r2.threshold)  # item in U2
        )
        return (
            released1 | "TagR1" >> beam.Map(tag_round, 1),
            released2 | "TagR2" >> beam.Map(tag_round, 2),
        ) | "Union" >> beam.Flatten()  # (round, item)


def _materialise(user, parts):
    """(user, [[(item, b)]]) -> (user, [(item, b)]) in canonical item order (as the reference)."""
    return user, sorted((e for part in parts for e in part), key=lambda e: sort_key(e[0]))
