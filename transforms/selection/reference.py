"""In-memory reference implementations: the test oracle and the fast path for small data.

Operates on ``dict[user, iterable[item]]`` with the same parameters
(:class:`privacy.params.SelectionParams`), the same calibration plan (:mod:`privacy.selection`) and the
same randomness contract (:mod:`transforms.core.randomness`) as the Beam transforms, so under a seed
``select(...)`` returns exactly what ``SelectPartitions`` releases. Float sums are exact and order
independent like the Beam path's (:mod:`transforms.core.fixed64` for the columnar weights, ``math.fsum``
in the MAD kernels), so the comparison is exact.

Everything here holds the whole dataset in memory; use the Beam transforms beyond a few million pairs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Set, Tuple

import numpy as np

from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.privacy.cap import CapPlan, choose_cap, choose_weight_cap, degree_histogram
from dp_partition_beam.privacy.counts import CountPlan
from dp_partition_beam.privacy.selection import RoundPlan, SelectionParams
from dp_partition_beam.privacy.selection import plan as selection_plan
from dp_partition_beam.privacy.validation import check_choice, check_int
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.fixed64 import exact_sum64
from dp_partition_beam.transforms.selection import counts_kernels, policy_kernels
from dp_partition_beam.transforms.selection import mad_kernels as K
from dp_partition_beam.transforms.selection.basic_kernels import WEIGHTINGS, per_item_weight

UserSets = Mapping[Hashable, Iterable[Hashable]]

# Re-export: the MAD weighting (Alg. 3) lives with its kernels.
mad_weights = K.mad_weights


def _unique(items: Iterable[Hashable]) -> List[Hashable]:
    return list(dict.fromkeys(items))


def bound_contributions(
    user_sets: UserSets,
    max_contributions: int,
    seed: Optional[int] = None,
    round_: int = 0,
    rng: Optional[np.random.Generator] = None,
) -> Dict[Hashable, List[Hashable]]:
    """Distinct items per user, uniformly subsampled to ``max_contributions`` (BoundContributions)."""
    check_int("max_contributions", max_contributions, 1)
    if seed is None and rng is None:
        rng = randomness.worker_rng()
    out = {}
    for user, items in user_sets.items():
        capped = randomness.subsample(_unique(items), max_contributions, user, round_, seed, rng)
        if capped:
            out[user] = capped
    return out


def basic_weights(user_sets: UserSets, weighting: str = "weighted_gaussian") -> Dict[Hashable, float]:
    """Per-item sum of the users' weights (no capping: pass capped sets), exact at 2^-64 like the
    columnar path (:func:`transforms.core.fixed64.exact_sum64`; equal to ``math.fsum`` for these weights).

    weighting: 'weighted_gaussian' (1/sqrt(d)), 'weighted_laplace' (1/d) or 'count' (1).
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    parts: Dict[Hashable, List[float]] = defaultdict(list)
    for items in user_sets.values():
        items = _unique(items)
        w = per_item_weight(weighting, len(items))
        for item in items:
            parts[item].append(w)
    return {item: exact_sum64(ws) for item, ws in parts.items()}


def add_noise(
    weights: Mapping[Hashable, float],
    noise: str,
    scale: float,
    seed: Optional[int] = None,
    round_: int = 1,
    rng: Optional[np.random.Generator] = None,
) -> Dict[Hashable, float]:
    """Noisy weights: item i gets ``scale * Z_i`` with Z_i keyed by (seed, 'noise', round, i)."""
    if seed is None and rng is None:
        rng = randomness.worker_rng()
    items = list(weights)
    z = randomness.standard_noise(noise, items, "noise", round_, seed, rng)
    return {item: float(weights[item]) + float(scale) * float(zi) for item, zi in zip(items, z)}


def noisy_threshold(
    weights: Mapping[Hashable, float],
    plan: RoundPlan,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
) -> Set[Hashable]:
    """Items whose noisy weight is >= rho (NoisyThreshold); with a keep table, items kept with probability
    F(W) (64 random bits per item, keyed as the noise: docs/thresholding.md)."""
    if plan.keep_table is not None:
        if seed is None and rng is None:
            rng = randomness.worker_rng()
        items = list(weights)
        bits = randomness.random_bits(items, "noise", plan.index, seed, rng)

        def low_bits(idx):  # a 128-bit rule's second draws (keyed (seed, 'noise_low', round, item))
            return randomness.random_bits([items[i] for i in idx], randomness.KEEP_LOW_PURPOSE, plan.index, seed, rng)

        kept = plan.keep_table.keep(np.array([float(weights[i]) for i in items], dtype=np.float64), bits, low_bits)
        return {item for item, k in zip(items, kept) if k}
    noisy = add_noise(weights, plan.noise, plan.noise_scale, seed, plan.index, rng)
    return {item for item, w in noisy.items() if passes_threshold(w, plan.threshold)}


def _single_round(user_sets, spec, params, plans, seed, rng, cap=None):
    plan = plans[0]
    capped = bound_contributions(user_sets, params.max_contributions, seed, 0, rng)
    if plan.weighting == "mad":
        weights = K.mad_weights(capped, plan.tau, params.d_max)
    else:
        weights = basic_weights(capped, plan.weighting)
    return {1: noisy_threshold(weights, plan, seed, rng)}, capped


def _policy(user_sets, spec, params, plans, seed, rng, cap=None):
    """POLICY LAPLACE / GAUSSIAN (DPSU Alg. 4 / 6): secret-order l1/l2-descent histogram, noise, threshold.

    ``params.max_sequential_pairs`` is enforced here as in the Beam transform, before the histogram (issue
    59): the realisation reserve of the keep curve and rule assumes it (policy_kernels.check_sequential_size).
    """
    plan = plans[0]
    capped = bound_contributions(user_sets, params.max_contributions, seed, 0, rng)
    pairs = sum(len(items) for items in capped.values())  # after contribution bounding, as Beam counts them
    policy_kernels.check_sequential_size(spec.name, pairs, params.max_sequential_pairs)
    hist = policy_kernels.policy_histogram(capped.items(), spec.weighting, plan.cutoff, params.passes, seed)
    return {1: noisy_threshold(hist, plan, seed, rng)}, capped


def _dp_sips(user_sets, spec, params, plans, seed, rng, cap=None):
    full = {u: _unique(items) for u, items in user_sets.items()}
    released: Set[Hashable] = set()
    per_round = {}
    for plan in plans:
        r = plan.index
        remaining = {u: [i for i in items if i not in released] for u, items in full.items()}
        remaining = {u: items for u, items in remaining.items() if items}
        capped = bound_contributions(remaining, params.max_contributions, seed, r, rng)
        out = noisy_threshold(basic_weights(capped, "weighted_gaussian"), plan, seed, rng)
        per_round[r] = out
        released |= out
    # The rounds re-subsample per round; the counts use one subsample of the full sets (round 0).
    return per_round, bound_contributions(full, params.max_contributions, seed, 0, rng)


def _mad2r(user_sets, spec, params, plans, seed, rng, cap=None):
    r1, r2 = plans
    capped = bound_contributions(user_sets, params.max_contributions, seed, 0, rng)  # Alg. 4 line 1
    w1 = K.mad_weights(capped, r1.tau, params.d_max)  # line 5
    noisy1 = add_noise(w1, r1.noise, r1.noise_scale, seed, r1.index, rng)  # line 6
    u1 = {i for i, w in noisy1.items() if passes_threshold(w, r1.threshold)}  # line 7
    biases = {}
    for item, w in noisy1.items():  # lines 10-14
        if item in u1:
            continue
        b = K.round2_bias(w, r2.threshold, r1.noise_scale, params.c_lb, params.c_ub)
        if b is not None:
            biases[item] = b
    sets2 = {u: [i for i in items if i in biases] for u, items in capped.items()}  # line 13
    sets2 = {u: items for u, items in sets2.items() if items}
    if r2.keep_table is not None:  # threshold 'optimal': biased Basic weights rounded onto C, the table
        return {
            1: u1,
            2: noisy_threshold(
                table_round_weights(sets2, biases, params.b_min, params.b_max, r2.keep_table), r2, seed, rng
            ),
        }, capped
    w2 = K.mad_weights(sets2, r2.tau, params.d_max, biases, params.b_min, params.b_max)  # line 15
    noisy2 = add_noise(w2, r2.noise, r2.noise_scale, seed, r2.index, rng)  # line 16
    u2 = {i for i, w in noisy2.items() if passes_threshold(w, r2.threshold)}  # line 17
    return {1: u1, 2: u2}, capped


def previous_round_biases(candidates, noisy_prev, prev_plan, plan, params, seed, rng, rho_drop=None):
    """MAD-SIPS round ``plan.index`` >= 2: ``{item: bias}`` of the candidates it keeps (docs/mad_sips.md).

    ``candidates``: the items still held by some user after removing the released ones; ``noisy_prev``:
    the previous round's noisy weights (on that round's union). The previous round's extended noisy vector
    (MAD paper Alg. 1 line 9) is queried on every candidate: a candidate outside that round's union (no user
    subsampled it then) gets its pure-noise entry ``sigma_{r-1} * Z`` with Z keyed by (seed, 'noise', r-1,
    item), the key its noise would have had. Then MAD paper Alg. 4 lines 10-14: items with
    ``w~ + C_ub sigma_{r-1} < rho_drop`` are dropped (``rho_drop``: the least threshold of rounds r..R, an
    item that cannot reach rho_r may still reach a later round's; default rho_r), the others biased
    ``min(1, rho_r / w~_lb)``.
    """
    absent = [i for i in candidates if i not in noisy_prev]
    zeros = dict.fromkeys(absent, 0.0)
    pure_noise = add_noise(zeros, prev_plan.noise, prev_plan.noise_scale, seed, prev_plan.index, rng)
    sigma_prev = prev_plan.noise_scale
    return biases_from_entries(candidates, noisy_prev, pure_noise, plan.threshold, sigma_prev, params, rho_drop)


def biases_from_entries(candidates, noisy_prev, absent, threshold, prev_sigma, params, rho_drop=None):
    """``{item: bias}`` of the candidates a round >= 2 keeps, from the previous round's noisy entries:
    ``noisy_prev`` on its support, ``absent`` (drawn by the caller) outside it. MAD paper Alg. 4 lines 10-14
    through :func:`kernels.round2_bias`; shared by MAD-SIPS and by MAD-SIPS inside DPNE's levels."""
    biases = {}
    for item in candidates:
        w = noisy_prev[item] if item in noisy_prev else absent[item]
        b = K.round2_bias(w, threshold, prev_sigma, params.c_lb, params.c_ub, rho_drop)  # l. 10-14
        if b is not None:
            biases[item] = b
    return biases


def drop_hopeless(items, biases):
    """A user's round-r items without its hopeless ones (those without a bias), unless all are hopeless.

    Dropping a hopeless item frees l2 budget for the user's other items (MAD paper Alg. 4 line 13); a user
    whose remaining items are all hopeless has nothing to free it for, so it keeps them (and they keep the
    small chance to pass that a mistaken "hopeless" leaves them). A function of the user's own set and of
    the previous round's noisy weights: privacy as in docs/mad_sips.md, step (2).
    """
    kept = [i for i in items if i in biases]
    return kept if kept else list(items)


def noisy_degree_histogram(user_sets: UserSets, grid, noise_scale: float, seed=None, rng=None) -> List[float]:
    """MAD-SIPS's noisy degree histogram (privacy/cap.py): ``n_j + sigma_H Z_j`` over the distinct sets, Z_j
    keyed by (seed, 'cap', 0, j) (drawn here, not by the columnar kernel, so the Beam equality tests check the
    keys too). One draw serves the adaptive cap and ``weight_cap='auto'``."""
    degrees = np.array([len(_unique(items)) for items in user_sets.values()], dtype=np.int64)
    histogram = degree_histogram(degrees[degrees > 0], grid)
    if seed is None and rng is None:
        rng = randomness.worker_rng()
    buckets = list(range(len(grid)))
    z = randomness.standard_noise("gaussian", buckets, "cap", 0, seed, rng)
    return [float(n) + noise_scale * float(zj) for n, zj in zip(histogram, z)]


def adaptive_cap(user_sets: UserSets, plan: CapPlan, seed=None, rng=None) -> int:
    """MAD-SIPS's adaptive cap: :func:`noisy_degree_histogram`, then :func:`privacy.cap.choose_cap`."""
    return choose_cap(noisy_degree_histogram(user_sets, plan.grid, plan.noise_scale, seed, rng), plan)


def histogram_choices(user_sets: UserSets, run_plan, seed=None, rng=None) -> Tuple[Optional[int], Optional[float]]:
    """(the adaptive cap, the weight cap) MAD-SIPS chose from one noisy degree histogram; each None when its
    plan is (``run_plan.cap``, ``run_plan.weight_caps``); no draw when both are."""
    hist_plan = run_plan.cap or run_plan.weight_caps
    if hist_plan is None:
        return None, None
    noisy = noisy_degree_histogram(user_sets, hist_plan.grid, hist_plan.noise_scale, seed, rng)
    cap = None if run_plan.cap is None else choose_cap(noisy, run_plan.cap)
    weight_cap = None if run_plan.weight_caps is None else choose_weight_cap(noisy, run_plan.weight_caps)
    return cap, weight_cap


def mad_sips_round(full_sets, released, prev, plan, params, seed=None, rng=None, rho_drop=None, cap=None):
    """One MAD-SIPS round (docs/mad_sips.md): ``(capped round-r sets, biases or None, MAD weights)``.

    ``full_sets``: user -> distinct items; ``released``: the items of U_<r; ``prev``: ``(plan, noisy
    weights)`` of round r - 1, or None in round 1; ``rho_drop``: the least threshold of rounds r..R
    (:func:`previous_round_biases`); ``cap``: the round's cap (the adaptive cap; default Delta_0).
    Everything that depends on the data of earlier rounds comes through ``released``, ``prev`` and ``cap``
    (public / noisy outputs), which is what the privacy proof uses.
    """
    r = plan.index
    remaining = {u: [i for i in items if i not in released] for u, items in full_sets.items()}  # remove U_<r
    biases = None
    if prev is not None:
        candidates = _unique(i for items in remaining.values() for i in items)
        biases = previous_round_biases(candidates, prev[1], prev[0], plan, params, seed, rng, rho_drop)
        remaining = {u: drop_hopeless(items, biases) for u, items in remaining.items()}  # drop U_low
        biases = {**dict.fromkeys(candidates, 1.0), **biases}  # a kept hopeless item: bias 1 (line 14)
    remaining = {u: items for u, items in remaining.items() if items}
    k = params.max_contributions if cap is None else cap
    capped = bound_contributions(remaining, k, seed, r, rng)  # re-subsample (round r) to Delta
    if plan.keep_table is not None:  # the keep-table round: biased Basic weights rounded onto C
        b_min, b_max = (1.0, 1.0) if biases is None else (params.b_min, params.b_max)
        return capped, biases, table_round_weights(capped, biases or {}, b_min, b_max, plan.keep_table)
    if biases is None:  # round 1: unbiased MAD (MAD paper Alg. 4 line 5)
        w = K.mad_weights(capped, plan.tau, params.d_max)
    else:  # rounds >= 2: biased MAD (Alg. 4 line 15)
        w = K.mad_weights(capped, plan.tau, params.d_max, biases, params.b_min, params.b_max)
    return capped, biases, w


def table_round_weights(capped, biases, b_min, b_max, table) -> Dict[Hashable, float]:
    """Per-item totals of MAD-SIPS's keep-table round (docs/mad_sips.md): each user's Algorithm 2 weights
    (:func:`mad_kernels.user_weights`, bias 1 for an item without one), rounded down onto the table's
    contribution set, summed exactly (:func:`exact_sum64`) per item."""
    parts: Dict[Hashable, List[float]] = defaultdict(list)
    for items in capped.values():
        w = K.user_weights(np.array([biases.get(i, 1.0) for i in items], dtype=np.float64), b_min, b_max)
        for item, c in zip(items, table.round_down(w)):
            parts[item].append(float(c))
    return {item: exact_sum64(cs) for item, cs in parts.items()}


def _mad_sips(user_sets, spec, params, plans, seed, rng, cap=None):
    """MAD-SIPS (docs/mad_sips.md): R rounds of MAD; every round removes the released items, drops the
    hopeless ones and biases the rest from the previous round's noisy weights, and re-subsamples each user's
    remaining items to Delta_0 (randomness round r), or to the adaptive ``cap`` with the plans of that cap."""
    full = {u: _unique(items) for u, items in user_sets.items()}
    released: Set[Hashable] = set()
    per_round = {}
    prev = None  # (plan, noisy weights) of round r - 1
    for k, plan in enumerate(plans):
        rho_drop = min(p.threshold for p in plans[k:])  # hopeless: below every remaining round's threshold
        _, _, w = mad_sips_round(full, released, prev, plan, params, seed, rng, rho_drop, cap)
        if plan.keep_table is not None:  # the last round with threshold 'optimal': nothing follows it
            per_round[plan.index] = noisy_threshold(w, plan, seed, rng)
            break
        noisy = add_noise(w, plan.noise, plan.noise_scale, seed, plan.index, rng)
        per_round[plan.index] = {i for i, x in noisy.items() if passes_threshold(x, plan.threshold)}
        released |= per_round[plan.index]
        prev = (plan, noisy)
    # The rounds re-subsample per round; the counts use one subsample of the full sets (round 0).
    return per_round, bound_contributions(full, params.max_contributions, seed, 0, rng)


#: one runner per shape of the registry (privacy.selection.SHAPES); SelectPartitions has the same table.
#: Every runner is ``(user_sets, spec, params, plans, seed, rng, cap)``; ``cap`` is the adaptive cap the
#: plan's ``cap`` chose (MAD-SIPS; None for every other shape, whose plans never carry one).
_RUNNERS = {"single": _single_round, "sequential": _policy, "dp_sips": _dp_sips, "mad2r": _mad2r, "mad_sips": _mad_sips}


@dataclasses.dataclass(frozen=True)
class SelectionResult:
    """Everything a reference run releases, with its public plans.

    Attributes:
      rounds: the calibrated :class:`privacy.selection.RoundPlan` of each round.
      count_plan: the :class:`privacy.counts.CountPlan`, or None without ``release_counts``.
      per_round: ``{round: set of items released in that round}`` (before the ``min_users`` floor).
      counts: ``{item: noisy count}`` of the released items kept by the floor, or None without counts.
      cap: the adaptive cap MAD-SIPS chose (privacy/cap.py), or None when every round caps at Delta_0.
      weight_cap: the weight cap MAD-SIPS chose with ``weight_cap='auto'``, or None.
    """

    rounds: Tuple[RoundPlan, ...]
    count_plan: Optional[CountPlan]
    per_round: Dict[int, Set[Hashable]]
    counts: Optional[Dict[Hashable, int]]
    cap: Optional[int] = None
    weight_cap: Optional[float] = None

    @property
    def items(self) -> Set[Hashable]:
        """The released items (with counts: those whose noisy count passed ``min_users``)."""
        if self.counts is not None:
            return set(self.counts)
        out: Set[Hashable] = set()
        for items in self.per_round.values():
            out |= items
        return out


def restrict_to_allowlist(user_sets: UserSets, allowlist: Optional[Iterable[Hashable]]) -> UserSets:
    """The user sets with items outside the public ``allowlist`` dropped (users left empty removed)."""
    if allowlist is None:
        return user_sets
    if isinstance(allowlist, (str, bytes)):
        raise ValueError("allowlist must be an iterable of items (e.g. a list or set), not a single str")
    allowed = frozenset(allowlist)
    out = {u: [i for i in items if i in allowed] for u, items in user_sets.items()}
    return {u: items for u, items in out.items() if items}


def release(
    user_sets: UserSets,
    algorithm: str,
    params: SelectionParams,
    seed: Optional[int] = None,
    allowlist: Optional[Iterable[Hashable]] = None,
) -> SelectionResult:
    """The whole release of ``SelectPartitions`` (same output under the same seed): items, rounds, counts."""
    run_plan = selection_plan(algorithm, params)  # params resolved: the algorithm's defaults filled in
    params, count_plan = run_plan.params, run_plan.counts
    randomness.warn_if_seeded(seed)
    rng = None if seed is not None else randomness.worker_rng()
    user_sets = restrict_to_allowlist(user_sets, allowlist)
    # with an adaptive cap or weight_cap='auto' (MAD-SIPS), a noisy degree histogram picks the cap and the
    # weight cap, hence the rounds' plans
    cap, weight_cap = histogram_choices(user_sets, run_plan, seed, rng)
    plans = run_plan.rounds_for(cap, weight_cap)
    per_round, capped = _RUNNERS[run_plan.shape](user_sets, run_plan.spec, params, plans, seed, rng, cap)
    counts = None
    if count_plan is not None:
        released = set().union(*per_round.values())
        counts = counts_kernels.noisy_counts(
            counts_kernels.holder_counts(capped, released), count_plan.sigma2, seed, count_plan.round, params.min_users
        )
    return SelectionResult(plans, count_plan, per_round, counts, cap, weight_cap)


def select_rounds(
    user_sets: UserSets,
    algorithm: str,
    params: SelectionParams,
    seed: Optional[int] = None,
    allowlist: Optional[Iterable[Hashable]] = None,
) -> Tuple[Tuple[RoundPlan, ...], Dict[int, Set[Hashable]]]:
    """The calibrated plan and the items released in each round (before any ``min_users`` floor)."""
    result = release(user_sets, algorithm, params, seed, allowlist)
    return result.rounds, result.per_round


def select(
    user_sets: UserSets,
    algorithm: str,
    params: SelectionParams,
    seed: Optional[int] = None,
    allowlist: Optional[Iterable[Hashable]] = None,
) -> Set[Hashable]:
    """Released items of ``algorithm`` (same output as ``SelectPartitions`` under the same seed).

    With ``params.release_counts``: the items whose noisy count passed ``params.min_users``.
    """
    return release(user_sets, algorithm, params, seed, allowlist).items


def select_counts(
    user_sets: UserSets,
    algorithm: str,
    params: SelectionParams,
    seed: Optional[int] = None,
    allowlist: Optional[Iterable[Hashable]] = None,
) -> Dict[Hashable, int]:
    """``{item: noisy count}`` of ``SelectPartitions`` with ``params.release_counts`` (same seed, same output)."""
    if not params.release_counts:
        raise ValueError("select_counts needs params.release_counts=True")
    return release(user_sets, algorithm, params, seed, allowlist).counts


def user_sets_from_pairs(pairs: Iterable[Tuple[Hashable, Hashable]]) -> Dict[Hashable, List[Hashable]]:
    """dict user -> distinct items, from (user, item) pairs."""
    sets: Dict[Hashable, Dict[Hashable, None]] = defaultdict(dict)
    for user, item in pairs:
        sets[user][item] = None
    return {u: list(items) for u, items in sets.items()}
