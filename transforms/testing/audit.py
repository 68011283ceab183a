"""Empirical privacy audit of the released-set algorithms (worst-case neighbouring datasets).

Each :class:`AuditCase` describes a pair of neighbouring datasets ``D`` and ``D' = D + one user``
and an event on the released set; :func:`run_audit` runs the in-memory reference
(:func:`transforms.reference.select`, :func:`transforms.dpne.reference.dpne_reference`) *without a
seed* (fresh OS-entropy randomness) many times on both, counts the event and turns the counts into
a lower bound on epsilon (:func:`privacy.audit.audit_bound`).

Runs in one call. A call on ``B`` disjoint copies of the case (users and items renamed per copy) is
``B`` independent runs: every algorithm here treats items only through the users holding them, the
thresholds (rho, tau) and noise scales are fixed by the public plan before any data is seen, and every
noise/subsample draw is a fresh draw of the worker generator. So the released set restricted to one
copy has exactly the distribution of one run on that copy alone, independently of the other copies.
This does not hold in general for DPNE levels k >= 2 (rho_k depends on |S_{k-1}| and |V_k|), so the DPNE
'tip' cases use events on 1-grams (level 1 has a fixed rho_1). The 'bigram' cases audit level 2: there
every copy's two words are held by BIGRAM_BACKGROUND users alone, so level 1 releases all of them (each
word's weight is >= 40 against rho_1 = 9.5 at sigma 1.7, or rho 10.5 at sigma 1.8 in mad_sips's round 2:
a miss has probability < 1e-30; level 1's keep table is at 1 - 1e-8 from weight 17.3),
hence |S_1| = 2B, |V_2| = 4B^2 and rho_2 are the same in every call and on
D and D', and the target bigram is always in the support, so it passes by its own noise only: the copies
are again independent runs.
The policy algorithms (sequential, order-dependent) run one copy per call (``copies_per_call=1``).

Worst cases (MAD paper section 5; DPSU paper section 3):
  tip      ``k`` users hold only the target; the added user holds only the target and tips it over
           rho (l2/l1 shift 1 on one coordinate: the Gaussian/Laplace worst case for one item).
  all      the added user holds Delta_0 targets, each held by ``k`` users; event "all released" (the
           worst case of the count baselines, whose sensitivity is spread over Delta_0 items).
  dmax     MAD: the added user has degree d_max and its items sit near tau (truncation + rerouting).
  bigram   DPNE level 2: ``k`` users hold the bigram "a b" (as a line "a b"), its words are common; the added
           user holds it too (``targets`` 2: its two words). Event: the bigram released (the known-domain
           Gaussian round(s) of level 2, at the rho_2 of a call of ``copies_per_call`` copies).
  unique   the added user holds Delta_0 items nobody else has: each must be released with
           probability <= delta in total, so at delta <= 1e-6 it must never be seen.
  resample MAD-SIPS / DP-SIPS re-subsampling: the added user holds 2 Delta_0 targets (more than one
           round can take), each also held by ``k`` single-item users; it sends a fresh subsample of
           its unreleased targets every round. Event: all targets released.

MAD-SIPS's adaptive cap (privacy/cap.py, on by default) reads a degree histogram of *all* users of a
call, so the copies of one call are not independent under it: the multi-copy MAD-SIPS cases fix the cap
(``cap_quantile=1``) and ``mad_sips/cap_tip`` runs the default (adaptive) MAD-SIPS one copy per call.

Count release (``params.release_counts``): a case with ``min_count`` has the event "the target is
released AND its noisy count is >= min_count" (the ``basic/counts`` case: the tip shape, where the
added user moves both the selection weight and the count by 1).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple

from dp_partition_beam.privacy.audit import AuditBound, audit_bound
from dp_partition_beam.privacy.dpne import DPNEParams
from dp_partition_beam.privacy.selection import ALGORITHMS, L1_CALIBRATIONS, SelectionParams, noise_rule

UserSets = Dict[Hashable, List[str]]


@dataclasses.dataclass(frozen=True)
class AuditCase:
    """One neighbouring pair and one event.

    Attributes:
      name: ``<algorithm>/<shape>``.
      algorithm: a selection algorithm (``privacy.params.ALGORITHMS``), or 'dpne'.
      params: SelectionParams (or DPNEParams for 'dpne'); ``params.epsilon`` is the claimed epsilon.
      shape: 'tip', 'all', 'dmax', 'resample', 'bigram' or 'unique' (see the module docstring).
      holders: ``k``, the users holding each target in D.
      targets: number of target items the added user holds.
      copies_per_call: disjoint copies per reference call (1 for order-dependent algorithms).
      min_count: with ``params.release_counts``: a target counts as released only if its noisy count
        is >= min_count (the event is on the released count).
    """

    name: str
    algorithm: str
    params: object
    shape: str
    holders: int
    targets: int = 1
    copies_per_call: int = 500
    min_count: Optional[int] = None

    @property
    def claimed_epsilon(self) -> float:
        return float(self.params.epsilon)

    @property
    def delta(self) -> float:
        return float(self.params.delta)


def _target(copy: int, j: int) -> str:
    return f"c{copy}t{j}"


def case_datasets(case: AuditCase, copies: int) -> Tuple[UserSets, UserSets]:
    """``(D, D')`` made of ``copies`` disjoint copies of the case (D' = D + one user per copy)."""
    base: UserSets = {}
    neighbour: UserSets = {}
    for c in range(copies):
        targets = [_target(c, j) for j in range(case.targets)]
        if case.shape == "tip":
            for h in range(case.holders):
                base[f"c{c}u{h}"] = [targets[0]]
        elif case.shape in ("all", "dmax", "resample"):
            # 'all': background users hold all targets (same per-user weight as the added user).
            # 'dmax': single-item background users put each target's w_init at `holders` (near tau);
            # 'resample': the same background, the added user holds more targets than Delta_0.
            for h in range(case.holders):
                if case.shape == "all":
                    base[f"c{c}u{h}"] = list(targets)
                else:
                    for j, t in enumerate(targets):
                        base[f"c{c}u{h}x{j}"] = [t]
        elif case.shape == "unique":
            base[f"c{c}bg"] = [f"c{c}common"]
        elif case.shape == "bigram":
            # DPNE level 2: the bigram's two words are common (BIGRAM_BACKGROUND users hold each alone, so level 1
            # releases them), `holders` users hold the bigram; the added user holds it too
            a, b = targets[0] + "a", targets[0] + "b"
            for h in range(BIGRAM_BACKGROUND):
                base[f"c{c}wa{h}"] = [a]
                base[f"c{c}wb{h}"] = [b]
            for h in range(case.holders):
                base[f"c{c}u{h}"] = [a, b]
            neighbour[f"c{c}added"] = [a, b]
            continue
        else:
            raise ValueError(f"unknown audit shape {case.shape!r}")
        neighbour[f"c{c}added"] = list(targets)
    d_prime = dict(base)
    d_prime.update(neighbour)
    return base, d_prime


def _release(case: AuditCase, user_sets: UserSets) -> Set[str]:
    if case.algorithm == "dpne":
        from dp_partition_beam.transforms.dpne.reference import dpne_reference

        texts = {u: " ".join(items) for u, items in user_sets.items()}
        return dpne_reference(texts, "dpne", case.params).all_ngrams()
    from dp_partition_beam.transforms import reference

    if case.min_count is not None:
        counts = reference.select_counts(user_sets, case.algorithm, case.params)
        return {item for item, c in counts.items() if c >= case.min_count}
    return reference.select(user_sets, case.algorithm, case.params)


def event_counts(case: AuditCase, released: Set[str], copies: int) -> int:
    """Copies in which the event happened: all targets released ('unique': any target released)."""
    n = 0
    for c in range(copies):
        if case.shape == "bigram":
            n += int(f"{_target(c, 0)}a {_target(c, 0)}b" in released)
            continue
        hits = sum(1 for j in range(case.targets) if _target(c, j) in released)
        n += int(hits > 0) if case.shape == "unique" else int(hits == case.targets)
    return n


def run_counts(case: AuditCase, runs: int, release: Optional[Callable] = None) -> Tuple[int, int]:
    """``(events under D, events under D')`` over ``runs`` runs each, fresh randomness every call."""
    release = release or _release
    done = e0 = e1 = 0
    while done < runs:
        copies = min(case.copies_per_call, runs - done)
        base, d_prime = case_datasets(case, copies)
        e0 += event_counts(case, release(case, base), copies)
        e1 += event_counts(case, release(case, d_prime), copies)
        done += copies
    return e0, e1


@dataclasses.dataclass(frozen=True)
class AuditResult:
    case: AuditCase
    bound: AuditBound

    def row(self) -> Dict[str, object]:
        return {
            "case": self.case.name,
            "runs": self.bound.runs,
            "events_D": self.bound.events_base,
            "events_D'": self.bound.events_neighbour,
            "epsilon_lb": round(self.bound.epsilon_lb, 3),
            "epsilon": self.case.claimed_epsilon,
            "delta": self.case.delta,
        }


def run_audit(case: AuditCase, runs: int, alpha: float) -> AuditResult:
    """Runs ``case`` and returns its lower bound (each of 4 one-sided bounds at level ``alpha``)."""
    e0, e1 = run_counts(case, runs)
    return AuditResult(case, audit_bound(e0, e1, runs, case.delta, alpha))


# ------------------------------------------------------------------------------------------------
# The worst cases. `holders` was chosen from the public plan (rho, sigma) so that the event sits in
# the noise tail where the privacy-loss ratio is largest yet still observable in ~1e4-1e5 runs
# (benchmarks/privacy_audit.py --design prints the expected bound for each k).
# ------------------------------------------------------------------------------------------------

_EPS = 4.0
_DELTA = 1e-6
_UNIQUE_DELTA = 1e-12


def _sel(max_contributions: int, delta: float = _DELTA, **kw) -> SelectionParams:
    return SelectionParams(epsilon=_EPS, delta=delta, max_contributions=max_contributions, d_max=4, **kw)


def _dpne_params(delta: float = _DELTA, **kw) -> DPNEParams:
    return DPNEParams(epsilon=_EPS, delta=delta, max_n=2, max_contributions=4, **kw)


def _bigram_case(name: str, **kw) -> AuditCase:
    """A DPNE level-2 case (module docstring): 4 holders of the bigram, 100 copies a call."""
    return AuditCase(name, "dpne", _dpne_params(**kw), "bigram", holders=4, targets=2, copies_per_call=100)


def _mad_sips_table_case(name: str, weight_cap, holders: int, copies_per_call: int = 500) -> AuditCase:
    """A ``tip`` case of MAD-SIPS's keep-table last round (epsilon 4, no adaptive cap) at ``weight_cap``."""
    params = _sel(4, threshold="optimal", cap_quantile=1.0, weight_cap=weight_cap)
    return AuditCase(f"mad_sips/{name}", "mad_sips", params, "tip", holders=holders, copies_per_call=copies_per_call)


#: users holding each word of a 'bigram' case alone (enough for level 1 to release both words every time)
BIGRAM_BACKGROUND = 40


def _tip_settings(spec) -> dict:
    """The multi-round algorithms' ``tip`` cases audit their Gaussian rounds (``threshold='gaussian'``; the
    ``*/optimal_tip`` cases audit the keep-table last round, their default), the Laplace algorithms' and
    count_gaussian's, mad's and policy_gaussian's their own noise (``threshold`` 'laplace' / 'gaussian';
    ``*/optimal_tip``: the l1 curve, count_gaussian's table and MAD's and Policy Gaussian's l2 rule, their
    defaults). MAD-SIPS's multi-copy cases fix the cap at Delta_0 (``cap_quantile=1``): the adaptive cap's histogram
    would couple the copies of one call (the ``cap_tip`` case audits the adaptive cap, one copy per call)."""
    if spec.shape == "mad_sips":
        return {"cap_quantile": 1.0, "threshold": "gaussian"}
    if spec.calibration in L1_CALIBRATIONS or spec.name in ("count_gaussian", "policy_gaussian", "mad"):  # their
        return {"threshold": noise_rule(spec)}  # noise + rho (*/optimal_tip: the l1 curve, the tables, the l2 rule)
    return {"threshold": "gaussian"} if spec.shape in ("mad2r", "dp_sips") else {}


def standard_cases() -> List[AuditCase]:
    """Worst-case neighbouring pairs for every released-set algorithm (claimed epsilon 4).

    Every algorithm of the registry (:data:`privacy.selection.ALGORITHMS`) gets its ``tip`` case from
    its entry (``audit_holders``; the count baselines at Delta_0 = 1, where one item carries the whole
    sensitivity; the sequential ones one copy per call). The algorithm-specific worst cases follow.
    """
    cases = [
        AuditCase(
            f"{name}/tip",
            name,
            _sel(1 if spec.weighting == "count" else 4, **_tip_settings(spec)),
            "tip",
            holders=spec.audit_holders,
            copies_per_call=1 if spec.sequential else 500,
        )
        for name, spec in ALGORITHMS.items()
    ]
    return cases + [
        AuditCase("count_gaussian/all", "count_gaussian", _sel(4, threshold="gaussian"), "all", holders=13, targets=4),
        AuditCase("count_laplace/all", "count_laplace", _sel(4, threshold="laplace"), "all", holders=15, targets=4),
        AuditCase("mad/dmax", "mad", _sel(4, threshold="gaussian"), "dmax", holders=7, targets=4),
        # MAD's l2 keep rule (its default; docs/thresholding.md, "The l2 rule"), read with 128 bits: the tip (each
        # holder's one item weighs 1; expected bound ~1.4 at 10^4 runs) and the d_max case, where the added user's
        # weight is rerouted (a sanity check: ~0.01 expected at 1,500 runs, the Gaussian case's budget)
        AuditCase("mad/optimal_tip", "mad", _sel(4, threshold="optimal"), "tip", holders=4),
        AuditCase("mad/optimal_dmax", "mad", _sel(4, threshold="optimal"), "dmax", holders=8, targets=4),
        # the added user holds 8 targets at Delta_0 = 4: rounds 2 and 3 re-subsample its unreleased ones
        AuditCase(
            "mad_sips/resample",
            "mad_sips",
            _sel(4, cap_quantile=1.0, threshold="gaussian"),
            "resample",
            holders=10,
            targets=8,
        ),
        # MAD-SIPS's adaptive cap (privacy/cap.py; its degree histogram reads every user of the call, so copies
        # would share one cap: one copy per call) with the default keep-table last round (the cap is asked for:
        # with the table it is off by default)
        AuditCase("mad_sips/cap_tip", "mad_sips", _sel(4, cap_quantile=0.98), "tip", holders=5, copies_per_call=1),
        AuditCase("dp_sips/resample", "dp_sips", _sel(4, threshold="gaussian"), "resample", holders=9, targets=8),
        # the count release with half the budget (expected epsilon lower bound ~0.9 in 10^4 runs)
        AuditCase(
            "basic/counts", "basic", _sel(1, release_counts=True, count_budget=0.5), "tip", holders=7, min_count=9
        ),
        AuditCase("dpne/tip", "dpne", _dpne_params(threshold="gaussian"), "tip", holders=6),
        # MAD-SIPS inside the levels (docs/dpne.md): level 1's rounds (unknown domain) and level 2's (known domain,
        # thresholds from the spurious rate; the event is the bigram, its words released by level 1)
        AuditCase("dpne/mad_sips_tip", "dpne", _dpne_params(selection="mad_sips"), "tip", holders=6),
        _bigram_case("dpne/bigram", threshold="gaussian"),
        # DPNE's keep tables (the default, docs/dpne.md): level 1's table (unknown domain; F(6), F(7) ~ 0.03, 0.10)
        # and level 2's (known domain, F(0) = q_2; F(4), F(5) ~ 0.08, 0.24 at 100 copies a call)
        AuditCase("dpne/optimal_tip", "dpne", _dpne_params(threshold="optimal"), "tip", holders=6),
        _bigram_case("dpne/optimal_bigram", threshold="optimal"),
        _bigram_case("dpne/mad_sips_bigram", selection="mad_sips"),
        # basic's keep-probability table (threshold 'optimal', docs/thresholding.md)
        AuditCase("basic/optimal_tip", "basic", _sel(4, threshold="optimal"), "tip", holders=5),
        # MAD-SIPS's last round as a keep table (docs/mad_sips.md): the target is out of reach of rounds 1-2
        # (rho_1, rho_2 ~ 60, 40), so the event is round 3's table on biased Basic weights
        # (weight_cap 1: the table alone, many copies per call; the default 'auto' is weight_cap_auto_tip below)
        _mad_sips_table_case("optimal_tip", 1.0, holders=5),
        # the same with a weight cap (docs/mad_sips.md, "Weight cap"): C only up to 0.3, each holder of the target
        # (a set of one item, weight 1) contributes the grid value 0.29. One such step is a small privacy loss:
        # the expected bound is ~0.16 at 4,000 runs (holders 11, the design's best), a sanity check only; that
        # no weight escapes the cap is what tests/privacy/test_mad_sips_table.py checks (properties, exact)
        _mad_sips_table_case("weight_cap_tip", 0.3, holders=11),
        # weight_cap 'auto' (docs/mad_sips.md, "Automatic weight cap"; mad_sips's default): the noisy degree
        # histogram (0.2% of the budget, one per call: one copy per call) then the table of the chosen cap. The
        # holders hold one item each and are few, so the choice is 1: the case checks the histogram and the table
        # composed, not the cap's grid
        _mad_sips_table_case("weight_cap_auto_tip", "auto", holders=5, copies_per_call=1),
        # MAD2R's round 2 as the table over biased Basic weights (as MAD-SIPS's last round)
        AuditCase("mad2r/optimal_tip", "mad2r", _sel(4, threshold="optimal"), "tip", holders=5),
        # DP-SIPS's last round (0.9 of its budget) as basic's table
        AuditCase("dp_sips/optimal_tip", "dp_sips", _sel(4, threshold="optimal"), "tip", holders=5),
        # the l1 keep curve (docs/thresholding.md, "The l1 curve"): at epsilon 4, delta 1e-6, f(3) ~ 0.003 and
        # f(4) ~ 0.17 (the ratio e^4: the curve's lower piece is tight at a shift of 1)
        AuditCase("weighted_laplace/optimal_tip", "weighted_laplace", _sel(4, threshold="optimal"), "tip", holders=3),
        # count_gaussian's keep table over counts read as contributions 1/sqrt(Delta_0) (Delta_0 = 1: F(3) ~ 0.001,
        # F(4) ~ 0.026)
        AuditCase("count_gaussian/optimal_tip", "count_gaussian", _sel(1, threshold="optimal"), "tip", holders=3),
        AuditCase("count_laplace/optimal_tip", "count_laplace", _sel(1, threshold="optimal"), "tip", holders=3),
        AuditCase(
            "policy_laplace/optimal_tip",
            "policy_laplace",
            _sel(4, threshold="optimal"),
            "tip",
            holders=3,
            copies_per_call=1,
        ),
        # Policy Gaussian's l2 keep rule (docs/thresholding.md, "The l2 rule"): at epsilon 4, delta 1e-6 the event's
        # probabilities are ~0.005 and ~0.063 (the design's best holders; each holder's one item weighs 1, below the
        # cutoff Gamma ~ 13.5)
        AuditCase(
            "policy_gaussian/optimal_tip",
            "policy_gaussian",
            _sel(4, threshold="optimal"),
            "tip",
            holders=4,
            copies_per_call=1,
        ),
    ]


def unique_item_cases(algorithms: Sequence[str], **selection) -> List[AuditCase]:
    """'unique' cases at delta = 1e-12 (<= 1e-6): a single-user item must never be released. ``selection``:
    more :class:`SelectionParams` fields (``threshold='optimal'``: basic's keep table, ``basic/optimal_unique``)."""
    cases = []
    for a in algorithms:
        if a == "dpne":  # the paper's Gaussian levels unless asked (its default is keep tables)
            params = _dpne_params(_UNIQUE_DELTA, threshold=selection.get("threshold", "gaussian"))
        else:  # its noise + rho unless asked (mad_sips's default is its keep table, the Laplace ones' the curve)
            params = _sel(4, delta=_UNIQUE_DELTA, **{"threshold": noise_rule(ALGORITHMS[a]), **selection})
        per_call = 1 if a.startswith("policy_") else 500
        name = f"{a}/{'optimal_' if selection.get('threshold') == 'optimal' else ''}unique"
        cases.append(AuditCase(name, a, params, "unique", holders=1, targets=4, copies_per_call=per_call))
    return cases
