"""Contractive update policies of the DP set union paper (Gopi et al. 2020), pure functions.

POLICY LAPLACE (Algorithm 4) and POLICY GAUSSIAN (Algorithm 6) build a weighted histogram ``H`` by
letting users, one after the other in a random order fixed by a keyed hash of their ids
(Algorithm 2), push their items' weights toward a cutoff ``Gamma``:

* l1-descent (Algorithm 3): the user spends an l1 budget of 1, raising all of its items below the
  cutoff uniformly ("water filling"); an item that reaches ``Gamma`` stops. l1-contractive over
  ``I = {(G1, G2): G1 >= G2, ||G1 - G2||_1 <= 1}`` (Lemma 4.1).
* l2-descent (Algorithm 5): the user moves its items' weights toward ``(Gamma, ..., Gamma)`` by an
  l2 distance of at most 1. l2-contractive over ``I = {(G1, G2): ||G1 - G2||_2 <= 1}`` (Lemma 5.2).

By Theorem 1.1 the histogram then has l1 (resp. l2) sensitivity 1, and an item held only by a new
user who holds ``t`` such items has weight at most ``1/t`` (resp. ``1/sqrt(t)``), which is what
Theorems 4.1 and 5.1 need for the thresholds (``privacy.calibration.calibrate_weighted_laplace`` /
``calibrate_weighted_gaussian`` compute exactly those thresholds).

The cutoff is ``Gamma = rho + alpha * noise_scale`` (Algorithms 4 and 6, computed in
``privacy.selection.plan_rounds``; the printed Algorithm 6 says ``rho_Lap``, it means ``rho_Gauss``:
docs/design.md errata). The paper reports that alpha in [2, 6] works
best (sections 4.2 and 5.2) and uses alpha = 5 in Table 2. alpha does not affect privacy.

The greedy policy of appendix C is NOT contractive (its sensitivity grows with the number of users)
and is deliberately not offered here.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Dict, Hashable, Iterable, List, MutableMapping, Optional, Sequence, Tuple

from dp_partition_beam.privacy.validation import check_choice, check_int
from dp_partition_beam.transforms.core import randomness

#: budgeted bytes per gathered (user, item) pair on the single worker (measured ~110 by
#: benchmarks/bench_policy.py with short items; see DEFAULT_MAX_SEQUENTIAL_PAIRS in privacy/selection.py)
BYTES_PER_PAIR = 250


class SequentialSizeError(RuntimeError):
    """The input is too large for the single-worker sequential policy algorithms."""


def size_error_message(algorithm: str, limit: int) -> str:
    # Says only that the (bounded) input exceeds the limit: no exact data-dependent count.
    return (
        f"SequentialSizeError: {algorithm} builds its histogram on a single worker and the input has more "
        f"than max_sequential_pairs={limit:,d} (user, item) pairs after contribution bounding "
        f"(about {BYTES_PER_PAIR} bytes each on that worker). Raise --max_sequential_pairs if the worker "
        f"has the memory, lower --max_contributions, or use a parallel algorithm such as --algorithm mad2r."
    )


def check_sequential_size(algorithm: str, total_pairs: int, limit: int) -> None:
    """Raises :class:`SequentialSizeError` when the bounded input has more than ``limit`` (user, item) pairs.

    Not only a memory guard: the l1 curve's and the l2 rule's realisation reserves count the items one
    user's change can touch on the policy's worker as at most ``max_sequential_pairs``
    (privacy.selection), so a run past it would release under a reserve that does not cover it. The
    Beam transform checks before its gather, the reference before its histogram: before any release."""
    if total_pairs > limit:
        raise SequentialSizeError(size_error_message(algorithm, limit))


#: the policies (the ``weighting`` of the sequential algorithms in privacy.selection.ALGORITHMS)
POLICIES = ("l1_descent", "l2_descent")

Histogram = MutableMapping[Hashable, float]


def l1_descent_update(hist: Histogram, items: Sequence[Hashable], gamma: float, budget: float = 1.0) -> None:
    """One user's l1-descent update (Algorithm 3), in place. ``items`` must be distinct.

    Water filling: sort the user's items below the cutoff by their gap ``Gamma - H[u]`` (the sorted
    dictionary G, lines 3-9; docs/design.md erratum: the loop runs over G, not B), then raise all items
    still below the cutoff by the same amount until either the next item reaches the cutoff
    (``cost = gap * K <= budget``, lines 14-21) or the budget is spent (``budget / K`` each, lines
    22-26). We track the common raise ``level`` instead of updating every remaining gap, so the cost is
    O(d log d) for the sort plus O(d). An item that reaches the cutoff is set to exactly ``Gamma``.
    The total l1 change is ``min(budget, sum of gaps)``.
    """
    gaps = []
    for u in items:
        h = hist.get(u, 0.0)
        if h < gamma:  # line 5: only items below the cutoff
            gaps.append((gamma - h, u))
    if not gaps:
        return
    gaps.sort(key=_first)  # line 11: increasing gap
    k = len(gaps)  # line 10: K, items still under the cutoff
    level = 0.0  # common raise applied so far to every item still under the cutoff
    filled = 0  # gaps[:filled] reached the cutoff
    for gap, _ in gaps:
        cost = (gap - level) * k  # line 15: raise the remaining K items by the j-th remaining gap
        if cost <= budget:
            budget -= cost  # line 20
            level = gap
            filled += 1
            k -= 1  # line 21
        else:
            level += budget / k  # line 24: spend the rest uniformly
            break
    for j, (gap, u) in enumerate(gaps):
        if j < filled:
            hist[u] = gamma
        else:
            hist[u] = hist.get(u, 0.0) + level


def _first(pair):
    return pair[0]


def l2_descent_update(hist: Histogram, items: Sequence[Hashable], gamma: float, budget: float = 1.0) -> None:
    """One user's l2-descent update (Algorithm 5), in place. ``items`` must be distinct.

    ``G[u] = Gamma - H[u]`` for the user's items, ``Z = ||G||_2``; if ``Z < budget`` every item is set
    to ``Gamma``, else ``H[u] += budget * G[u] / Z`` (a step of l2 length ``budget`` toward
    ``(Gamma, ..., Gamma)``). Weights start at 0 < Gamma and never pass Gamma, so ``G >= 0``.
    """
    if not items:
        return
    gaps = [gamma - hist.get(u, 0.0) for u in items]
    z = math.sqrt(math.fsum(g * g for g in gaps))  # line 6
    if z < budget:  # lines 8-11
        for u in items:
            hist[u] = gamma
        return
    step = budget / z
    for u, g in zip(items, gaps):  # lines 12-15
        hist[u] = hist.get(u, 0.0) + g * step


_UPDATES = {"l1_descent": l1_descent_update, "l2_descent": l2_descent_update}


def build_histogram(
    ordered_sets: Iterable[Sequence[Hashable]], policy: str, gamma: float, passes: int = 1
) -> Dict[Hashable, float]:
    """Algorithm 2: the weighted histogram of users processed in the given order.

    ``ordered_sets`` are the users' (bounded, distinct) item lists, already in the secret order
    (:func:`order_users`). With ``passes = p > 1`` (section 6.2.1) the users are processed ``p`` times
    in the same order, each time with budget ``1/p``: a user's total change is still at most 1 in
    l1 / l2 (triangle inequality), each pass is contractive, and an item held only by the new user
    gains at most ``1/(p t)`` (l1) or ``1/(p sqrt(t))`` (l2) per pass, so Theorems 4.1 / 5.1 apply
    unchanged. Needs a re-iterable ``ordered_sets`` when ``passes > 1``.
    """
    update = _UPDATES[check_choice("policy", policy, POLICIES)]
    passes = check_int("passes", passes, 1)
    budget = 1.0 / passes
    hist: Dict[Hashable, float] = {}
    for _ in range(passes):
        for items in ordered_sets:
            update(hist, items, gamma, budget)
    return hist


def order_secret(seed: Optional[int]) -> bytes:
    """The per-run secret key of the user order (Algorithm 2's random hash function).

    Production (``seed is None``): 32 bytes of OS entropy, drawn where the histogram is built (on the
    worker), never stored in the pipeline graph. Reproducible mode: a function of
    ``(seed, 'policy_order', 0)`` (randomness contract).
    """
    if seed is None:
        return os.urandom(32)
    return randomness.keyed_bytes(seed, "policy_order", 0, "secret", 32)


def order_key(user: Any, secret: bytes) -> Tuple[bytes, bytes]:
    """Sort key of ``user``: keyed BLAKE2b hash of its canonical encoding (ties: the encoding)."""
    enc = randomness.encode_key(user)
    return hashlib.blake2b(enc, key=secret, digest_size=16).digest(), enc


def order_users(user_sets: Iterable[Tuple[Any, Sequence[Hashable]]], secret: bytes) -> List[Sequence[Hashable]]:
    """The users' item lists sorted by :func:`order_key` (a function of the secret and the ids only)."""
    keyed = [(order_key(user, secret), items) for user, items in user_sets]
    keyed.sort(key=_first)
    return [items for _, items in keyed]


def policy_histogram(
    user_sets: Iterable[Tuple[Any, Sequence[Hashable]]],
    policy: str,
    gamma: float,
    passes: int = 1,
    seed: Optional[int] = None,
) -> Dict[Hashable, float]:
    """Orders ``(user, [item])`` by the secret keyed hash and runs :func:`build_histogram`.

    The single code path of both the Beam transform (``transforms.selection.policy``) and the reference.
    """
    return build_histogram(order_users(user_sets, order_secret(seed)), policy, gamma, passes)
