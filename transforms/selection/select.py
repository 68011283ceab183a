"""``SelectPartitions``: the single entry point of DP partition selection on Beam.

Input: a PCollection of ``(user, item)`` pairs (duplicates allowed). Output: the released items, or
``(round, item)`` with ``output_rounds=True`` (each item is released in exactly one round); with
``params.release_counts`` ``(item, noisy_count)`` (or ``(round, (item, noisy_count))``), the counts
computed by :class:`transforms.selection.counts.ReleaseCounts` on the same capped user sets.

Every algorithm follows the calibrated plan of :func:`privacy.selection.plan_rounds`; the in-memory
oracle with the same randomness contract is :func:`transforms.reference.select`.
"""

from __future__ import annotations

from typing import Optional

import apache_beam as beam

from privacy.selection import SelectionParams, algorithm_spec, plan_counts, plan_rounds
from privacy.validation import check_int
from transforms.core import randomness
from transforms.core.allowlist import KeepAllowlisted, check_allowlist
from transforms.core.bounding import BoundContributions, CapUserItemsFn
from transforms.core.joins import DEFAULT_MAX_BROADCAST_ITEMS
from transforms.core.noise import NoisyThreshold, only_value, tag_round
from transforms.selection.basic import UserSetWeights
from transforms.selection.counts import ReleaseCounts
from transforms.selection.mad import MAD2R, MADWeights
from transforms.selection.policy import SequentialPolicy


def drop_released_items(element, released):
    """(user, [item]) -> (user, [item not in released]) (DP-SIPS: post-processing of earlier rounds)."""
    user, items = element
    return user, [i for i in items if i not in released]


def materialise(user, items):
    """(user, iterable[item]) -> (user, [distinct item]) (repeats dropped: no separate Distinct shuffle)."""
    return user, list(dict.fromkeys(items))


def as_present(item):
    return item, True


def has_items(element):
    return len(element[1]) > 0


class _SingleRound(beam.PTransform):
    """Bound contributions, weigh, add noise, threshold: one round of the template (MAD paper Alg. 1).

    Every runner returns ``((round, item), capped user sets or None)``: the capped sets (what the count
    release counts) only with ``with_user_sets``.
    """

    def __init__(self, spec, plans, params: SelectionParams, seed: Optional[int], join_options: dict, with_user_sets):
        super().__init__()
        self._plan, self._params, self._seed = plans[0], params, seed
        self._join_options = join_options
        self._with_user_sets = with_user_sets

    def expand(self, pairs):
        rnd = self._plan
        user_sets = pairs | "BoundContributions" >> BoundContributions(
            self._params.max_contributions, self._seed, round_=0
        )  # (user, [item]) |.| <= D0
        if rnd.weighting == "mad":
            weights = user_sets | "MADWeights" >> MADWeights(
                rnd.tau, self._params.d_max, **self._join_options
            )  # (item, w)
        else:
            weights = user_sets | "Weights" >> UserSetWeights(rnd.weighting)  # (item, w)
        tagged = (
            weights
            | "NoisyThreshold"
            >> NoisyThreshold(rnd.noise, rnd.noise_scale, rnd.threshold, self._seed, rnd.index)  # item
            | "TagRound" >> beam.Map(tag_round, rnd.index)  # (1, item)
        )
        return tagged, (user_sets if self._with_user_sets else None)


class _DPSIPS(beam.PTransform):
    """DP-SIPS: rounds of Basic; items released earlier are removed and sets re-subsampled each round.

    Privacy: round r runs Basic (l2 sensitivity 1, novel-item bound 1/sqrt(t)) on a dataset that is
    a function of the raw user sets and of the *released* output of rounds < r only; removing
    released items is post-processing, and re-subsampling to Delta_0 keeps each user's round-r
    contribution within Basic's sensitivity. The rounds compose adaptively under the accounting of
    ``params.accounting`` (privacy/accounting.py).
    """

    def __init__(self, spec, plans, params: SelectionParams, seed: Optional[int], join_options: dict, with_user_sets):
        super().__init__()
        self._plans, self._params, self._seed = plans, params, seed
        self._with_user_sets = with_user_sets

    def expand(self, pairs):
        full_sets = (
            pairs
            | "GroupByUser" >> beam.GroupByKey()  # (user, [item]) with repeats
            | "Materialise" >> beam.MapTuple(materialise)  # (user, [item]) all distinct items
        )
        outputs = []
        released_so_far = None  # item, released in rounds < r
        for rnd in self._plans:
            last = rnd.index == len(self._plans)
            released_r = full_sets | f"Round{rnd.index}" >> _DPSIPSRound(
                rnd, released_so_far, self._params.max_contributions, self._seed, checkpoint=not last
            )  # item released in round r
            outputs.append(released_r | f"Tag{rnd.index}" >> beam.Map(tag_round, rnd.index))  # (r, item)
            if not last:
                released_so_far = (
                    released_r
                    if released_so_far is None
                    else (released_so_far, released_r) | f"Union{rnd.index}" >> beam.Flatten()
                )  # item, released in rounds <= r
        tagged = tuple(outputs) | "AllRounds" >> beam.Flatten()  # (round, item)
        if not self._with_user_sets:
            return tagged, None
        # The rounds re-subsample per round; the counts use one subsample of the full sets (round 0).
        capped = full_sets | "CapForCounts" >> beam.ParDo(
            CapUserItemsFn(self._params.max_contributions, self._seed, 0)
        )  # (user, [item]) |.| <= D0
        return tagged, capped


def join_round(element):
    """(item, {'round': [r], 'count': [c]}) -> (r, (item, c)) for items that kept their count."""
    item, grouped = element
    counts = list(grouped["count"])
    if counts:
        (r,) = grouped["round"]
        yield r, (item, counts[0])


class _DPSIPSRound(beam.PTransform):
    """One DP-SIPS round r: (user, [all distinct items]) -> items released in round r.

    Stages:
      DropReleased   (user, [item not in U_<r])   post-processing of earlier rounds (side input)
      NonEmpty       (user, [item])               users with items left
      CapToDelta0    (user, [item])               fresh uniform subsample to Delta_0 (round r's draw)
      Weights        (item, w)                    Basic's 1/sqrt(d) weights, exact sums
      NoisyThreshold item                         checkpointed when a later round reads it
    """

    def __init__(self, plan, released_before, max_contributions: int, seed: Optional[int], checkpoint: bool):
        super().__init__()
        self._plan, self._released_before = plan, released_before
        self._k, self._seed, self._checkpoint = max_contributions, seed, checkpoint

    def expand(self, full_sets):
        rnd, sets = self._plan, full_sets
        if self._released_before is not None:
            released_si = beam.pvalue.AsDict(self._released_before | "AsPresent" >> beam.Map(as_present))
            sets = (
                full_sets
                | "DropReleased" >> beam.Map(drop_released_items, released_si)  # (user, [item \ U_<r])
                | "NonEmpty" >> beam.Filter(has_items)  # (user, [item]) non-empty
            )
        return (
            sets
            | "CapToDelta0" >> beam.ParDo(CapUserItemsFn(self._k, self._seed, rnd.index))  # (user, [item]) <= D0
            | "Weights" >> UserSetWeights("weighted_gaussian")  # (item, w)
            | "NoisyThreshold"
            >> NoisyThreshold(rnd.noise, rnd.noise_scale, rnd.threshold, self._seed, rnd.index, self._checkpoint)
        )  # item; checkpointed: the output and the next round's removal see the same draw


class SelectPartitions(beam.PTransform):
    """User-level (epsilon, delta)-DP partition selection, optionally with DP counts of the released items.

    Args:
      algorithm: a key of :data:`privacy.selection.ALGORITHMS`: 'basic' (weighted Gaussian),
        'weighted_laplace', 'count_gaussian', 'count_laplace', 'mad', 'mad2r', 'dp_sips', and the
        sequential single-worker 'policy_gaussian', 'policy_laplace' (DPSU paper Alg. 4 and 6;
        :class:`transforms.selection.policy.SequentialPolicy`, limited to ``params.max_sequential_pairs``).
      params: :class:`privacy.selection.SelectionParams`. With ``params.release_counts`` the output
        carries a noisy count of distinct users per released item (``count_budget`` of the budget,
        composed exactly; docs/counts.md) and ``params.min_users`` drops items whose noisy count is below it.
      seed: None for production (OS entropy on workers); an int for reproducible, NON-private runs.
      output_rounds: emit ``(round, item)`` (or ``(round, (item, count))``) instead of ``item``.
      allowlist: optional PUBLIC list of candidate items (an iterable, or a PCollection of items for
        long lists, sent to the workers as a side input): pairs whose item is not in it are dropped
        before contribution bounding. It must not be derived from the private data (docs/counts.md).
      max_users_per_key, max_broadcast_items: execution options of MAD/MAD2R's item-value step and of
        the count release's join (:class:`transforms.core.joins.JoinValuesToSets`): per-item values go to
        the workers as a side input when at most ``max_broadcast_items`` items have one, else by a join
        sharded to about ``max_users_per_key`` users per key. They change the cost, never the output.

    Input: PCollection of ``(user, item)``; items must be hashable and deterministically encodable
    (str, bytes, int, tuples of those). Output: released items, or ``(item, noisy_count)`` (ints) with
    ``release_counts`` (or the round-tagged forms with ``output_rounds``). The plans are public:
    ``self.rounds`` (the selection) and ``self.counts`` (:class:`privacy.counts.CountPlan` or None).
    """

    def __init__(
        self,
        algorithm: str,
        params: SelectionParams,
        *,
        seed: Optional[int] = None,
        output_rounds: bool = False,
        allowlist=None,
        max_users_per_key: int = 10_000,
        max_broadcast_items: int = DEFAULT_MAX_BROADCAST_ITEMS,
        label=None,
    ):
        super().__init__(label)
        self.join_options = dict(
            max_users_per_key=check_int("max_users_per_key", max_users_per_key, 1),
            max_broadcast_items=check_int("max_broadcast_items", max_broadcast_items, 0),
        )
        self.spec = algorithm_spec(algorithm)
        self.algorithm = self.spec.name
        if not isinstance(params, SelectionParams):
            raise TypeError(f"params must be a SelectionParams, got {type(params).__name__}")
        self.params = params
        self.seed = seed
        self.output_rounds = output_rounds
        self.allowlist = check_allowlist(allowlist)
        self.rounds = plan_rounds(algorithm, params)  # calibrated before any data is read
        self.counts = plan_counts(algorithm, params)  # None without release_counts

    def expand(self, pairs):
        randomness.warn_if_seeded(self.seed)
        if self.allowlist is not None:
            pairs = pairs | "Allowlist" >> KeepAllowlisted(self.allowlist)  # (user, item), item allowed
        runner = _RUNNERS[self.spec.shape](
            self.spec, self.rounds, self.params, self.seed, self.join_options, self.counts is not None
        )
        tagged, user_sets = pairs | self.algorithm.upper() >> runner  # (round, item), (user, [item]) or None
        if self.counts is None:
            if self.output_rounds:
                return tagged  # (round, item)
            return tagged | "Items" >> beam.Values()  # item
        if self.output_rounds:
            # The released items feed both the counts and the round tags: materialise them once.
            rounds_by_item = (
                tagged
                | "ItemRound" >> beam.Map(swap)  # (item, round)
                | "CheckpointReleased" >> beam.GroupByKey()  # (item, [round]) materialised
                | "OneRound" >> beam.MapTuple(only_value)  # (item, round)
            )
            released = rounds_by_item | "Released" >> beam.Keys()  # item
        else:
            released = tagged | "Released" >> beam.Values()  # item
        counted = user_sets | "ReleaseCounts" >> ReleaseCounts(
            released, self.counts, self.seed, self.params.min_users, **self.join_options
        )  # (item, noisy_count), noisy_count >= min_users
        if not self.output_rounds:
            return counted  # (item, noisy_count)
        return (
            {"round": rounds_by_item, "count": counted}
            | "JoinRounds" >> beam.CoGroupByKey()  # (item, {round: [r], count: [c]})
            | "TagCounts" >> beam.FlatMap(join_round)  # (round, (item, noisy_count))
        )


def swap(element):
    """(a, b) -> (b, a)."""
    return element[1], element[0]


def _mad2r(spec, plans, params, seed, join_options, with_user_sets):
    return MAD2R(plans, params, seed, with_user_sets=True, **join_options)  # (round, item), (user, [item])


class _Sequential(beam.PTransform):
    """The single-worker policy algorithms (DPSU paper Alg. 4 and 6), tagged with their one round."""

    def __init__(self, spec, plans, params: SelectionParams, seed: Optional[int], join_options: dict, with_user_sets):
        super().__init__()
        self._spec, self._plan, self._params, self._seed = spec, plans[0], params, seed

    def expand(self, pairs):
        released, user_sets = pairs | "Policy" >> SequentialPolicy(
            self._spec.name, self._plan, self._params, self._seed, with_user_sets=True
        )  # item, (user, [item])
        return released | "TagRound" >> beam.Map(tag_round, self._plan.index), user_sets  # (1, item)


#: one Beam runner per shape of the registry (privacy.selection.SHAPES); the reference has the same table
_RUNNERS = {"single": _SingleRound, "dp_sips": _DPSIPS, "mad2r": _mad2r, "sequential": _Sequential}
