"""Parameters of the Bayesian DP n-gram distribution release (Bayesian DP paper, Alg. 1-2, sec. 4.2-4.3).

One frozen, self-validating dataclass (:class:`BayesianParams`); every error names the parameter, the
value given and what is allowed, like :mod:`privacy.params`; and the calibration of the default
mechanism's noisy counts (:func:`noisy_counts_plan`).

Mechanisms (:data:`MECHANISMS`; docs/bayesian_ngrams.md):

* ``bayesian`` (the default, issue 59): worst-case user-level (epsilon, delta)-DP. The clamped n-gram
  counts ``c`` (each user: <= C per n-gram, <= W in total) are released with exact discrete Gaussian noise
  calibrated to their l2 sensitivity (:func:`noisy_counts_plan`); the posterior, and the choice of the
  prior's weight (S, rho), are post-processing of those noisy counts and the public prior. The whole
  (epsilon, delta) goes to the counts; the choice costs nothing.
* ``bayesian_data_dependent``: the paper's mechanism (Algorithm 1, Algorithm 2 with ``tune``, the private
  choice of issue 33), whose noise and choice are calibrated to sensitivities computed from the private
  data: NOT worst-case DP (one outlier user is detectable). Opt-in only, with
  ``acknowledge_data_dependent=True``.
* ``laplace`` (sec. 4.2 baseline 1): worst-case pure epsilon-DP.
* ``laplace_public`` (sec. 4.2 baseline 2): its scale reads the private total: data-dependent, opt-in only
  with ``acknowledge_data_dependent=True``.

Budget of ``bayesian_data_dependent``. By default (neither ``S`` nor ``rho`` given, no ``tune``) a
fraction ``choice_epsilon_fraction`` (0.2) of epsilon pays for the private choice of the prior's weight
(issue 33: the generalized exponential mechanism over ``choice_S_grid`` x ``choice_rho_grid`` and the
public prior alone, pure epsilon; its sensitivities are data-dependent) and the rest, with all of delta,
for the Gaussian release; with both ``S`` and ``rho`` given the whole ``(epsilon, delta)`` goes to the
Gaussian release of Algorithm 1. With ``tune=True`` (Algorithm 2, section 4.3) a fraction
``tune_epsilon_fraction`` (paper: 1/3) of epsilon pays for the Laplace report-noisy-min over the (S, rho)
grid (pure epsilon, no delta) and the rest, with all of delta, pays for the Gaussian release. The total
is ``(epsilon, delta)`` by basic composition (the paper's ``(eps1 + eps2, delta)``). The default
``bayesian`` spends all of (epsilon, delta) on its noisy counts (:meth:`BayesianParams.budget`).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Optional, Tuple

from dp_partition_beam.privacy.calibration import analytic_gaussian_sigma
from dp_partition_beam.privacy.counts import (
    DELTA_SLACK,
    check_kernel_slack,
    discrete_gaussian_error_bound,
    discrete_gaussian_std,
    discrete_sigma2,
    kernel_tau2,
)
from dp_partition_beam.privacy.validation import (
    DELTA_RANGE,
    EPSILON_RANGE,
    check_choice,
    check_int,
    check_range,
    needs,
    use_table,
)

MECHANISMS = ("bayesian", "bayesian_data_dependent", "laplace", "laplace_public")
#: The mechanisms whose guarantee is data-dependent (NOT worst-case DP): they run only with
#: ``acknowledge_data_dependent=True``.
DATA_DEPENDENT = ("bayesian_data_dependent", "laplace_public")
SENSITIVITIES = ("brute_force", "bound")

#: Which :class:`BayesianParams` fields each mechanism reads (a field absent here is read by all: epsilon,
#: n, C, W). The Laplace baselines are pure epsilon-DP (no delta) and use neither the prior's posterior
#: (S, rho) nor a sensitivity method; ``tune`` (Algorithm 2) replaces S and rho by the grids. The CLI
#: rejects a flag given for a field the run does not read.
FIELD_USE = use_table(
    {
        "bayesian": ("delta", "S", "rho", "choice_S_grid", "choice_rho_grid"),
        "bayesian_data_dependent": (
            "acknowledge_data_dependent",
            "delta",
            "S",
            "rho",
            "sensitivity",
            "tune",
            "S_grid",
            "rho_grid",
            "tune_epsilon_fraction",
            "validation_fraction",
            "choice_S_grid",
            "choice_rho_grid",
            "choice_epsilon_fraction",
            "choice_beta",
        ),
        "laplace": (),
        "laplace_public": ("acknowledge_data_dependent",),
    },
    {
        "S": (needs("tune", False),),
        "rho": (needs("tune", False),),
        "S_grid": (needs("tune", True),),
        "rho_grid": (needs("tune", True),),
        "tune_epsilon_fraction": (needs("tune", True),),
        "validation_fraction": (needs("tune", True),),
        "choice_S_grid": (needs("tune", False),),
        "choice_rho_grid": (needs("tune", False),),
        "choice_epsilon_fraction": (needs("tune", False),),
        "choice_beta": (needs("tune", False),),
    },
)

# Paper section 4.3: S in [1e-3, 1e4] (log grid); rho in (0, 1].
DEFAULT_S_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)
DEFAULT_RHO_GRID = (0.1, 0.3, 0.5, 0.7, 0.9)

# The private choice's candidates (issue 33; docs/bayesian_ngrams.md "Choosing the prior's weight"): S as
# multiples of C (w = min(1, S N / C) depends on S / C), from leaning on the prior to trusting an n-gram
# held by 5 users; rho from 5% private weight to none on the prior. The public prior alone is always a
# candidate too.
DEFAULT_CHOICE_S_GRID = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2)
DEFAULT_CHOICE_RHO_GRID = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)


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
      S: decay hyperparameter of eq. 5, ``w = min(1, S*N/C)`` (paper's grid: [1e-3, 1e4]). None (the
        default): chosen privately with rho (:attr:`choose`); given alone, only rho is chosen.
      rho: posterior weight of the private counts, ``mu_ps = rho*w*x_hat + (1-rho)*mu_p``. None (the
        default): chosen privately; with both S and rho given the release is Algorithm 1 as printed.
      sensitivity: ``brute_force`` (Alg. 1, exact max over users) or ``bound`` (Claim 1, corrected).
      tune: private hyperparameter selection over ``S_grid`` x ``rho_grid`` (Alg. 2).
      tune_epsilon_fraction: share of epsilon spent on the selection (paper sec. 4.3: 1/3).
      validation_fraction: share of users scored in Alg. 2's first set (paper sec. 4.3: 10%).
      choice_S_grid, choice_rho_grid: the private choice's candidates (S as multiples of C); the public
        prior alone is always one more candidate.
      choice_epsilon_fraction: share of epsilon spent on the private choice (default 0.2).
      choice_beta: the generalized exponential mechanism's failure probability beta (default 0.1): a
        candidate beats the public prior only when its estimated gain exceeds about
        ``2 * ln(K / beta) / epsilon_choice`` times its score's sensitivity.
      acknowledge_data_dependent: must be True to run a mechanism of :data:`DATA_DEPENDENT`, whose
        guarantee is not worst-case DP.

    Which mechanism reads which field: :data:`FIELD_USE`. The default ``bayesian`` reads epsilon, delta,
    n, C, W, S, rho and the choice grids (its choice of S, rho is post-processing: no budget, no beta);
    ``sensitivity``, ``tune`` and its grids and fractions, ``choice_epsilon_fraction`` and
    ``choice_beta`` belong to ``bayesian_data_dependent``.
    """

    epsilon: float = _field(1.0, "total user-level epsilon, in (0, 100]")
    delta: float = _field(1e-5, "delta of the Gaussian release (unused by the Laplace baselines), in [1e-30, 0.5]")
    n: int = _field(3, "n-gram length (1..20)")
    C: int = _field(1, "max count of one n-gram per user (Alg. 1 line 2; paper: 1 below 1M users)")
    W: int = _field(100, "max total count per user over all n-grams (>= C)")
    S: Optional[float] = _field(None, "decay S of w = min(1, S*N/C) (eq. 5), > 0; default: chosen privately")
    rho: Optional[float] = _field(None, "posterior weight of the private counts, in (0, 1]; default: chosen privately")
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
    choice_S_grid: Tuple[float, ...] = _field(
        DEFAULT_CHOICE_S_GRID, "S candidates of the private choice, as multiples of C (comma-separated)"
    )
    choice_rho_grid: Tuple[float, ...] = _field(
        DEFAULT_CHOICE_RHO_GRID, "rho candidates of the private choice (comma-separated)"
    )
    choice_epsilon_fraction: float = _field(0.2, "share of epsilon spent on the private choice of S, rho, in (0, 1)")
    choice_beta: float = _field(0.1, "failure probability beta of the choice's generalized exponential mechanism")
    acknowledge_data_dependent: bool = _field(
        False,
        "run a data-dependent mechanism (bayesian_data_dependent, laplace_public): its guarantee is NOT "
        "worst-case (epsilon, delta)-DP; one outlier user can be detected (docs/bayesian_ngrams.md)",
    )

    def __post_init__(self):
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass setter)
        s("epsilon", check_range("epsilon", self.epsilon, *EPSILON_RANGE, lo_open=True))
        s("delta", check_range("delta", self.delta, *DELTA_RANGE))
        s("n", check_int("n", self.n, 1, 20))
        s("C", check_int("C", self.C, 1))
        s("W", check_int("W", self.W, 1))
        if self.W < self.C:
            raise ValueError(f"W (total count per user) must be >= C (count per n-gram), got W={self.W}, C={self.C}")
        if self.S is not None:
            s("S", check_range("S", self.S, 0.0, math.inf, lo_open=True))
        if self.rho is not None:
            s("rho", check_range("rho", self.rho, 0.0, 1.0, lo_open=True))
        if self.tune and (self.S is not None or self.rho is not None):
            raise ValueError("S and rho are chosen by tune (Algorithm 2): give S_grid and rho_grid instead")
        check_choice("sensitivity", self.sensitivity, SENSITIVITIES)
        if not isinstance(self.tune, bool):
            raise ValueError(f"tune must be True or False, got {self.tune!r}")
        if not isinstance(self.acknowledge_data_dependent, bool):
            raise ValueError(
                f"acknowledge_data_dependent must be True or False, got {self.acknowledge_data_dependent!r}"
            )
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
        s("choice_S_grid", _grid("choice_S_grid", self.choice_S_grid, 0.0, math.inf, lo_open=True))
        s("choice_rho_grid", _grid("choice_rho_grid", self.choice_rho_grid, 0.0, 1.0, lo_open=True))
        s(
            "choice_epsilon_fraction",
            check_range("choice_epsilon_fraction", self.choice_epsilon_fraction, 0.0, 1.0, lo_open=True, hi_open=True),
        )
        s("choice_beta", check_range("choice_beta", self.choice_beta, 0.0, 1.0, lo_open=True, hi_open=True))

    @property
    def choose(self) -> bool:
        """True when (S, rho) are chosen (no tune and S or rho not given): by post-processing for
        ``bayesian``, by the private choice of issue 33 for ``bayesian_data_dependent``."""
        return not self.tune and (self.S is None or self.rho is None)

    @property
    def epsilon_choice(self) -> float:
        """Epsilon of ``bayesian_data_dependent``'s private choice of (S, rho); 0 unless :attr:`choose`
        (the default ``bayesian`` spends none: :meth:`budget`)."""
        return self.epsilon * self.choice_epsilon_fraction if self.choose else 0.0

    @property
    def epsilon_tune(self) -> float:
        """Epsilon of the report-noisy-min (Alg. 2's Laplace scores); 0 without tuning."""
        return self.epsilon * self.tune_epsilon_fraction if self.tune else 0.0

    @property
    def epsilon_release(self) -> float:
        """Epsilon of the final release (Gaussian of Alg. 1 or the Laplace baselines)."""
        return self.epsilon - self.epsilon_tune - self.epsilon_choice

    def budget(self, mechanism: str) -> dict:
        """How ``epsilon`` is split for ``mechanism``: ``epsilon_choice`` (the private choice of S, rho),
        ``epsilon_tune`` (Algorithm 2) and ``epsilon_release`` (the release itself). Only
        ``bayesian_data_dependent`` splits it: the default ``bayesian`` chooses S, rho by post-processing
        (all of epsilon and delta go to its noisy counts) and the Laplace baselines have neither S nor rho."""
        if mechanism != "bayesian_data_dependent":
            return {"epsilon_choice": 0.0, "epsilon_tune": 0.0, "epsilon_release": self.epsilon}
        return {
            "epsilon_choice": self.epsilon_choice,
            "epsilon_tune": self.epsilon_tune,
            "epsilon_release": self.epsilon_release,
        }

    @property
    def grid(self) -> Tuple[Tuple[float, float], ...]:
        """The (S, rho) candidates: the grid with tuning, the choice's grid (S given or ``choice_S_grid``
        times C, rho given or ``choice_rho_grid``) when choosing, else the single (S, rho)."""
        if self.tune:
            return tuple((S, r) for S in self.S_grid for r in self.rho_grid)
        if self.choose:
            S_values = (self.S,) if self.S is not None else tuple(v * self.C for v in self.choice_S_grid)
            rhos = (self.rho,) if self.rho is not None else self.choice_rho_grid
            return tuple((S, r) for S in S_values for r in rhos)
        return ((self.S, self.rho),)

    @property
    def S_values(self) -> Tuple[float, ...]:
        """Distinct S values whose sensitivity is needed (the brute force runs once per S)."""
        if self.tune:
            return self.S_grid
        return tuple(dict.fromkeys(S for S, _ in self.grid))

    def replace(self, **changes) -> "BayesianParams":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["S_grid"] = list(self.S_grid)
        d["rho_grid"] = list(self.rho_grid)
        d["choice_S_grid"] = list(self.choice_S_grid)
        d["choice_rho_grid"] = list(self.choice_rho_grid)
        return d


def check_mechanism(algorithm: str, params: BayesianParams) -> str:
    """Validates the mechanism and its parameters together (``tune`` is Algorithm 2 of the paper's
    mechanism, ``bayesian_data_dependent``, only; a mechanism of :data:`DATA_DEPENDENT` needs
    ``acknowledge_data_dependent=True``); returns ``algorithm``. Raises ``ValueError`` naming the parameter."""
    check_choice("algorithm", algorithm, MECHANISMS)
    if not isinstance(params, BayesianParams):
        raise TypeError(f"params must be a BayesianParams, got {type(params).__name__}")
    if params.tune and algorithm != "bayesian_data_dependent":
        raise ValueError(f"tune applies to mechanism 'bayesian_data_dependent' only, got {algorithm!r}")
    if algorithm in DATA_DEPENDENT and not params.acknowledge_data_dependent:
        raise ValueError(
            f"mechanism {algorithm!r} calibrates to a data-dependent sensitivity: NOT worst-case (epsilon, "
            "delta)-DP, one outlier user can be detected (docs/bayesian_ngrams.md). Pass "
            "acknowledge_data_dependent=True (--acknowledge_data_dependent) to run it, or use the default "
            "'bayesian' (worst-case DP)"
        )
    if algorithm not in DATA_DEPENDENT and params.acknowledge_data_dependent:
        raise ValueError(
            f"acknowledge_data_dependent applies to {' and '.join(DATA_DEPENDENT)} only, got {algorithm!r}"
        )
    return algorithm


# --------------------------------------------------------------------------------------------------
# The default mechanism's noisy counts (docs/bayesian_ngrams.md, "The default: noisy counts")
# --------------------------------------------------------------------------------------------------


def count_l2_sensitivity(C: int, W: int) -> float:
    """l2 sensitivity of the clamped count vector ``c`` under adding or removing one user: the user's
    vector has integer entries in [0, C] summing to at most W, so its squared l2 norm is at most
    ``q C^2 + r^2`` with ``q, r = divmod(W, C)`` (the norm of a vector in that box is largest at a vertex
    that puts C on as many coordinates as W allows)."""
    q, r = divmod(int(W), int(C))
    return math.sqrt(q * C * C + r * r)


@dataclasses.dataclass(frozen=True)
class NoisyCountsPlan:
    """The default mechanism's count release: ``c_i + X_i``, ``X_i ~ N_Z(0, sigma2)`` per public n-gram.

    Attributes:
      sigma2: the discrete Gaussian's ``sigma^2`` (an exact rational, the sampler's parameter).
      noise_scale: ``sqrt(sigma2)``.
      sigma_continuous: ``sigma_1``, the analytic Gaussian mechanism's sigma for (epsilon, delta') at
        l2 sensitivity ``l2_sensitivity`` (``delta' = delta (1 - DELTA_SLACK)``).
      tau2: the kernel lemma's extra variance (``sigma2 = sigma_1^2 + tau2``, rounded up).
      l2_sensitivity: :func:`count_l2_sensitivity` (C, W).
      l0: coordinates one user can change (<= W: its distinct n-grams, each counted at least once).
      epsilon, delta: the release's budget (all of it).
    """

    sigma2: Fraction
    noise_scale: float
    sigma_continuous: float
    tau2: Fraction
    l2_sensitivity: float
    l0: int
    epsilon: float
    delta: float

    def as_report(self) -> dict:
        return {
            "noise": "discrete_gaussian",
            "count_noise_scale": self.noise_scale,
            "count_noise_std": discrete_gaussian_std(self.sigma2),
            "count_error_bound_95": discrete_gaussian_error_bound(self.sigma2, 0.95),
            "sigma2": f"{self.sigma2.numerator}/{self.sigma2.denominator}",
            "sigma_continuous": self.sigma_continuous,
            "kernel_tau2": float(self.tau2),
            "l2_sensitivity": self.l2_sensitivity,
            "l0_sensitivity": self.l0,
        }


def noisy_counts_plan(params: BayesianParams) -> NoisyCountsPlan:
    """Calibrates the default mechanism's count noise to (epsilon, delta) (docs/bayesian_ngrams.md, the
    proof). The continuous Gaussian ``N(0, sigma_1^2)`` on a query of l2 sensitivity ``D`` is
    (epsilon, delta')-DP for the analytic Gaussian mechanism's ``sigma_1`` (Balle & Wang 2018); the
    discrete Gaussian of ``sigma_1^2 + tau^2`` is, coordinate by coordinate, within ``e^{+-gamma}`` of a
    post-processing of it (the kernel lemma of :mod:`privacy.counts`, for any integer centre), and at most
    ``l0`` coordinates differ between neighbours, so its hockey-stick divergence exceeds delta' by at most
    the slack :func:`privacy.counts.check_kernel_slack` verifies fits in ``DELTA_SLACK * delta``."""
    D = count_l2_sensitivity(params.C, params.W)
    l0 = int(params.W)
    delta = params.delta
    sigma_1 = analytic_gaussian_sigma(params.epsilon, delta * (1.0 - DELTA_SLACK), D)
    tau2 = kernel_tau2(l0, delta)
    check_kernel_slack(l0, delta, tau2)
    sigma2 = discrete_sigma2(sigma_1, tau2)
    return NoisyCountsPlan(
        sigma2=sigma2,
        noise_scale=math.sqrt(float(sigma2)),
        sigma_continuous=float(sigma_1),
        tau2=tau2,
        l2_sensitivity=D,
        l0=l0,
        epsilon=params.epsilon,
        delta=delta,
    )
