"""Exploration (issue 30, lever 3; docs/mad_sips.md, "Optimising the delta split"): where delta goes in a plan,
and how much the thresholds move if the split of delta is chosen numerically. Plan only (no data) unless --data.

    .venv/bin/python -m benchmarks.explore.explore_delta_split               # the tables of docs/mad_sips.md
    .venv/bin/python -m benchmarks.explore.explore_delta_split --quick       # epsilon 1, delta 1e-5 only
    .venv/bin/python -m benchmarks.explore.explore_delta_split --no_tables   # Gaussian plans only (3 s)
    .venv/bin/python -m benchmarks.explore.explore_delta_split --data retail --seeds 2 --lam 0.5 0.366 \
        --config mad_sips --config mad_sips:threshold=gaussian               # released items, paired by seed

Gaussian plans (``threshold='gaussian'``): sigma = AGM(eps, (1 - lam) delta), the thresholds get lam delta, round r
a share g_r of it (today lam = 1/2, g_r = f_r). Columns: today's rho per round; lam* minimising the last round's
rho with g = f (every round's change shown); the best (lam, s) on a grid that lowers the last round's rho while no
earlier round's rho rises (g_r = s f_r for r < R, the last round the rest); and the bound of giving the last round
*every* threshold's delta (s -> 0, lam re-optimised: the earlier rounds' rho then grow without bound).

Keep-table plans (``threshold='optimal'``): the earlier rounds keep the Gaussian plan's sigma_r (from AGM(eps,
delta/2)) and thresholds (failure probability f_r delta/2 each); the table gets the rest of delta, split between
its mixture and the RDP conversion over (1/4, 1/2, 3/4). Columns: where delta goes; today's W50; W50 with the
mixture/conversion split (0.3..0.7) and the order re-searched on a finer grid; the best W50 with the earlier
rounds' sigma scaled by k and their thresholds' delta by s in (0.25, 0.5, 2, 4), k the largest keeping every
earlier rho <= today's (a percentage above 0 means no s beats today's s = 1); the bound of the earlier thresholds'
delta -> 0 at today's sigma (their rho grow without bound); and the bound of Gaussian steps that cost nothing
(gaussian_rdp = 0: what any tighter accounting of them, PLD included, could at most give the table). W50s of the
searches are the tables' first entry >= 1/2 built on the calibration's grid with 20 bisections (the percentages
compare like with like); every "today" value is checked against :func:`privacy.selection.plan`. The table part
takes 20-120 s per row on the shared 2-core machine (it builds a dozen tables).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from dp_partition_beam.privacy import calibration, thresholding
from dp_partition_beam.privacy import selection as S
from dp_partition_beam.privacy.thresholding import _build_rows, _search_subset


def resolved(algo, eps, delta, d0, threshold):
    return S.resolve_params(
        algo, S.SelectionParams(epsilon=eps, delta=delta, max_contributions=d0, threshold=threshold)
    )


def h_functions(algo, params):
    n = len(params.budget_split)
    if algo == "dp_sips":
        return [None] * n
    return [None] + [S._biased_h(params.b_max)] * (n - 1)


def sigma_rounds(algo, params, noise_delta):
    """The rounds' GDP noise: AGM(eps, noise_delta), less the degree histogram's share (mad_sips: the adaptive
    cap or weight_cap 'auto')."""
    sigma = calibration.analytic_gaussian_sigma(params.epsilon, noise_delta)
    if algo == "mad_sips" and S.histogram_on(params):
        return sigma / math.sqrt(1.0 - params.cap_budget) * (1.0 + 1e-12), sigma / math.sqrt(params.cap_budget) * (
            1.0 + 1e-12
        )
    return sigma, None


def gaussian_rhos(algo, params, lam, g=None, k=1.0, rounds=None):
    """rho_r with sigma = k * AGM(eps, (1 - lam) delta) and round r's threshold failure probability lam delta g_r."""
    f = params.budget_split
    g = f if g is None else g
    sig, _ = sigma_rounds(algo, params, (1.0 - lam) * params.delta)
    hs = h_functions(algo, params)
    rounds = len(f) if rounds is None else rounds
    return [
        calibration.gaussian_threshold(
            k * sig / math.sqrt(f[r]), 2.0 * lam * params.delta * g[r], params.max_contributions, hs[r]
        )
        for r in range(rounds)
    ]


def basic_rho(params, lam):
    sigma = calibration.analytic_gaussian_sigma(params.epsilon, (1.0 - lam) * params.delta)
    return calibration.gaussian_threshold(sigma, 2.0 * lam * params.delta, params.max_contributions)


def golden(fn, lo, hi, iters=40):
    """argmin of a unimodal fn on [lo, hi]."""
    phi = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = fn(c), fn(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = fn(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = fn(d)
    return (a + b) / 2


def pct(new, old):
    return 100.0 * (new / old - 1.0)


def gaussian_row(algo, eps, delta, d0):
    params = resolved(algo, eps, delta, d0, "gaussian")
    if algo == "basic":
        today = S.plan_rounds(algo, params)[0].threshold
        assert math.isclose(basic_rho(params, 0.5), today, rel_tol=1e-12), (basic_rho(params, 0.5), today)
        lam = golden(lambda x: basic_rho(params, x), 0.02, 0.98)
        best = basic_rho(params, lam)
        return dict(today=[today], lam=lam, at_lam=[best], pareto=(lam, None, [best]), bound=best)
    f = params.budget_split
    R = len(f)
    today = [r.threshold for r in S.plan_rounds(algo, params)]
    mine = gaussian_rhos(algo, params, 0.5)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(mine, today)), (mine, today)
    lam = golden(lambda x: gaussian_rhos(algo, params, x)[-1], 0.02, 0.98)
    at_lam = gaussian_rhos(algo, params, lam)

    def shares(s):
        early = [s * x for x in f[:-1]]
        return early + [1.0 - sum(early)]

    best = (0.5, 1.0, today)
    for s in np.geomspace(0.1, 1 / sum(f[:-1]) * 0.95, 25):
        for x in np.arange(0.2, 0.951, 0.025):
            rh = gaussian_rhos(algo, params, float(x), shares(float(s)))
            if all(a <= b * (1 + 1e-12) for a, b in zip(rh[:-1], today[:-1])) and rh[-1] < best[2][-1]:
                best = (float(x), float(s), rh)
    lam_b = golden(lambda x: gaussian_rhos(algo, params, x, shares(1e-4))[-1], 0.02, 0.98)
    bound = gaussian_rhos(algo, params, lam_b, shares(1e-4))[-1]
    return dict(today=today, lam=lam, at_lam=at_lam, pareto=best, bound=bound, rounds=R)


# ---------------------------------------------------------------------------------------------- keep tables


def w50_rows(alphas, eps, deltas, contributions, bisections=20, bits=thresholding.DEFAULT_GRID_BITS, rank=False):
    """W50 of tables at the calibration's grid (2^-10), built only to probability 1/2, one row per candidate;
    ``bisections`` 20 (the final tables use 36: the same ranking, W50 to ~0.1%). ``rank``: all rows at once,
    stopped when the first reaches 1/2 (the others get inf: enough for an argmin); else one build per row."""
    alphas, eps, deltas = (np.asarray(x, float).ravel() for x in np.broadcast_arrays(alphas, eps, deltas))
    groups = [np.arange(len(alphas))] if rank else [np.array([i]) for i in range(len(alphas))]
    out = np.full(len(alphas), math.inf)
    for g in groups:
        live = g[eps[g] > 0]
        if live.size == 0:
            continue
        probs, n = _build_rows(alphas[live], eps[live], deltas[live], contributions, bits, 1 << 17, bisections, 0.5)
        for i, row in zip(live, probs[:, :n]):
            hit = np.flatnonzero(row >= 0.5)
            out[i] = math.inf if hit.size == 0 else hit[0] * math.ldexp(1.0, -bits)
    return out


def table_eps(eps, delta_avail, gaussian_rdp, alpha, f):
    """The table's RDP epsilon at order alpha when the mixture gets f of delta_avail (calibrate_keep_table)."""
    return eps - thresholding.rdp_to_dp_epsilon(0.0, alpha, delta_avail * (1.0 - f)) - alpha * gaussian_rdp


def table_parts(algo, params):
    """(sigma_r of the earlier rounds, sigma_H or None, their thresholds' delta_r args, C)."""
    f = params.budget_split
    sig, sig_h = sigma_rounds(algo, params, params.delta / 2.0)
    sigmas = [sig / math.sqrt(x) for x in f[:-1]]
    if algo == "dp_sips":
        contributions = thresholding.basic_contributions(params.max_contributions)
    else:
        contributions = S.last_round_contributions(params)
    return sigmas, sig_h, [x * params.delta for x in f[:-1]], contributions


def table_row(algo, eps, delta, d0):
    params = resolved(algo, eps, delta, d0, "optimal")
    rounds = S.plan_rounds(algo, params)
    last = rounds[-1]
    t = last.keep_table
    if algo == "basic":
        sigmas, sig_h, dargs, contributions = [], None, [], thresholding.basic_contributions(d0)
        hs = []
    else:
        sigmas, sig_h, dargs, contributions = table_parts(algo, params)
        hs = h_functions(algo, params)
    early_today = [r.threshold for r in rounds[:-1]]
    assert all(math.isclose(a.noise_scale, b, rel_tol=1e-12) for a, b in zip(rounds[:-1], sigmas))

    def early_rhos(k, s):
        return [calibration.gaussian_threshold(k * sg, s * da, d0, h) for sg, da, h in zip(sigmas, dargs, hs)]

    def rdp(k):
        return math.fsum(1.0 / (2.0 * (k * sg) ** 2) for sg in sigmas) + (0.0 if sig_h is None else 1 / (2 * sig_h**2))

    thr = math.fsum(x / 2.0 for x in dargs)
    avail = delta - thr
    parts = dict(thresholds=thr, mixture=t.delta_rdp, conversion=last.delta_conversion)
    assert math.isclose(thr + t.delta_rdp + last.delta_conversion, delta, rel_tol=1e-9)
    f0 = t.delta_rdp / avail
    assert math.isclose(t.epsilon_rdp, table_eps(eps, avail, rdp(1.0), t.alpha, f0), rel_tol=1e-6, abs_tol=1e-9)
    sub = _search_subset(contributions)
    # (1) the mixture/conversion split and the order, on a finer grid around today's (alpha, f)
    a2, f2 = (x.ravel() for x in np.meshgrid(t.alpha * np.array([0.8, 0.9, 1.0, 1.1, 1.25]), [0.3, 0.4, 0.5, 0.6, 0.7]))
    e2 = [table_eps(eps, avail, rdp(1.0), a, f) for a, f in zip(a2, f2)]
    # rank on the subset of C (the first row to reach 1/2, then the next among the rest...), finish on all of C
    order, rest = [], list(range(len(a2)))
    while len(order) < 3 and rest:
        ws = w50_rows(a2[rest], np.array(e2)[rest], avail * f2[rest], sub, rank=True)
        order.append(rest.pop(int(np.argmin(ws))))
    alphas = [t.alpha] + [a2[i] for i in order]
    fs = [f0] + [f2[i] for i in order]
    ws = w50_rows(
        alphas, [t.epsilon_rdp] + [e2[i] for i in order], [t.delta_rdp] + [avail * f2[i] for i in order], contributions
    )
    today_e = ws[0]
    k = int(np.argmin(ws))
    fine_e, alpha, f = float(ws[k]), float(alphas[k]), float(fs[k])
    out = dict(today=last.threshold, today_e=today_e, parts=parts, alpha=t.alpha, f0=f0, fine=(fine_e, alpha, f))
    if not sigmas:
        return dict(out, pareto=None, bound=None)
    # (2) at that (alpha, f): the earlier thresholds' delta scaled by s, their sigma by the largest k keeping
    # every earlier rho <= today's; s -> 0 at k = 1 is the bound (the earlier rho then grow without bound)
    cands = [(1.0, 1.0), (1.0, 1e-4)]
    for s in (0.25, 0.5, 2.0, 4.0):
        lo, hi = 0.3, 3.0
        for _ in range(30):
            mid = math.sqrt(lo * hi)
            ok = all(a <= b * (1 + 1e-12) for a, b in zip(early_rhos(mid, s), early_today))
            lo, hi = (mid, hi) if ok else (lo, mid)
        cands.append((lo, s))
    rows_e = [table_eps(eps, delta - s * thr, rdp(k), alpha, f) for k, s in cands]
    rows_d = [(delta - s * thr) * f for k, s in cands]
    ws = w50_rows([alpha] * len(cands), rows_e, rows_d, sub, rank=True)
    j = 2 + int(np.argmin(ws[2:]))
    ref, bound, best = w50_rows(
        [alpha] * 3, [rows_e[0], rows_e[1], rows_e[j]], [rows_d[0], rows_d[1], rows_d[j]], contributions
    )
    # (3) the Gaussian rounds and the histogram for free (gaussian_rdp = 0, the order searched again): a bound on
    # what any tighter accounting of the Gaussian steps (PLD instead of RDP at the table's order) could give
    free, _ = thresholding.calibrate_keep_table(eps, avail, contributions, gaussian_rdp=0.0)
    return dict(out, pareto=(best, cands[j][0], cands[j][1], ref), bound=(bound, ref), free=free.weight_for(0.5))


def patch_split(lam: float) -> None:
    """Exploration only: the planner with sigma = AGM(eps, (1 - lam) delta) and thresholds' delta lam delta (split f),
    the adaptive cap's histogram and the rounds scaled alike (no counts). With the table, its delta is what the
    earlier thresholds leave (the planner reads their delta from the rounds), so every plan stays (eps, delta)."""
    from dp_partition_beam.privacy import accounting

    original, original_cap = accounting.multi_round_calibration, S.adaptive_cap_sigmas

    def ratio(params):
        return calibration.analytic_gaussian_sigma(params.epsilon, (1.0 - lam) * params.delta) / (
            calibration.analytic_gaussian_sigma(params.epsilon, params.delta / 2.0)
        )

    def cap_sigmas(spec, params):
        if params.release_counts:
            raise ValueError("patch_split: no counts")
        a, b = original_cap(spec, params)
        return a * ratio(params), b * ratio(params)

    def patched(epsilon, delta, fractions, accounting_="gdp", max_contributions=100, h_per_round=None, sigma=None):
        if accounting_ != "gdp":
            raise ValueError("patch_split: gdp accounting only")
        if sigma is None:
            sigma = calibration.analytic_gaussian_sigma(epsilon, (1.0 - lam) * delta)
        return original(epsilon, 2.0 * lam * delta, fractions, "gdp", max_contributions, h_per_round, sigma)

    S.accounting = type("PatchedAccounting", (), {"multi_round_calibration": staticmethod(patched)})
    S.adaptive_cap_sigmas = cap_sigmas


def items(data: str, seeds: int, lams, configs) -> None:
    """Released items of ``configs`` on ``data`` (the reference under seeds 0..seeds-1) for each thresholds'
    fraction lam of delta (the first should be 1/2, today's plan); paired by seed (same randomness keys)."""
    from benchmarks.explore.explore_mad_sips import load, parse_config
    from dp_partition_beam.transforms import reference

    sets = load(data)
    base = S.SelectionParams(epsilon=1.0, delta=1e-5, max_contributions=100)
    results = {}
    for lam in lams:
        patch_split(lam)
        for text in configs:
            algo, changes = parse_config(text)
            params = base.replace(**changes)
            t = time.time()
            runs = [reference.release(sets, algo, params, seed=s) for s in range(seeds)]
            sizes = [len(r.items) for r in runs]
            last = S.plan(algo, params).rounds_for(runs[0].cap)[-1].threshold
            ref = results.setdefault(text, sizes)
            gain = 100.0 * (sum(sizes) / sum(ref) - 1.0)
            print(
                f"{data} {text:40s} lam {lam:.3f}: {np.mean(sizes):8.1f}  {sizes}  last threshold {last:.3f} "
                f"(cap {runs[0].cap})  vs lam 1/2: {gain:+.2f}%  ({time.time() - t:.0f} s)",
                flush=True,
            )


SETTINGS = [(0.5, 1e-5, 100), (1.0, 1e-5, 100), (2.0, 1e-5, 100), (4.0, 1e-5, 100), (1.0, 1e-7, 10)]
ALGOS = ("mad_sips", "mad2r", "dp_sips", "basic")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="epsilon 1, delta 1e-5, Delta_0 100 only")
    ap.add_argument("--algorithms", nargs="+", default=list(ALGOS), choices=ALGOS)
    ap.add_argument("--no_tables", action="store_true", help="Gaussian plans only")
    ap.add_argument("--data", help="released items on this dataset (explore_mad_sips's names) instead of the table")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--lam", type=float, nargs="+", default=[0.5, 0.366], help="thresholds' fraction of delta")
    ap.add_argument("--config", action="append", help="explore_mad_sips configs (default: mad_sips)")
    args = ap.parse_args(argv)
    if args.data:
        items(args.data, args.seeds, args.lam, args.config or ["mad_sips"])
        return
    settings = SETTINGS[1:2] if args.quick else SETTINGS
    t0 = time.time()
    print("## threshold='gaussian': last round's rho (today: lam = 1/2, g = f)")
    print(
        "| algorithm | eps | delta | D0 | rho today (all rounds) | lam* | rho_R at lam* | rounds' change | "
        "Pareto (lam, s): rho_R | all thresholds' delta to round R |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for algo in args.algorithms:
        for eps, delta, d0 in settings:
            r = gaussian_row(algo, eps, delta, d0)
            ch = ", ".join(f"{pct(a, b):+.2f}%" for a, b in zip(r["at_lam"], r["today"]))
            lam_p, s_p, rh = r["pareto"]
            par = f"({lam_p:.3f}, {s_p if s_p is None else round(s_p, 2)}): {pct(rh[-1], r['today'][-1]):+.2f}%"
            today = " / ".join(f"{x:.3f}" for x in r["today"])
            print(
                f"| {algo} | {eps:g} | {delta:g} | {d0} | {today} | {r['lam']:.3f} | {r['at_lam'][-1]:.3f} | "
                f"{ch} | {par} | {pct(r['bound'], r['today'][-1]):+.2f}% |",
                flush=True,
            )
    if args.no_tables:
        return
    print("\n## threshold='optimal': the table's W50 (delta: earlier thresholds' sum + mixture + conversion)")
    print(
        "| algorithm | eps | delta | D0 | delta: thresholds / mixture / conversion | alpha (f) | W50 today | "
        "mixture/conversion split and alpha re-searched: W50 (alpha, f) | earlier rounds (k, s), no rho up | "
        "earlier thresholds' delta -> 0 | Gaussian steps free (bound for PLD) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for algo in args.algorithms:
        for eps, delta, d0 in settings:
            t = time.time()
            r = table_row(algo, eps, delta, d0)
            p = r["parts"]
            parts = f"{p['thresholds']:.3g} / {p['mixture']:.3g} / {p['conversion']:.3g}"
            w, a, fr = r["fine"]
            fine = f"{w:.3f} ({a:.1f}, {fr:.1f}): {pct(w, r['today_e']):+.2f}%"
            if r["pareto"] is None:
                par = bnd = free = "-"
            else:
                w, k, s, ref = r["pareto"]
                par = f"({k:.3f}, {s:g}): {pct(w, ref):+.2f}%"
                bnd = f"{pct(r['bound'][0], r['bound'][1]):+.2f}%"
                free = f"{r['free']:.3f}: {pct(r['free'], r['today']):+.2f}%"
            print(
                f"| {algo} | {eps:g} | {delta:g} | {d0} | {parts} | {r['alpha']:.1f} ({r['f0']:.2f}) | "
                f"{r['today']:.3f} | {fine} | {par} | {bnd} | {free} |  ({time.time() - t:.0f} s)",
                flush=True,
            )
    print(f"\n# {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
