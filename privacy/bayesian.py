"""Parameters of the Bayesian DP n-gram distribution release (Bayesian DP paper, Alg. 1-2, sec. 4.2-4.3).

One frozen, self-validating dataclass (:class:`BayesianParams`); every error names the parameter, the
value given and what is allowed, like :mod:`privacy.params`.

Budget (Algorithm 2, section 4.3): without tuning the whole ``(epsilon, delta)`` goes to the Gaussian
release of Algorithm 1. With ``tune=True`` a fraction ``tune_epsilon_fraction`` (paper: 1/3) of epsilon
pays for the Laplace report-noisy-min over the (S, rho) grid (pure epsilon, no delta) and the rest,
with all of delta, pays for the Gaussian release; the total is ``(epsilon, delta)`` by basic
composition (the paper's ``(eps1 + eps2, delta)``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Tuple

from dp_partition_beam.privacy.validation import (
    DELTA_RANGE,
    EPSILON_RANGE,
    check_choice,
    check_int,
    check_range,
    needs,
    use_table,
)

MECHANISMS = ("bayesian", "laplace", "laplace_public")
SENSITIVITIES = ("brute_force", "bound")

#: Which :class:`BayesianParams` fields each mechanism reads (a field absent here is read by all: epsilon,
#: n, C, W). The Laplace baselines are pure epsilon-DP (no delta) and use neither the prior's posterior
#: (S, rho) nor a sensitivity method; ``tune`` (Algorithm 2) replaces S and rho by the grids. The CLI
#: rejects a flag given for a field the run does not read.
FIELD_USE = use_table(
    {
        "bayesian": (
            "delta",
            "S",
            "rho",
            "sensitivity",
            "tune",
            "S_grid",
            "rho_grid",
            "tune_epsilon_fraction",
            "validation_fraction",
        ),
        "laplace": (),
        "laplace_public": (),
    },
    {
        "S": (needs("tune", False),),
        "rho": (needs("tune", False),),
        "S_grid": (needs("tune", True),),
        "rho_grid": (needs("tune", True),),
        "tune_epsilon_fraction": (needs("tune", True),),
        "validation_fraction": (needs("tune", True),),
    },
)

# Paper section 4.3: S in [1e-3, 1e4] (log grid); rho in (0, 1].
DEFAULT_S_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)
DEFAULT_RHO_GRID = (0.1, 0.3, 0.5, 0.7, 0.9)


def _field(default, help: str, choices=None):
    """A dataclass field whose help text (and choices) the CLI flags and the report share."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def _grid(name: str, values, lo: float, hi: float, lo_open: bool) -> Tuple[float, ...]:
    try:
        vals = tuple(values)
    except TypeError:
        raise ValueError(f"{name} must be a non-empty list of numbers, got {values!r}") from None
    if not vals:
        raise ValueError(f"{name} must be a non-empty list of numbers, got {values!r}")
    out = tuple(check_range(f"{name} entry", v, lo, hi, lo_open=lo_open) for v in vals)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat values, got {values!r}")
    return out


@dataclasses.dataclass(frozen=True)
class BayesianParams:
    """Parameters of one release (validated on construction; each field's help text is in its
    ``metadata["help"]``, from which the CLI flags are generated). The mechanism itself
    (:data:`MECHANISMS`: ``bayesian``, Alg. 1, or Alg. 2 with ``tune``; ``laplace``, sec. 4.2 baseline
    1; ``laplace_public``, sec. 4.2 baseline 2) is the first argument of :class:`transforms.BayesianNgrams` and of
    :func:`transforms.reference.bayesian_release`; :func:`check_mechanism` validates the pair.

    Attributes:
      epsilon, delta: total user-level privacy budget of the release (delta unused by the Laplace
        baselines, which are pure epsilon-DP).
      n: n-gram length (paper: trigrams).
      C: maximum count of one n-gram per user (Alg. 1 line 2; paper sec. 4.3: 1 below 1M users).
      W: maximum total count per user over all n-grams (sec. 4.2 baseline 1 and sec. 4.3, which use
        |U|/1000; a data-independent constant here). Applied to every mechanism.
      S: decay hyperparameter of eq. 5, ``w = min(1, S*N/C)`` (paper's grid: [1e-3, 1e4]). Default
        1e-3 with rho = 0.1, chosen on the bundled sample (docs/bayesian_ngrams.md); use ``tune``
        to choose privately.
      rho: posterior weight of the private counts, ``mu_ps = rho*w*x_hat + (1-rho)*mu_p``.
      sensitivity: ``brute_force`` (Alg. 1, exact max over users) or ``bound`` (Claim 1, corrected).
      tune: private hyperparameter selection over ``S_grid`` x ``rho_grid`` (Alg. 2).
      tune_epsilon_fraction: share of epsilon spent on the selection (paper sec. 4.3: 1/3).
      validation_fraction: share of users scored in Alg. 2's first set (paper sec. 4.3: 10%).
    """

    epsilon: float = _field(1.0, "total user-level epsilon, in (0, 100]")
    delta: float = _field(1e-5, "delta of the Gaussian release (unused by the Laplace baselines), in [1e-30, 0.5]")
    n: int = _field(3, "n-gram length (1..20)")
    C: int = _field(1, "max count of one n-gram per user (Alg. 1 line 2; paper: 1 below 1M users)")
    W: int = _field(100, "max total count per user over all n-grams (>= C)")
    S: float = _field(1e-3, "decay S of w = min(1, S*N/C) (eq. 5), > 0")
    rho: float = _field(0.1, "posterior weight of the private counts, in (0, 1]")
    sensitivity: str = _field(
        "brute_force",
        "brute_force (exact max over users) or bound (Claim 1, corrected); both data-dependent",
        SENSITIVITIES,
    )
    tune: bool = _field(False, "choose (S, rho) privately on S_grid x rho_grid (Algorithm 2) instead of S, rho")
    S_grid: Tuple[float, ...] = _field(DEFAULT_S_GRID, "S candidates of tune (comma-separated)")
    rho_grid: Tuple[float, ...] = _field(DEFAULT_RHO_GRID, "rho candidates of tune (comma-separated)")
    tune_epsilon_fraction: float = _field(1.0 / 3.0, "share of epsilon spent on tuning, in (0, 1) (paper: 1/3)")
    validation_fraction: float = _field(0.1, "share of users in the scoring set of Algorithm 2, in (0, 1) (paper: 0.1)")

    def __post_init__(self):
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass setter)
        s("epsilon", check_range("epsilon", self.epsilon, *EPSILON_RANGE, lo_open=True))
        s("delta", check_range("delta", self.delta, *DELTA_RANGE))
        s("n", check_int("n", self.n, 1, 20))
        s("C", check_int("C", self.C, 1))
        s("W", check_int("W", self.W, 1))
        if self.W < self.C:
            raise ValueError(f"W (total count per user) must be >= C (count per n-gram), got W={self.W}, C={self.C}")
        s("S", check_range("S", self.S, 0.0, math.inf, lo_open=True))
        s("rho", check_range("rho", self.rho, 0.0, 1.0, lo_open=True))
        check_choice("sensitivity", self.sensitivity, SENSITIVITIES)
        if not isinstance(self.tune, bool):
            raise ValueError(f"tune must be True or False, got {self.tune!r}")
        s("S_grid", _grid("S_grid", self.S_grid, 0.0, math.inf, lo_open=True))
        s("rho_grid", _grid("rho_grid", self.rho_grid, 0.0, 1.0, lo_open=True))
        s(
            "tune_epsilon_fraction",
            check_range("tune_epsilon_fraction", self.tune_epsilon_fraction, 0.0, 1.0, lo_open=True, hi_open=True),
        )
        s(
            "validation_fraction",
            check_range("validation_fraction", self.validation_fraction, 0.0, 1.0, lo_open=True, hi_open=True),
        )

    @property
    def epsilon_tune(self) -> float:
        """Epsilon of the report-noisy-min (Alg. 2's Laplace scores); 0 without tuning."""
        return self.epsilon * self.tune_epsilon_fraction if self.tune else 0.0

    @property
    def epsilon_release(self) -> float:
        """Epsilon of the final release (Gaussian of Alg. 1 or the Laplace baselines)."""
        return self.epsilon - self.epsilon_tune

    @property
    def grid(self) -> Tuple[Tuple[float, float], ...]:
        """The (S, rho) candidates: the grid with tuning, else the single (S, rho)."""
        if self.tune:
            return tuple((S, r) for S in self.S_grid for r in self.rho_grid)
        return ((self.S, self.rho),)

    @property
    def S_values(self) -> Tuple[float, ...]:
        """Distinct S values whose sensitivity is needed (the brute force runs once per S)."""
        return self.S_grid if self.tune else (self.S,)

    def replace(self, **changes) -> "BayesianParams":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["S_grid"] = list(self.S_grid)
        d["rho_grid"] = list(self.rho_grid)
        return d


def check_mechanism(algorithm: str, params: BayesianParams) -> str:
    """Validates the mechanism and its parameters together (``tune`` is Algorithm 2 of the Bayesian
    mechanism only); returns ``algorithm``. Raises ``ValueError`` naming the parameter."""
    check_choice("algorithm", algorithm, MECHANISMS)
    if not isinstance(params, BayesianParams):
        raise TypeError(f"params must be a BayesianParams, got {type(params).__name__}")
    if params.tune and algorithm != "bayesian":
        raise ValueError(f"tune applies to mechanism 'bayesian' only, got {algorithm!r}")
    return algorithm
