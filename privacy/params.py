"""Frozen, self-validating parameter dataclasses.

Every dataclass validates on construction and raises ``ValueError`` naming the parameter, the value
given and the allowed range, e.g. ``epsilon must be in (0, 100], got -1.0``. Defaults are those of
the MAD paper's experiments (section 7): Delta_0 = 100, d_max = 50, beta = 2, b_min = 0.5,
b_max = 2, C_lb = 1, C_ub = 3, budget split [0.1, 0.9].
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence, Tuple

# Ranges over which privacy/calibration.py is tested to be numerically sound.
EPSILON_RANGE = (0.0, 100.0)
DELTA_RANGE = (1e-30, 0.5)

ALGORITHMS = (
    "basic",
    "weighted_laplace",
    "count_gaussian",
    "count_laplace",
    "mad",
    "mad2r",
    "dp_sips",
    "policy_gaussian",
    "policy_laplace",
)
#: the sequential (single-worker) algorithms of the DP set union paper (Algorithms 4 and 6)
SEQUENTIAL_ALGORITHMS = ("policy_gaussian", "policy_laplace")
#: Default limit on the (user, item) pairs, after contribution bounding, that the sequential policy
#: algorithms gather on one worker. benchmarks/bench_policy.py measures the Python heap of that worker
#: (decoded user sets + order keys + histogram) at ~110 bytes per pair with short synthetic items
#: (Python 3.11); we budget 250 bytes per pair for longer items and runner overhead, so 20M pairs take
#: about 5 GB: a quarter of the 24 GB development machine and within a 15 GB n1-standard-4 Dataflow
#: worker. Raise it with --max_sequential_pairs on bigger machines.
DEFAULT_MAX_SEQUENTIAL_PAIRS = 20_000_000
ACCOUNTINGS = ("gdp", "basic")


def _fmt_interval(lo, hi, lo_open, hi_open) -> str:
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def check_range(
    name: str,
    value: Any,
    lo: float = -math.inf,
    hi: float = math.inf,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Validates ``lo <= value <= hi`` (open ends as given); returns ``float(value)``."""
    interval = _fmt_interval(lo, hi, lo_open or lo == -math.inf, hi_open or hi == math.inf)
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}") from None
    ok = not math.isnan(x)
    ok = ok and (x > lo if (lo_open or lo == -math.inf) else x >= lo)
    ok = ok and (x < hi if (hi_open or hi == math.inf) else x <= hi)
    if not ok or (math.isinf(x) and not (math.isinf(lo) or math.isinf(hi))):
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return x


def check_int(name: str, value: Any, lo: int = 1, hi: Optional[int] = None) -> int:
    """Validates an integer in ``[lo, hi]``."""
    allowed = f"an integer in [{lo}, {hi if hi is not None else 'inf'}]"
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return v


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_fractions(name: str, fractions: Sequence[float]) -> Tuple[float, ...]:
    """Budget fractions: each in (0, 1], summing to 1 (within 1e-9)."""
    try:
        fr = tuple(float(f) for f in fractions)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of positive numbers summing to 1, got {fractions!r}") from None
    if not fr:
        raise ValueError(f"{name} must be a non-empty list of positive numbers summing to 1, got {fractions!r}")
    for f in fr:
        if not (f > 0.0) or math.isinf(f):
            raise ValueError(f"{name} entries must be in (0, 1], got {fractions!r}")
    if abs(sum(fr) - 1.0) > 1e-9:
        raise ValueError(f"{name} must sum to 1, got {fractions!r} (sum {sum(fr):g})")
    return fr


@dataclasses.dataclass(frozen=True)
class PrivacyBudget:
    """Total user-level (epsilon, delta) of a release."""

    epsilon: float
    delta: float

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_range("epsilon", self.epsilon, *EPSILON_RANGE, lo_open=True))
        object.__setattr__(self, "delta", check_range("delta", self.delta, *DELTA_RANGE))


@dataclasses.dataclass(frozen=True)
class SelectionParams:
    """Parameters of partition selection (``SelectPartitions`` and ``reference.select``).

    Attributes:
      epsilon, delta: total user-level privacy budget.
      max_contributions: Delta_0, the cap on distinct items per user (uniform subsampling).
      d_max: MAD maximum adaptive degree (proof needs d_max >= 4).
      beta: MAD adaptive threshold tau = rho + beta * sigma (beta >= 0; tau >= 1 is checked once
        rho and sigma are known).
      b_min, b_max: MAD2R round-2 minimum / maximum bias (b_min in [0.5, 1], b_max >= 1).
      c_lb, c_ub: MAD2R lower / upper confidence constants on round-1 weights (>= 0).
      budget_split: fractions of (epsilon, delta) per round for mad2r and dp_sips.
      accounting: 'gdp' (exact Gaussian-DP composition, default) or 'basic' (paper's split).
      alpha: policy algorithms' cutoff Gamma = rho + alpha * noise_scale (DPSU paper Algorithms 4 and
        6; default 5 as in its Table 2, the paper finds alpha in [2, 6] best). Any alpha >= 0 is private.
      passes: policy algorithms' passes over the users, each with 1/passes of every user's budget
        (DPSU paper section 6.2.1; default 1).
      max_sequential_pairs: policy algorithms fail, before gathering the user sets on one worker, if
        there are more (user, item) pairs after contribution bounding (default
        ``DEFAULT_MAX_SEQUENTIAL_PAIRS``).
    """

    epsilon: float
    delta: float
    max_contributions: int = 100
    d_max: int = 50
    beta: float = 2.0
    b_min: float = 0.5
    b_max: float = 2.0
    c_lb: float = 1.0
    c_ub: float = 3.0
    budget_split: Tuple[float, ...] = (0.1, 0.9)
    accounting: str = "gdp"
    alpha: float = 5.0
    passes: int = 1
    max_sequential_pairs: int = DEFAULT_MAX_SEQUENTIAL_PAIRS

    def __post_init__(self):
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass setter)
        budget = PrivacyBudget(self.epsilon, self.delta)
        s("epsilon", budget.epsilon)
        s("delta", budget.delta)
        s("max_contributions", check_int("max_contributions", self.max_contributions, 1, 10_000_000))
        s("d_max", check_int("d_max", self.d_max, 4))
        s("beta", check_range("beta", self.beta, 0.0, math.inf))
        s("b_min", check_range("b_min", self.b_min, 0.5, 1.0))
        s("b_max", check_range("b_max", self.b_max, 1.0, math.inf))
        s("c_lb", check_range("c_lb", self.c_lb, 0.0, math.inf))
        s("c_ub", check_range("c_ub", self.c_ub, 0.0, math.inf))
        s("budget_split", check_fractions("budget_split", self.budget_split))
        s("accounting", check_choice("accounting", self.accounting, ACCOUNTINGS))
        s("alpha", check_range("alpha", self.alpha, 0.0, math.inf))
        s("passes", check_int("passes", self.passes, 1, 100))
        s("max_sequential_pairs", check_int("max_sequential_pairs", self.max_sequential_pairs, 1))

    def replace(self, **changes) -> "SelectionParams":
        return dataclasses.replace(self, **changes)
