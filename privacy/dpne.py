"""Parameters and privacy accounting of DPNE (DP n-gram extraction) and its DPSU baselines (pure math).

Paper: Kim, Gopi, Kulkarni, Yekhanin, "Differentially Private n-gram Extraction"
(the DPNE paper of docs/design.md), Algorithm 1, Propositions 2.2-2.4, Theorem 2.1.

Theorem 2.1 (what :func:`dpne_level_sigmas` and :func:`dpne_rho_1` implement):

* ``sigma*`` solves ``delta/2 = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s))``, i.e.
  ``sigma* = AGM(eps, delta/2)`` (analytic Gaussian mechanism, sensitivity 1);
* ``sigma_1..sigma_T`` with ``1/sigma*^2 = sum_k 1/sigma_k^2``; we use the paper's geometric
  schedule ``sigma_k = c sigma_{k-1}`` (``sigma_decay`` c, default 1: all equal, ``sigma* sqrt(T)``);
* ``rho_1 = max_{1<=t<=Delta_1} 1/sqrt(t) + sigma_1 PhiInv((1 - delta/2)^(1/t))`` (DPSU's threshold
  at total delta; its novel-item failure probability is delta/2).

Level k >= 2 is a Gaussian mechanism with l2 sensitivity 1 over the domain ``V_k`` of valid k-grams,
which is a function of the released ``S_1, S_{k-1}`` only; its threshold ``rho_k`` does not enter the
privacy analysis (it is post-processing of the noisy histogram over all of ``V_k``), so it is set to
control spurious k-grams (Prop. 2.2):

    rho_k = sigma_k * PhiInv(1 - eta * min(1, |S_{k-1}| / |V_k|))

so that ``P[N(0, sigma_k^2) >= rho_k] = q_k = eta * min(1, |S_{k-1}|/|V_k|)`` and the expected number
of spurious k-grams is at most ``|V_k| q_k = eta * min(|S_{k-1}|, |V_k|)``.

GDP composition of the T Gaussian mechanisms (Prop. 2.3) gives one Gaussian with noise ``sigma*``,
which is (eps, delta/2)-DP (Prop. 2.4); adding the (0, delta/2) novel-item event of level 1 gives
(eps, delta). :func:`dpne_composed_privacy` recomputes this from the sigmas (used by the tests).

Baselines (paper section 3.1.2), all with the same (eps, delta):

* ``dpsu_all``: one DPSU run over the n-grams of all lengths 1..T with ``Delta = sum_k Delta_k``
  (``T * Delta_0``): ``sigma*``, ``rho = threshold(sigma*, delta, Delta)``.
* ``dpsu_even``: one DPSU run per length with the budget split evenly. The paper uses advanced
  composition (eps/sqrt(T) each); we compose exactly in GDP (``sigma_k = sigma* sqrt(T)``) and give each
  length's novel-item event ``delta/(2T)`` (``rho_k = threshold(sigma_k, delta/T, Delta_k)``), which is
  the same (eps, delta) and a slightly stronger baseline than the paper's.
* ``dpsu_single``: all budget on one length L (``sigma*``, ``rho = threshold(sigma*, delta, Delta_L)``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import special

from dp_partition_beam.privacy import counts, thresholding
from dp_partition_beam.privacy.accounting import gdp_compose, geometric_sigma_schedule
from dp_partition_beam.privacy.calibration import (
    analytic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_threshold,
    mad_tau,
)
from dp_partition_beam.privacy.validation import (
    DELTA_RANGE,
    EPSILON_RANGE,
    Condition,
    check_bool,
    check_choice,
    check_fractions,
    check_int,
    check_range,
    needs,
    use_table,
)

__all__ = [
    "DPNEParams",
    "DPNE_ALGORITHMS",
    "FIELD_USE",
    "DPNE_WEIGHTINGS",
    "PRUNINGS",
    "VK_METHODS",
    "RunPlan",
    "dpne_level_sigmas",
    "dpne_rho_1",
    "dpne_rho_k",
    "spurious_probability",
    "dpne_composed_privacy",
    "plan_runs",
    "plan_dpne_counts",
    "count_l0",
    "release_privacy",
    "LEVEL_SELECTIONS",
    "LevelRound",
    "rounds_report",
    "level_rounds",
    "round_id",
    "THRESHOLDS",
    "LevelTable",
    "TablePlan",
    "plan_tables",
    "resolved_threshold",
]

DPNE_ALGORITHMS = ("dpne", "dpsu_all", "dpsu_even", "dpsu_single")
DPNE_WEIGHTINGS = ("weighted_gaussian", "mad")
#: How each level selects: one weighted-Gaussian round (the paper) or MAD-SIPS's rounds (docs/dpne.md).
LEVEL_SELECTIONS = ("single", "mad_sips")
#: Randomness-contract round of round r >= 2 of level k: ``k + ROUND_STRIDE (r - 1)`` (round 1 is k).
ROUND_STRIDE = 100
PRUNINGS = ("both", "single")
#: How a level releases (selection='single', weighting='weighted_gaussian'): Gaussian noise + threshold (the
#: paper) or a keep-probability table under Renyi DP (docs/dpne.md, "Keep tables at every level")
THRESHOLDS = ("gaussian", "optimal")
VK_METHODS = ("exact", "sample")


def _uses_mad(v) -> bool:
    """MAD's beta and d_max are read by ``weighting='mad'`` and by every MAD-SIPS round."""
    return getattr(v, "weighting", None) == "mad" or getattr(v, "selection", None) == "mad_sips"


_MAD = Condition(
    "unless {weighting} is mad (or, with dpne, {selection} is mad_sips)", _uses_mad, (("weighting", "mad"),)
)
# MAD-SIPS's rounds are MAD: weighting is read by the single-round levels and the DPSU baselines
_SINGLE = Condition("with {selection} mad_sips", lambda v: getattr(v, "selection", "single") != "mad_sips")
_LEVELS = Condition("unless {max_n} is 2 or more (levels k >= 2)", lambda v: v.max_n >= 2, (("max_n", 2),))

#: Which :class:`DPNEParams` fields each algorithm reads (a field absent here is read by all: epsilon,
#: delta, max_n, max_contributions, weighting, release_counts), and only under the conditions given: DPNE's
#: levels k >= 2 (rho_k from eta, sigma_decay's schedule, the pruned V_k and its size), MAD's parameters,
#: the counts' budget and floor. The CLI rejects a flag given for a field the run does not read.
FIELD_USE = use_table(
    {
        "dpne": (
            "eta",
            "sigma_decay",
            "pruning",
            "vk_method",
            "sample_rate",
            "selection",
            "budget_split",
            "b_min",
            "b_max",
            "c_lb",
            "c_ub",
            "threshold",
        ),
        "dpsu_all": (),
        "dpsu_even": (),
        "dpsu_single": ("dpsu_single_length",),
    },
    {
        "eta": (_LEVELS,),
        "sigma_decay": (_LEVELS,),
        "pruning": (_LEVELS,),
        "vk_method": (_LEVELS, needs("pruning", "both")),  # pruning single: |V_k| = |S_{k-1}| |S_1|, exact
        "sample_rate": (_LEVELS, needs("pruning", "both"), needs("vk_method", "sample")),
        "weighting": (_SINGLE,),
        "beta": (_MAD,),
        "d_max": (_MAD,),
        "budget_split": (needs("selection", "mad_sips"),),
        "b_min": (needs("selection", "mad_sips"),),
        "b_max": (needs("selection", "mad_sips"),),
        "c_lb": (needs("selection", "mad_sips"),),
        "c_ub": (needs("selection", "mad_sips"),),
        "count_budget": (needs("release_counts", True),),
        "min_users": (needs("release_counts", True),),
        "threshold": (_SINGLE, needs("weighting", "weighted_gaussian")),
    },
)


def _field(default, help: str, choices=None):
    """A dataclass field whose help text (and choices) the CLI flags and the report share."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class DPNEParams:
    """Parameters of DPNE and its DPSU baselines (validated on construction; each field's help text is
    in its ``metadata["help"]``, from which the CLI flags are generated). The algorithm itself
    ('dpne', 'dpsu_all', 'dpsu_even' or 'dpsu_single', :data:`DPNE_ALGORITHMS`) is the first argument of
    :class:`transforms.DPNE`, :func:`transforms.reference.dpne_reference` and :func:`plan_runs`.

    Attributes:
      epsilon, delta: total user-level budget (default 4, 1e-7: the paper's Reddit setting).
      max_n: T, the longest n-gram length (1..50, default 9).
      max_contributions: Delta_k, one int for all levels or a list of T ints (default 300).
      eta: target spurious fraction in (0, 1) (default 0.01), sets rho_k for k >= 2.
      sigma_decay: c in sigma_k = c sigma_{k-1} (default 1: equal noise at all levels).
      pruning: 'both' (V_k = (S_1 x S_{k-1}) cap (S_{k-1} x S_1), paper default) or 'single'
        (V_k = S_{k-1} x S_1).
      weighting: 'weighted_gaussian' (paper, 1/sqrt(d)) or 'mad' (MAD at every level, tau_k =
        max(1, rho_k + beta sigma_k)).
      vk_method: 'exact' (sum_y L(y) R(y), default) or 'sample' (supplement Alg. 2 with rate p).
      sample_rate: p of the sampling estimator, in (0, 1].
      dpsu_single_length: the length L of 'dpsu_single' (default T).
      beta, d_max: MAD's adaptive threshold offset (tau = rho + beta sigma) and max adaptive degree.
      threshold: 'gaussian' (the paper) or 'optimal' (keep tables, :func:`plan_tables`; dpne only, with
        selection 'single' and weighting 'weighted_gaussian'); None: 'optimal' where it applies, else
        'gaussian' (:func:`resolved_threshold`).
      release_counts, count_budget, min_users: a DP count of users for every released n-gram (exact
        discrete Gaussian; ``count_budget`` of epsilon and delta, composed in GDP with the levels) and
        the floor on it (post-processing); docs/counts.md.
    """

    epsilon: float = _field(4.0, "total user-level epsilon, in (0, 100]")
    delta: float = _field(1e-7, "total user-level delta, in [1e-30, 0.5]")
    max_n: int = _field(9, "T, the longest n-gram length (1..50)")
    max_contributions: Union[int, Tuple[int, ...]] = _field(
        300, "Delta_k: n-grams kept per user and length, one integer for all lengths or max_n comma-separated"
    )
    eta: float = _field(0.01, "target spurious fraction in (0, 1); sets rho_k for k >= 2")
    sigma_decay: float = _field(1.0, "c in sigma_k = c * sigma_{k-1} (1: equal noise at all levels)")
    pruning: str = _field(
        "both",
        "V_k: both = (S_1 x S_{k-1}) cap (S_{k-1} x S_1) (paper default), single = S_{k-1} x S_1",
        PRUNINGS,
    )
    weighting: str = _field(
        "weighted_gaussian",
        "per-user weights: weighted_gaussian (1/sqrt(d), paper) or mad (MAD at every level)",
        DPNE_WEIGHTINGS,
    )
    vk_method: str = _field(
        "exact", "|V_k|: exact sum_y L(y)R(y) or the paper's sampling estimator (sample)", VK_METHODS
    )
    sample_rate: float = _field(0.01, "p of --vk_method sample, in (0, 1]")
    dpsu_single_length: Optional[int] = _field(None, "the length L of dpsu_single (default: max_n)")
    selection: str = _field(
        "single",
        "how each level selects: single (one weighted-Gaussian round, the paper) or mad_sips (MAD-SIPS's "
        "rounds inside the level's budget; docs/dpne.md)",
        LEVEL_SELECTIONS,
    )
    budget_split: Tuple[float, ...] = _field(
        (0.1, 0.9), "mad_sips: fractions of each level's budget per round (and of its spurious rate), summing to 1"
    )
    b_min: float = _field(0.5, "mad_sips: minimum bias of rounds >= 2, in [0.5, 1]")
    b_max: float = _field(2.0, "mad_sips: maximum bias of rounds >= 2, >= 1")
    c_lb: float = _field(1.0, "mad_sips: lower confidence constant on the previous round's noisy weights, >= 0")
    c_ub: float = _field(1.5, "mad_sips: upper confidence constant (hopeless items) on the previous round's, >= 0")
    beta: float = _field(2.0, "MAD tau_k = max(1, rho_k + beta*sigma_k), beta >= 0")
    d_max: int = _field(50, "MAD maximum adaptive degree (the proof needs d_max >= 4)")
    release_counts: bool = _field(
        False,
        "also release, for every released n-gram, a DP count of the users holding it (exact discrete Gaussian "
        "noise; spends count_budget of epsilon and delta, composed exactly; docs/counts.md)",
    )
    count_budget: float = _field(
        counts.DEFAULT_COUNT_BUDGET,
        "fraction of (epsilon, delta) spent on the released counts, in (0, 1) (only with release_counts)",
    )
    min_users: int = _field(
        0,
        "keep only released n-grams whose noisy count is >= min_users (post-processing of the noisy counts: "
        "no privacy cost; needs release_counts); 0 keeps all",
    )
    threshold: Optional[str] = _field(
        None,
        "how dpne's levels release (selection single, weighting weighted_gaussian): gaussian (noise + threshold "
        "rho_k, the paper) or optimal (a keep-probability table per level under Renyi DP, the same spurious rate; "
        "docs/dpne.md). unset: optimal where it applies and tables exist at the budget, else gaussian",
        THRESHOLDS,
    )

    def __post_init__(self):
        s = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass setter)
        s("epsilon", check_range("epsilon", self.epsilon, *EPSILON_RANGE, lo_open=True))
        s("delta", check_range("delta", self.delta, *DELTA_RANGE))
        s("max_n", check_int("max_n", self.max_n, 1, 50))
        mc = self.max_contributions
        if isinstance(mc, str):
            mc = [int(x) for x in mc.replace(",", " ").split()] if mc.strip() else mc
        if isinstance(mc, (list, tuple)):
            vals = tuple(check_int(f"max_contributions[{i}]", v, 1, 10_000_000) for i, v in enumerate(mc))
            if len(vals) == 1:
                vals = vals * self.max_n
            if len(vals) != self.max_n:
                raise ValueError(
                    f"max_contributions must be one integer or a list of max_n={self.max_n} integers "
                    f"(one per n-gram length), got {len(vals)} values: {mc!r}"
                )
            s("max_contributions", vals)
        else:
            s("max_contributions", check_int("max_contributions", mc, 1, 10_000_000))
        s("eta", check_range("eta", self.eta, 0.0, 1.0, lo_open=True, hi_open=True))
        s("sigma_decay", check_range("sigma_decay", self.sigma_decay, 0.01, 100.0))
        s("pruning", check_choice("pruning", self.pruning, PRUNINGS))
        s("weighting", check_choice("weighting", self.weighting, DPNE_WEIGHTINGS))
        s("vk_method", check_choice("vk_method", self.vk_method, VK_METHODS))
        s("sample_rate", check_range("sample_rate", self.sample_rate, 0.0, 1.0, lo_open=True))
        if self.dpsu_single_length is None:
            s("dpsu_single_length", self.max_n)
        else:
            s("dpsu_single_length", check_int("dpsu_single_length", self.dpsu_single_length, 1, self.max_n))
        s("selection", check_choice("selection", self.selection, LEVEL_SELECTIONS))
        split = self.budget_split
        if isinstance(split, str):
            split = [x for x in split.replace(",", " ").split()]
        s("budget_split", check_fractions("budget_split", split))
        if len(self.budget_split) > 10:
            raise ValueError(f"budget_split has at most 10 rounds, got {len(self.budget_split)}")
        s("b_min", check_range("b_min", self.b_min, 0.5, 1.0))
        s("b_max", check_range("b_max", self.b_max, 1.0, math.inf))
        s("c_lb", check_range("c_lb", self.c_lb, 0.0, math.inf))
        s("c_ub", check_range("c_ub", self.c_ub, 0.0, math.inf))
        s("beta", check_range("beta", self.beta, 0.0, math.inf))
        # MAD's privacy proof needs d_max >= 4 (Lemma 5.3); tau >= 1 is enforced by mad_tau().
        s("d_max", check_int("d_max", self.d_max, 4))
        s("release_counts", check_bool("release_counts", self.release_counts))
        s("count_budget", counts.check_count_budget(self.count_budget))
        s("min_users", counts.check_min_users(self.min_users))
        if self.threshold is not None:
            s("threshold", check_choice("threshold", self.threshold, THRESHOLDS))
        if self.threshold == "optimal" and (self.selection != "single" or self.weighting != "weighted_gaussian"):
            raise ValueError(
                "threshold='optimal' (keep tables) is proven for selection='single' with weighting="
                f"'weighted_gaussian' (got selection={self.selection!r}, weighting={self.weighting!r}): MAD's "
                "weights are rerouted by other users and MAD-SIPS's rounds need noisy weights (docs/dpne.md)"
            )
        if self.min_users > 0 and not self.release_counts:
            raise ValueError(
                f"min_users={self.min_users} filters on the released noisy counts: it needs release_counts=True"
            )

    @property
    def deltas(self) -> Tuple[int, ...]:
        """``(Delta_1, ..., Delta_T)``."""
        mc = self.max_contributions
        return tuple(mc) if isinstance(mc, tuple) else (int(mc),) * self.max_n

    def replace(self, **changes) -> "DPNEParams":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------
# Theorem 2.1
# ---------------------------------------------------------------------------------------------


def dpne_level_sigmas(params: DPNEParams) -> Tuple[float, List[float]]:
    """``(sigma*, [sigma_1..sigma_T])``: sigma* = AGM(eps, delta/2) (with ``release_counts``: the levels'
    share, :func:`plan_runs`), geometric schedule composing to it."""
    share = _count_share("dpne", params)
    sigma_star = analytic_gaussian_sigma(params.epsilon, params.delta / 2.0) if share is None else share.sigma
    return sigma_star, geometric_sigma_schedule(sigma_star, params.max_n, params.sigma_decay)


def dpne_rho_1(sigma_1: float, delta: float, max_contributions: int) -> float:
    """``rho_1 = max_t 1/sqrt(t) + sigma_1 PhiInv((1 - delta/2)^(1/t))`` (Theorem 2.1; total delta)."""
    return gaussian_threshold(sigma_1, delta, max_contributions)


def spurious_probability(eta: float, s_prev_size: int, v_size: int) -> float:
    """``q_k = eta * min(1, |S_{k-1}|/|V_k|) = Phi(-rho_k/sigma_k)`` (0 if V_k is empty)."""
    if v_size <= 0:
        return 0.0
    return float(eta) * min(1.0, s_prev_size / v_size)


def dpne_rho_k(sigma_k: float, eta: float, s_prev_size: int, v_size: int) -> float:
    """``rho_k = sigma_k PhiInv(1 - eta min(1, |S_{k-1}|/|V_k|))`` (section 2); ``inf`` if V_k is empty."""
    q = spurious_probability(eta, s_prev_size, v_size)
    if q <= 0.0:
        return math.inf
    return float(sigma_k) * -float(special.ndtri(q))  # PhiInv(1 - q) = -PhiInv(q), no cancellation


def dpne_composed_privacy(sigmas: Sequence[float], epsilon: float, delta: float) -> Dict[str, float]:
    """What the level sigmas actually give (Theorem 2.1 recomputed).

    Returns ``sigma_composed`` (GDP composition, Prop. 2.3), ``gaussian_delta`` (delta of that Gaussian
    at ``epsilon``, Prop. 2.4; must be <= delta/2), ``total_delta`` (that + delta/2 of rho_1) and
    ``epsilon_at_delta`` (smallest epsilon of the composed Gaussian at delta/2).
    """
    sc = gdp_compose(list(sigmas))
    gd = gaussian_delta(sc, epsilon)
    return {
        "sigma_composed": sc,
        "gaussian_delta": gd,
        "total_delta": gd + delta / 2.0,
        "epsilon_at_delta": gaussian_epsilon(sc, delta / 2.0),
    }


def release_privacy(runs: Sequence["RunPlan"], params: DPNEParams, count_plan=None) -> Dict[str, float]:
    """:func:`dpne_composed_privacy` of a plan's runs, with the counts when released: their continuous
    equivalent (privacy/counts.py, kernel lemma) joins the GDP composition, and the thresholds' delta
    is ``(1 - count_budget) delta / 2``. ``total_delta`` must be <= delta (the tests check it).

    With keep tables (``threshold='optimal'``): the RDP composition of :class:`TablePlan` converted once,
    ``sigma_composed`` and ``gaussian_delta`` None, ``epsilon_at_delta`` its epsilon."""
    if any(r.table is not None for r in runs):
        return plan_tables(params).privacy()
    sigmas = [r.sigma for r in runs]
    if count_plan is not None:
        sigmas.append(count_plan.sigma_continuous / math.sqrt(count_plan.l0))
    comp = dpne_composed_privacy(sigmas, params.epsilon, params.delta)
    if count_plan is not None:
        comp["total_delta"] = comp["gaussian_delta"] + (1.0 - params.count_budget) * params.delta / 2.0
    return comp


# ---------------------------------------------------------------------------------------------
# Run plans (DPNE levels and DPSU baselines)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One noisy-histogram run: the n-gram lengths it covers, its noise, cap and (fixed) threshold.

    For DPNE levels k >= 2 ``rho`` is None here: it depends on the released S_{k-1} and |V_k| and is
    computed during the run (:func:`dpne_rho_k`). ``round_`` is the randomness-contract round. With
    ``threshold='optimal'`` the level releases by its keep table (``table``, :class:`LevelTable`) and has no
    noise or threshold (``sigma``, ``rho`` and ``delta_threshold`` None).
    """

    name: str
    lengths: Tuple[int, ...]
    sigma: Optional[float]
    max_contributions: int
    rho: Optional[float]
    delta_threshold: Optional[float]
    round_: int
    table: Optional["LevelTable"] = None

    def as_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["table"] = None if self.table is None else self.table.as_report()
        return d


def count_l0(algorithm: str, params: DPNEParams) -> int:
    """Coordinates of the count vector one user can change: ``sum_k Delta_k`` over the lengths released
    (one capped set per level, or dpsu_all's one set capped at the sum), ``Delta_L`` for dpsu_single."""
    if algorithm == "dpsu_single":
        return params.deltas[params.dpsu_single_length - 1]
    return int(sum(params.deltas))


def _count_share(algorithm: str, params: DPNEParams) -> Optional[counts.SelectionShare]:
    if not params.release_counts:
        return None
    return counts.split_gdp(params.epsilon, params.delta, params.count_budget, count_l0(algorithm, params))


def plan_dpne_counts(algorithm: str, params: DPNEParams) -> Optional[counts.CountPlan]:
    """The count release's plan (one discrete Gaussian for every released n-gram of every length; the
    randomness-contract round of run r's counts is ``r.round_``), or None without ``release_counts``."""
    algorithm = check_choice("algorithm", algorithm, DPNE_ALGORITHMS)
    share = _count_share(algorithm, params)
    return None if share is None else share.counts


def plan_runs(algorithm: str, params: DPNEParams) -> Tuple[Optional[float], List[RunPlan]]:
    """``(sigma*, runs)`` of ``algorithm`` (one of :data:`DPNE_ALGORITHMS`; see the module docstring).

    With ``threshold='optimal'`` (dpne only) every level is a keep table (:func:`plan_tables`) and sigma* is
    None: there is no Gaussian to compose.

    With ``release_counts`` the levels get the selection's share of the GDP budget (``sigma*`` is
    ``1 / mu_sel``) and the thresholds ``(1 - count_budget)`` of ``delta`` (privacy/counts.py, 'gdp').
    """
    algorithm = check_choice("algorithm", algorithm, DPNE_ALGORITHMS)
    if not isinstance(params, DPNEParams):
        raise TypeError(f"params must be a DPNEParams, got {type(params).__name__}")
    if params.threshold == "optimal" and algorithm != "dpne":
        raise ValueError(f"threshold='optimal' is a dpne option ({algorithm} is the paper's Gaussian baseline)")
    share = _count_share(algorithm, params)
    if share is None:
        sigma_star = analytic_gaussian_sigma(params.epsilon, params.delta / 2.0)
        delta_thr = params.delta
    else:
        sigma_star, delta_thr = share.sigma, share.delta_threshold
    T = params.max_n
    deltas = params.deltas
    if algorithm == "dpne" and resolved_threshold(algorithm, params) == "optimal":
        tp = plan_tables(params)
        return None, [RunPlan(f"level_{t.k}", (t.k,), None, deltas[t.k - 1], None, None, t.k, t) for t in tp.levels]
    if algorithm == "dpne":
        _, sigmas = dpne_level_sigmas(params)
        runs = [
            RunPlan("level_1", (1,), sigmas[0], deltas[0], dpne_rho_1(sigmas[0], delta_thr, deltas[0]), delta_thr, 1)
        ]
        for k in range(2, T + 1):
            runs.append(RunPlan(f"level_{k}", (k,), sigmas[k - 1], deltas[k - 1], None, None, k))
        return sigma_star, runs
    if algorithm == "dpsu_all":
        d = int(sum(deltas))
        return sigma_star, [
            RunPlan(
                "dpsu_all",
                tuple(range(1, T + 1)),
                sigma_star,
                d,
                gaussian_threshold(sigma_star, delta_thr, d),
                delta_thr,
                0,
            )
        ]
    if algorithm == "dpsu_even":
        sig = sigma_star * math.sqrt(T)  # GDP: T equal shares of mu^2 = 1/sigma*^2
        dk = delta_thr / T
        return sigma_star, [
            RunPlan(f"dpsu_even_{k}", (k,), sig, deltas[k - 1], gaussian_threshold(sig, dk, deltas[k - 1]), dk, k)
            for k in range(1, T + 1)
        ]
    L = params.dpsu_single_length
    return sigma_star, [
        RunPlan(
            f"dpsu_single_{L}",
            (L,),
            sigma_star,
            deltas[L - 1],
            gaussian_threshold(sigma_star, delta_thr, deltas[L - 1]),
            delta_thr,
            L,
        )
    ]


# ---------------------------------------------------------------------------------------------
# MAD-SIPS inside a level (selection='mad_sips'; docs/dpne.md, "MAD-SIPS inside the levels")
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LevelRound:
    """Round r of a level run with ``selection='mad_sips'`` (public: a function of the parameters and, for
    k >= 2, of the released ``|S_{k-1}|`` and ``|V_k|``).

    Attributes:
      index: r (1-based).
      round_: the randomness-contract round, :func:`round_id` (k for r = 1).
      sigma: ``sigma_k / sqrt(f_r)``: the R rounds compose in GDP to the level's sigma_k.
      rho: the threshold. Level 1: ``max_t h_r(t) + sigma PhiInv((1 - f_r delta_thr/2)^(1/t))`` with
        ``h_1 = 1/sqrt(t)`` and ``h_r = min(b_max/sqrt(t), 1)``. Level k >= 2: ``sigma PhiInv(1 - f_r q_k)``
        (post-processing; it sets the spurious rate).
      tau: MAD's ``max(1, rho + beta sigma)``.
      spurious_prob: ``f_r q_k``, the chance a zero-weight k-gram passes (k >= 2); None at level 1.
      delta_threshold: level 1's ``f_r delta_thr`` (its novel-item event has probability <= half of it).
    """

    index: int
    round_: int
    sigma: float
    rho: float
    tau: float
    spurious_prob: Optional[float] = None
    delta_threshold: Optional[float] = None

    def as_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rho"] = self.rho if math.isfinite(self.rho) else None
        d["tau"] = self.tau if math.isfinite(self.tau) else None
        return d


def round_id(k: int, r: int) -> int:
    """The randomness-contract round of round r of level k: ``k + 100 (r - 1)`` (max_n <= 50, r <= 10)."""
    return int(k) + ROUND_STRIDE * (int(r) - 1)


def _level_one_h(r: int, b_max: float):
    """The novel-item bound of round r at level 1: 1/sqrt(t) (r = 1, unbiased MAD), then min(b_max/sqrt(t), 1)
    (MAD paper Lemma 5.3 with biases <= b_max, and <= 1 by the l2 bound; as MAD-SIPS, docs/mad_sips.md)."""
    if r == 1:
        return None  # calibration's default 1/sqrt(t)
    return lambda t: np.minimum(b_max / np.sqrt(t), 1.0)


def level_rounds(run: RunPlan, params: DPNEParams, q: Optional[float] = None) -> Tuple[LevelRound, ...]:
    """The rounds of a DPNE level with ``selection='mad_sips'``: level 1 from ``run.delta_threshold``, level
    k >= 2 from its spurious rate ``q = q_k`` (:func:`spurious_probability`; 0 when V_k is empty: no round
    can release, every rho is inf). The fractions ``f_r`` are ``params.budget_split``."""
    k = run.lengths[0]
    rounds = []
    for r, f in enumerate(params.budget_split, start=1):
        sigma = run.sigma / math.sqrt(f)  # sum_r f_r / sigma_k^2 = 1 / sigma_k^2 (GDP)
        if k == 1:
            d = f * run.delta_threshold
            rho = gaussian_threshold(sigma, d, run.max_contributions, _level_one_h(r, params.b_max))
            qr = None
        else:
            if q is None:
                raise ValueError(f"level {k} >= 2 needs its spurious rate q_k")
            d = None
            qr = f * q
            rho = sigma * -float(special.ndtri(qr)) if qr > 0.0 else math.inf
        rounds.append(LevelRound(r, round_id(k, r), sigma, rho, mad_tau(rho, sigma, params.beta), qr, d))
    return tuple(rounds)


# ---------------------------------------------------------------------------------------------
# Keep tables at every level (threshold='optimal'; docs/dpne.md, "Keep tables at every level")
# ---------------------------------------------------------------------------------------------

#: the levels' table grid H = 2^-8 (finer when the smallest contribution needs it,
#: :func:`thresholding.min_grid_bits`): W50 within ~0.6% of 2^-10's, a quarter of the entries (0.2 s a table
#: at Delta_k 10, 1 s at 300)
TABLE_GRID_BITS = 8
#: a level table's length limit (2 MB of floats); a table that does not reach ~1 within it is an error
TABLE_MAX_ENTRIES = 1 << 18
#: the fractions of delta tried for level 1's mixture (the rest is the conversion's)
TABLE_DELTA_FRACTIONS = (0.05, 0.1, 0.25, 0.5)
#: the search ranks orders at the spurious rate eta / 100 (q_k = eta min(1, |S_{k-1}|/|V_k|) is known only at
#: run time; the best order barely moves with q: docs/dpne.md)
TABLE_RATE_REF = 0.01
#: the smallest rate a level's table is checked at in the plan, times eta
TABLE_RATE_MIN = 1e-9


@dataclasses.dataclass(frozen=True)
class LevelTable:
    """Level k's keep table, as parameters (public, fixed before any data is read): level 1's table is built
    from them in the plan; a level k >= 2 builds its own once its spurious rate q_k is known (:meth:`build`).

    Attributes:
      k: the level.
      alpha, epsilon_rdp: the table's Renyi order and budget (one user changes the level's release by an
        (alpha, epsilon_rdp)-RDP pair; docs/thresholding.md).
      delta_rdp: level 1's mixture delta (an unknown domain: n-grams nobody holds are never kept); 0 at
        levels k >= 2 (a known domain V_k: F(0) = q_k > 0 and the table is pure RDP).
      contributions: C = {1/sqrt(d) : d <= Delta_k}, the weighted-Gaussian weights.
      grid_bits: the table's grid H = 2^-grid_bits.
    """

    k: int
    alpha: float
    epsilon_rdp: float
    delta_rdp: float
    contributions: Tuple[float, ...]
    grid_bits: int

    def build(self, unseen: float = 0.0) -> thresholding.KeepTable:
        """The table (cached per process): F(0) = ``unseen`` (level k >= 2: its rate q_k), each step the
        largest the budget allows (:func:`thresholding.keep_table`). ``ValueError`` if it does not reach ~1."""
        return _build_level_table(self, thresholding.keep_rate(unseen))

    def as_report(self) -> Dict[str, Any]:
        return {
            "alpha": self.alpha,
            "epsilon_rdp": self.epsilon_rdp,
            "delta_rdp": self.delta_rdp,
            "grid": math.ldexp(1.0, -self.grid_bits),
        }


@functools.lru_cache(maxsize=256)
def _keep_table(alpha, epsilon_rdp, delta_rdp, contributions, grid_bits, unseen) -> thresholding.KeepTable:
    return thresholding.keep_table(
        alpha, epsilon_rdp, delta_rdp, contributions, grid_bits, TABLE_MAX_ENTRIES, unseen=unseen
    )


def _build_level_table(spec: LevelTable, unseen: float) -> thresholding.KeepTable:
    table = _keep_table(spec.alpha, spec.epsilon_rdp, spec.delta_rdp, spec.contributions, spec.grid_bits, unseen)
    if not table.complete:
        raise ValueError(
            f"level {spec.k}'s keep table (alpha {spec.alpha:.3g}, RDP budget {spec.epsilon_rdp:.3g}, rate "
            f"{unseen:.3g}) does not reach probability 1 within {len(table.probs)} entries: the budget is too "
            "small for tables; use threshold='gaussian'"
        )
    return table


def table_report(table: thresholding.KeepTable) -> Dict[str, Any]:
    """What a level's report prints of its built table: its rate F(0), length and the weights kept with
    probability 0.1, 0.5 and 0.9 (W50 plays the role of the Gaussian's rho_k)."""
    return {
        "unseen": table.unseen,
        "entries": len(table.probs),
        "weight_kept_10_50_90": [table.weight_for(0.1), table.weight_for(0.5), table.weight_for(0.9)],
    }


@dataclasses.dataclass(frozen=True)
class TablePlan:
    """DPNE with a keep table at every level (``threshold='optimal'``; docs/dpne.md, "Keep tables at every
    level"): one Renyi order alpha for all, each level a share of one RDP budget, converted once.

    Level 1 (unknown domain) is ``delta_level_1``-approximately (alpha, eps_1)-RDP, level k >= 2 (known domain
    V_k) (alpha, eps_k)-RDP, the counts (with ``release_counts``) (alpha, ``counts_rdp``)-RDP (their continuous
    equivalent, docs/counts.md (b)). Adaptive composition adds the eps and the deltas; the conversion at
    ``delta_conversion`` (Balle et al. 2020, Thm 21) gives (epsilon, delta_level_1 + delta_conversion
    [+ the counts' kernel slack]) <= (epsilon, delta).

    Attributes:
      alpha: the common order.
      levels: level k's :class:`LevelTable` (k = 1..T); eps_k is the budget's share ``c^{-2(k-1)} /
        sum_j c^{-2(j-1)}`` (``sigma_decay`` c, as the paper's sigma_k = c sigma_{k-1}: RDP ~ 1/sigma^2).
      delta_level_1, delta_conversion: level 1's mixture delta and the conversion's.
      counts_rdp: the counts' RDP at alpha (0 without counts).
      delta_slack: delta reserved for the counts' discrete kernel (0 without counts).
      epsilon, delta: the run's budget.
    """

    alpha: float
    levels: Tuple[LevelTable, ...]
    delta_level_1: float
    delta_conversion: float
    counts_rdp: float
    delta_slack: float
    epsilon: float
    delta: float

    def privacy(self) -> Dict[str, Any]:
        """The composed guarantee: ``epsilon_at_delta`` (<= epsilon to rounding), ``total_delta`` (<= delta)."""
        rdp = math.fsum([t.epsilon_rdp for t in self.levels] + [self.counts_rdp])
        return {
            "sigma_composed": None,
            "gaussian_delta": None,
            "total_delta": self.delta_level_1 + self.delta_conversion + self.delta_slack,
            "epsilon_at_delta": thresholding.rdp_to_dp_epsilon(rdp, self.alpha, self.delta_conversion),
            "alpha": self.alpha,
            "epsilon_rdp": rdp,
            "delta_level_1": self.delta_level_1,
            "delta_conversion": self.delta_conversion,
        }


def resolved_threshold(algorithm: str, params: DPNEParams) -> str:
    """The threshold a run uses: ``params.threshold``; for None 'optimal' where keep tables apply (dpne with
    selection 'single' and weighting 'weighted_gaussian') and :func:`plan_tables` finds tables at the budget
    (they release ~13% more n-grams on MSNBC, docs/dpne.md), else 'gaussian'."""
    if params.threshold is not None:
        return params.threshold
    if algorithm != "dpne" or params.selection != "single" or params.weighting != "weighted_gaussian":
        return "gaussian"
    try:
        plan_tables(params)
    except ValueError:  # too small a budget for tables: the paper's Gaussian levels
        return "gaussian"
    return "optimal"


def level_shares(params: DPNEParams) -> np.ndarray:
    """Level k's fraction of the tables' RDP budget: ``c^{-2(k-1)}`` normalised (``sigma_decay`` c)."""
    w = np.asarray(params.sigma_decay, dtype=np.float64) ** (-2.0 * np.arange(params.max_n))
    return w / w.sum()


@functools.lru_cache(maxsize=32)
def plan_tables(params: DPNEParams) -> TablePlan:
    """The keep tables of every level (pure function of the parameters, cached).

    The budget: ``E(alpha, f) = epsilon - conv(alpha, (1 - f) delta_P) - alpha counts_rdp`` (``delta_P`` =
    delta, less the counts' kernel slack), level k gets ``share_k E`` and level 1 the mixture delta ``f
    delta_P``. The order alpha and f minimise, at equal shares, level 1's W50 plus (T - 1) times a level
    k >= 2's W50 at the rate ``eta / 100`` (:func:`thresholding.search_order`, on a coarse grid)."""
    if not isinstance(params, DPNEParams):
        raise TypeError(f"params must be a DPNEParams, got {type(params).__name__}")
    T, deltas = params.max_n, params.deltas
    delta_p, counts_coef, slack = params.delta, 0.0, 0.0
    plan = plan_dpne_counts("dpne", params)
    if plan is not None:  # the counts' noise of the gdp split, in RDP (privacy/selection.py does the same)
        counts_coef = plan.l0 / (2.0 * plan.sigma_continuous**2)
        counts.check_kernel_slack(plan.l0, delta_p, plan.tau2)
        slack = delta_p * counts.DELTA_SLACK
        delta_p -= slack
    contributions = [thresholding.basic_contributions(d) for d in deltas]
    sub_1 = thresholding._search_subset(contributions[0])
    sub_k = thresholding._search_subset(contributions[min(1, T - 1)])
    q_ref = params.eta * TABLE_RATE_REF

    def budget(alpha: float, f: float) -> float:
        return params.epsilon - thresholding.rdp_to_dp_epsilon(0.0, alpha, (1.0 - f) * delta_p) - alpha * counts_coef

    def score(alphas, fractions) -> np.ndarray:
        alphas, fractions = np.broadcast_arrays(np.asarray(alphas, float), np.asarray(fractions, float))
        alphas, fractions = alphas.ravel(), fractions.ravel()
        eps = np.array([budget(a, f) for a, f in zip(alphas, fractions)]) / T
        w = thresholding._weights_kept(alphas, eps, fractions * delta_p, sub_1, 5, 0.5, every=True)
        if T > 1:
            w = w + (T - 1) * thresholding._weights_kept(alphas, eps, 0.0, sub_k, 5, 0.5, q_ref, True)
        return w

    try:
        alpha, f, _ = thresholding.search_order(budget, score, params.epsilon, TABLE_DELTA_FRACTIONS)
    except ValueError:
        raise ValueError(
            f"no keep tables at epsilon {params.epsilon:g}, delta {params.delta:g}: use threshold='gaussian'"
        ) from None
    total = budget(alpha, f) * (1.0 - 1e-12)  # float error of the sum of shares stays below the budget
    shares = level_shares(params)
    levels = tuple(
        LevelTable(
            k,
            alpha,
            float(total * shares[k - 1]),
            f * delta_p if k == 1 else 0.0,
            contributions[k - 1],
            max(TABLE_GRID_BITS, thresholding.min_grid_bits(contributions[k - 1])),
        )
        for k in range(1, T + 1)
    )
    levels[0].build()  # level 1's table is data-independent: built (and checked) with the plan
    # a level k >= 2 builds its table at run time from q_k >= eta / |S_1| (|V_k| <= |S_{k-1}| |S_1|): checked here
    # at a rate below that of a billion released words, so that a run never stops on a table cut short (levels
    # with the same budget and Delta_k share one cached build)
    for spec in levels[1:]:
        spec.build(params.eta * TABLE_RATE_MIN)
    delta_1, delta_conversion = f * delta_p, (1.0 - f) * delta_p
    return TablePlan(alpha, levels, delta_1, delta_conversion, alpha * counts_coef, slack, params.epsilon, params.delta)


# ---------------------------------------------------------------------------------------------
# Level reports (the public parameters of each run; the Beam transform and the reference share them)
# ---------------------------------------------------------------------------------------------


def _with_tau(level: Dict[str, Any], rho: Optional[float], sigma: float, weighting: str, beta: float):
    if weighting == "mad":
        level["tau"] = mad_tau(rho, sigma, beta) if rho is not None and math.isfinite(rho) else None
    return level


def _table_level(level: Dict[str, Any], spec: LevelTable, unseen: float) -> Dict[str, Any]:
    level["threshold"] = "optimal"
    level["keep_table"] = {**spec.as_report(), **table_report(spec.build(unseen))}
    return level


def level_one_report(plan: RunPlan, weighting: str, beta: float) -> Dict[str, Any]:
    """DPNE's level 1 (fixed rho_1): k, sigma, rho, max_contributions and MAD's tau; with a keep table
    (``plan.table``) k, max_contributions and the table (no sigma, rho)."""
    if plan.table is not None:
        return _table_level({"k": 1, "max_contributions": plan.max_contributions}, plan.table, 0.0)
    level = {"k": 1, "sigma": plan.sigma, "rho": plan.rho, "max_contributions": plan.max_contributions}
    return _with_tau(level, plan.rho, plan.sigma, weighting, beta)


def baseline_run_report(plan: RunPlan, weighting: str, beta: float) -> Dict[str, Any]:
    """A DPSU baseline run (fixed rho over its lengths): run, lengths, sigma, rho, max_contributions, tau."""
    level = {
        "run": plan.name,
        "lengths": list(plan.lengths),
        "sigma": plan.sigma,
        "rho": plan.rho,
        "max_contributions": plan.max_contributions,
    }
    return _with_tau(level, plan.rho, plan.sigma, weighting, beta)


def rounds_report(level: Dict[str, Any], rounds: Sequence[LevelRound], released: Sequence[int]) -> Dict[str, Any]:
    """A level's report with ``selection='mad_sips'``: its single-round ``rho``/``tau`` replaced by the rounds
    (:meth:`LevelRound.as_dict` and the number each released)."""
    level = {k: v for k, v in level.items() if k not in ("rho", "tau")}
    level["rounds"] = [{**rd.as_dict(), "released": int(n)} for rd, n in zip(rounds, released)]
    return level


def level_k_report(
    k: int,
    sigma: Optional[float],
    max_contributions: int,
    eta: float,
    weighting: str,
    beta: float,
    s_prev_size: int,
    v_size: int,
    table: Optional[LevelTable] = None,
) -> Dict[str, Any]:
    """DPNE's level k >= 2, from the released |S_{k-1}| and |V_k| (public): rho_k, q_k and the bound
    on the expected number of spurious k-grams (rho None when V_k is empty).

    With a keep table (``table``): q_k rounded down to 2^-64 (:func:`thresholding.keep_rate`, the table's
    F(0) and the spurious step's rate) and the built table's report instead of sigma and rho
    (``keep_table`` None when V_k is empty: q_k = 0, nothing is released)."""
    if table is not None:
        q = thresholding.keep_rate(spurious_probability(eta, s_prev_size, v_size))
        level = {
            "k": k,
            "max_contributions": max_contributions,
            "s_prev": int(s_prev_size),
            "v_k": int(v_size),
            "spurious_prob": q,
            "expected_spurious_bound": v_size * q,
        }
        if q > 0.0:
            return _table_level(level, table, q)
        return dict(level, threshold="optimal", keep_table=None)
    rho = dpne_rho_k(sigma, eta, s_prev_size, v_size)
    q = spurious_probability(eta, s_prev_size, v_size)
    level = {
        "k": k,
        "sigma": sigma,
        "max_contributions": max_contributions,
        "s_prev": int(s_prev_size),
        "v_k": int(v_size),
        "spurious_prob": q,
        "expected_spurious_bound": v_size * q,
        "rho": rho if math.isfinite(rho) else None,
    }
    return _with_tau(level, level["rho"], sigma, weighting, beta)
