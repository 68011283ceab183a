"""A keep rule for weights that move by any real amount under an l2 bound: Policy Gaussian's and MAD's release.

Pure math, fixed before any data is read (no Beam). Policy Gaussian's neighbouring histograms differ by a vector
of l2 norm <= 1 whose coordinates take any real value (the l2-descent reroutes other users' weight; DPSU paper,
Lemma 5.2). A keep rule f (keep item i with probability f(W_i), release only the kept set) is then
delta-approximately (alpha, eps)-RDP per user if, for every real W >= 0 and t in (0, 1],

    (Bern f(W), Bern f(W + t)) is (delta t^2)-approximately (alpha, eps t^2)-RDP in both directions     (*)

(the items are independent and sum t_i^2 <= 1; docs/thresholding.md, "The l2 rule"). MAD's one round is in the
same position (its change vector has l2 norm <= 1 with real coordinates, MAD paper Lemma 5.6). The step tables of
:mod:`privacy.thresholding` cannot meet (*): a tiny shift across a step is a jump at a budget that vanishes.
This rule is continuous:

* **a quadratic start**, ``f(W) = c W^2`` for W <= W_s (an item nobody holds is never kept; near 0 the mixture
  delta t^2 pays for the pair): Lemma S of the docs proves (*) for both ends in [0, W_s] when
  ``2 alpha c max(rho*^(alpha-2) + P/(1-P), 1 + e P/(1-P)) / (1 - delta) <= eps``, rho* = kappa/(kappa - 1),
  kappa = delta / c, P = c W_s^2 <= 1/(2 alpha) (:func:`start_ok`);
* **linear interpolation** of knots F[j] at jH (H = 2^-grid_bits) from W_s on, F nondecreasing, the last knot
  held beyond the end. Three finite families of conditions imply (*) for every other pair
  (:func:`rule_violations` checks them at the exact budget):
  - *local* (shifts t <= t_max = m0 H): on each window of cells [jH, (j + m0 + 1)H], the largest slope s and the
    end values p_lo, r_hi satisfy ``(alpha/2) s^2 K <= eps`` with the certified Taylor bound K of both
    Bernoulli divergences (:func:`local_slope`), which bounds D <= eps t^2 for every pair within t <= t_max;
  - *far, linear* (t >= t_max, W >= W_s): for fixed t, W -> (f(W), f(W + t)) is linear between the W at which
    W or W + t is a knot, and R_t = {(p, r): p <= r <= g_t(p)} is convex (g_t concave in p), so the pairs at
    those W suffice: W = jH (family A) and W + t = nH (family B), t = (m + theta) H, m >= m0. Each theta in
    [0, 1) is covered by K sub-steps with monotone bounds (the interpolated value at the sub-step's end, the
    budget at its start);
  - *far, from the start* (t >= t_max, W < W_s <= W + t): with monotone bounds per cell of W.

Every knot is a multiple of 2^-64; ``c W_s^2`` is one too (W_s is a power of two), so f is continuous at W_s.
:meth:`L2KeepRule.keep` keeps an item iff 64 random bits are below ``floor(f(W) 2^64)``, computed exactly in
integers at the float weight W (:meth:`L2KeepRule.limit`): the realised probability is at most 2^-64 below f,
which :func:`calibrate_l2_keep_rule` reserves from delta for every item one user's change may touch
(``(1 + e^eps) items 2^-64``: the total variation between the realised and the ideal release, on both sides).
Where nothing public bounds those items (MAD's rerouting) the rule reads 128 bits (``realisation_bits``; the second
64 only for an item whose first 64 equal its limit, probability 2^-64) and reserves ``(1 + e^eps) 2^64 2^-128``
(:data:`ANY_RUN_ITEMS`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional, Tuple

import numpy as np

from dp_partition_beam.privacy import thresholding as T
from dp_partition_beam.privacy.validation import PrivacyBudget, check_int, check_range

__all__ = [
    "L2KeepRule",
    "l2_keep_rule",
    "rule_violations",
    "start_ok",
    "start_coefficient",
    "local_slope",
    "realisation_reserve",
    "ANY_RUN_ITEMS",
    "WIDE_REALISATION_BITS",
    "calibrate_l2_keep_rule",
    "DEFAULT_GRID_BITS",
    "exact_shifts",
    "necessary_table",
]

#: H = 2^-6 (W50 17.67 at epsilon 1, delta 1e-5; 2^-7 about 0.3 lower in twice the time; the necessary bound at
#: the same order: 17.02)
DEFAULT_GRID_BITS = 6
DEFAULT_SUB_STEPS = 8  # K: a far shift's theta in [0, 1) in 8 sub-steps
DEFAULT_LOCAL_CELLS = 4  # m0: shifts below 4 H are certified by the local Taylor bound
_BUILD_MARGIN = 1e-9  # the rule is built for eps (1 - 1e-9); rule_violations checks the exact budget
_ALMOST_ONE = 1.0 - 1e-8
_MAX_ENTRIES = 1 << 16
#: a bound on the distinct items of any run, for a release whose changes reach items no public parameter bounds
#: (MAD's rerouting): Beam's and Arrow's element counts and offsets are 64-bit, so no run holds 2^64 items
ANY_RUN_ITEMS = 1 << 64
#: the random bits of such a release's keep decisions: its reserve (1 + e^eps) 2^64 2^-128 is then ~1e-19
WIDE_REALISATION_BITS = 128
_BUILD_BISECTIONS = 20  # g to 2^-20 of its bracket, feasible end (a lower bound: the build stays below the check's)


def start_ok(c: float, alpha: float, eps: float, delta: float, w_start: float, margin: float = 0.0) -> bool:
    """Lemma S's condition (module docstring): ``f(W) = c W^2`` on [0, ``w_start``] meets (*)."""
    if not (c > 0.0 and c < delta and alpha >= 2.0):
        return False
    top = c * w_start * w_start / (1.0 - delta)  # bounds both cores u, w (values <= c W_s^2, divided by 1 - delta')
    if top > 1.0 / (2.0 * alpha):
        return False
    kappa = delta / c
    rho_star = kappa / (kappa - 1.0)
    tail = top / (1.0 - top)
    factor = max(rho_star ** (alpha - 2.0) + tail, 1.0 + math.e * tail)
    return 2.0 * alpha * c * factor / (1.0 - delta) <= eps * (1.0 - margin)


def start_coefficient(alpha: float, eps: float, delta: float, w_start: float) -> float:
    """The largest c (a multiple of 2^-64 / W_s^2, so that c W_s^2 is a knot value) meeting :func:`start_ok`."""
    scale = math.ldexp(1.0, -T.KEEP_BITS) / (w_start * w_start)
    lo, hi = 0.0, delta
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if start_ok(mid, alpha, eps, delta, w_start, _BUILD_MARGIN) else (lo, mid)
    c = math.floor(lo / scale) * scale
    if c <= 0.0:
        raise ValueError(f"no quadratic start at alpha {alpha:g}, eps {eps:g}, delta {delta:g}")
    return c


def _taylor_ok(b: float, p_lo: float, r_hi: float, t_max: float, alpha: float, eps: float) -> bool:
    """The certified bound of the local pairs: for p, r in [p_lo, r_hi] with 0 <= r - p <= b t, t <= t_max,
    ``D_alpha <= (alpha/2) (r - p)^2 K`` both ways (second-order Taylor bounds, alpha >= 2) with K below."""
    b, p_lo, r_top, t_max, alpha = float(b), float(p_lo), float(r_hi), float(t_max), float(alpha)
    if r_top >= 1.0 or p_lo <= 0.0:
        return False

    def ratio_power(x: float) -> float:  # (1 + x)^(alpha - 2), inf past the float range
        log = (alpha - 2.0) * math.log1p(x)
        return math.inf if log > 700.0 else math.exp(log)

    k_up = ratio_power(b * t_max / p_lo) / p_lo + 1.0 / (1.0 - r_top)
    k_down = 1.0 / p_lo + ratio_power(b * t_max / (1.0 - r_top)) / (1.0 - r_top)
    return 0.5 * alpha * b * b * max(k_up, k_down) <= eps


def local_slope(p_lo: float, r_hi: float, t_max: float, alpha: float, eps: float) -> float:
    """The largest slope b (bisection, feasible end) with :func:`_taylor_ok`: a piece of f on which f rises by at
    most b per unit weight, with values in [p_lo, r_hi], meets (*) for every shift t <= t_max."""
    if not _taylor_ok(0.0, p_lo, r_hi, t_max, alpha, eps):
        return 0.0
    lo, hi = 0.0, math.sqrt(2.0 * eps / alpha) * 2.0  # K >= 4 (p(1-p) <= 1/4): b <= sqrt(eps / (2 alpha))
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _taylor_ok(mid, p_lo, r_hi, t_max, alpha, eps) else (lo, mid)
    return lo


@dataclasses.dataclass(frozen=True)
class L2KeepRule:
    """Keep an item of total weight W with probability f(W): ``c W^2`` up to W_s, then the knots ``probs``
    interpolated linearly (index j at jH; the last knot held beyond the end).

    Attributes:
      grid_bits: H = 2^-grid_bits.
      start_cells: n_s, W_s = n_s H (a power of two).
      coefficient: c, a multiple of 2^-64 / W_s^2; ``probs[j] = c (jH)^2`` rounded down for j < n_s (reporting
        only) and ``probs[n_s] = c W_s^2`` exactly.
      probs: the knots, nondecreasing multiples of 2^-64, the last within 1e-8 of 1 (``complete``).
      alpha, epsilon_rdp, delta_rdp: (*)'s budget per unit of l2 norm squared (the release is delta_rdp-
        approximately (alpha, epsilon_rdp)-RDP per user).
      sub_steps, local_cells: K and m0 of the conditions (module docstring).
      realisation_bits: 64 or 128, the random bits an item's decision reads (:meth:`keep`): with 128 the realised
        probability is at most 2^-128 below f, for releases where no public bound limits the items one user's
        change may touch (MAD's rerouting: :data:`ANY_RUN_ITEMS`).
    """

    grid_bits: int
    start_cells: int
    coefficient: float
    probs: Tuple[float, ...]
    alpha: float
    epsilon_rdp: float
    delta_rdp: float
    sub_steps: int = DEFAULT_SUB_STEPS
    local_cells: int = DEFAULT_LOCAL_CELLS
    realisation_bits: int = T.KEEP_BITS

    @property
    def grid(self) -> float:
        return math.ldexp(1.0, -self.grid_bits)

    @property
    def start(self) -> float:
        """W_s, where the quadratic start meets the knots."""
        return self.start_cells * self.grid

    @functools.cached_property
    def _probs(self) -> np.ndarray:  # the knots as an array, once per process (a release reads them per item)
        return np.asarray(self.probs, dtype=np.float64)

    def keep_probability(self, weights) -> np.ndarray:
        """f(W) per weight in float64 (what :meth:`keep` rounds down to a multiple of 2^-64)."""
        w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
        probs = self._probs
        x = np.ldexp(w, self.grid_bits)  # exact
        j = np.clip(np.floor(x), self.start_cells, len(probs) - 1).astype(np.int64)
        theta = np.clip(x - j, 0.0, 1.0)  # exact where j = floor(x)
        nxt = probs[np.minimum(j + 1, len(probs) - 1)]
        linear = probs[j] + theta * (nxt - probs[j])
        return np.where(w < self.start, self.coefficient * w * w, np.minimum(linear, probs[-1]))

    @functools.cached_property
    def _units(self) -> Tuple[int, ...]:  # the knots in units of 2^-64 (exact integers)
        return tuple(int(math.ldexp(p, T.KEEP_BITS)) for p in self.probs)

    def limit(self, weight: float) -> int:
        """``floor(f(W) 2^64)`` computed exactly (integers) at the float weight W: the number of 64-bit patterns
        :meth:`keep` keeps outright. f(W) is a dyadic rational there (c, W, the knots and W's position in its cell
        are), so the only rounding is this floor, at most 2^-64 below f (:func:`realisation_reserve`)."""
        return self.limit_bits(weight, T.KEEP_BITS)

    def limit_bits(self, weight: float, bits: int) -> int:
        """``floor(f(W) 2^bits)`` exactly (``bits`` >= 64, so every knot is an integer there): :meth:`limit` at 64
        bits; at 128, its top 64 bits are :meth:`limit` (``floor(floor(x 2^128) / 2^64) = floor(x 2^64)``)."""
        w = max(float(weight), 0.0)
        if not math.isfinite(w):
            raise ValueError(f"the keep rule reads finite weights, got {weight}")
        if bits < T.KEEP_BITS:
            raise ValueError(f"bits must be >= {T.KEEP_BITS}, got {bits}")
        if w < self.start:
            a, b = self.coefficient.as_integer_ratio()
            p, q = w.as_integer_ratio()
            return (a * p * p << bits) // (b * q * q)
        x = math.ldexp(w, self.grid_bits)  # exact
        j = min(int(math.floor(x)), len(self.probs) - 1)
        shift = bits - T.KEEP_BITS
        units = self._units
        if j >= len(units) - 1:
            return units[-1] << shift
        p, q = (x - j).as_integer_ratio()  # x - j exact (Sterbenz: j <= x < j + 1, j >= start cells >= 1)
        return (units[j] << shift) + (((units[j + 1] - units[j]) << shift) * p) // q

    def keep(self, weights, bits: np.ndarray, low_bits: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        """Keep decisions for uint64 random ``bits`` (one per weight): ``bits < floor(f(W) 2^64)`` (:meth:`limit`,
        exact: every limit is an integer below 2^64 since f < 1). With ``realisation_bits`` 128 the decision is
        ``bits 2^64 + low < floor(f(W) 2^128)``: an item whose ``bits`` equal its limit (probability 2^-64) reads
        64 more, ``low_bits(indices)`` (uint64, one per index into the flattened weights; keyed (seed,
        'noise_low', round, item) under a seed), the others are decided by ``bits`` alone."""
        w = np.asarray(weights, dtype=np.float64)
        flat = w.ravel().tolist()
        limits = np.array([self.limit(x) for x in flat], dtype=np.uint64)
        b = np.asarray(bits, dtype=np.uint64).ravel()
        kept = b < limits
        if self.realisation_bits > T.KEEP_BITS:
            ties = np.flatnonzero(b == limits)
            if ties.size:
                if low_bits is None:
                    raise ValueError("a 128-bit keep rule needs low_bits for the items at their 64-bit limit")
                low = np.asarray(low_bits(ties), dtype=np.uint64)
                mask = (1 << T.KEEP_BITS) - 1
                low_limits = [self.limit_bits(flat[i], self.realisation_bits) & mask for i in ties.tolist()]
                kept[ties] = low < np.array(low_limits, dtype=np.uint64)
        return kept.reshape(w.shape)

    def weight_for(self, probability: float) -> float:
        """The smallest total weight kept with at least ``probability`` (``inf`` if none): W50 for 1/2."""
        probs = np.asarray(self.probs)
        if probability <= self.coefficient * self.start * self.start:
            return math.sqrt(max(probability, 0.0) / self.coefficient)
        hits = np.flatnonzero(probs >= probability)
        if hits.size == 0:
            return math.inf
        j = int(hits[0])
        lo, hi = float(probs[j - 1]), float(probs[j])
        return (j - 1 + (probability - lo) / (hi - lo)) * self.grid

    @property
    def complete(self) -> bool:
        return self.probs[-1] >= _ALMOST_ONE

    def as_report(self, delta_conversion: float) -> dict:
        """What a round's report shows of the rule (``noise`` 'keep_rule')."""
        return {
            "kind": "l2_rule",
            "alpha": self.alpha,
            "epsilon_rdp": self.epsilon_rdp,
            "delta_rdp": self.delta_rdp,
            "delta_conversion": delta_conversion,
            "grid": self.grid,
            "start": self.start,
            "entries": len(self.probs),
            "weight_kept_10_50_90": [self.weight_for(0.1), self.weight_for(0.5), self.weight_for(0.9)],
        }


def _g(p, t, alpha, eps, delta, margin):
    t = np.asarray(t, dtype=np.float64)
    return T.one_step(p, alpha, eps * t * t, delta * t * t, margin)


def _quad(c, w):
    return c * w * w


class _Knots:
    """The knots while they are built or checked: f at any point, its largest slope on a window."""

    def __init__(self, c: float, grid_bits: int, start_cells: int, probs: np.ndarray):
        self.c, self.h, self.ns, self.probs = c, math.ldexp(1.0, -grid_bits), start_cells, probs

    def at_knot(self, j):  # f(jH), knots j < len
        j = np.asarray(j)
        return np.where(j <= self.ns, _quad(self.c, j * self.h), self.probs[np.maximum(j, 0)])

    def max_slope(self, j0: int, j1: int) -> float:
        """The largest slope of f on [j0 H, j1 H]: 2 c W on the quadratic part, the cells' slopes after it."""
        s = 0.0
        if j0 < self.ns:
            s = 2.0 * self.c * min(j1, self.ns) * self.h
        a = max(j0, self.ns)
        if j1 > a:
            s = max(s, float(np.max(np.diff(self.probs[a : j1 + 1]))) / self.h)
        return s


def _pieces(M: int, K: int, m0: int):
    """The far shifts t = (m + theta) H, m0 <= m < M, theta in [0, 1], in pieces [lo, hi] of theta: (m, lo, hi)
    arrays. ceil(K m0 / m) pieces for shift m, so that a piece's monotone bound (the budget at its start, the
    value at its end) costs at most 1/(K m0) of the shift at every m."""
    ms, los, his = [], [], []
    for m in range(m0, M):
        k = max(1, -(-K * m0 // m))
        for i in range(k):
            ms.append(m)
            los.append(i / k)
            his.append((i + 1) / k)
    return np.array(ms, dtype=np.int64), np.array(los), np.array(his)


def _far_bounds(knots: _Knots, n: int, alpha, eps, delta, pieces, m0: int, margin: float, bisections: int = 36):
    """The explicit bounds on knot n from the far shifts (families A and B, and from the start): its largest value."""
    F, ns, h = knots.probs, knots.ns, knots.h
    mm, lo, hi = pieces
    prev = F[n - 1]
    best = [1.0]
    a = n - 1 - mm >= ns  # family A: W = jH, j = n - 1 - m, in the linear part
    b = n - mm - 1 >= ns  # family B: W + t = nH, W in cell [n-m-1, n-m] of the linear part
    pa = F[n - 1 - mm[a]]
    pb = hi[b] * F[n - mm[b] - 1] + (1.0 - hi[b]) * F[n - mm[b]]
    # from the start: W in quadratic cell i, W + t in cell [n-1, n], t >= max(m0 H, (n - 2 - i) H), t <= 1
    i = np.arange(ns)
    t_start = np.maximum(m0, n - 2 - i) * h
    live = t_start <= 1.0
    p_all = np.concatenate([pa, pb, _quad(knots.c, i[live] * h)])
    t_all = np.concatenate([(mm[a] + lo[a]) * h, (mm[b] + lo[b]) * h, t_start[live]])
    if p_all.size:
        g = T.one_step(p_all, alpha, eps * t_all * t_all, delta * t_all * t_all, margin, bisections)
        na = int(np.count_nonzero(a))
        if na:  # family A bounds the value at the piece's end: (1 - hi) F[n-1] + hi F[n] <= g
            best.append(float(np.min(prev + (g[:na] - prev) / hi[a])))
        if g.size > na:  # family B and from the start bound F[n] itself
            best.append(float(np.min(g[na:])))
    return min(best)


def _local_ok(knots: _Knots, n: int, x: float, alpha, eps, m0: int, ahead: bool = False) -> bool:
    """The local window [n - m0 - 1, n] with knot n at x: its largest slope within :func:`_taylor_ok`'s bound.
    ``ahead`` (the build): at the window's top value extrapolated m0 cells on at the new cell's slope, so that the
    next windows, which hold this cell's slope at higher values (the bound falls as values rise), are likely to
    hold it too (without it the rule becomes a staircase past W50); the check reads the window as it is."""
    saved = knots.probs[n]
    knots.probs[n] = x
    try:
        j0 = max(0, n - m0 - 1)
        s = knots.max_slope(j0, n)
        p_lo = float(knots.at_knot(j0))
        top = min(x + m0 * (x - float(knots.probs[n - 1])), 1.0) if ahead else x
        return _taylor_ok(s, p_lo, top, m0 * knots.h, alpha, eps)
    finally:
        knots.probs[n] = saved


def l2_keep_rule(
    alpha: float,
    epsilon_rdp: float,
    delta_rdp: float,
    grid_bits: int = DEFAULT_GRID_BITS,
    sub_steps: int = DEFAULT_SUB_STEPS,
    local_cells: int = DEFAULT_LOCAL_CELLS,
    start: float = 1.0,
    max_entries: int = _MAX_ENTRIES,
) -> L2KeepRule:
    """The rule of the module docstring at (alpha, eps, delta): each knot the largest value its conditions allow
    given the earlier knots (every condition on a knot reads only knots before it and itself)."""
    if not alpha >= 2.0:
        raise ValueError(f"alpha must be >= 2 for the rule's Taylor bounds, got {alpha}")
    check_range("epsilon_rdp", epsilon_rdp, 0.0, math.inf, lo_open=True)
    check_range("delta_rdp", delta_rdp, 0.0, 1.0, lo_open=True, hi_open=True)
    K, m0 = check_int("sub_steps", sub_steps, 1, 64), check_int("local_cells", local_cells, 1, 1 << 10)
    check_int("grid_bits", grid_bits, 1, 12)
    if not (start > 0 and math.log2(start).is_integer()):
        raise ValueError(f"start must be a power of two, got {start}")
    h, M = math.ldexp(1.0, -grid_bits), 1 << grid_bits
    ns = int(round(start / h))
    if ns < m0 + 2:
        raise ValueError(f"start {start} must span at least local_cells + 2 cells of 2^-{grid_bits}")
    c = start_coefficient(alpha, epsilon_rdp, delta_rdp, start)
    probs = np.zeros(max_entries)
    probs[: ns + 1] = np.floor(np.ldexp(_quad(c, np.arange(ns + 1) * h), T.KEEP_BITS)) / 2.0**T.KEEP_BITS
    probs[ns] = _quad(c, start)  # a multiple of 2^-64 by the choice of c (exact)
    knots = _Knots(c, grid_bits, ns, probs)
    eps_b = epsilon_rdp * (1.0 - _BUILD_MARGIN)
    pieces = _pieces(M, K, m0)
    n = ns + 1
    while n < max_entries and probs[n - 1] < _ALMOST_ONE:
        prev = probs[n - 1]
        far = _far_bounds(knots, n, alpha, epsilon_rdp, delta_rdp, pieces, m0, _BUILD_MARGIN, _BUILD_BISECTIONS)
        x = min(far, 1.0)  # far is at eps (1 - 1e-9) and a bisection's feasible end: below the check's bound
        x = max(x, prev)
        if not _local_ok(knots, n, x, alpha, eps_b, m0, ahead=True):
            lo, hi = prev, x
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if _local_ok(knots, n, mid, alpha, eps_b, m0, ahead=True) else (lo, mid)
            x = lo
        x = math.floor(math.ldexp(x, T.KEEP_BITS)) / 2.0**T.KEEP_BITS
        probs[n] = max(x, prev)
        n += 1
    return L2KeepRule(
        grid_bits, ns, c, tuple(probs[:n].tolist()), float(alpha), float(epsilon_rdp), float(delta_rdp), K, m0
    )


def rule_violations(rule: L2KeepRule) -> dict:
    """Checks every condition of the proof on ``rule`` at its exact budget; every count is 0 for a sound rule.

    ``decreasing`` knots; ``start``: Lemma S's condition and the junction value; ``far``: knots above a family-A,
    family-B or from-the-start bound (the knots padded with the last one for M + 1 cells: past the end f is
    constant, a linear piece like the others); ``local``: windows whose slope exceeds :func:`local_slope`."""
    h, M, K, m0, ns = rule.grid, 1 << rule.grid_bits, rule.sub_steps, rule.local_cells, rule.start_cells
    a, e, d = rule.alpha, rule.epsilon_rdp, rule.delta_rdp
    probs = np.concatenate([np.asarray(rule.probs, dtype=np.float64), np.full(M + 1, rule.probs[-1])])
    knots = _Knots(rule.coefficient, rule.grid_bits, ns, probs)
    pieces = _pieces(M, K, m0)
    out = {"decreasing": int(np.count_nonzero(np.diff(probs[ns:]) < 0)), "start": 0, "far": 0, "local": 0}
    if not start_ok(rule.coefficient, a, e, d, rule.start) or probs[ns] != _quad(rule.coefficient, rule.start):
        out["start"] = 1
    for n in range(ns + 1, len(probs)):
        if probs[n] > _far_bounds(knots, n, a, e, d, pieces, m0, 0.0):
            out["far"] += 1
        j0 = max(0, n - m0 - 1)
        if not _taylor_ok(knots.max_slope(j0, n), float(knots.at_knot(j0)), float(probs[n]), m0 * h, a, e):
            out["local"] += 1
    return out


def realisation_reserve(epsilon: float, changed_items: int, bits: int = T.KEEP_BITS) -> float:
    """The delta reserved for the 2^-bits rounding of the realised keep probabilities (:meth:`L2KeepRule.limit_bits`:
    f exactly at the float weight, rounded down): the realised release is within total variation ``items 2^-bits``
    of the ideal one on either dataset (on the items whose weight differs; the others are the same factor of the
    product on both sides), so ``M~(D)(S) <= e^eps M~(D')(S) + delta + (1 + e^eps) items 2^-bits``; items: every
    item a user's change may touch (a policy: any item on its worker, ``max_sequential_pairs``; MAD:
    :data:`ANY_RUN_ITEMS` with 128 bits)."""
    items = float(check_int("changed_items", changed_items, 0))
    return (1.0 + math.exp(epsilon)) * items * 2.0 ** -check_int("bits", bits, T.KEEP_BITS, 1024)


@functools.lru_cache(maxsize=32)
def calibrate_l2_keep_rule(
    epsilon: float,
    delta: float,
    changed_items: int = 0,
    gaussian_rdp: float = 0.0,
    grid_bits: int = DEFAULT_GRID_BITS,
    realisation_bits: int = T.KEEP_BITS,
) -> Tuple[L2KeepRule, float]:
    """The rule for one (epsilon, delta)-DP release: ``(rule, delta_conversion)``.

    delta less the :func:`realisation_reserve` of ``changed_items`` at ``realisation_bits`` (64, or 128 where the
    changed items have no public bound but :data:`ANY_RUN_ITEMS`) is split between the mixture (delta_rdp) and
    the RDP conversion; the order alpha and the split are those of the necessary-condition bound (the table with
    exact shifts, docs/thresholding.md; a fast vectorised search whose optimum the rule's tracks), and the rule
    gets ``epsilon - conversion - alpha gaussian_rdp`` (Gaussian mechanisms composed at its order, as for the
    tables). An error if the rule does not reach probability 1."""
    budget = PrivacyBudget(epsilon, delta)
    if realisation_bits not in (T.KEEP_BITS, WIDE_REALISATION_BITS):
        raise ValueError(f"realisation_bits must be {T.KEEP_BITS} or {WIDE_REALISATION_BITS}, got {realisation_bits}")
    reserve = realisation_reserve(budget.epsilon, changed_items, realisation_bits)
    if reserve >= budget.delta / 2:
        raise ValueError(
            f"delta {delta:g} is too small for the 2^-{realisation_bits} rounding reserve of {changed_items} items"
        )
    avail = budget.delta - reserve
    alpha, f, w50 = _search(budget.epsilon, avail, gaussian_rdp)
    alpha = max(alpha, 2.0)
    # a coarser grid when the rule would be long (small epsilon: W50 in the hundreds), never so coarse that the
    # quadratic start [0, 1] spans fewer than local_cells + 2 cells
    grid_bits = max(3, min(grid_bits, int(math.floor(math.log2(8192.0 / (4.0 * w50))))))
    delta_conv = avail * (1.0 - f)
    eps_r = budget.epsilon - T.rdp_to_dp_epsilon(0.0, alpha, delta_conv) - alpha * gaussian_rdp
    if eps_r <= 0:
        raise ValueError(f"no budget is left for the keep rule at ({epsilon}, {delta})")
    rule = l2_keep_rule(alpha, eps_r, avail * f, grid_bits)
    if not rule.complete:
        raise ValueError(f"the keep rule at ({epsilon:g}, {delta:g}) does not reach probability 1; use gaussian")
    return dataclasses.replace(rule, realisation_bits=realisation_bits), delta_conv


def exact_shifts(grid_bits: int, subset: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """(index shifts, budgets) of the necessary condition on the grid 2^-grid_bits: the exact shift m H moves a knot
    by m cells, at the budget of m H (no float slack), m = 1..2^grid_bits (``subset``: a few spread over them, for
    the order search, as :func:`thresholding._search_subset`)."""
    grid = math.ldexp(1.0, -grid_bits)
    shifts = tuple(m * grid for m in range(1, (1 << grid_bits) + 1))
    if subset:
        shifts = T._search_subset(shifts)
    return np.array([round(c / grid) for c in shifts], dtype=np.int64), np.array(shifts, dtype=np.float64)


def necessary_table(epsilon: float, delta: float, grid_bits: int) -> T.KeepTable:
    """The pointwise-largest knot values on the grid 2^-grid_bits that every sound real-shift keep rule stays below
    (docs/thresholding.md, "How close to the best keep rule"), at the order and split of :func:`_search`: its W50
    bounds any such rule's from below. ``contributions`` of the table are the shifts (the table is a bound, not a
    release rule: it is never used to keep items)."""
    alpha, f, _ = _search(epsilon, delta, 0.0)
    eps = epsilon - T.rdp_to_dp_epsilon(0.0, alpha, delta * (1.0 - f))
    shifts = exact_shifts(grid_bits)
    probs, n = T._build_rows(
        alpha, eps, delta * f, (), grid_bits, _MAX_ENTRIES << 2, T._BISECTIONS, _ALMOST_ONE, shifts=shifts
    )
    probs = probs[0, :n]
    full = np.flatnonzero(probs >= _ALMOST_ONE)
    probs = probs[: int(full[0]) + 1] if full.size else probs
    return T.KeepTable(grid_bits, tuple(probs.tolist()), float(alpha), float(eps), delta * f, tuple(shifts[1]))


def _search(epsilon: float, delta: float, gaussian_rdp: float) -> Tuple[float, float, float]:
    """(alpha, mixture fraction, its W50) minimising the W50 of the necessary-condition table on a coarse grid
    (2^-5)."""
    bits = 5
    exact = exact_shifts(bits, subset=True)
    sub = tuple(exact[1].tolist())

    def table_epsilon(alpha: float, f: float) -> float:
        return epsilon - T.rdp_to_dp_epsilon(0.0, alpha, delta * (1.0 - f)) - alpha * gaussian_rdp

    def w50(alphas, fractions):
        alphas, fractions = np.broadcast_arrays(np.asarray(alphas, float), np.asarray(fractions, float))
        eps = np.array([table_epsilon(x, f) for x, f in zip(alphas.ravel(), fractions.ravel())])
        return T._weights_kept(alphas, eps, delta * fractions, sub, bits, 0.5, shifts=exact)

    return T.search_order(table_epsilon, w50, epsilon)
