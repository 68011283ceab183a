"""Random neighbouring datasets under the sequential policies, for the keep rules' composition tests
(tests/privacy/test_l1_curve.py, test_l2_rule.py)."""

from __future__ import annotations

import random
from typing import Dict, Iterator, Tuple

from dp_partition_beam.transforms.selection import policy_kernels as PK


def neighbouring_histograms(
    seed: int, policy: str, gamma: float, cases: int, items: int, max_degree: int, max_users: int, max_shared: int
) -> Iterator[Tuple[int, Dict, Dict, Dict]]:
    """``cases`` pairs of policy histograms of D and D + one user, the extra user anywhere in the order, holding
    up to ``max_shared`` of D's items and up to 2 novel ones: ``(case, h, h2, change)``, change = |h2 - h| per
    item (both supports)."""
    rng = random.Random(seed)
    for case in range(cases):
        sets = [
            sorted(set(rng.choices(range(items), k=rng.randint(1, max_degree))))
            for _ in range(rng.randint(1, max_users))
        ]
        shared = sorted(set(rng.sample(range(items), rng.randint(0, max_shared))), key=str)
        extra = shared + [f"new{j}" for j in range(rng.randint(0, 3))] or [0]
        pos = rng.randint(0, len(sets))
        h = PK.build_histogram(sets, policy, gamma)
        h2 = PK.build_histogram(sets[:pos] + [extra] + sets[pos:], policy, gamma)
        change = {i: abs(h2.get(i, 0.0) - h.get(i, 0.0)) for i in set(h) | set(h2)}
        yield case, h, h2, change
