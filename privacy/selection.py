"""Partition selection: the parameters, the algorithm registry and the per-round calibration plans.

Everything here is pure math, fixed before any data is read. :class:`SelectionParams` holds the user's
choices (validated on construction); :data:`ALGORITHMS` is the one table of the selection algorithms
(the CLI's ``--algorithm`` choices, the report, the template metadata, the audit cases and the docs
table are generated from it or checked against it); :func:`plan` turns an algorithm and its
parameters, once, into a :class:`SelectionPlan` (resolved parameters, calibrated rounds, the count
release's and the adaptive cap's plans) that the Beam transform
(:class:`transforms.selection.select.SelectPartitions`), the in-memory reference
(:func:`transforms.reference.select`) and the report all read (:func:`plan_rounds`, :func:`plan_counts`,
:func:`plan_cap` are its parts).

Rounds per algorithm (the ``shape`` of its :class:`AlgorithmSpec`):

  basic            weighted Gaussian (1/sqrt(d)), 1 round   (MAD paper Alg. 1; DPSU paper B.2)
  weighted_laplace 1/d weights, Laplace, 1 round            (DPSU paper B.1, Theorem B.1)
  count_gaussian   +1 per item, l2 sensitivity sqrt(Delta_0) (DPSU paper section 1.1)
  count_laplace    +1 per item, l1 sensitivity Delta_0       (DPSU paper section 1.1, [KKMN09])
  mad              MAD weights, 1 round, tau = rho + beta*sigma (MAD paper Alg. 3, Cor. 5.2)
  mad2r            2 rounds (MAD paper Alg. 4); round 2 uses h(t) = min(b_max/sqrt(t), 1)
  dp_sips          len(budget_split) rounds of Basic (DP-SIPS, MAD paper sec. 1.3)
  mad_sips         len(budget_split) rounds of MAD; released items removed and the remaining sets
                   re-subsampled every round (as DP-SIPS), hopeless items dropped and the rest biased from
                   the previous round's noisy weights (as MAD2R round 2); h(t) = min(b_max/sqrt(t), 1)
                   from round 2
                   (docs/mad_sips.md)
  policy_laplace   l1-descent histogram, Laplace, 1 round  (DPSU paper Alg. 3-4, Theorem 4.1)
  policy_gaussian  l2-descent histogram, Gaussian, 1 round (DPSU paper Alg. 5-6, Theorem 5.1)

Multi-round accounting (``params.accounting``) is implemented in
:func:`privacy.accounting.multi_round_calibration`; see its module docstring for the proof.
Defaults are those of the MAD paper's experiments (section 7): Delta_0 = 100, d_max = 50, beta = 2,
b_min = 0.5, b_max = 2, C_lb = 1, C_ub = 3, budget split [0.1, 0.9]; MAD-SIPS's own are C_ub = 1.5 and
budget split [0.03, 0.07, 0.9] (``budget_split`` and ``c_ub`` left at None take the algorithm's default:
:func:`resolve_params`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple, Union

import numpy as np

from dp_partition_beam.privacy import accounting, calibration, counts, l2_rule, thresholding
from dp_partition_beam.privacy import cap as cap_plans
from dp_partition_beam.privacy.validation import (
    Condition,
    PrivacyBudget,
    check_bool,
    check_choice,
    check_fractions,
    check_int,
    check_range,
    needs,
    set_fields,
    use_table,
)

__all__ = [
    "AlgorithmSpec",
    "ALGORITHMS",
    "SEQUENTIAL_ALGORITHMS",
    "SHAPES",
    "MULTI_ROUND_SHAPES",
    "SelectionPlan",
    "plan",
    "ACCOUNTINGS",
    "THRESHOLDS",
    "DEFAULT_MAX_SEQUENTIAL_PAIRS",
    "SelectionParams",
    "RoundPlan",
    "plan_rounds",
    "plan_counts",
    "plan_cap",
    "resolve_params",
    "default_cap_quantile",
    "default_weight_cap",
    "ALGORITHM_DEFAULTS",
    "FIELD_USE",
]

# --------------------------------------------------------------------------------------------------
# The algorithm registry
# --------------------------------------------------------------------------------------------------

#: How an algorithm's rounds are executed (the Beam transform and the reference each have one runner
#: per shape): one weight-and-threshold round, DP-SIPS's rounds of Basic with removal and
#: re-subsampling, MAD2R's two rounds with biases, MAD-SIPS's rounds of biased MAD with removal and
#: re-subsampling (docs/mad_sips.md), or the sequential single-worker policy histogram.
SHAPES = ("single", "dp_sips", "mad2r", "mad_sips", "sequential")

#: the shapes whose Gaussian rounds are calibrated together by privacy.accounting.multi_round_calibration
MULTI_ROUND_SHAPES = ("dp_sips", "mad2r", "mad_sips")


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """One selection algorithm.

    Attributes:
      name: the ``--algorithm`` value.
      shape: one of :data:`SHAPES`.
      weighting: the per-user weighting of its rounds: 'weighted_gaussian', 'weighted_laplace' and
        'count' (:mod:`transforms.selection.basic_kernels`), 'mad' (:mod:`transforms.selection.mad_kernels`),
        'l2_descent' / 'l1_descent' (:mod:`transforms.selection.policy_kernels`).
      calibration: the one-round calibration (``privacy.calibration.calibrate_<calibration>``):
        'weighted_gaussian', 'weighted_laplace', 'count_gaussian' or 'count_laplace'. Multi-round
        shapes calibrate their Gaussian rounds with :func:`privacy.accounting.multi_round_calibration`.
      h: the novel-item sensitivity bound h(t) of the threshold, as printed in the report.
      summary: one line for --help, the report and the docs table.
      paper: where the algorithm is described.
      options: the :class:`SelectionParams` fields it reads besides epsilon, delta and max_contributions.
      audit_holders: the number k of users holding the target in D of its empirical privacy audit's
        ``tip`` case (:mod:`transforms.testing.audit`; chosen from this plan with
        ``benchmarks/privacy_audit.py --design NAME/tip`` so the event sits in the noise tail).
      defaults: ``(field, value)`` pairs for the :class:`SelectionParams` fields left at None
        (``budget_split``, ``c_ub``) that differ from :data:`ALGORITHM_DEFAULTS` for this algorithm.
    """

    name: str
    shape: str
    weighting: str
    calibration: str
    h: str
    summary: str
    paper: str
    options: Tuple[str, ...] = ()
    audit_holders: int = 4
    defaults: Tuple[Tuple[str, object], ...] = ()

    def __post_init__(self):
        check_choice("shape", self.shape, SHAPES)

    @property
    def sequential(self) -> bool:
        return self.shape == "sequential"


#: the options MAD2R and MAD-SIPS share: MAD's, the biases' and the rounds' (MAD-SIPS adds its adaptive cap)
_MAD_ROUNDS_OPTIONS = (
    "d_max",
    "beta",
    "b_min",
    "b_max",
    "c_lb",
    "c_ub",
    "budget_split",
    "accounting",
    "threshold",
    "weight_cap",
)

ALGORITHMS: Dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            "basic",
            "single",
            "weighted_gaussian",
            "weighted_gaussian",
            "1/sqrt(t)",
            "weighted Gaussian: each user adds 1/sqrt(d) to its d items",
            "MAD paper Alg. 1; DPSU B.2",
            ("threshold",),
        ),
        AlgorithmSpec(
            "weighted_laplace",
            "single",
            "weighted_laplace",
            "weighted_laplace",
            "1/t",
            "each user adds 1/d to its d items, Laplace noise",
            "DPSU paper Alg. 7, Thm. B.1",
            ("threshold",),
            defaults=(("threshold", "optimal"),),  # the l1 keep curve (docs/thresholding.md, "The l1 curve")
        ),
        AlgorithmSpec(
            "count_gaussian",
            "single",
            "count",
            "count_gaussian",
            "1",
            "+1 per item, Gaussian noise of l2 sensitivity sqrt(Delta_0)",
            "DPSU paper sec. 1.1",
            ("threshold",),
            # a keep table over counts read as n contributions 1/sqrt(Delta_0) (docs/thresholding.md, Defaults)
            defaults=(("threshold", "optimal"),),
        ),
        AlgorithmSpec(
            "count_laplace",
            "single",
            "count",
            "count_laplace",
            "1",
            "+1 per item, Laplace noise of l1 sensitivity Delta_0",
            "DPSU paper sec. 1.1",
            ("threshold",),
            defaults=(("threshold", "optimal"),),  # the l1 keep curve (docs/thresholding.md, "The l1 curve")
        ),
        AlgorithmSpec(
            "mad",
            "single",
            "mad",
            "weighted_gaussian",
            "1/sqrt(t)",
            "MaxAdaptiveDegree: excess weight of heavy items rerouted to the users' other items",
            "MAD paper Alg. 3",
            ("d_max", "beta", "threshold"),
            # the l2 keep rule (docs/thresholding.md, "The l2 rule"): its change has l2 norm <= 1 (Lemma 5.6)
            defaults=(("threshold", "optimal"),),
        ),
        AlgorithmSpec(
            "mad2r",
            "mad2r",
            "mad",
            "weighted_gaussian",
            "1/sqrt(t); min(b_max/sqrt(t), 1)",
            "MAD in two rounds; round 2 drops found and hopeless items and biases the rest",
            "MAD paper Alg. 4",
            _MAD_ROUNDS_OPTIONS,
            # round 2 as a keep table (docs/thresholding.md, Defaults): +12-20% items at epsilon 1
            defaults=(("threshold", "optimal"),),
        ),
        AlgorithmSpec(
            "dp_sips",
            "dp_sips",
            "weighted_gaussian",
            "weighted_gaussian",
            "1/sqrt(t)",
            "rounds of Basic; released items removed and sets re-subsampled each round",
            "MAD paper sec. 1.3, 7.2",
            ("budget_split", "accounting", "threshold"),
            # the last round as a keep table (docs/thresholding.md, Defaults): +11-22% items at epsilon 1
            defaults=(("threshold", "optimal"),),
        ),
        AlgorithmSpec(
            "mad_sips",
            "mad_sips",
            "mad",
            "weighted_gaussian",
            "1/sqrt(t); min(b_max/sqrt(t), 1)",
            "rounds of MAD; found items removed, sets re-subsampled, hopeless items dropped and the rest "
            "biased from the previous round's noisy weights",
            "docs/mad_sips.md (MAD paper Alg. 3-4 + DP-SIPS)",
            (*_MAD_ROUNDS_OPTIONS, "cap_quantile", "cap_budget"),
            defaults=(  # docs/mad_sips.md, Defaults
                ("budget_split", (0.03, 0.07, 0.9)),
                ("c_ub", 1.5),
                # the adaptive cap serves the Gaussian rounds; with the keep table (the default) it is off:
                # resolve_params (docs/mad_sips.md, "Adaptive cap")
                ("cap_quantile", cap_plans.DEFAULT_CAP_QUANTILE),
                # the last round as a keep table (docs/mad_sips.md): +3-21% items (+11% with counts on retail)
                ("threshold", "optimal"),
            ),
        ),
        AlgorithmSpec(
            "policy_gaussian",
            "sequential",
            "l2_descent",
            "weighted_gaussian",
            "1/sqrt(t)",
            "sequential l2-descent toward the cutoff Gamma (one worker)",
            "DPSU paper Alg. 5-6",
            ("alpha", "passes", "max_sequential_pairs", "threshold"),
            # the l2 keep rule for real-valued shifts (docs/thresholding.md, "The l2 rule: Policy Gaussian")
            defaults=(("threshold", "optimal"),),
        ),
        AlgorithmSpec(
            "policy_laplace",
            "sequential",
            "l1_descent",
            "weighted_laplace",
            "1/t",
            "sequential l1-descent toward the cutoff Gamma (one worker)",
            "DPSU paper Alg. 3-4",
            ("alpha", "passes", "max_sequential_pairs", "threshold"),
            defaults=(("threshold", "optimal"),),  # the l1 keep curve (docs/thresholding.md, "The l1 curve")
        ),
    )
}

#: the sequential (single-worker) algorithms of the DP set union paper (Algorithms 4 and 6)
SEQUENTIAL_ALGORITHMS = tuple(name for name, spec in ALGORITHMS.items() if spec.sequential)


def _adaptive_cap_on(values) -> bool:
    """mad_sips's adaptive cap is on: cap_quantile below 1 with gdp accounting; unset, only with the Gaussian
    last round (``threshold='gaussian'``; :func:`resolve_params`)."""
    q = values.cap_quantile
    if q is None:
        q = default_cap_quantile("mad_sips", values.threshold)
    return values.accounting == "gdp" and q < 1.0


def _histogram_used(values) -> bool:
    """mad_sips computes the degree histogram: the adaptive cap (:func:`_adaptive_cap_on`) or weight_cap auto
    (given, or unset with a keep-table last round: :func:`default_weight_cap`)."""
    weight_cap = values.weight_cap
    if weight_cap is None:
        return _adaptive_cap_on(values) or _table_round_on(values)
    return _adaptive_cap_on(values) or str(weight_cap).strip().lower() == AUTO_WEIGHT_CAP


def _table_round_on(values) -> bool:
    """mad2r's and mad_sips's last round is a keep table: threshold 'optimal', or unset with gdp accounting
    (:func:`resolve_params`)."""
    return values.threshold == "optimal" or (values.threshold is None and values.accounting == "gdp")


def default_cap_quantile(algorithm: str, threshold: Optional[str]) -> float:
    """An unset ``cap_quantile`` under gdp accounting: the algorithm's (mad_sips 0.98) with a Gaussian last
    round, 1 (no adaptive cap) with a keep table (``threshold`` 'optimal' or unset, which resolves to it where
    the algorithm's default is the table). The table's W50 does not depend on the cap, so the degree histogram
    (1% of the budget) only serves the earlier rounds; without it MAD-SIPS releases 0-1.5% more on every
    corpus measured (docs/mad_sips.md, "Adaptive cap")."""
    defaults = _algorithm_defaults(algorithm_spec(algorithm))
    table = (threshold or defaults["threshold"]) == "optimal"
    return 1.0 if table else defaults["cap_quantile"]


def default_weight_cap(spec: AlgorithmSpec, threshold: str) -> Union[float, str]:
    """An unset ``weight_cap`` (``threshold`` resolved): 'auto' for mad_sips with its keep-table last round
    (``threshold='optimal'``), 1 (no cap) otherwise. Where users hold many items the chosen cap releases
    5-29% more; where they hold few the choice is 1 and the histogram's share (0.2% of mu^2) costs 0.0-0.1%
    (docs/mad_sips.md, "Automatic weight cap")."""
    return AUTO_WEIGHT_CAP if spec.shape == "mad_sips" and threshold == "optimal" else 1.0


def _algorithm_defaults(spec: AlgorithmSpec) -> dict:
    """:data:`ALGORITHM_DEFAULTS` overridden by ``spec.defaults`` (before the accounting's adjustments)."""
    return {**ALGORITHM_DEFAULTS, "threshold": noise_rule(spec), **dict(spec.defaults)}


def noise_rule(spec: AlgorithmSpec) -> str:
    """The ``threshold`` value naming an algorithm's own noise + threshold rho: 'laplace' for the l1 weightings
    (weighted_laplace, count_laplace, policy_laplace), 'gaussian' for the others."""
    return "laplace" if spec.calibration in L1_CALIBRATIONS else "gaussian"


#: Which :class:`SelectionParams` fields each algorithm reads: those of its ``AlgorithmSpec.options``
#: (a field no algorithm lists is read by all: epsilon, delta, max_contributions, release_counts), and
#: only under the conditions below. The CLI rejects a flag given for a field the run does not read.
FIELD_USE = use_table(
    {name: spec.options for name, spec in ALGORITHMS.items()},
    {
        "count_budget": (needs("release_counts", True),),
        "min_users": (needs("release_counts", True),),
        "weight_cap": (
            Condition(
                "without a keep-table last round ({threshold} optimal, or unset with {accounting} gdp)",
                _table_round_on,
                (("threshold", "optimal"),),
            ),
        ),
        "cap_budget": (
            Condition(
                "without the degree histogram ({cap_quantile} below 1 with {accounting} gdp, or {weight_cap} auto, "
                "unset with a keep-table last round)",
                _histogram_used,
                (("accounting", "gdp"), ("cap_quantile", 0.98)),
            ),
        ),
    },
)

ACCOUNTINGS = accounting.ACCOUNTINGS

#: How a single Basic round decides: Gaussian noise against rho, or a keep-probability table
#: (privacy/thresholding.py, docs/thresholding.md)
THRESHOLDS = ("gaussian", "laplace", "optimal")

#: Default limit on the (user, item) pairs, after contribution bounding, that the sequential policy
#: algorithms gather on one worker. benchmarks/bench_policy.py measures the Python heap of that worker
#: (decoded user sets + order keys + histogram) at ~110 bytes per pair with short synthetic items
#: (Python 3.11); we budget 250 bytes per pair for longer items and runner overhead, so 20M pairs take
#: about 5 GB: a quarter of the 24 GB development machine and within a 15 GB n1-standard-4 Dataflow
#: worker. Raise it with --max_sequential_pairs on bigger machines.
DEFAULT_MAX_SEQUENTIAL_PAIRS = 20_000_000


def algorithm_spec(algorithm: str) -> AlgorithmSpec:
    """The registry entry of ``algorithm`` (``ValueError`` naming the choices if unknown)."""
    return ALGORITHMS[check_choice("algorithm", algorithm, tuple(ALGORITHMS))]


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


#: ``weight_cap='auto'``: chosen privately from the degree histogram (privacy/cap.py, choose_weight_cap)
AUTO_WEIGHT_CAP = "auto"


def check_weight_cap(value) -> Union[float, str]:
    """``weight_cap``: a number in (0, 1] or 'auto' (:data:`AUTO_WEIGHT_CAP`)."""
    if isinstance(value, str):
        if value.strip().lower() == AUTO_WEIGHT_CAP:
            return AUTO_WEIGHT_CAP
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"weight_cap must be a number in (0, 1] or 'auto', got {value!r}") from None
    return check_range("weight_cap", value, 0.0, 1.0, lo_open=True)


def weight_cap_value(text: str) -> Union[float, str]:
    """The CLI's ``--weight_cap``: 'auto' or a number (validated by :func:`check_weight_cap`)."""
    return check_weight_cap(text)


def _field(default, help: str):
    """A dataclass field whose help text the CLIs, the report and the template metadata share."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class SelectionParams:
    """Parameters of partition selection (``SelectPartitions`` and ``reference.select``).

    Validated on construction: a bad value raises ``ValueError`` naming the parameter, the value and
    the allowed range. Every field's help text is in its ``metadata["help"]`` (the CLI flags are
    generated from it).
    """

    epsilon: float = dataclasses.field(metadata={"help": "total user-level epsilon, in (0, 100]"})
    delta: float = dataclasses.field(metadata={"help": "total user-level delta, in [1e-30, 0.5]"})
    max_contributions: int = _field(100, "Delta_0, the cap on distinct items per user (uniform subsample)")
    d_max: int = _field(50, "MAD maximum adaptive degree (the proof needs d_max >= 4)")
    beta: float = _field(2.0, "MAD adaptive threshold tau = max(1, rho + beta*sigma), beta >= 0")
    b_min: float = _field(0.5, "MAD2R round-2 minimum bias, in [0.5, 1]")
    b_max: float = _field(2.0, "MAD2R round-2 maximum bias, >= 1")
    c_lb: float = _field(1.0, "MAD2R lower confidence constant on round-1 weights, >= 0")
    c_ub: Optional[float] = _field(
        None,
        "MAD2R/MAD-SIPS upper confidence constant on the previous round's noisy weights (hopeless items), >= 0; "
        "unset: the algorithm's default (3; mad_sips 1.5)",
    )
    budget_split: Optional[Tuple[float, ...]] = _field(
        None,
        "fractions of (epsilon, delta) per round for mad2r (exactly 2), dp_sips and mad_sips, summing to 1; "
        "unset: the algorithm's default (0.1,0.9; mad_sips 0.03,0.07,0.9)",
    )
    cap_quantile: Optional[float] = _field(
        None,
        "mad_sips adaptive cap: every round re-subsamples users to the smallest cap of a grid up to Delta_0 "
        "(1, 2, 3, 4, 6, 8, 11, 16, 23, ...) that at most 1 - cap_quantile of the users exceed, read from a noisy "
        "degree histogram (cap_budget of the selection's Gaussian budget); in (0, 1], 1 = always Delta_0 (no "
        "histogram); unset: mad_sips 0.98 with gdp accounting and threshold gaussian, 1 otherwise (the keep table's "
        "last round gains nothing from the cap)",
    )
    cap_budget: Optional[float] = _field(
        None,
        "fraction of the selection's Gaussian budget (mu^2) spent on mad_sips's degree histogram, in (0, 0.5]; "
        "unset: 0.01 with the adaptive cap, 0.002 when only weight_cap auto reads it (the median degree)",
    )
    weight_cap: Union[float, str, None] = dataclasses.field(
        default=None,
        metadata={
            "help": "mad2r/mad_sips keep-table round: the largest weight one user gives one item (each biased "
            "weight is rounded down onto the grid 2^(-k/16) at or below it), in (0, 1]; the table then only has to "
            "absorb steps up to it and keeps an item with less weight (W50 18.2 at 1, 13.2 at 0.25; epsilon 1, "
            "Delta_0 100). It pays where users hold many items: about 1.5 / sqrt(median user degree); on data of "
            'users with a few items it loses (docs/mad_sips.md, "Weight cap"); 1 = no cap; auto (mad_sips): '
            "chosen from a noisy degree histogram (cap_budget of the selection's Gaussian budget) as 1.5 / "
            "sqrt(its median) rounded up onto 1, 0.5, 0.354, 0.25, 0.177, 0.125 (1 on fewer than ~1,300 users); "
            "unset: auto for mad_sips with its keep-table last round, 1 otherwise",
            "type": weight_cap_value,  # the CLI flag's argparse type
        },
    )
    accounting: str = dataclasses.field(
        default="gdp",
        metadata={
            "help": "multi-round accounting: gdp (exact Gaussian-DP composition) or basic (the paper's split)",
            "choices": ACCOUNTINGS,
        },
    )
    threshold: Optional[str] = dataclasses.field(
        default=None,
        metadata={
            "help": "the release rule of basic's and count_gaussian's round and of the last round of dp_sips, mad2r "
            "and mad_sips: "
            "gaussian (noise + threshold rho) or optimal (a keep-probability table under approximate Renyi DP: "
            "fewer users per released item, no noisy weight; the multi-round algorithms' last round then uses "
            "biased Basic weights; calibrating it takes seconds; docs/thresholding.md, docs/mad_sips.md); for "
            "weighted_laplace, count_laplace and policy_laplace: laplace (their Laplace noise + rho) or optimal "
            "(the l1 keep curve, a continuous truncated geometric in closed form; docs/thresholding.md). "
            "policy_gaussian and mad: gaussian or optimal (the l2 keep rule for real-valued shifts; MAD's reads 128 "
            "random bits; docs/thresholding.md). "
            "unset: optimal for dp_sips, mad2r and mad_sips (gdp accounting), count_gaussian, policy_gaussian, mad and "
            "the three Laplace algorithms, gaussian otherwise (basic)",
            "choices": THRESHOLDS,
        },
    )
    alpha: float = _field(
        5.0,
        "policy algorithms' cutoff Gamma = rho + alpha*noise_scale (DPSU paper Table 2; it finds 2-6 best); with "
        "the l1 curve the weight it keeps with probability 1 - exp(-alpha)/2",
    )
    passes: int = _field(
        1, "policy algorithms' passes over the users, each with 1/passes of every user's budget (DPSU paper sec. 6.2.1)"
    )
    max_sequential_pairs: int = _field(
        DEFAULT_MAX_SEQUENTIAL_PAIRS,
        "policy algorithms gather the user sets on one worker: fail before that if there are more "
        "(user, item) pairs after contribution bounding (about 250 bytes per pair on that worker)",
    )
    release_counts: bool = _field(
        False,
        "also release, for every released item, a DP count of the users holding it (exact discrete Gaussian "
        "noise on the capped data; spends count_budget of epsilon and delta, composed exactly; docs/counts.md)",
    )
    count_budget: float = _field(
        counts.DEFAULT_COUNT_BUDGET,
        "fraction of (epsilon, delta) spent on the released counts, in (0, 1) (only with release_counts)",
    )
    min_users: int = _field(
        0,
        "keep only released items whose noisy count is >= min_users (post-processing of the noisy counts: "
        "no privacy cost; needs release_counts); 0 keeps all",
    )

    def __post_init__(self):
        budget = PrivacyBudget(self.epsilon, self.delta)
        set_fields(
            self,
            epsilon=budget.epsilon,
            delta=budget.delta,
            max_contributions=check_int("max_contributions", self.max_contributions, 1, 10_000_000),
            d_max=check_int("d_max", self.d_max, 4),
            beta=check_range("beta", self.beta, 0.0, math.inf),
            b_min=check_range("b_min", self.b_min, 0.5, 1.0),
            b_max=check_range("b_max", self.b_max, 1.0, math.inf),
            c_lb=check_range("c_lb", self.c_lb, 0.0, math.inf),
            c_ub=None if self.c_ub is None else check_range("c_ub", self.c_ub, 0.0, math.inf),
            budget_split=None if self.budget_split is None else check_fractions("budget_split", self.budget_split),
            cap_quantile=None if self.cap_quantile is None else cap_plans.check_cap_quantile(self.cap_quantile),
            cap_budget=None if self.cap_budget is None else cap_plans.check_cap_budget(self.cap_budget),
            weight_cap=None if self.weight_cap is None else check_weight_cap(self.weight_cap),
            accounting=check_choice("accounting", self.accounting, ACCOUNTINGS),
            threshold=None if self.threshold is None else check_choice("threshold", self.threshold, THRESHOLDS),
            alpha=check_range("alpha", self.alpha, 0.0, math.inf),
            passes=check_int("passes", self.passes, 1, 100),
            max_sequential_pairs=check_int("max_sequential_pairs", self.max_sequential_pairs, 1),
            release_counts=check_bool("release_counts", self.release_counts),
            count_budget=counts.check_count_budget(self.count_budget),
            min_users=counts.check_min_users(self.min_users),
        )
        if self.min_users > 0 and not self.release_counts:
            raise ValueError(
                f"min_users={self.min_users} filters on the released noisy counts: it needs release_counts=True"
            )

    def replace(self, **changes) -> "SelectionParams":
        return dataclasses.replace(self, **changes)

    def as_report(self) -> dict:
        """The parameters as the report prints them (JSON types)."""
        d = dataclasses.asdict(self)
        d["budget_split"] = None if self.budget_split is None else list(self.budget_split)
        return d


# --------------------------------------------------------------------------------------------------
# Calibration plans
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """One noisy round: what the report's ``rounds`` list shows, plus MAD's tau."""

    index: int  # 1-based round number; also the ``round`` of the randomness contract
    epsilon: float
    delta: float
    noise: str  # 'gaussian' | 'laplace'
    noise_scale: float  # sigma or the Laplace scale b
    threshold: float  # rho
    weighting: str  # weighted_gaussian | weighted_laplace | count | mad | l2_descent | l1_descent
    tau: Optional[float] = None  # MAD adaptive threshold (calibration.mad_tau)
    h: str = "1/sqrt(t)"  # novel-item sensitivity bound used for the threshold
    cutoff: Optional[float] = None  # policy algorithms' Gamma = rho + alpha * noise_scale
    # threshold 'optimal': noise is 'keep_table' (a KeepTable), 'keep_curve' (an L1KeepCurve, l1 weightings) or
    # 'keep_rule' (an L2KeepRule, the real-valued shifts of Policy Gaussian and MAD)
    keep_table: Optional[Union[thresholding.KeepTable, thresholding.L1KeepCurve, l2_rule.L2KeepRule]] = None
    delta_conversion: Optional[float] = None  # its RDP -> DP conversion's delta

    def without_keep_table(self) -> "RoundPlan":
        """This plan without its keep table, for steps that read only its noise, threshold and tau: a table
        (~340 KB pickled at epsilon 1) is pickled with every DoFn that holds it (docs/columnar.md, "Runner
        overhead")."""
        return self if self.keep_table is None else dataclasses.replace(self, keep_table=None)

    def as_report(self) -> dict:
        d = {
            "round": self.index,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise": self.noise,
            "noise_scale": self.noise_scale,
            "threshold": self.threshold,
            "weighting": self.weighting,
            "h": self.h,
        }
        if self.tau is not None:
            d["tau"] = self.tau
        if self.cutoff is not None:
            d["cutoff"] = self.cutoff
        if isinstance(self.keep_table, thresholding.L1KeepCurve):  # "threshold" is W50, as for a table
            d["noise_scale"] = None
            d["keep_table"] = self.keep_table.as_report()
        elif isinstance(self.keep_table, l2_rule.L2KeepRule):
            d["noise_scale"] = None
            d["keep_table"] = self.keep_table.as_report(self.delta_conversion)
        elif self.keep_table is not None:  # no noise scale; "threshold" is W50, the weight kept half the time
            t = self.keep_table
            d["noise_scale"] = None
            d["keep_table"] = {
                "alpha": t.alpha,
                "epsilon_rdp": t.epsilon_rdp,
                "delta_rdp": t.delta_rdp,
                "delta_conversion": self.delta_conversion,
                "grid": t.grid,
                "entries": len(t.probs),
                "weight_kept_10_50_90": [t.weight_for(0.1), t.weight_for(0.5), t.weight_for(0.9)],
            }
        return d


def selection_share(spec: AlgorithmSpec, params: SelectionParams) -> Optional[counts.SelectionShare]:
    """The selection's budget when counts are released (None without counts): privacy/counts.py.

    Gaussian selections compose with the counts in Gaussian DP ('gdp'), Laplace selections as a pure
    eps_0-DP mechanism ('pure'), multi-round selections under ``accounting='basic'`` by basic composition.
    """
    if not params.release_counts:
        return None
    args = (params.epsilon, params.delta, params.count_budget, params.max_contributions)
    if params.threshold == "optimal" and spec.calibration not in L1_CALIBRATIONS:
        return counts.split_gdp(*args)  # the counts' noise as under gdp; the table composes with it in RDP
    if spec.shape in MULTI_ROUND_SHAPES:
        return (counts.split_gdp if params.accounting == "gdp" else counts.split_basic)(*args)
    if spec.calibration in ("weighted_gaussian", "count_gaussian"):
        return counts.split_gdp(*args)
    return counts.split_pure(*args)


def _one_round_calibration(spec: AlgorithmSpec, params: SelectionParams) -> calibration.Calibration:
    eps, delta, d0 = params.epsilon, params.delta, params.max_contributions
    share = selection_share(spec, params)
    if share is None:
        return getattr(calibration, f"calibrate_{spec.calibration}")(eps, delta, d0)
    if share.composition == "pure":  # Laplace at (eps_0, (1 - f) delta): the calibration of its own budget
        return getattr(calibration, f"calibrate_{spec.calibration}")(share.epsilon, share.delta_threshold, d0)
    # 'gdp': the selection's share of mu^2 (sensitivity sqrt(Delta_0) for the count weighting, h = 1)
    if spec.calibration == "count_gaussian":
        sigma = math.sqrt(d0) * share.sigma
        rho = calibration.gaussian_threshold(sigma, share.delta_threshold, d0, h=np.ones_like)
    else:
        sigma = share.sigma
        rho = calibration.gaussian_threshold(sigma, share.delta_threshold, d0)
    return calibration.Calibration("gaussian", sigma, rho, share.epsilon, share.delta_threshold)


def _table_with_counts(spec, params, contributions, gaussian_rdp: float, delta_thresholds: float):
    """The keep table of a plan: calibrated at the run's epsilon and its delta less the Gaussian rounds'
    threshold events, composed at its order with the Gaussian mechanisms (``gaussian_rdp``) and, with
    ``release_counts``, with the counts: their discrete Gaussian is within the kernel lemma's slack of a
    continuous Gaussian of noise sigma_1 and l2 sensitivity sqrt(l0) (docs/counts.md (b)), i.e.
    (alpha, alpha l0 / (2 sigma_1^2))-RDP, and the table is calibrated to ``delta_P (1 - DELTA_SLACK)`` so that
    ``e^kappa (H + e^{2 kappa} - 1) <= delta_P`` (:func:`counts.check_kernel_slack`). The counts keep the noise
    of the gdp split (``count_budget`` of mu^2): as precise as with the Gaussian threshold."""
    delta_p, gaussian_rdp = _with_counts_rdp(spec, params, params.delta - delta_thresholds, gaussian_rdp)
    return thresholding.calibrate_keep_table(params.epsilon, delta_p, contributions, gaussian_rdp=gaussian_rdp)


def _with_counts_rdp(spec, params, delta_p: float, gaussian_rdp: float) -> Tuple[float, float]:
    """``(delta_p, gaussian_rdp)`` of a keep rule's RDP plan with the released counts joined, if any: their
    continuous-Gaussian RDP added, the kernel slack checked to fit delta_p and ``DELTA_SLACK`` of it reserved
    (:func:`_table_with_counts`); unchanged without counts."""
    share = selection_share(spec, params)
    if share is None:
        return delta_p, gaussian_rdp
    plan = share.counts
    counts.check_kernel_slack(plan.l0, delta_p, plan.tau2)
    return delta_p * (1.0 - counts.DELTA_SLACK), gaussian_rdp + plan.l0 / (2.0 * plan.sigma_continuous**2)


def _keep_table_round(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    """Basic's round with the keep-probability table (docs/thresholding.md) at the run's (eps, delta), composed
    with the counts in RDP when they are released (:func:`_table_with_counts`)."""
    eps, delta = params.epsilon, params.delta
    if spec.weighting == "count":  # +1 per item read as n contributions c = 1/sqrt(Delta_0) (l2 sensitivity 1)
        c = float(1.0 / math.sqrt(params.max_contributions))
        table, delta_conversion = _table_with_counts(spec, params, (c,), 0.0, 0.0)
        table = dataclasses.replace(table, scale=c)
    else:
        contributions = thresholding.basic_contributions(params.max_contributions)
        table, delta_conversion = _table_with_counts(spec, params, contributions, 0.0, 0.0)
    if params.release_counts:  # the round on its own (informational): the table's conversion at its order
        eps, delta = thresholding.to_dp(table, delta_conversion)
    w50 = table.weight_for(0.5)
    return (
        RoundPlan(1, eps, delta, "keep_table", 0.0, w50, spec.weighting, None, "table", None, table, delta_conversion),
    )


#: the calibrations whose change per user has l1 norm <= 1 (in units of 1 or Delta_0): their keep rule is the
#: l1 curve (docs/thresholding.md, "The l1 curve")
L1_CALIBRATIONS = ("weighted_laplace", "count_laplace")
#: the one-round weightings whose change per user has l2 norm <= 1 in real-valued coordinates (rerouted weights):
#: their keep rule is the l2 rule (docs/thresholding.md, "The l2 rule")
L2_RULE_WEIGHTINGS = ("l2_descent", "mad")


def _changed_items(spec: AlgorithmSpec, params: SelectionParams) -> int:
    """The most items whose weight one user changes: its own (<= Delta_0), or under a policy's rerouting any item
    of the single worker's input (<= max_sequential_pairs). The l1 curve reserves its realisation error (the 2^-64
    rounding and the 2^-90 of its evaluation, :func:`thresholding.rounding_reserve`) for that many items
    (docs/thresholding.md, "The realised probabilities")."""
    return params.max_sequential_pairs if spec.sequential else params.max_contributions


def _l1_curve_round(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    """The round of a Laplace weighting (weighted_laplace, count_laplace, policy_laplace) with the l1 keep curve
    at the budget its Laplace threshold had: (eps, delta), or with counts the pure split's (eps_0, (1 - f) delta)
    (the curve is (eps_0, delta_0)-DP like the Laplace round it replaces, docs/counts.md). Policy Laplace's cutoff
    Gamma is the weight the curve keeps with probability 1 - e^-alpha / 2, as rho + alpha b is for Lap(b)."""
    eps, delta = params.epsilon, params.delta
    share = selection_share(spec, params)
    if share is not None:
        eps, delta = share.epsilon, share.delta_threshold
    unit = float(params.max_contributions) if spec.calibration == "count_laplace" else 1.0
    changed = _changed_items(spec, params)
    curve = thresholding.calibrate_l1_curve(eps, delta, unit, changed)
    gamma = curve.weight_for(1.0 - 0.5 * math.exp(-params.alpha)) if spec.sequential else None
    w50 = curve.weight_for(0.5)
    return (RoundPlan(1, eps, delta, "keep_curve", 0.0, w50, spec.weighting, None, "curve", gamma, curve),)


def _l2_realisation(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[int, int]:
    """``(changed items, random bits)`` of the l2 rule's realisation reserve: a policy's change touches items of its
    one worker only (``max_sequential_pairs``, 64 bits); MAD's rerouting reaches any item of the users who share a
    truncated item with the new one, which no parameter bounds, so its decisions read 128 bits and reserve for
    every item a run can hold (``l2_rule.ANY_RUN_ITEMS``; docs/thresholding.md, "Realising f")."""
    if spec.weighting == "mad":
        return l2_rule.ANY_RUN_ITEMS, l2_rule.WIDE_REALISATION_BITS
    return _changed_items(spec, params), thresholding.KEEP_BITS


def _l2_rule_round(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    """The one round of Policy Gaussian and of MAD with the l2 keep rule (docs/thresholding.md, "The l2 rule"):
    their histograms of neighbouring datasets differ by l2 norm <= 1 in real-valued coordinates (DPSU Lemma 5.2;
    MAD Lemma 5.6), which the rule covers. At the run's (epsilon, delta) less the realisation reserve
    (:func:`_l2_realisation`); with counts, composed with them in RDP as the tables are (:func:`_table_with_counts`).
    Policy Gaussian's cutoff Gamma is the weight the rule keeps with probability Phi(alpha), and MAD's tau the weight
    it keeps with probability Phi(beta) (at least 1), as rho + alpha sigma and rho + beta sigma are for the Gaussian
    rule (both capped at the last knot's probability, so a large alpha or beta still gets a finite weight)."""
    delta_p, gaussian_rdp = _with_counts_rdp(spec, params, params.delta, 0.0)
    changed, bits = _l2_realisation(spec, params)
    rule, delta_conversion = l2_rule.calibrate_l2_keep_rule(
        params.epsilon, delta_p, changed, gaussian_rdp, realisation_bits=bits
    )
    eps, delta = params.epsilon, params.delta
    if params.release_counts:  # the round on its own (informational): the rule's conversion at its order
        eps = thresholding.rdp_to_dp_epsilon(rule.epsilon_rdp, rule.alpha, delta_conversion)
        delta = rule.delta_rdp + delta_conversion

    def weight_kept_with(z: float) -> float:  # the weight kept with probability Phi(z), capped at the last knot
        return rule.weight_for(min(0.5 * math.erfc(-z / math.sqrt(2.0)), rule.probs[-1]))

    gamma = weight_kept_with(params.alpha) if spec.sequential else None
    tau = max(1.0, weight_kept_with(params.beta)) if spec.weighting == "mad" else None  # MAD Alg. 3's tau
    w50 = rule.weight_for(0.5)
    return (
        RoundPlan(1, eps, delta, "keep_rule", 0.0, w50, spec.weighting, tau, "rule", gamma, rule, delta_conversion),
    )


def _one_round(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    if params.threshold == "optimal" and spec.calibration in L1_CALIBRATIONS:
        return _l1_curve_round(spec, params)
    if params.threshold == "optimal" and spec.weighting in L2_RULE_WEIGHTINGS:
        return _l2_rule_round(spec, params)
    if params.threshold == "optimal":
        return _keep_table_round(spec, params)
    c = _one_round_calibration(spec, params)
    tau = calibration.mad_tau(c.threshold, c.noise_scale, params.beta) if spec.weighting == "mad" else None
    # Policy algorithms: Theorem 5.1's sigma and rho_Gauss (h(t) = 1/sqrt(t)) are those of weighted
    # Gaussian (Theorem B.2); Theorem 4.1's Lap(1/eps) and rho_Lap (h(t) = 1/t) those of weighted Laplace
    # (Theorem B.1): an item held only by a new user with t such items gets at most 1/sqrt(t)
    # (l2-descent) or 1/t (l1-descent), since those items all start at 0 and are raised equally.
    gamma = c.threshold + params.alpha * c.noise_scale if spec.sequential else None  # Alg. 4 / 6 (erratum)
    return (RoundPlan(1, c.epsilon, c.delta, c.noise, c.noise_scale, c.threshold, spec.weighting, tau, spec.h, gamma),)


def _biased_h(b_max: float):
    """The novel-item bound of a biased MAD round: ``h(t) = min(b_max/sqrt(t), 1)``.

    Lemma 5.3 (MAD paper) bounds each of a new user's t novel items by ``b_max/sqrt(t)``; a novel item's
    weight is also one coordinate of the change of the weight vector, whose l2 norm is <= 1 (Lemma 5.6),
    so it is <= 1 as well (privacy review t3, L3). The min matters for small t: with the adaptive cap's
    small caps at large epsilon it lowers the last round's threshold by 8-12% (docs/mad_sips.md)."""

    def h(t):
        return np.minimum(b_max / np.sqrt(t), 1.0)

    return h


def _biased_h_name(b_max: float) -> str:
    """The report's name of :func:`_biased_h`: ``min(2/sqrt(t), 1)`` (just ``1/sqrt(t)`` when b_max is 1)."""
    return "1/sqrt(t)" if b_max == 1.0 else f"min({b_max:g}/sqrt(t), 1)"


def _gaussian_rounds(
    spec: AlgorithmSpec, params: SelectionParams, cap: Optional[int] = None, weight_cap: Optional[float] = None
) -> Tuple[RoundPlan, ...]:
    """The calibrated rounds of a multi-round shape; with ``cap`` (adaptive cap, 'gdp' only) the thresholds
    are those of ``cap`` novel items and the rounds share ``1 - cap_budget`` of the selection's mu^2.
    ``weight_cap``: the keep-table round's cap (one candidate of ``weight_cap='auto'``; default the params')."""
    fractions = params.budget_split
    if spec.shape == "mad2r":
        if len(fractions) != 2:
            raise ValueError(f"budget_split for mad2r must have exactly 2 fractions, got {list(fractions)!r}")
        hs = [None, _biased_h(params.b_max)]  # Alg. 4 lines 4 and 9 (with min(., 1): _biased_h)
        hnames = ["1/sqrt(t)", _biased_h_name(params.b_max)]
    elif spec.shape == "mad_sips":  # round 1 unbiased MAD (Lemma 5.3, b_max = 1); later rounds biased
        hs = [None] + [_biased_h(params.b_max)] * (len(fractions) - 1)
        hnames = ["1/sqrt(t)"] + [_biased_h_name(params.b_max)] * (len(fractions) - 1)
    else:  # dp_sips
        hs = [None] * len(fractions)
        hnames = ["1/sqrt(t)"] * len(fractions)
    if params.threshold == "optimal":  # dp_sips, mad2r, mad_sips (resolve_params): the last round is a keep table
        return _table_last_round(spec, params, cap, hs, hnames, weight_cap)
    share = selection_share(spec, params)
    if cap is not None:  # adaptive cap (privacy/cap.py): the histogram takes cap_budget of mu_sel^2
        sigma_rounds, _ = adaptive_cap_sigmas(spec, params)
        delta_thr = params.delta if share is None else share.delta_threshold
        cals = accounting.multi_round_calibration(
            params.epsilon, delta_thr, fractions, "gdp", cap, h_per_round=hs, sigma=sigma_rounds
        )
    elif share is None:
        cals = accounting.multi_round_calibration(
            params.epsilon, params.delta, fractions, params.accounting, params.max_contributions, h_per_round=hs
        )
    elif share.composition == "gdp":  # the rounds split the selection's share of mu^2 and of the thresholds' delta
        cals = accounting.multi_round_calibration(
            params.epsilon,
            share.delta_threshold,
            fractions,
            "gdp",
            params.max_contributions,
            h_per_round=hs,
            sigma=share.sigma,
        )
    else:  # 'basic': the rounds split ((1 - f) eps, (1 - f) delta)
        cals = accounting.multi_round_calibration(
            share.epsilon, share.delta_threshold, fractions, "basic", params.max_contributions, h_per_round=hs
        )
    rounds = []
    for r, c in enumerate(cals, start=1):
        tau = calibration.mad_tau(c.threshold, c.noise_scale, params.beta) if spec.weighting == "mad" else None
        rounds.append(
            RoundPlan(r, c.epsilon, c.delta, c.noise, c.noise_scale, c.threshold, spec.weighting, tau, hnames[r - 1])
        )
    return tuple(rounds)


def _selection_budget(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[float, float]:
    """The selection's (epsilon, delta): the run's, or its share when counts are released."""
    share = selection_share(spec, params)
    return (params.epsilon, params.delta) if share is None else (share.epsilon, share.delta_threshold)


def last_round_contributions(params: SelectionParams, weight_cap: Optional[float] = None) -> Tuple[float, ...]:
    """The contribution set C of MAD-SIPS's table round: the geometric grid 2^(-k/16) from 1 down to below
    the smallest user weight of Algorithm 2, ``b_min / sqrt(Delta_0)`` (Lemma 5.4; any cap <= Delta_0),
    one step lower for the float slack of that bound (docs/mad_sips.md, "The last round as a keep table").

    With ``weight_cap`` c below 1, only the values of the grid at or below c (the grid then reaches at least
    one step below c): :func:`thresholding.round_down` maps every heavier weight to the largest of them, so a
    user's rounded weights stay <= c with their squares summing to at most 1 (docs/mad_sips.md, "Weight cap").
    ``weight_cap`` overrides the params' (a candidate of 'auto', whose own table without a choice is c = 1)."""
    cap = _fixed_weight_cap(params) if weight_cap is None else check_weight_cap(weight_cap)
    smallest = min(1.0, params.b_min) / math.sqrt(params.max_contributions) * (1.0 - 1e-9)
    grid = thresholding.geometric_contributions(min(smallest, cap))
    return tuple(c for c in grid if c <= cap)


def _fixed_weight_cap(params: SelectionParams) -> float:
    """The params' weight cap as a number: 1 for 'auto' (the rounds a run uses before its choice) and unset
    (whose default is 'auto' or 1)."""
    return 1.0 if params.weight_cap in (None, AUTO_WEIGHT_CAP) else params.weight_cap


def histogram_on(params: SelectionParams) -> bool:
    """MAD-SIPS spends ``cap_budget`` on a noisy degree histogram: for the adaptive cap (``cap_quantile`` < 1),
    for ``weight_cap='auto'``, or both (one histogram; privacy/cap.py)."""
    return params.cap_quantile < 1.0 or params.weight_cap == AUTO_WEIGHT_CAP


def _table_last_round(spec, params, cap, hs, hnames, weight_cap=None) -> Tuple[RoundPlan, ...]:
    """MAD-SIPS, MAD2R or DP-SIPS with ``threshold='optimal'`` (docs/mad_sips.md, "The last round as a keep table").

    Rounds 1..R-1 are today's Gaussian rounds (the selection's GDP noise split by ``budget_split``, with
    MAD-SIPS's adaptive cap histogram taking ``cap_budget`` of it; thresholds for ``cap`` novel items,
    failure probability delta_r/2 each). The last round releases with a keep table: over biased Basic
    weights rounded down onto :func:`last_round_contributions` (MAD-SIPS, MAD2R), over Basic's own weights
    1/sqrt(d) (DP-SIPS, :func:`thresholding.basic_contributions`, no rounding). Accounting at one RDP order
    alpha: every Gaussian mechanism costs alpha / (2 sigma^2), the table gets the rest of epsilon after the
    conversion, and delta is the earlier thresholds' sum(delta_r / 2) plus the table's mixture delta plus
    the conversion's delta. The table does not depend on the cap (C and sum c^2 <= 1 do not): one table
    for every grid value. With ``weight_cap='auto'`` the histogram's noise is spent whatever the cap, and the
    table is that of ``weight_cap`` (a candidate; c = 1 when None)."""
    eps, delta = _selection_budget(spec, params)  # with counts: the gdp share's thresholds' delta and noise
    share = selection_share(spec, params)
    d = params.max_contributions if cap is None else cap
    if histogram_on(params):
        sigma_rounds, sigma_h = adaptive_cap_sigmas(spec, params)
    else:
        sigma_rounds, sigma_h = (None if share is None else share.sigma), None
    cals = accounting.multi_round_calibration(
        eps, delta, params.budget_split, "gdp", d, h_per_round=hs, sigma=sigma_rounds
    )[:-1]
    sigmas = [c.noise_scale for c in cals] + ([] if sigma_h is None else [sigma_h])
    gaussian_rdp = math.fsum(1.0 / (2.0 * s * s) for s in sigmas)
    delta_thresholds = math.fsum(c.delta / 2.0 for c in cals)  # gaussian_threshold bounds each at delta_r / 2
    if spec.weighting == "mad":  # biased Basic weights rounded onto a geometric grid
        contributions, weighting = last_round_contributions(params, weight_cap), "biased_basic"
    else:  # DP-SIPS: Basic's own weights
        contributions, weighting = thresholding.basic_contributions(params.max_contributions), spec.weighting
    table, delta_conversion = _table_with_counts(spec, params, contributions, gaussian_rdp, delta_thresholds)
    rounds = []
    for r, c in enumerate(cals, start=1):
        tau = calibration.mad_tau(c.threshold, c.noise_scale, params.beta) if spec.weighting == "mad" else None
        rounds.append(
            RoundPlan(r, c.epsilon, c.delta, c.noise, c.noise_scale, c.threshold, spec.weighting, tau, hnames[r - 1])
        )
    eps_last, delta_last = thresholding.to_dp(table, delta_conversion)  # the round on its own (informational)
    last = len(cals) + 1
    rounds.append(
        RoundPlan(
            last,
            eps_last,
            delta_last,
            "keep_table",
            0.0,
            table.weight_for(0.5),
            weighting,
            None,
            "table",
            None,
            table,
            delta_conversion,
        )
    )
    return tuple(rounds)


_PLANNERS = {
    "single": _one_round,
    "sequential": _one_round,
    "dp_sips": _gaussian_rounds,
    "mad2r": _gaussian_rounds,
    "mad_sips": _gaussian_rounds,
}


#: the values of the per-algorithm fields of SelectionParams left at None, unless the algorithm's
#: AlgorithmSpec.defaults says otherwise (the MAD paper's section 7.2 settings)
ALGORITHM_DEFAULTS = {"budget_split": (0.1, 0.9), "c_ub": 3.0, "cap_quantile": 1.0, "threshold": "gaussian"}


def resolve_params(algorithm: str, params: SelectionParams) -> SelectionParams:
    """``params`` with the fields left at None (``budget_split``, ``c_ub``, ``cap_quantile``, ``threshold``) set
    to the algorithm's defaults (:data:`ALGORITHM_DEFAULTS`, overridden by its ``AlgorithmSpec.defaults``; the
    adaptive cap is off by default under ``accounting='basic'`` and with a keep-table last round
    (:func:`default_cap_quantile`), and the threshold is 'gaussian' under ``accounting='basic'``). Every
    entry point (``plan_rounds``, ``reference.release``, ``SelectPartitions``) resolves first; explicit values
    win. Raises ``ValueError`` for an adaptive cap (``cap_quantile < 1``) outside mad_sips or with basic accounting."""
    spec = algorithm_spec(algorithm)
    defaults = _algorithm_defaults(spec)
    if params.accounting != "gdp":
        defaults["cap_quantile"] = 1.0  # the histogram composes by Gaussian DP only
        if spec.shape in MULTI_ROUND_SHAPES:  # the table's RDP plan starts from the gdp rounds (docs/thresholding.md)
            defaults["threshold"] = noise_rule(spec)
    else:  # the adaptive cap only with a Gaussian last round
        defaults["cap_quantile"] = default_cap_quantile(algorithm, params.threshold)
    if params.threshold is None and defaults["threshold"] == "optimal" and spec.calibration in L1_CALIBRATIONS:
        # the l1 curve's realisation reserve must fit in delta (tiny delta under a policy: its Laplace rule)
        reserve = thresholding.rounding_reserve(params.epsilon, _changed_items(spec, params))
        if reserve >= params.delta / 2:
            defaults["threshold"] = noise_rule(spec)
    if (
        params.threshold is None
        and defaults["threshold"] == "optimal"
        and spec.shape not in MULTI_ROUND_SHAPES
        and spec.weighting in L2_RULE_WEIGHTINGS
    ):  # the l2 rule's realisation reserve must fit in delta (a tiny delta: the Gaussian rule)
        if l2_rule.realisation_reserve(params.epsilon, *_l2_realisation(spec, params)) >= params.delta / 2:
            defaults["threshold"] = noise_rule(spec)
    unset = {name: value for name, value in defaults.items() if getattr(params, name) is None}
    params = params.replace(**unset) if unset else params
    if params.weight_cap is None:  # after the threshold: auto only where the last round is a keep table
        params = params.replace(weight_cap=default_weight_cap(spec, params.threshold))
    if params.cap_budget is None:  # after the cap and the weight cap: the median alone needs less
        median_only = params.cap_quantile >= 1.0 and params.weight_cap == AUTO_WEIGHT_CAP
        params = params.replace(cap_budget=cap_plans.MEDIAN_CAP_BUDGET if median_only else cap_plans.DEFAULT_CAP_BUDGET)
    if params.threshold in ("gaussian", "laplace") and params.threshold != noise_rule(spec):
        raise ValueError(
            f"threshold={params.threshold!r}: {algorithm}'s noise is {noise_rule(spec)} "
            f"(use threshold={noise_rule(spec)!r}, or 'optimal' where it applies)"
        )
    if params.threshold == "optimal" and spec.shape in MULTI_ROUND_SHAPES and params.accounting != "gdp":
        raise ValueError(
            f"threshold='optimal' with {algorithm} composes its rounds in RDP from the Gaussian plan of "
            "accounting='gdp' (docs/mad_sips.md); leave accounting unset"
        )
    if params.weight_cap != 1.0 and not (
        params.threshold == "optimal" and spec.weighting == "mad" and spec.shape in MULTI_ROUND_SHAPES
    ):
        raise ValueError(
            f"weight_cap={params.weight_cap!r} caps the weights of the keep-table round of mad2r and mad_sips "
            f"({algorithm} with threshold={params.threshold!r} has none); leave it at 1"
        )
    if params.weight_cap == AUTO_WEIGHT_CAP and spec.shape != "mad_sips":
        raise ValueError(
            f"weight_cap='auto' is chosen from mad_sips's noisy degree histogram ({algorithm} has none); give "
            "a number in (0, 1] (about 1.5 / sqrt(median user degree), docs/tuning.md)"
        )
    if params.cap_quantile < 1.0:
        if spec.shape != "mad_sips":
            raise ValueError(
                f"cap_quantile={params.cap_quantile:g}: the adaptive cap is a mad_sips option ({algorithm} caps "
                "every user at max_contributions); leave it unset or 1"
            )
        if params.accounting != "gdp":
            raise ValueError(
                f"cap_quantile={params.cap_quantile:g} needs accounting='gdp' (the degree histogram composes with "
                "the rounds by Gaussian DP); use cap_quantile=1 with accounting='basic'"
            )
    return params


def adaptive_cap_sigmas(spec: AlgorithmSpec, params: SelectionParams) -> Tuple[float, float]:
    """``(sigma_rounds, sigma_H)``: the selection's GDP noise ``sigma_sel`` split between the rounds
    (``1 - cap_budget`` of mu_sel^2) and the degree histogram (``cap_budget``), each rounded up
    (``1/sigma_rounds^2 + 1/sigma_H^2 <= 1/sigma_sel^2``)."""
    share = selection_share(spec, params)
    if share is None or share.sigma is None:  # no counts (a 'basic' share has no sigma; no cap there)
        eps, delta = _selection_budget(spec, params)
        sigma_sel = calibration.analytic_gaussian_sigma(eps, delta / 2.0)
    else:
        sigma_sel = share.sigma
    b = params.cap_budget
    up = 1.0 + 1e-12
    return sigma_sel / math.sqrt(1.0 - b) * up, sigma_sel / math.sqrt(b) * up


def plan_rounds(algorithm: str, params: SelectionParams) -> Tuple[RoundPlan, ...]:
    """The calibrated rounds of ``algorithm`` under ``params`` (see the module docstring).

    With the adaptive cap (mad_sips, ``cap_quantile < 1``): the rounds if the cap turns out to be
    Delta_0; a run uses ``plan_cap(...).rounds_for(cap)`` of the cap it chose.
    """
    spec = algorithm_spec(algorithm)
    params = resolve_params(algorithm, params)
    if params.cap_quantile < 1.0:
        return _gaussian_rounds(spec, params, params.max_contributions)
    return _PLANNERS[spec.shape](spec, params)


def plan_cap(algorithm: str, params: SelectionParams) -> Optional[cap_plans.CapPlan]:
    """The adaptive cap's plan (privacy/cap.py) with the rounds of every grid value, or None when the
    cap is fixed at Delta_0 (``cap_quantile`` 1, any algorithm but mad_sips, basic accounting)."""
    spec = algorithm_spec(algorithm)
    params = resolve_params(algorithm, params)
    if params.cap_quantile >= 1.0:
        return None
    grid = cap_plans.cap_grid(params.max_contributions)
    _, sigma_h = adaptive_cap_sigmas(spec, params)
    rounds = tuple(_gaussian_rounds(spec, params, g) for g in grid)
    return cap_plans.CapPlan(grid, sigma_h, params.cap_quantile, params.cap_budget, cap_plans.CAP_Z, rounds)


def plan_weight_cap(algorithm: str, params: SelectionParams) -> Optional[cap_plans.WeightCapPlan]:
    """``weight_cap='auto'``'s plan (privacy/cap.py): the histogram's grid and noise (shared with the adaptive
    cap's when both are on) and MAD-SIPS's keep-table last round for every candidate cap; None otherwise.

    Every candidate's table is built at ONE order alpha, RDP epsilon, mixture delta and grid, those the
    calibration finds for the candidate ``WEIGHT_CAP_COMMON_ORDER_OF`` (1, no cap;
    ``thresholding.KeepTableSpec`` with C_c), with one conversion delta: whichever table the histogram picks, the
    run composes at that order exactly as the plan says (docs/mad_sips.md, "Automatic weight cap"). Their W50
    are within 3.8% of each table's at its own best order (epsilon 0.5-4, Delta_0 100). The last round does
    not depend on the adaptive cap (:func:`_table_last_round`): one per candidate."""
    spec = algorithm_spec(algorithm)
    params = resolve_params(algorithm, params)
    if params.weight_cap != AUTO_WEIGHT_CAP:
        return None
    grid = cap_plans.cap_grid(params.max_contributions)
    _, sigma_h = adaptive_cap_sigmas(spec, params)
    candidates = cap_plans.WEIGHT_CAP_CANDIDATES
    common = _gaussian_rounds(spec, params, None, cap_plans.WEIGHT_CAP_COMMON_ORDER_OF)[-1]  # its calibration
    common_spec = thresholding.KeepTableSpec.of(common.keep_table)
    specs = tuple(
        dataclasses.replace(common_spec, contributions=last_round_contributions(params, c)) for c in candidates
    )  # each table is built when a run chooses it (WeightCapPlan.last_round): no plan time for the others
    return cap_plans.WeightCapPlan(
        grid, sigma_h, params.cap_budget, candidates, cap_plans.WEIGHT_CAP_FACTOR, common, specs
    )


def plan_counts(algorithm: str, params: SelectionParams) -> Optional[counts.CountPlan]:
    """The count release's plan (discrete Gaussian noise, error bound) or None without ``release_counts``."""
    share = selection_share(algorithm_spec(algorithm), resolve_params(algorithm, params))
    return None if share is None else share.counts


# --------------------------------------------------------------------------------------------------
# The plan: computed once, before any data is read
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SelectionPlan:
    """Everything a selection run fixes before reading data, computed once by :func:`plan`.

    ``SelectPartitions``, the in-memory reference (:func:`transforms.reference.release`) and the CLI's
    report all read this one object: a runner gets the plan and finds what its algorithm needs in it
    (MAD-SIPS's adaptive cap in :attr:`cap`), so no generic code special-cases an algorithm.

    Attributes:
      spec: the registry row (:class:`AlgorithmSpec`); ``algorithm`` and ``shape`` are its name and shape.
      params: the :class:`SelectionParams` resolved for the algorithm (:func:`resolve_params`).
      rounds: the calibrated :class:`RoundPlan` of each round (with the adaptive cap: those of Delta_0; with
        ``weight_cap='auto'`` the last one is c = 1's).
      counts: the count release's :class:`privacy.counts.CountPlan`, or None without ``release_counts``.
      cap: the adaptive cap's :class:`privacy.cap.CapPlan` (mad_sips, ``cap_quantile < 1``), or None.
      weight_caps: ``weight_cap='auto'``'s :class:`privacy.cap.WeightCapPlan` (mad_sips), or None.
    """

    spec: AlgorithmSpec
    params: SelectionParams
    rounds: Tuple[RoundPlan, ...]
    counts: Optional[counts.CountPlan]
    cap: Optional[cap_plans.CapPlan]
    weight_caps: Optional[cap_plans.WeightCapPlan] = None

    @property
    def algorithm(self) -> str:
        return self.spec.name

    @property
    def shape(self) -> str:
        return self.spec.shape

    def rounds_for(self, cap: Optional[int] = None, weight_cap: Optional[float] = None) -> Tuple[RoundPlan, ...]:
        """The rounds a run uses: those of the cap it chose (adaptive cap), else :attr:`rounds`; with
        ``weight_cap='auto'``, the last round of the weight cap it chose (:attr:`rounds` end with c = 1's)."""
        rounds = self.rounds if self.cap is None else self.cap.rounds_for(cap)
        if self.weight_caps is None or weight_cap is None:
            return rounds
        return tuple(rounds[:-1]) + (self.weight_caps.last_round(weight_cap),)

    def as_report(self, cap: Optional[int] = None, weight_cap: Optional[float] = None) -> dict:
        """The plan's part of the run report: ``rounds`` (of the run's ``cap`` with the adaptive cap and of its
        ``weight_cap`` with 'auto', DP outputs then), ``counts`` (with ``min_users``), ``adaptive_cap``/``cap``
        and ``auto_weight_cap``/``chosen_weight_cap`` when they apply."""
        if self.weight_caps is not None and weight_cap is None:
            raise ValueError(
                "this plan chooses its weight cap from the data (weight_cap='auto'): pass the run's chosen weight_cap "
                f"(one of {list(self.weight_caps.candidates)})"
            )
        report = {"rounds": [r.as_report() for r in self.rounds_for(cap, weight_cap)]}
        if self.counts is not None:
            # the per-round "released" numbers the report adds are the items kept by min_users
            report["counts"] = dict(
                self.counts.as_report(), min_users=self.params.min_users, min_users_cost="none (post-processing)"
            )
        if self.cap is not None:
            report["adaptive_cap"] = self.cap.as_report()
            report["cap"] = int(cap)
        if self.weight_caps is not None:
            report["auto_weight_cap"] = self.weight_caps.as_report()
            report["chosen_weight_cap"] = float(weight_cap)
        return report


def plan(algorithm: str, params: SelectionParams) -> SelectionPlan:
    """The :class:`SelectionPlan` of ``algorithm`` under ``params``: resolved parameters, calibrated rounds,
    the count release's plan and the adaptive cap's plan (``ValueError``/``TypeError`` on bad input)."""
    spec = algorithm_spec(algorithm)
    if not isinstance(params, SelectionParams):
        raise TypeError(f"params must be a SelectionParams, got {type(params).__name__}")
    params = resolve_params(spec.name, params)
    rounds, weight_caps = plan_rounds(spec.name, params), plan_weight_cap(spec.name, params)
    if weight_caps is not None:  # until the histogram chooses: the rounds of c = 1 (at the common order)
        rounds = tuple(rounds[:-1]) + (weight_caps.last_round(1.0),)
    return SelectionPlan(spec, params, rounds, plan_counts(spec.name, params), plan_cap(spec.name, params), weight_caps)
