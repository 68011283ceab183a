"""Table kernels of MAD-SIPS (docs/mad_sips.md; pure numpy/Arrow, no Beam): hopeless items, the adaptive cap.

The scalar (in-memory) forms are in :mod:`transforms.selection.reference` (``drop_hopeless``,
``adaptive_cap``); the MAD weighting of every round is :mod:`transforms.selection.mad_kernels`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dp_partition_beam.privacy import cap as cap_plans
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core.batches import ITEM, USER, dictionary_codes
from dp_partition_beam.transforms.core.tables import ItemIndex, cap_pairs, user_codes


def drop_hopeless(table: pa.Table, hopeless: Optional[pa.Array]) -> pa.Table:
    """MAD-SIPS: each user's rows without its hopeless items, unless all of the user's items are hopeless.

    The columnar :func:`transforms.selection.reference.drop_hopeless` (docs/mad_sips.md): a user keeps its
    hopeless items only when it has no other item to give its l2 budget to.
    """
    if hopeless is None or len(hopeless) == 0 or table.num_rows == 0:
        return table
    return drop_doomed(table, pc.is_in(table.column(ITEM), value_set=hopeless).to_numpy())


def drop_doomed(table: pa.Table, doomed: np.ndarray) -> pa.Table:
    """:func:`drop_hopeless` with the hopeless rows given as a mask (``doomed[i]``: row i's item is hopeless)."""
    if table.num_rows == 0:
        return table
    codes, users = dictionary_codes(table.column(USER))
    has_hope = np.zeros(len(users), dtype=bool)
    has_hope[codes[~doomed]] = True  # users with at least one item that is not hopeless
    return table.filter(pa.array(~doomed | ~has_hope[codes]))


def attach_biases_or_one(capped: pa.Table, hopeful: pa.Table, index: Optional[ItemIndex] = None) -> pa.Table:
    """Table(user, item, degree, bias): each capped row's bias from ``hopeful`` Table(item, bias), 1 for an
    item it does not list (a hopeless item its user keeps, Alg. 4 line 14: below every later threshold).
    ``index``: an :class:`ItemIndex` of ``hopeful``'s items (built here if not given)."""
    pos = (index or ItemIndex(hopeful.column(ITEM))).positions(capped.column(ITEM))
    biases = hopeful.column("bias").to_numpy()
    bias = np.where(pos >= 0, biases[np.maximum(pos, 0)] if len(biases) else 1.0, 1.0)
    return pa.table(
        {USER: capped.column(USER), ITEM: capped.column(ITEM), "degree": capped.column("degree"), "bias": bias}
    )


def round_sets(
    table: pa.Table,
    cap: int,
    seed: int,
    round_: int,
    doomed: Optional[np.ndarray] = None,
    hopeful: Optional[pa.Table] = None,
    index: Optional[ItemIndex] = None,
) -> pa.Table:
    """Round r's capped sets of whole users' rows: Table(user, item, degree[, bias]). Without ``doomed`` (round 1)
    each user's bottom-k to ``cap`` with round ``round_``'s priorities; with it (``doomed[i]``: row i's item is
    hopeless) each user's hopeless rows dropped unless all are (Alg. 4 line 13), the bottom-k, and each kept row's
    bias from ``hopeful`` Table(item, bias) (1 for a kept hopeless item: :func:`attach_biases_or_one`)."""
    if doomed is None:
        return cap_pairs(table, int(cap), seed, round_)
    capped = cap_pairs(drop_doomed(table, doomed), int(cap), seed, round_)  # re-subsample (round r)
    return attach_biases_or_one(capped, hopeful, index)


#: the randomness purpose of the adaptive cap's histogram noise (round 0, key = bucket index)
CAP_NOISE = "cap"


def degree_histogram_of(table: pa.Table, grid) -> np.ndarray:
    """``n_j`` of a piece of distinct (user, item) rows whose users are all complete in it (privacy/cap.py)."""
    if table.num_rows == 0:
        return np.zeros(len(grid), dtype=np.int64)
    degrees = np.bincount(user_codes(table))
    return cap_plans.degree_histogram(degrees[degrees > 0], grid)


def noisy_histogram(histogram: np.ndarray, noise_scale: float, seed: Optional[int], rng) -> np.ndarray:
    """``n_j + sigma_H Z_j`` (Z_j keyed by (seed, 'cap', 0, j), or from ``rng``): the noisy degree histogram
    from which the adaptive cap and ``weight_cap='auto'`` choose (privacy/cap.py)."""
    keys = list(range(len(histogram)))
    z = randomness.standard_noise("gaussian", keys, CAP_NOISE, 0, seed, rng)
    return np.asarray(histogram, dtype=np.float64) + noise_scale * z


def noisy_cap(histogram: np.ndarray, plan: "cap_plans.CapPlan", seed: Optional[int], rng) -> int:
    """The chosen cap: :func:`noisy_histogram`, then :func:`privacy.cap.choose_cap`."""
    return cap_plans.choose_cap(noisy_histogram(histogram, plan.noise_scale, seed, rng), plan)
