"""In-memory reference of DPNE (paper Alg. 1 / supplement Alg. 1) and the DPSU baselines.

The test oracle of :class:`transforms.dpne.dpne.DPNE` and the fast path for small data. It uses the same
kernels (:mod:`transforms.dpne.dpne_kernels`), the same accounting (:mod:`privacy.dpne`) and the same
randomness contract, so under a seed the Beam transform returns exactly the same n-grams:

* subsample of user u at level k: ``randomness.subsample(items, Delta_k, u, round_=k, seed)``;
* noise of k-gram g: ``sigma_k * keyed_normal(seed, 'noise', k, [g])``; with keep tables
  (``threshold='optimal'``) the 64 bits ``random_bits([g], 'noise', k, seed)`` (keep iff below F(H[g]) 2^64);
* spurious k-grams: a Bernoulli(q_k) subset of V_k (:func:`dpne_kernels.spurious_subset`), round k, or with
  ``selection='mad_sips'`` each round's round id: its size from ``(seed, 'spurious', round, 'subset_count')``,
  candidates from ``(seed, 'spurious', round, ('subset_candidates', chunk))``, priorities
  ``keyed_uniform(seed, 'spurious_priority', round, [g])``;
* |V_k| sampling estimator (``vk_method='sample'``): ``keyed_generator(seed, 'vk_estimate', k, 0)``.

DPSU baselines use round 0 (dpsu_all) or the n-gram length (dpsu_even, dpsu_single).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

import numpy as np
from scipy import special

from dp_partition_beam.privacy.calibration import mad_tau, passes_threshold
from dp_partition_beam.privacy.counts import CountPlan
from dp_partition_beam.privacy.dpne import (
    DPNEParams,
    LevelRound,
    RunPlan,
    baseline_run_report,
    dpne_rho_k,
    level_k_report,
    level_one_report,
    level_rounds,
    plan_dpne_counts,
    plan_runs,
    release_privacy,
    resolved_threshold,
    rounds_report,
)
from dp_partition_beam.transforms.core import randomness
from dp_partition_beam.transforms.core import text as tx
from dp_partition_beam.transforms.dpne import dpne_kernels
from dp_partition_beam.transforms.selection import counts_kernels
from dp_partition_beam.transforms.selection.mad_kernels import mad_weights
from dp_partition_beam.transforms.selection.reference import (
    add_noise,
    basic_weights,
    biases_from_entries,
    bound_contributions,
    drop_hopeless,
)

Records = Union[Mapping[Any, Union[str, Iterable[str]]], Iterable[Tuple[Any, str]]]


def _iter_records(records: Records):
    if isinstance(records, Mapping):
        for user, texts in records.items():
            if isinstance(texts, str):
                yield user, texts
            else:
                for t in texts:
                    yield user, t
    else:
        for user, text in records:
            yield user, text


def user_kgrams(records: Records, max_n: int, tokenizer=tx.default_tokenize) -> Dict[int, Dict[Any, Set[str]]]:
    """``{k: {user: distinct k-grams}}`` for k = 1..max_n (a user may have many texts/lines)."""
    out: Dict[int, Dict[Any, Set[str]]] = {k: defaultdict(set) for k in range(1, max_n + 1)}
    for user, text in _iter_records(records):
        for k, grams in tx.text_all_kgrams(text, max_n, tokenizer).items():
            if grams:
                out[k][user].update(grams)
    return out


@dataclasses.dataclass
class DPNEResult:
    """Released n-grams per length and the (public) report.

    With ``release_counts``: ``counts[k]`` maps each released k-gram kept by ``min_users`` to its noisy
    count (an int), ``ngrams[k]`` is the set of those k-grams, and ``count_plan`` the counts' plan.
    """

    ngrams: Dict[int, Set[str]]
    levels: List[Dict[str, Any]]
    summary: Dict[str, Any]
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)  # wall time per level/run
    counts: Optional[Dict[int, Dict[str, int]]] = None
    count_plan: Optional[CountPlan] = None

    def all_ngrams(self) -> Set[str]:
        return set().union(*self.ngrams.values()) if self.ngrams else set()

    def lines(self) -> List[str]:
        """Output lines ``k<TAB>n-gram``, sorted."""
        return sorted(f"{k}\t{g}" for k, gs in self.ngrams.items() for g in gs)

    def count_lines(self) -> List[str]:
        """Output lines ``n-gram<TAB>count`` (with ``release_counts``), sorted."""
        return sorted(f"{g}\t{c}" for per_k in (self.counts or {}).values() for g, c in per_k.items())


# ---------------------------------------------------------------------------------------------
# One noisy histogram (weights -> noise -> threshold)
# ---------------------------------------------------------------------------------------------


def _capped(user_sets: Mapping[Any, Iterable[str]], cap: int, round_: int, seed, rng) -> Dict[Any, List[str]]:
    """Each user's distinct n-grams, uniformly subsampled to ``cap`` (selection's bounding, round ``round_``)."""
    return bound_contributions(user_sets, cap, seed, round_, rng)


def histogram(capped: Mapping[Any, List[str]], weighting: str, tau: float, d_max: int) -> Dict[str, float]:
    """H (the weighted histogram) over supp: weighted Gaussian 1/sqrt(d) (exact sums) or MAD."""
    if weighting == "mad":
        return mad_weights(capped, tau, d_max)
    return basic_weights(capped, "weighted_gaussian")


def noisy_release(hist: Mapping[str, float], sigma: float, rho: float, round_: int, seed, rng) -> Set[str]:
    """Items with ``H[g] + sigma * Z_g >= rho``; Z_g keyed by (seed, 'noise', round, g) if seeded
    (selection's in-memory noise: :func:`transforms.selection.reference.add_noise`)."""
    if not hist or not math.isfinite(rho):
        return set()
    return {g for g, w in add_noise(hist, "gaussian", sigma, seed, round_, rng).items() if passes_threshold(w, rho)}


def table_release(hist: Mapping[str, float], table, round_: int, seed, rng) -> Set[str]:
    """Items kept by a keep table: ``bits < F(H[g]) 2^64`` with 64 bits keyed by (seed, 'noise', round, g) if
    seeded (the draws of selection's tables, :func:`transforms.selection.reference.noisy_threshold`)."""
    if not hist:
        return set()
    items = list(hist)
    bits = randomness.random_bits(items, "noise", round_, seed, rng)
    kept = table.keep(np.array([float(hist[g]) for g in items], dtype=np.float64), bits)
    return {g for g, k in zip(items, kept) if k}


def sample_spurious(sampler: dpne_kernels.ValidSampler, supp: Set[str], q: float, k: int, seed, rng) -> List[str]:
    """Supplement Alg. 1's spurious step, drawn as a Bernoulli(q) subset of V_k (:func:`dpne_kernels.spurious_subset`,
    randomness round k) minus ``supp`` = supp(H_k): each k-gram of V_k outside the support is released
    independently with probability q, the law of the paper's ``Bin(|V_k| - |supp(H_k)|, q)`` uniform k-grams of
    ``V_k \\ supp(H_k)``, so the result is exactly the zero-weight part of the Gaussian mechanism (or of the keep
    table, F(0) = q) on V_k. The draws and their one failure event (:data:`dpne_kernels.OVERSAMPLE_FAILURE_PROB`)
    read the public plan only (the exact |V_k| = ``sampler.size``, also with ``vk_method='sample'``, whose
    estimate only sets rho_k): the support is read once, to drop the drawn k-grams it holds (docs/dpne.md, "The
    spurious draws as a subset of V_k").
    """
    return [g for g in dpne_kernels.spurious_subset(sampler, q, k, seed, rng) if g not in supp]


# ---------------------------------------------------------------------------------------------
# MAD-SIPS inside a level (selection='mad_sips'; docs/dpne.md, "MAD-SIPS inside the levels")
# ---------------------------------------------------------------------------------------------


def absent_entries(items: List[str], prev: LevelRound, known_domain: bool, seed, rng) -> Dict[str, float]:
    """The previous round's noisy-vector entries of ``items``, which were outside its support (nobody held
    them then, so their weight was 0), keyed as their noise would have been: (seed, 'noise', prev.round_, g).

    Level 1 (unknown domain, no spurious step): ``sigma Z``, the extended vector's coordinate (as MAD-SIPS).
    Level k >= 2: every k-gram of the round's domain was noised and the spurious step released those whose
    ``sigma Z`` reached rho; these were not released, so their entry is ``sigma Z`` given ``sigma Z < rho``:
    ``sigma PhiInv(U Phi(rho/sigma))`` from the same uniform U. Drawing it unconditioned would make the
    biases depend on a value the spurious step did not see (docs/dpne.md, step (2) of the proof).
    """
    if not items:
        return {}
    if not known_domain:
        return add_noise(dict.fromkeys(items, 0.0), "gaussian", prev.sigma, seed, prev.round_, rng)
    if seed is not None:
        u = randomness.keyed_uniform(seed, "noise", prev.round_, items)
    else:
        u = 1.0 - rng.random(len(items))  # (0, 1]
    z = special.ndtri(u * special.ndtr(prev.rho / prev.sigma))
    return {g: float(prev.sigma * zi) for g, zi in zip(items, z)}


def level_mad_sips(
    users: Mapping[Any, Iterable[str]],
    cap: int,
    rounds: Tuple[LevelRound, ...],
    params: DPNEParams,
    seed,
    rng,
    sampler: Optional[dpne_kernels.ValidSampler] = None,
) -> Tuple[Set[str], List[int], Dict[Any, List[str]]]:
    """MAD-SIPS's rounds inside one DPNE level: ``(released, released per round, round 1's capped sets)``.

    ``users``: each user's distinct (valid) n-grams of the level; ``sampler``: the level's V_k sampler for
    k >= 2 (known domain: every round also releases its spurious k-grams), None at level 1. Round r (as
    MAD-SIPS, docs/mad_sips.md): remove the level's released n-grams; from round 2, bias the remaining ones
    from the previous round's noisy entries and drop the hopeless (MAD paper Alg. 4 lines 10-14, keep rule
    of :func:`drop_hopeless`); subsample each user to ``cap`` (randomness round ``round_``); MAD weights
    (unbiased in round 1, biased after); noise ``sigma_r``; keep ``>= rho_r``; spurious draws at ``f_r q_k``.
    """
    full = {u: sorted(set(gs)) for u, gs in users.items()}
    released: Set[str] = set()
    per_round: List[int] = []
    first: Dict[Any, List[str]] = {}
    prev = None  # (LevelRound, noisy entries on its support)
    for i, rd in enumerate(rounds):
        if not math.isfinite(rd.rho):  # V_k empty: nothing can pass
            per_round.append(0)
            continue
        rho_drop = min(x.rho for x in rounds[i:])  # hopeless: below every remaining round's threshold
        remaining = {u: [g for g in gs if g not in released] for u, gs in full.items()}  # remove U_<r
        biases = None
        if prev is not None:
            p_rd, p_noisy = prev
            candidates = sorted({g for gs in remaining.values() for g in gs})
            absent = absent_entries([g for g in candidates if g not in p_noisy], p_rd, sampler is not None, seed, rng)
            biases = biases_from_entries(candidates, p_noisy, absent, rd.rho, p_rd.sigma, params, rho_drop)  # l. 10-14
            remaining = {u: drop_hopeless(gs, biases) for u, gs in remaining.items()}  # drop U_low
            biases = {**dict.fromkeys(candidates, 1.0), **biases}  # a kept hopeless n-gram: bias 1
        remaining = {u: gs for u, gs in remaining.items() if gs}
        capped = bound_contributions(remaining, cap, seed, rd.round_, rng)  # re-subsample (round r)
        if i == 0:
            first = capped
        if biases is None:  # round 1: unbiased MAD (Alg. 4 line 5)
            w = mad_weights(capped, rd.tau, params.d_max)
        else:  # rounds >= 2: biased MAD (Alg. 4 line 15)
            w = mad_weights(capped, rd.tau, params.d_max, biases, params.b_min, params.b_max)
        noisy = add_noise(w, "gaussian", rd.sigma, seed, rd.round_, rng)
        out = {g for g, x in noisy.items() if passes_threshold(x, rd.rho)}
        if sampler is not None:  # the zero-weight k-grams of V_k \\ U_<r that pass (docs/dpne.md)
            drawn = dpne_kernels.spurious_subset(sampler, rd.spurious_prob, rd.round_, seed, rng)  # Bernoulli(f_r q_k)
            out |= {g for g in drawn if g not in w and g not in released}  # outside supp H_r and U_<r
        per_round.append(len(out))
        released |= out
        prev = (rd, noisy)
    return released, per_round, first


# ---------------------------------------------------------------------------------------------
# DPNE and baselines
# ---------------------------------------------------------------------------------------------


def _summary(algorithm: str, params: DPNEParams, sigma_star: float, runs: List[RunPlan], count_plan) -> Dict[str, Any]:
    comp = release_privacy(runs, params, count_plan)
    d = dataclasses.asdict(params)
    d["max_contributions"] = list(params.deltas)
    return {
        "algorithm": algorithm,
        "params": d,
        "sigma_star": sigma_star,
        "epsilon": params.epsilon,
        "delta": params.delta,
        "composed_sigma": comp["sigma_composed"],
        "composed_gaussian_delta": comp["gaussian_delta"],
        "total_delta_bound": comp["total_delta"],
        "counts": None if count_plan is None else count_plan.as_report(),
        "threshold": resolved_threshold(algorithm, params),
        "rdp": {k: comp[k] for k in ("alpha", "epsilon_rdp", "delta_level_1", "delta_conversion") if k in comp},
        "epsilon_at_delta": comp["epsilon_at_delta"],
    }


def dpne_reference(
    records: Records,
    algorithm: str,
    params: DPNEParams,
    seed: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
    tokenizer=tx.default_tokenize,
    user_grams: Optional[Dict[int, Dict[Any, Set[str]]]] = None,
    allowlist: Optional[Iterable[str]] = None,
) -> DPNEResult:
    """Runs ``algorithm`` in memory on ``records`` (dict user -> text(s), or (user, text) pairs).

    Args:
      algorithm: one of :data:`privacy.dpne.DPNE_ALGORITHMS` ('dpne', 'dpsu_all', 'dpsu_even', 'dpsu_single').
      params: :class:`privacy.dpne.DPNEParams`.
      seed: reproducible mode (NOT private against anyone who knows it); else ``rng`` or OS entropy.
      user_grams: optional precomputed :func:`user_kgrams` output (benchmarks reuse it across seeds).
      allowlist: optional PUBLIC list of candidate n-grams; the others are dropped before bounding.
    """
    sigma_star, runs = plan_runs(algorithm, params)  # validates algorithm and params before any work
    if seed is None and rng is None:
        rng = randomness.worker_rng()
    randomness.warn_if_seeded(seed)
    if user_grams is None:
        user_grams = user_kgrams(records, params.max_n, tokenizer)
    if allowlist is not None:
        if isinstance(allowlist, (str, bytes)):
            raise ValueError("allowlist must be an iterable of n-grams (e.g. a list or set), not a single str")
        allowed = frozenset(allowlist)
        user_grams = {
            k: {u: {g for g in gs if g in allowed} for u, gs in users.items()} for k, users in user_grams.items()
        }
    count_plan = plan_dpne_counts(algorithm, params)
    summary = _summary(algorithm, params, sigma_star, runs, count_plan)
    seconds: Dict[str, float] = {}
    counted: Optional[Dict[int, Dict[str, int]]] = {} if count_plan is not None else None
    if algorithm == "dpne":
        out, levels = _dpne(user_grams, params, runs, seed, rng, seconds, count_plan, counted)
    else:
        out, levels = _dpsu(user_grams, params, runs, seed, rng, seconds, count_plan, counted)
    if counted is not None:  # the output is what passed min_users; the levels ran on the released sets
        out = {k: set(counted.get(k, {})) for k in out}
    return DPNEResult(out, levels, summary, seconds, counted, count_plan)


def _count_run(counted, count_plan, capped, released, run: RunPlan, params: DPNEParams, seed) -> None:
    """Noisy counts of a run's released n-grams on its capped sets (round = the run's round), by length."""
    if counted is None:
        return
    noisy = counts_kernels.noisy_counts(
        counts_kernels.holder_counts(capped, released), count_plan.sigma2, seed, run.round_, params.min_users
    )
    for g, c in noisy.items():
        counted.setdefault(tx.ngram_len(g), {})[g] = c


def _dpne(user_grams, params: DPNEParams, runs: List[RunPlan], seed, rng, seconds, count_plan=None, counted=None):
    out: Dict[int, Set[str]] = {}
    levels: List[Dict[str, Any]] = []
    s1: Set[str] = set()
    s_prev: Set[str] = set()
    for run in runs:
        t0 = time.perf_counter()
        k = run.lengths[0]
        if k == 1:
            level = level_one_report(run, params.weighting, params.beta)
            rho = run.rho
            live = True  # level 1 always runs
            users = user_grams[1]
        else:
            # V_k is a function of the released S_1, S_{k-1}: public.
            v_exact = dpne_kernels.valid_count_exact(s_prev, s1, params.pruning)
            if params.vk_method == "sample" and params.pruning == "both":
                gen = randomness.keyed_generator(seed, "vk_estimate", k, 0) if seed is not None else rng
                v_est = dpne_kernels.valid_count_sample(sorted(s_prev), sorted(s1), params.sample_rate, gen)
                v_used = int(round(v_est))
            else:
                v_used = v_exact
            level = level_k_report(
                k,
                run.sigma,
                run.max_contributions,
                params.eta,
                params.weighting,
                params.beta,
                len(s_prev),
                v_used,
                run.table,
            )
            q = level["spurious_prob"]
            rho = None if run.table is not None else dpne_rho_k(run.sigma, params.eta, len(s_prev), v_used)
            live = q > 0.0  # V_k empty: rho_k = inf (a table's rate 0), nothing can be released
            users = {
                u: {g for g in gs if dpne_kernels.is_valid(g, s_prev, s1, params.pruning)}
                for u, gs in user_grams[k].items()
            }
        released: Set[str] = set()
        if params.selection == "mad_sips":
            rounds = level_rounds(run, params, None if k == 1 else level["spurious_prob"])
            sampler = dpne_kernels.ValidSampler(s_prev, s1, params.pruning) if k >= 2 and live else None
            cap = run.max_contributions
            released, per_round, capped = level_mad_sips(users, cap, rounds, params, seed, rng, sampler)
            level = rounds_report(level, rounds, per_round)
            if live:
                _count_run(counted, count_plan, capped, released, run, params, seed)
        tau = mad_tau(rho, run.sigma, params.beta) if params.weighting == "mad" else None
        if params.selection == "single" and live:
            capped = _capped(users, run.max_contributions, k, seed, rng)
            hist = histogram(capped, params.weighting, tau, params.d_max)
            if run.table is None:
                released = noisy_release(hist, run.sigma, rho, k, seed, rng)
            else:  # keep tables (docs/dpne.md): F(0) = q_k at k >= 2, the spurious step below at the same rate
                released = table_release(hist, run.table.build(0.0 if k == 1 else q), k, seed, rng)
            if k >= 2:
                sampler = dpne_kernels.ValidSampler(s_prev, s1, params.pruning)
                released |= set(sample_spurious(sampler, set(hist), q, k, seed, rng))
            _count_run(counted, count_plan, capped, released, run, params, seed)
        level["released"] = len(released)
        out[k] = released
        levels.append(level)
        seconds[run.name] = time.perf_counter() - t0
        if k == 1:
            s1 = released
        s_prev = released
    return out, levels


def _dpsu(user_grams, params: DPNEParams, runs: List[RunPlan], seed, rng, seconds, count_plan=None, counted=None):
    out: Dict[int, Set[str]] = {}
    levels: List[Dict[str, Any]] = []
    for run in runs:
        t0 = time.perf_counter()
        users: Dict[Any, Set[str]] = defaultdict(set)
        for k in run.lengths:
            for u, gs in user_grams[k].items():
                users[u] |= gs
        tau = mad_tau(run.rho, run.sigma, params.beta) if params.weighting == "mad" else None
        capped = _capped(users, run.max_contributions, run.round_, seed, rng)
        hist = histogram(capped, params.weighting, tau, params.d_max)
        released = noisy_release(hist, run.sigma, run.rho, run.round_, seed, rng)
        _count_run(counted, count_plan, capped, released, run, params, seed)
        for k in run.lengths:
            out[k] = {g for g in released if tx.ngram_len(g) == k}
        level = baseline_run_report(run, params.weighting, params.beta)
        level["released"] = len(released)
        levels.append(level)
        seconds[run.name] = time.perf_counter() - t0
    return out, levels


# ---------------------------------------------------------------------------------------------
# Synthetic text (tests, benchmarks)
# ---------------------------------------------------------------------------------------------


def ngram_user_counts(user_grams: Dict[int, Dict[Any, Set[str]]]) -> Dict[int, Dict[str, int]]:
    """``{k: {n-gram: number of users using it}}`` (non-private ground truth for evaluations)."""
    out: Dict[int, Dict[str, int]] = {}
    for k, users in user_grams.items():
        c: Dict[str, int] = defaultdict(int)
        for gs in users.values():
            for g in gs:
                c[g] += 1
        out[k] = dict(c)
    return out
