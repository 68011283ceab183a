"""Shared validators of every parameter class (frozen dataclasses of privacy/selection.py, dpne.py,
bayesian.py) and of the kernels' entry points.

Every check raises ``ValueError`` naming the parameter, the value given and the allowed range, e.g.
``epsilon must be in (0, 100], got -1.0``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

# Ranges over which privacy/calibration.py is tested to be numerically sound.
EPSILON_RANGE = (0.0, 100.0)
DELTA_RANGE = (1e-30, 0.5)


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
    if (
        isinstance(value, bool)
        or not isinstance(value, (int,))
        and not (isinstance(value, float) and value.is_integer())
    ):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return v


def check_bool(name: str, value: Any) -> bool:
    """Validates a flag: ``True`` or ``False`` (not a string, not a number)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


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


def set_fields(obj, **values) -> None:
    """Sets fields of a frozen dataclass from its ``__post_init__`` (validated values)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------------------------------
# Which parameters an algorithm reads
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Condition:
    """A setting a parameter needs besides the algorithm, e.g. ``count_budget`` needs ``release_counts``.

    Attributes:
      unmet: how the setting reads when it does not hold, after "<parameter> is not used by <algorithm>";
        ``{name}`` stands for the parameter ``name`` (the CLI writes ``--name``), e.g. "without {release_counts}".
      holds: the test, on any object with the parameters as attributes (the parameter dataclass or the
        parsed flags; None is an unset optional parameter).
      example: parameter values under which it holds (the tests and the template checks set them).
    """

    unmet: str
    holds: Callable[[Any], bool]
    example: Tuple[Tuple[str, Any], ...] = ()


def needs(name: str, value: Any, unmet: Optional[str] = None) -> Condition:
    """The condition ``<name> == value``: "without {name}" for True, "with {name}" for False, else
    "unless {name} is <value>"."""
    if unmet is None:
        if value is True:
            unmet = f"without {{{name}}}"
        elif value is False:
            unmet = f"with {{{name}}}"
        else:
            unmet = f"unless {{{name}}} is {value}"
    return Condition(unmet, lambda values: getattr(values, name) == value, ((name, value),))


@dataclasses.dataclass(frozen=True)
class ParamUse:
    """When an algorithm reads a parameter: ``algorithms`` (None: every one) and ``conditions`` (all must
    hold). A parameter absent from a family's table is read by every algorithm, always."""

    algorithms: Optional[Tuple[str, ...]] = None
    conditions: Tuple[Condition, ...] = ()

    def unmet(self, values) -> Optional[Condition]:
        """The first condition that does not hold under ``values`` (None: all hold)."""
        return next((c for c in self.conditions if not c.holds(values)), None)

    def used(self, algorithm: str, values) -> bool:
        """Whether ``algorithm`` reads the parameter under ``values``."""
        return (self.algorithms is None or algorithm in self.algorithms) and self.unmet(values) is None


def use_table(
    options: Mapping[str, Sequence[str]], conditions: Mapping[str, Sequence[Condition]] = ()
) -> Dict[str, ParamUse]:
    """A family's table from ``options`` (algorithm -> the parameters only some algorithms read) and
    ``conditions`` (parameter -> the settings it needs)."""
    conditions = dict(conditions)
    names = {n for fields in options.values() for n in fields} | set(conditions)
    table = {}
    for name in sorted(names):
        users = tuple(a for a, fields in options.items() if name in fields)
        table[name] = ParamUse(users or None, tuple(conditions.get(name, ())))
    return table
