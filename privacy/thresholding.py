"""Keep-probability tables: an optimal-thresholding replacement for "Gaussian noise + threshold" (issue 30).

Pure math, fixed before any data is read (no Beam). A weight-and-threshold round releases item i with
total weight W_i when ``W_i + N(0, sigma^2) >= rho``. When the weight itself is never released, any
rule "keep i with probability f(W_i)" does the same job, and the largest f that a privacy budget
allows keeps items with fewer users. This module computes such an f as a table, in the spirit of the
truncated-geometric rule of Desfontaines et al. (PoPETs 2022), generalised to approximate Renyi DP and
to weighted contributions (Harrison & Manurangsi, arXiv 2603.09167, announce this; their paper body
and code are not available, so the construction and its proof are ours: docs/thresholding.md).

**Approximate RDP (mixture form).** A pair of output distributions (M, M') is delta-approximately
(alpha, eps)-RDP if M = (1 - delta) P + delta Q and M' = (1 - delta) P' + delta Q' with
D_alpha(P || P') <= eps and D_alpha(P' || P) <= eps. Products of independent such pairs compose:
the eps add, and the mixture weight of the product is 1 - prod(1 - delta_i) <= sum delta_i.

**The contributions.** A user adds ``c`` to the total of each of its items, with c from a finite set
``C`` in (0, 1] and sum c^2 <= 1 over its items (Basic: c = 1/sqrt(d) on each of d <= Delta_0 items;
the count weighting: 1/sqrt(Delta_0)). Other users' contributions do not depend on the user (this is
what excludes MAD and the sequential policies, whose weights are rerouted by other users).

**The table.** Totals are read on a grid of step H = 2^-k: index j = floor(W / H). For a shift c the
index moves by floor(c/H) or ceil(c/H); with totals that are floats rounded from the exact sums, one more
(a total within half an ulp below a grid line may round onto it), so m_c = ceil(c/H) + 1. The table F
(F[j] = keep probability at index j) is

    F[0] = 0,    F[j] = min_{c in C} g_c(F[max(0, j - m_c)])                        (j >= 1)

where g_c(p) is the largest keep probability one more user of contribution c may cause from p at
budget (eps c^2, delta c^2) (:func:`one_step`). F is nondecreasing, and every pair of indices
(j, j + m) with m <= m_c satisfies F[j] <= F[j + m] <= g_c(F[j]); hence for every real W and c in
C the pair (Bern F(W), Bern F(W + c)) is (delta c^2)-approximately (alpha, eps c^2)-RDP in both
directions, and a user with sum c^2 <= 1 changes the whole release by a delta-approximately
(alpha, eps)-RDP pair. :func:`to_dp` converts that to (epsilon, delta)-DP.

**A known domain.** When every candidate item is public (DPNE's levels k >= 2: V_k is a function of earlier
releases) an item nobody holds may be kept too, with a chosen rate q (the spurious rate). The table then
starts at F[0] = q (``keep_table(..., unseen=q)``) and the same recursion applies; with q > 0 every step is
finite without a mixture, so delta may be 0 (pure RDP) and the argument above holds unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Sequence, Tuple

import numpy as np

from dp_partition_beam.privacy import l1_limits
from dp_partition_beam.privacy.validation import PrivacyBudget, check_int, check_range

__all__ = [
    "DEFAULT_GRID_BITS",
    "bernoulli_renyi",
    "one_step",
    "KeepTable",
    "keep_table",
    "table_violations",
    "rdp_to_dp_epsilon",
    "calibrate_keep_table",
    "KeepTableSpec",
    "to_dp",
    "basic_contributions",
    "GRID_STEPS_PER_OCTAVE",
    "geometric_contributions",
    "round_down",
    "keep_rate",
    "search_order",
    "min_grid_bits",
    "L1KeepCurve",
    "calibrate_l1_curve",
    "rounding_reserve",
]

#: H = 2^-10: a shift c moves the index by ceil(c/H) + 1 (float totals), at most 2/1024 more than c
#: (1.6% at c = 0.1, Delta_0 = 100)
DEFAULT_GRID_BITS = 10
#: entries are multiples of 2^-64, so "keep iff 64 random bits < F * 2^64" keeps with probability exactly F
KEEP_BITS = 64
_BISECTIONS = 36  # q' to 2^-36 of its bracket (~ core * eps wide) below the largest feasible value
_SEARCH_BISECTIONS = 20  # enough to rank the search's candidate orders (the bisection's end is always feasible)
_TINY = 1e-300
_SHAVE = 1e-9  # entries are built 1e-9 (relative) below the bound
_ALMOST_ONE = 1.0 - 1e-8  # a table ends at its first entry this close to 1
_MAX_FINAL_ENTRIES = 1 << 18  # a calibrated table's length limit (2 MB of floats)
_BUILD_MARGIN = 1e-9  # tables are built for eps (1 - 1e-9): float error in the divergences stays below it


def bernoulli_renyi(alpha: float, a, b) -> np.ndarray:
    """``D_alpha(Bern(a) || Bern(b)) = log(a^alpha b^(1-alpha) + (1-a)^alpha (1-b)^(1-alpha)) / (alpha-1)``,
    elementwise (``inf`` where a puts mass where b has none), alpha > 1."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.where(
            a > 0, alpha * np.log(np.maximum(a, _TINY)) + (1 - alpha) * np.log(np.maximum(b, _TINY)), -np.inf
        )
        one = np.where((a > 0) & (b <= 0), np.inf, one)
        zero = np.where(
            a < 1,
            alpha * np.log1p(-np.minimum(a, 1.0)) + (1 - alpha) * np.log(np.maximum(1.0 - b, _TINY)),
            -np.inf,
        )
        zero = np.where((a < 1) & (b >= 1), np.inf, zero)
        return np.logaddexp(one, zero) / (alpha - 1.0)


def one_step(p, alpha: float, eps, delta, margin: float = 0.0, bisections: int = _BISECTIONS) -> np.ndarray:
    """The largest keep probability a neighbour may have when one dataset keeps with probability ``p``.

    With ``p' = min(1, p/(1 - delta))``, Bern(p) = (1 - delta) Bern(p') + delta Bern(0) (or, for p' = 1,
    + delta Bern(x)); the largest q' >= p' with D_alpha(Bern q' || Bern p') <= eps and D_alpha(Bern p' ||
    Bern q') <= eps (both divergences grow with q' - p', so bisection finds it; it returns the feasible
    end) gives ``g = min(1, (1 - delta) q' + delta)``, i.e. Bern(g) = (1 - delta) Bern(q') + delta Bern(1).
    Any r in [p, g] is then delta-approximately (alpha, eps)-RDP with p (docs/thresholding.md, Lemma 1).
    Elementwise over ``p``, ``alpha``, ``eps`` and ``delta`` (arrays broadcast). ``margin``: q' is feasible for the
    budget ``eps (1 - margin)`` (:func:`keep_table` builds with a margin of 1e-9 so that the float error
    of the divergences cannot put an entry above the exact bound; :func:`table_violations` checks
    against the exact budget)."""
    st = _StepSearch(p, alpha, eps, delta, margin)
    st.bisect(bisections)
    return st.value(st.lo)


class _StepSearch:
    """The bisection of :func:`one_step`, elementwise over broadcast arrays, which can be advanced on a subset
    of its elements (:func:`_min_step`). Every element's arithmetic is the same whichever subset it is advanced
    in: its bracket [lo, hi] after n steps does not depend on the other elements."""

    def __init__(self, p, alpha, eps, delta, margin):
        p, eps, delta, alpha = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (p, eps, delta, alpha)))
        self.shape = p.shape
        core = np.minimum(1.0, p / (1.0 - delta))
        inner = (core > 0.0) & (core < 1.0)  # core 0: D(q || 0) = inf for q > 0, so q' = 0; core 1: q' = 1
        with np.errstate(divide="ignore"):
            lp, lq = np.log(np.where(inner, core, 0.5)), np.log1p(-np.where(inner, core, 0.5))
        a1, bound = alpha - 1.0, eps * (alpha - 1.0) * (1.0 - margin)
        self.alpha, self.lp, self.lq, self.a1, self.bound = alpha, lp, lq, a1, bound
        self.core, self.inner, self.delta = core, inner, delta
        self.lo = np.where(inner, core, 0.0)
        # the forward divergence alone bounds q': q'^alpha core^(1-alpha) <= e^bound, so the bisection runs on
        # [core, that bound] (a bracket of width ~ core * eps instead of 1: the steps are then relative to q')
        log_top = (bound + a1 * lp) / alpha
        with np.errstate(over="ignore"):
            top = np.exp(np.minimum(log_top, 0.0))
        self.hi = np.where(inner, np.minimum(1.0, np.maximum(top, core)), 0.0)
        # q' = 1 - 2^-53 feasible ("full"): tested only where the forward bound lets q' reach 1/2. Elsewhere
        # D(q || core) >= alpha log q - (alpha - 1) log core > bound + alpha log 2 - 1e-16 alpha, never feasible
        self.full = np.zeros(self.shape, dtype=bool)
        maybe = inner & (log_top >= -math.log(2.0))  # a mask (0-d arrays too)
        self.full[maybe] = self._ok(np.full(int(np.count_nonzero(maybe)), 1.0 - 2.0**-53), maybe)

    def _terms(self, at):
        """The per-element constants of :meth:`_ok` for the elements ``at``: (alpha, a1, alpha lp, alpha lq,
        a1 lp, a1 lq, bound), computed once per :meth:`bisect` (the same products as inline: bit-identical)."""
        alpha, lp, lq, a1 = self.alpha[at], self.lp[at], self.lq[at], self.a1[at]
        return alpha, a1, alpha * lp, alpha * lq, a1 * lp, a1 * lq, self.bound[at]

    @staticmethod
    def _ok_terms(q, terms):  # both divergences <= eps, in log space: log(sum) <= eps (alpha - 1)
        alpha, a1, alpha_lp, alpha_lq, a1_lp, a1_lq, bound = terms
        with np.errstate(divide="ignore"):
            lx, ly = np.log(q), np.log1p(-q)
        forward = np.logaddexp(alpha * lx - a1_lp, alpha * ly - a1_lq)  # D(q || core)
        backward = np.logaddexp(alpha_lp - a1 * lx, alpha_lq - a1 * ly)  # D(core || q)
        return (forward <= bound) & (backward <= bound)

    def _ok(self, q, at):
        return self._ok_terms(q, self._terms(at))

    def bisect(self, steps: int, at=...):
        """``steps`` bisection steps of the elements ``at`` (an index into the arrays; all by default)."""
        lo, hi = self.lo[at], self.hi[at]
        terms = self._terms(at)
        for _ in range(steps):
            mid = 0.5 * (lo + hi)
            good = self._ok_terms(mid, terms)
            lo = np.where(good, mid, lo)
            hi = np.where(good, hi, mid)
        self.lo[at], self.hi[at] = lo, hi

    def value(self, q):
        """The keep probability g for the feasible q' = ``q`` (the bracket's lower end; arrays of the full shape)."""
        q = np.where(self.core >= 1.0, 1.0, np.where(self.full, 1.0 - 2.0**-53, np.where(self.inner, q, 0.0)))
        return np.minimum(1.0, (1.0 - self.delta) * q + self.delta)


#: the bisection steps after which :func:`_min_step` drops the candidates that cannot be the minimum
_PRUNE_AFTER = (2, 4, 6, 8, 12)


def _min_step(p, alpha, eps, delta, margin: float, bisections: int) -> np.ndarray:
    """``np.min(one_step(p, alpha, eps, delta, margin, bisections), axis=-1)``, computed with fewer divergences.

    After each of :data:`_PRUNE_AFTER` steps every element's final value lies in [value(lo), value(hi)] (lo only rises,
    hi only falls, and ``value`` is nondecreasing in q); an element whose value(lo) exceeds the least
    value(hi) of its row cannot be the row's minimum, so only the others take the remaining steps. The
    minimum is then that of the same elements after the same steps: equal to the full computation's (a
    test checks it on random tables)."""
    st = _StepSearch(p, alpha, eps, delta, margin)
    live, done = np.ones(st.shape, dtype=bool), 0
    for prune in _PRUNE_AFTER:
        steps = min(prune, bisections) - done
        if steps <= 0:
            continue
        at = np.nonzero(live)
        st.bisect(steps, at)
        done += steps
        low = np.where(live, st.value(st.lo), np.inf)
        high = np.where(live, st.value(st.hi), np.inf)
        live &= low <= np.min(high, axis=-1, keepdims=True)  # may still be its row's minimum
    st.bisect(bisections - done, np.nonzero(live))
    final = np.where(live, st.value(st.lo), np.inf)
    return np.min(final, axis=-1)


def basic_contributions(max_contributions: int) -> Tuple[float, ...]:
    """Basic's contributions C = {1/sqrt(d) : d = 1..Delta_0} (as floats, the weights the kernels add)."""
    d0 = check_int("max_contributions", max_contributions, 1)
    return tuple(sorted({float(1.0 / math.sqrt(d)) for d in range(1, d0 + 1)}))


#: the geometric contribution grid 2^(-k/16) of weights that are not from a finite set (MAD-SIPS's last
#: round): a weight rounded down to it loses at most 1 - 2^(-1/16) = 4.2%
GRID_STEPS_PER_OCTAVE = 16


def geometric_contributions(smallest: float, steps: int = GRID_STEPS_PER_OCTAVE) -> Tuple[float, ...]:
    """C = {2^(-k/steps) (1 - 2^-40) : k = 0..K}, K the first k with ``2^(-k/steps) <= smallest`` (increasing).

    The contribution set of weights that can take any value in [smallest, 1] (biased user weights,
    Algorithm 2 of the MAD paper): :func:`round_down` maps each weight to the largest value of C at or
    below it, so a user's rounded contributions are in C and their squares still sum to at most 1."""
    smallest = check_range("smallest", smallest, 0.0, 1.0, lo_open=True)
    steps = check_int("steps", steps, 1, 1024)
    k_max = max(0, math.ceil(-steps * math.log2(smallest) + 1e-9))
    # each value a relative 2^-40 below 2^(-k/steps), so that a weight computed as that power (1/sqrt(2) is
    # one ulp below the float 2^(-8/16)) rounds onto it, not one step lower; still a multiple of 2^-64
    return tuple(sorted({float(2.0 ** (-k / steps)) * (1.0 - 2.0**-40) for k in range(k_max + 1)}))


def round_down(weights, contributions: Sequence[float]) -> np.ndarray:
    """Each weight rounded down to the largest value of ``contributions`` (increasing) at or below it; 0 for
    a weight below all of them (a user that adds 0 changes nothing). Exact float comparisons."""
    cs = np.asarray(contributions, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    j = np.searchsorted(cs, w, side="right") - 1  # the last c <= w
    return np.where(j >= 0, cs[np.maximum(j, 0)], 0.0)


@dataclasses.dataclass(frozen=True)
class KeepTable:
    """A keep-probability table: item with total weight W kept with probability ``probs[floor(W/H)]``.

    Attributes:
      grid_bits: H = 2^-grid_bits.
      probs: F[0..n-1], nondecreasing, F[0] = 0; indices past the end keep with probability probs[-1]
        (the table runs until it is within 1e-8 of 1, or to its length limit). Every entry is a multiple
        of 2^-64: :meth:`keep` realises it exactly from 64 random bits.
      alpha, epsilon_rdp, delta_rdp: the approximate-RDP guarantee of one release (per user).
      contributions: the contribution set C it was built for (increasing; :meth:`round_down` maps weights
        that are not from C onto it).
      unseen: F[0], the keep probability of an item nobody holds: 0 (an unknown domain), or a known domain's
        rate q rounded down to a multiple of 2^-64 (``keep_table(..., unseen=q)``).
      scale: the weights are multiplied by it before they are read (1; the count weighting: its contribution
        c = 1/sqrt(Delta_0), so that a count n is read as the correctly rounded total n c of n contributions c).
    """

    grid_bits: int
    probs: Tuple[float, ...]
    alpha: float
    epsilon_rdp: float
    delta_rdp: float
    contributions: Tuple[float, ...]
    unseen: float = 0.0
    scale: float = 1.0

    @property
    def grid(self) -> float:
        return math.ldexp(1.0, -self.grid_bits)

    def index(self, weights) -> np.ndarray:
        """floor(W / H) per weight (exact: H is a power of two), clipped to the table."""
        w = np.asarray(weights, dtype=np.float64) * self.scale  # exact for scale 1
        j = np.floor(np.ldexp(w, self.grid_bits))
        return np.clip(j, 0, len(self.probs) - 1).astype(np.int64)

    def keep_probability(self, weights) -> np.ndarray:
        return np.asarray(self.probs, dtype=np.float64)[self.index(weights)]

    def keep(self, weights, bits: np.ndarray, low_bits=None) -> np.ndarray:
        """Keep decisions: ``bits < F * 2^64`` for uint64 random ``bits`` (one per weight), so each item is
        kept with probability exactly F(W) (an entry times 2^64 is an integer below 2^64; ``low_bits``, the
        128-bit l2 rule's second draw, is never read)."""
        limits = np.ldexp(self.keep_probability(weights), KEEP_BITS).astype(np.uint64)  # exact: integers < 2^64
        return np.asarray(bits, dtype=np.uint64) < limits

    def round_down(self, weights) -> np.ndarray:
        """Weights rounded down onto C (:func:`round_down`): a user's contributions to a table round."""
        return round_down(weights, self.contributions)

    @property
    def complete(self) -> bool:
        """Whether the table reaches probability ~1 (within 1e-8): heavy items are then kept, not left at the
        last entry of a table cut at its length limit."""
        return self.probs[-1] >= _ALMOST_ONE

    def weight_for(self, probability: float) -> float:
        """The smallest total weight kept with at least ``probability`` (``inf`` if none): W50 for 1/2."""
        probs = np.asarray(self.probs)
        hits = np.flatnonzero(probs >= probability)
        return math.inf if hits.size == 0 else float(hits[0]) * self.grid / self.scale


def _shift_budgets(contributions: Iterable[float], grid_bits: int) -> Tuple[np.ndarray, np.ndarray]:
    """(m, c): for each distinct index shift m = ceil(c/H) + 1 the smallest c giving it (the binding budget)."""
    best = {}
    for c in contributions:
        c = check_range("contribution", float(c), 0.0, 1.0)
        if c <= 0.0:
            raise ValueError("contributions must be > 0")
        m = math.ceil(math.ldexp(c, grid_bits)) + 1  # + 1: float totals (module docstring)
        best[m] = min(best.get(m, c), c)
    ms = np.array(sorted(best), dtype=np.int64)
    return ms, np.array([best[m] for m in ms], dtype=np.float64)


def _build_rows(
    alphas, eps, deltas, contributions, grid_bits, limit, bisections, until, start=0.0, every=False, shifts=None
):
    """The recursion of the module docstring for one or many (alpha, eps, delta) at once (one row each):
    ``(probs, n)``, probs of shape (rows, limit) filled up to index n from F[0] = ``start`` (a multiple of
    2^-64), built until some row (``every``: every row) reaches ``until`` (or ``limit``). Every entry is a
    multiple of 2^-64 (exact in float). ``shifts``: the (index shifts, budgets) to use instead of
    :func:`_shift_budgets` of ``contributions`` (the l2 rule's search: exact shifts, privacy/l2_rule.py)."""
    a, e, d = (np.asarray(x, dtype=np.float64).reshape(-1, 1, 1) for x in np.broadcast_arrays(alphas, eps, deltas))
    ms, cs = _shift_budgets(contributions, grid_bits) if shifts is None else shifts
    eps_c, delta_c = e * cs**2, d * cs**2  # (rows, 1, |C|)
    probs = np.zeros((a.shape[0], limit), dtype=np.float64)
    probs[:, 0] = start
    n = 1
    # F[j] reads F[j - m] for m >= ms[0] only: a block of ms[0] entries is computed at once
    reached = np.all if every else np.any
    while n < limit and not reached(probs[:, n - 1] >= until):
        js = np.arange(n, min(n + int(ms[0]), limit))
        prev = probs[:, np.maximum(0, js[:, None] - ms[None, :])]  # (rows, block, |C|)
        # a margin on eps, and a relative 1e-9 off the result: the float error of the divergences (and
        # last-bit differences of numpy's vectorised log between array positions) and the rounding down
        # to 2^-64 cannot lift an entry above the exact bound that table_violations checks
        step = _min_step(prev, a, eps_c, delta_c, _BUILD_MARGIN, bisections) * (1.0 - _SHAVE)
        probs[:, js] = np.floor(np.ldexp(step, KEEP_BITS)) / 2.0**KEEP_BITS
        n = int(js[-1]) + 1
    return probs, n


def keep_rate(unseen: float) -> float:
    """A known domain's rate q as a table's F[0]: rounded down to a multiple of 2^-64 (never above q), so that
    64 random bits realise it exactly. The spurious step of such a table draws at this rate too."""
    unseen = check_range("unseen", unseen, 0.0, 1.0, hi_open=True)
    return math.floor(math.ldexp(unseen, KEEP_BITS)) / 2.0**KEEP_BITS


def keep_table(
    alpha: float,
    epsilon_rdp: float,
    delta_rdp: float,
    contributions: Sequence[float],
    grid_bits: int = DEFAULT_GRID_BITS,
    max_entries: int = 1 << 16,
    bisections: int = _BISECTIONS,
    unseen: float = 0.0,
) -> KeepTable:
    """The pointwise-largest table of the module docstring for one release at (alpha, eps, delta).

    ``unseen``: F[0], the keep probability of an item nobody holds (0 unless the domain is known, module
    docstring), rounded down to a multiple of 2^-64. With ``unseen`` 0 the table needs ``delta_rdp > 0``
    (nothing may leave 0 otherwise); with ``unseen > 0``, ``delta_rdp`` 0 gives a pure-RDP table."""
    check_range("alpha", alpha, 1.0, math.inf)
    if alpha <= 1.0:
        raise ValueError(f"alpha must be > 1, got {alpha}")
    check_range("epsilon_rdp", epsilon_rdp, 0.0, math.inf)
    check_range("delta_rdp", delta_rdp, 0.0, 1.0)
    check_int("grid_bits", grid_bits, 0, 30)
    start = keep_rate(unseen)
    if start == 0.0 and delta_rdp == 0.0:
        raise ValueError("a table whose unseen items are never kept needs delta_rdp > 0 (or unseen > 0)")
    every_c = tuple(sorted({float(c) for c in contributions}))
    probs, n = _build_rows(
        alpha, epsilon_rdp, delta_rdp, contributions, grid_bits, max_entries, bisections, _ALMOST_ONE, start
    )
    probs = probs[0]
    full = np.flatnonzero(probs[:n] >= _ALMOST_ONE)
    n = int(full[0]) + 1 if full.size else n
    return KeepTable(
        grid_bits, tuple(probs[:n].tolist()), float(alpha), float(epsilon_rdp), float(delta_rdp), every_c, start
    )


def table_violations(table: KeepTable) -> dict:
    """Checks a table against the conditions of the proof; every entry is 0 for a sound table.

    ``decreasing``: pairs F[j] > F[j + 1]; ``above_step``: pairs (j, j + m), m <= m_c, with F[j + m] above
    g_c(F[j]) at the exact budget; ``unseen``: F[0] != the table's ``unseen`` rate.
    """
    probs = np.asarray(table.probs, dtype=np.float64)
    ms, cs = _shift_budgets(table.contributions, table.grid_bits)
    above = 0
    for m, c in zip(ms.tolist(), cs.tolist()):
        g = one_step(probs, table.alpha, table.epsilon_rdp * c * c, table.delta_rdp * c * c)
        # the index past the table end reads probs[-1]: pad with it
        padded = np.concatenate([probs, np.full(m, probs[-1])])
        for k in range(1, m + 1):
            above += int(np.count_nonzero(padded[k : k + len(probs)] > g))
    return {
        "decreasing": int(np.count_nonzero(np.diff(probs) < 0)),
        "above_step": above,
        "unseen": int(probs[0] != table.unseen),
    }


def rdp_to_dp_epsilon(epsilon_rdp: float, alpha: float, delta: float) -> float:
    """(alpha, eps_R)-RDP -> (eps, delta)-DP: ``eps_R + log(1 - 1/alpha) - (log delta + log alpha)/(alpha - 1)``
    (Balle et al. 2020, Theorem 21; the conversion of dp-accounting's RdpAccountant)."""
    return epsilon_rdp + math.log1p(-1.0 / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def to_dp(table: KeepTable, delta_conversion: float) -> Tuple[float, float]:
    """The (epsilon, delta)-DP of one release with ``table``: the mixture's delta plus the conversion's."""
    return rdp_to_dp_epsilon(table.epsilon_rdp, table.alpha, delta_conversion), table.delta_rdp + delta_conversion


def _search_subset(contributions: Sequence[float]) -> Tuple[float, ...]:
    """A few contributions spread geometrically over C: enough to rank orders alpha (the search only)."""
    cs = sorted(set(float(c) for c in contributions))
    if len(cs) <= 16:
        return tuple(cs)
    picks = np.unique(np.round(np.geomspace(1, len(cs), 16)).astype(int) - 1)
    return tuple(cs[i] for i in picks)


def _weights_kept(
    alphas,
    eps,
    deltas,
    contributions,
    grid_bits: int,
    probability: float,
    start: float = 0.0,
    every: bool = False,
    shifts=None,
):
    """The weight kept with ``probability`` (W50 for 1/2) by the tables of many (alpha, eps, delta) at once,
    for the search's argmin: :func:`keep_table`'s recursion with one row per candidate, built only until the
    first row reaches ``probability`` (``every``: until every row does, so each gets its weight), from F[0] =
    ``start`` (a known domain's :func:`keep_rate`); the rows that reach it there get their weight, every other
    row ``inf`` (as do rows with eps <= 0, and all rows if none gets there within 2^14 entries). Approximate
    (20 bisection steps, a subset of C): it ranks candidates, the final table is built by keep_table."""
    alphas, eps, deltas = (np.asarray(x, dtype=np.float64).ravel() for x in np.broadcast_arrays(alphas, eps, deltas))
    out = np.full(alphas.shape, math.inf)
    live = eps > 0
    if not live.any():
        return out
    probs, n = _build_rows(
        alphas[live],
        eps[live],
        deltas[live],
        contributions,
        grid_bits,
        1 << 14,
        _SEARCH_BISECTIONS,
        probability,
        start,
        every,
        shifts,
    )
    reached = probs[:, :n] >= probability
    first = np.where(reached.any(axis=1), reached.argmax(axis=1).astype(np.float64), math.inf)
    out[live] = first * math.ldexp(1.0, -grid_bits)
    return out


def search_order(table_epsilon, w50, epsilon: float, delta_fractions: Sequence[float] = (0.25, 0.5, 0.75)):
    """The order alpha and the split of delta whose tables keep the least weight: ``(alpha, f, w)``.

    ``table_epsilon(alpha, f)``: the RDP budget the tables get at order alpha when a fraction f of delta is
    the mixture's (the rest the conversion's); ``w50(alphas, fractions)``: the score of each candidate (the
    weight kept with probability 1/2, ``inf`` where none is; smaller is better). The order is searched at
    an even split of delta: a log grid of 16 orders from the smallest that leaves the tables 5% of
    ``epsilon`` (a small epsilon needs a large order), then 12 around the best (the score is unimodal in
    alpha); then the split over ``delta_fractions`` and 1/2 at that order. ``ValueError`` if no candidate
    scores finite."""

    def smallest_order(f: float) -> float:
        smallest = 1.5
        while table_epsilon(smallest, f) <= 0.05 * epsilon:
            smallest *= 1.25
            if smallest > 1e8:
                return math.inf
        return smallest

    smallest = smallest_order(0.5)
    if not math.isfinite(smallest):
        raise ValueError(f"no order alpha leaves the tables a budget at epsilon {epsilon}")
    grid = np.geomspace(smallest, max(512.0, 8.0 * smallest), 16)
    i = int(np.argmin(w50(grid, 0.5)))
    fine = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 12)
    alpha = float(fine[int(np.argmin(w50(fine, 0.5)))])
    fractions = np.array(sorted(set(delta_fractions) | {0.5}))
    ws = w50(alpha, fractions)
    w, f = float(np.min(ws)), float(fractions[int(np.argmin(ws))])
    if not math.isfinite(w):
        raise ValueError(f"no table reaches the score's probability at epsilon {epsilon}")
    return alpha, f, w


@functools.lru_cache(maxsize=64)
def calibrate_keep_table(
    epsilon: float,
    delta: float,
    contributions: Tuple[float, ...],
    grid_bits: int = DEFAULT_GRID_BITS,
    delta_fractions: Tuple[float, ...] = (0.25, 0.5, 0.75),
    probability: float = 0.5,
    gaussian_rdp: float = 0.0,
) -> Tuple[KeepTable, float]:
    """The table for one (epsilon, delta)-DP release whose weight kept with ``probability`` (W50) is
    smallest, over the order alpha (a log grid of 16 orders, then 12 around the best, at an even split of
    delta) and then the split of delta between the mixture (``delta_rdp``) and the RDP conversion at that order.

    Returns ``(table, delta_conversion)``; ``to_dp(table, delta_conversion)`` is (epsilon, delta) (the
    epsilon to rounding). The search ranks candidates on a coarse grid (H = 2^-5) with a subset of C
    (:func:`_search_subset`); the winner is rebuilt with all of C at ``grid_bits``, or on a coarser grid
    when the table would be long (small epsilon), never so coarse that the smallest contribution moves
    the index by fewer than 8 steps. A table that does not reach 1 (heavy items must be kept with
    probability ~1, not with the last entry of a cut table) is an error. Cached per arguments.

    ``gaussian_rdp``: the table is composed, at its order alpha, with Gaussian mechanisms of l2 sensitivity 1
    and noise sigma_1, sigma_2, ... (MAD-SIPS's earlier rounds and the adaptive cap's histogram), each
    (alpha, alpha / (2 sigma^2))-RDP: ``gaussian_rdp = sum 1 / (2 sigma^2)``, and the table gets
    ``epsilon - conversion - alpha * gaussian_rdp``. ``(epsilon, delta)`` is then the budget of the whole
    composition (less any delta the caller adds outside it, such as the Gaussian rounds' threshold events)."""
    budget = PrivacyBudget(epsilon, delta)
    gaussian_rdp = check_range("gaussian_rdp", gaussian_rdp, 0.0, math.inf)
    sub = _search_subset(contributions)

    def table_epsilon(alpha: float, f: float) -> float:
        return budget.epsilon - rdp_to_dp_epsilon(0.0, alpha, budget.delta * (1.0 - f)) - alpha * gaussian_rdp

    def w50(alphas, fractions) -> np.ndarray:
        alphas, fractions = np.broadcast_arrays(np.asarray(alphas, float), np.asarray(fractions, float))
        eps = np.array([table_epsilon(x, f) for x, f in zip(alphas.ravel(), fractions.ravel())])
        return _weights_kept(alphas, eps, budget.delta * fractions, sub, 5, probability)

    try:
        alpha, f, w = search_order(table_epsilon, w50, budget.epsilon, delta_fractions)
    except ValueError:
        raise ValueError(f"no keep table reaches probability {probability} at ({epsilon}, {delta})") from None
    eps_r = table_epsilon(alpha, f)
    # the grid: at most grid_bits, coarser when the table would be long (small epsilon: W50 in the hundreds),
    # keeping ceil(c/H) >= 8 for the smallest contribution (the +1 slack then costs <= 12%)
    span = 4.0 * w  # the table reaches 1 at a few times W50
    bits = min(grid_bits, max(int(math.floor(math.log2(_MAX_FINAL_ENTRIES / span))), min_grid_bits(contributions)))
    table = keep_table(alpha, eps_r, budget.delta * f, contributions, bits, _MAX_FINAL_ENTRIES)
    if not table.complete:
        raise ValueError(
            f"the keep table at epsilon {epsilon:g}, delta {delta:g} does not reach probability 1 within "
            f"{len(table.probs)} entries (at small epsilon its tail is long: heavy items would be dropped); "
            "use threshold='gaussian'"
        )
    return table, budget.delta * (1.0 - f)


@dataclasses.dataclass(frozen=True)
class KeepTableSpec:
    """What :func:`keep_table` builds a table from (a few numbers instead of its ~340 KB of probabilities).

    A spec with another table's order alpha, RDP epsilon, mixture delta and grid but other ``contributions``
    (``dataclasses.replace(KeepTableSpec.of(table), contributions=C)``) builds a table of the same per-release
    guarantee (``to_dp`` with the same conversion delta), so that a run may pick one of several such tables
    from a DP output and still compose at one order (MAD-SIPS's ``weight_cap='auto'``, docs/mad_sips.md). The
    pipeline's steps carry the specs and build the chosen one on the worker, once per process (:meth:`build`,
    cached); the same arguments give the same table as at plan time."""

    alpha: float
    epsilon_rdp: float
    delta_rdp: float
    grid_bits: int
    contributions: Tuple[float, ...]

    @classmethod
    def of(cls, table: KeepTable) -> "KeepTableSpec":
        """The spec of ``table`` (an unknown domain's: F[0] = 0, scale 1)."""
        if table.unseen != 0.0 or table.scale != 1.0:
            raise ValueError("only a table of an unknown domain with scale 1 has a spec")
        return cls(table.alpha, table.epsilon_rdp, table.delta_rdp, table.grid_bits, tuple(table.contributions))

    def build(self) -> KeepTable:
        """The table (cached per process); an error if it does not reach probability 1."""
        out = _keep_table_at(self.alpha, self.epsilon_rdp, self.delta_rdp, self.contributions, self.grid_bits)
        if not out.complete:
            raise ValueError(
                f"the keep table at alpha {self.alpha:g} does not reach probability 1 within {len(out.probs)} "
                f"entries for the contributions up to {max(self.contributions):g}"
            )
        return out


@functools.lru_cache(maxsize=64)
def _keep_table_at(alpha, epsilon_rdp, delta_rdp, contributions, grid_bits) -> KeepTable:
    return keep_table(alpha, epsilon_rdp, delta_rdp, contributions, grid_bits, _MAX_FINAL_ENTRIES)


def min_grid_bits(contributions: Sequence[float]) -> int:
    """The coarsest grid on which the smallest contribution moves the index by >= 8 steps."""
    return max(0, math.ceil(math.log2(8.0 / min(contributions))))


# ---------------------------------------------------------------------------------------------
# The l1 keep curve: Laplace weightings and Policy Laplace (docs/thresholding.md, "The l1 curve")
# ---------------------------------------------------------------------------------------------

#: the curve is built at (eps, delta) (1 - 1e-6). The margin once absorbed the float error of its evaluation; the
#: limits are now within 2^-90 of the exact curve and that error is reserved (:func:`rounding_reserve`), but the
#: margin stays so that the curves, their reports and the seeded outputs stay as they were
_CURVE_MARGIN = 1e-6


@dataclasses.dataclass(frozen=True)
class L1KeepCurve:
    """Keep an item of total weight W with probability ``f(W / unit)`` (a continuous truncated geometric).

    For contributions whose change has l1 norm <= 1 per user, in l1 units x = W / ``unit`` (weighted Laplace
    and Policy Laplace: unit 1; the count weighting: unit Delta_0), with ``u(x) = delta (e^{eps x} - 1) /
    (e^eps - 1)`` and the midpoint x* (``u(x*) = 1/2``):

        f(x) = u(x)               for 0 <= x <= x*,
        f(x) = 1 - u(2 x* - x)    for x* <= x <= 2 x*,     f(x) = 1 beyond.

    For every real x >= 0 and shift t in (0, 1], (Bern f(x), Bern f(x + t)) is (eps t, delta t)-DP in both
    directions, so one user's change (l1 norm <= 1, any real coordinates: also the policies' rerouted weights)
    changes the release by an (eps, delta)-DP pair (proof: docs/thresholding.md). An item nobody holds is never
    kept (f(0) = 0). It is built at ``eps (1 - 1e-6)``, ``delta (1 - 1e-6)`` of the budget it reports, and
    realised by :meth:`limits` (double-word arithmetic, within 2^-90 of f before the 2^-64 rounding; the
    reserve of :func:`rounding_reserve` covers both, at every shift).

    Attributes:
      epsilon, delta: the (eps, delta)-DP of one release (per user).
      unit: the weight of one l1 unit (1, or Delta_0 for counts).
    """

    epsilon: float
    delta: float
    unit: float = 1.0

    def __post_init__(self):
        check_range("epsilon", self.epsilon, 0.0, math.inf, lo_open=True)
        check_range("delta", self.delta, 0.0, 1.0, lo_open=True, hi_open=True)
        check_range("unit", self.unit, 0.0, math.inf, lo_open=True)
        if not math.isfinite(self.epsilon) or not math.isfinite(self.unit):
            raise ValueError("epsilon and unit must be finite")
        # the drop side of the proof mirrors every pair (x, x + t) with x < x* inside [0, 2 x*]: needs x* >= 1
        if self.delta > 0.5:
            raise ValueError(f"delta {self.delta:g} must be at most 1/2 for the l1 curve (its midpoint is then >= 1)")
        # case "past the end" of the proof: 1 <= e^{eps t} (1 - u(t)) + delta t needs delta e^eps/(e^eps - 1) <= 1
        if self.delta >= -math.expm1(-self.epsilon):
            raise ValueError(
                f"delta {self.delta:g} must be below 1 - e^-epsilon = {-math.expm1(-self.epsilon):.3g} for the l1 curve"
            )
        self._constants  # the double-word constants; an error if eps x* > 256 (l1_limits.MAX_EXPONENT)

    @property
    def _eps(self) -> float:
        return self.epsilon * (1.0 - _CURVE_MARGIN)

    @property
    def _delta(self) -> float:
        return self.delta * (1.0 - _CURVE_MARGIN)

    @functools.cached_property
    def _constants(self) -> l1_limits.CurveConstants:
        return l1_limits.curve_constants(self._eps, self._delta, self.unit)

    @property
    def midpoint(self) -> float:
        """x*, in l1 units: ``u(x*) = 1/2``, i.e. ``log(1 + (e^eps - 1) / (2 delta)) / eps``."""
        e = self._eps
        return math.log1p(math.expm1(e) / (2.0 * self._delta)) / e

    def limits(self, weights) -> Tuple[np.ndarray, np.ndarray]:
        """(lower, limit) per weight, arrays of the weights' shape (bool, uint64): where ``lower`` (x <= x*),
        :meth:`keep` keeps iff the item's 64 random bits are below ``limit`` = floor(u 2^64); elsewhere it drops
        iff they are below ``limit`` = ceil(v 2^64), v = u(2 x* - x) the drop probability (0 from 2 x* on), computed
        directly (1 - f would lose its low bits near 1). u and v are evaluated in double words from the float
        weight, within 2^-90 of their exact values (:func:`privacy.l1_limits.limits`; docs/thresholding.md, "The
        realised probabilities"). A weight of 0 (or below) has limit 0 on the lower piece: never kept."""
        return l1_limits.limits(weights, self._constants)

    def keep_probability(self, weights) -> np.ndarray:
        """The keep probability :meth:`keep` realises per weight (f to within 2^-64 + 2^-90), rounded to float64:
        ``limit / 2^64`` below x*, ``1 - limit / 2^64`` above (1 from 2 x* on)."""
        lower, limit = self.limits(weights)
        p = np.ldexp(limit.astype(np.float64), -KEEP_BITS)
        return np.where(lower, p, 1.0 - p)

    def keep(self, weights, bits: np.ndarray, low_bits=None) -> np.ndarray:
        """Keep decisions from uint64 random ``bits``: below x*, keep iff ``bits < floor(u 2^64)``; above,
        drop iff ``bits < ceil(v 2^64)`` (v the drop probability), with the limits of :meth:`limits`. Either
        way the keep probability is f rounded down to a multiple of 2^-64, to within the 2^-90 of the evaluation,
        without a float uniform in between (docs/thresholding.md; ``low_bits`` is never read)."""
        lower, limit = self.limits(weights)
        bits = np.asarray(bits, dtype=np.uint64)
        return np.where(lower, bits < limit, bits >= limit)

    def weight_for(self, probability: float) -> float:
        """The smallest total weight kept with probability >= ``probability`` (in (0, 1]); W50 = x* unit."""
        p = check_range("probability", probability, 0.0, 1.0, lo_open=True)
        e, d, m = self._eps, self._delta, self.midpoint
        if p <= 0.5:  # u(x) = p
            x = math.log1p(p * math.expm1(e) / d) / e
        else:  # 1 - u(2 x* - x) = p
            x = 2.0 * m - math.log1p((1.0 - p) * math.expm1(e) / d) / e
        return min(x, 2.0 * m) * self.unit

    @property
    def complete(self) -> bool:
        return True

    def as_report(self) -> dict:
        """What a round's report shows of the curve (``noise`` 'keep_curve')."""
        return {
            "kind": "l1_curve",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "unit": self.unit,
            "weight_kept_10_50_90": [self.weight_for(0.1), self.weight_for(0.5), self.weight_for(0.9)],
            "weight_kept_1": self.weight_for(1.0),
        }


def rounding_reserve(epsilon: float, changed_items: int) -> float:
    """The delta reserved for the realisation of the curve's keep probabilities (:meth:`L1KeepCurve.limits`:
    within eta = 2^-90 of f, then rounded down to a multiple of 2^-64, so within [f - 2^-64 - eta, f + eta]):
    each item whose weight a user changes, by any shift t in (0, 1], may exceed its (eps t, delta t) condition by
    at most ``e^{eps t} (2^-64 + eta) + eta <= e^eps (2^-64 + eta) + eta``, so ``changed_items`` times that in all
    (docs/thresholding.md, "The realised probabilities")."""
    eta = l1_limits.LIMIT_ERROR
    per_item = math.exp(epsilon) * (2.0**-KEEP_BITS + eta) + eta
    return float(check_int("changed_items", changed_items, 0)) * per_item


def calibrate_l1_curve(epsilon: float, delta: float, unit: float = 1.0, changed_items: int = 0) -> L1KeepCurve:
    """The l1 keep curve of an (epsilon, delta)-DP release for changes of l1 norm <= 1 in units of ``unit``
    (closed form), with the :func:`rounding_reserve` of ``changed_items`` (the most items one user's change
    touches) taken off delta."""
    PrivacyBudget(epsilon, delta)
    reserve = rounding_reserve(epsilon, changed_items)
    if reserve >= delta / 2:
        raise ValueError(
            f"delta {delta:g} is too small for the 2^-64 rounding of {changed_items} items' keep probabilities"
        )
    return L1KeepCurve(float(epsilon), float(delta) - reserve, float(unit))
