"""Accounting of the count release (privacy/counts.py, docs/counts.md): the kernel lemma, the exact
composition with the selection, cross-checks with dp_accounting, the error bound, the sensitivity.

Deterministic tests (no sampling) except the hypothesis property test (which searches for a
counterexample; it has no false failures).
"""

import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from dp_partition_beam.privacy import counts as C
from dp_partition_beam.privacy import l2_rule
from dp_partition_beam.privacy.selection import ALGORITHMS, SelectionParams, plan_cap, plan_counts, plan_rounds
from dp_partition_beam.transforms.selection import counts_kernels
from dp_partition_beam.transforms.selection.reference import bound_contributions

# --------------------------------------------------------------------------------------------------
# helpers: exact hockey-stick divergences
# --------------------------------------------------------------------------------------------------


def gauss_delta(mu: float, e: np.ndarray) -> np.ndarray:
    """H_e(N(0,1) || N(mu,1)) = Phi(-e/mu + mu/2) - e^e Phi(-e/mu - mu/2), any real e (vectorised)."""
    e = np.asarray(e, float)
    a = special.log_ndtr(-e / mu + mu / 2)
    b = e + special.log_ndtr(-e / mu - mu / 2)
    return np.exp(a) * -np.expm1(np.minimum(b - a, 0.0))


def discrete_sum_pmf(sigma2: Fraction, l0: int):
    """(support, pmf) of the sum of l0 iid N_Z(0, sigma^2) (direct convolution)."""
    s = math.sqrt(float(sigma2))
    r = int(math.ceil(14 * s))
    xs = np.arange(-r, r + 1)
    p = np.exp(-(xs.astype(float) ** 2) / (2 * float(sigma2)))
    p /= p.sum()
    out = p
    for _ in range(l0 - 1):
        out = np.convolve(out, p)
    support = np.arange(-r * l0, r * l0 + 1)
    return support, out


def exact_delta_discrete_with_gaussian(sigma2: Fraction, l0: int, mu_sel: float, eps: float) -> float:
    """H_eps of (Gaussian mu_sel) x (l0 discrete Gaussians, each shifted by 1): the worst neighbouring pair.

    Privacy loss of one coordinate at x (P = N_Z(0), Q = N_Z(1)): ((x-1)^2 - x^2) / (2 sigma^2);
    summed over l0 coordinates it is (l0 - 2 S) / (2 sigma^2) with S the sum of the noises, so
    H_eps = sum_s P[S = s] H_{eps - l(s)}(Gaussian mu_sel) (exact, no lemma involved).
    """
    support, pmf = discrete_sum_pmf(sigma2, l0)
    loss = (l0 - 2.0 * support) / (2.0 * float(sigma2))
    if mu_sel == 0.0:
        terms = -np.expm1(np.minimum(eps - loss, 0.0))
    else:
        terms = gauss_delta(mu_sel, eps - loss)
    return float(np.sum(pmf * terms))


# --------------------------------------------------------------------------------------------------
# the kernel lemma
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau2,sigma1_2,a", [(Fraction(1, 4), 1.0, 0), (Fraction(1, 3), 2.5, 1)])
def test_kernel_lemma_ratio_is_within_e_gamma(tau2, sigma1_2, a):
    """Pr[K(N(a, s1^2)) = x] / N_Z(a, s1^2 + tau^2)(x) is within e^{+-gamma} (numerical integration),
    at a tau small enough that the deviation is visible."""
    t2, s1 = float(tau2), math.sqrt(sigma1_2)
    zs = np.arange(-60, 61)

    def theta(y):
        return np.exp(-((zs - y) ** 2) / (2 * t2)).sum()

    sigma2 = sigma1_2 + t2
    xs = np.arange(a - 8, a + 9)
    nz = np.exp(-((np.arange(-80, 81) - a) ** 2) / (2 * sigma2))
    q = np.exp(-((xs - a) ** 2) / (2 * sigma2)) / nz.sum()
    ratios = []
    for x, qx in zip(xs, q):

        def integrand(y, x=x):
            return (
                math.exp(-((y - a) ** 2) / (2 * sigma1_2))
                / (s1 * math.sqrt(2 * math.pi))
                * math.exp(-((x - y) ** 2) / (2 * t2))
                / theta(y)
            )

        px, _ = integrate.quad(integrand, a - 12 * s1, a + 12 * s1, epsabs=1e-15, epsrel=1e-12, limit=400)
        ratios.append(px / qx)
    log_r = np.abs(np.log(ratios))
    gamma = C.kernel_gamma(tau2)
    assert log_r.max() <= gamma * (1 + 1e-6), (log_r.max(), gamma)
    # not exactly equal (so the lemma's e^{+-gamma} is needed), far above the integration error of 1e-12
    assert log_r.max() > 1e-6


def test_kernel_gamma_is_negligible_at_the_default_tau():
    assert C.kernel_gamma(C.KERNEL_TAU2) < 2e-53
    assert C.check_kernel_slack(10_000_000, 1e-30) < 1e-45


def test_kernel_tau2_is_the_smallest_sixteenth_that_fits():
    for l0, dp in [(1, 1e-6), (100, 5e-7), (10_000, 1e-12), (10_000_000, 1e-30)]:
        t = C.kernel_tau2(l0, dp)
        assert t.denominator in (1, 2, 4, 8, 16) and t <= C.KERNEL_TAU2
        C.check_kernel_slack(l0, dp, t)
        if t > Fraction(1, 16):
            with pytest.raises(ArithmeticError):
                C.check_kernel_slack(l0, dp, t - Fraction(1, 16))


# --------------------------------------------------------------------------------------------------
# the composition with the selection: exact (no lemma) and with dp_accounting
# --------------------------------------------------------------------------------------------------

GDP_CASES = [(1.0, 1e-6, 0.25, 1), (1.0, 1e-6, 0.25, 4), (0.5, 1e-8, 0.5, 10), (4.0, 1e-5, 0.1, 3), (2.0, 1e-7, 0.9, 8)]


@pytest.mark.parametrize("eps,delta,f,l0", GDP_CASES)
def test_gdp_split_is_private_for_the_discrete_gaussian_exactly(eps, delta, f, l0):
    """The worst neighbouring pair of the selection's Gaussian share composed with l0 discrete Gaussian
    coordinates, computed exactly: its delta is within the GDP part's budget, and the split is tight
    (within a few percent of it when sigma_c is not dominated by tau^2)."""
    share = C.split_gdp(eps, delta, f, l0)
    delta_p = delta - share.delta_threshold / 2
    got = exact_delta_discrete_with_gaussian(share.counts.sigma2, l0, 1.0 / share.sigma, eps)
    assert got <= delta_p, (got, delta_p)
    assert got >= 0.5 * delta_p, (got, delta_p)


def _pld_discrete(sigma2, l0, interval, pessimistic):
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_discrete_gaussian_mechanism(
        math.sqrt(float(sigma2)),
        sensitivity=1,
        value_discretization_interval=interval,
        pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic,
    )
    return one.self_compose(l0) if l0 > 1 else one


@pytest.mark.parametrize("eps,delta,f,l0", GDP_CASES[:3] + [(1.0, 1e-6, 0.25, 100)])
def test_gdp_split_agrees_with_dp_accounting(eps, delta, f, l0):
    """dp_accounting's PLD accountant on the discrete Gaussian itself (DiscreteGaussianDpEvent's privacy
    loss, composed l0 times) and the selection's Gaussian: its optimistic estimate (a lower bound on the
    true delta) must be within our claim, its pessimistic one (an upper bound) within 1% of it (the
    discretisation error; the exact test above has none)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    share = C.split_gdp(eps, delta, f, l0)
    delta_p = delta - share.delta_threshold / 2
    interval = 2e-6 if l0 > 20 else 1e-5
    est = {}
    for pess in (False, True):
        g = pld.from_gaussian_mechanism(
            share.sigma, value_discretization_interval=interval, pessimistic_estimate=pess, use_connect_dots=pess
        )
        est[pess] = g.compose(_pld_discrete(share.counts.sigma2, l0, interval, pess)).get_delta_for_epsilon(eps)
    assert est[False] <= delta_p, (est, delta_p)
    assert est[True] <= 1.01 * delta_p, (est, delta_p)


@pytest.mark.parametrize("eps,delta,f,l0", [(1.0, 1e-6, 0.25, 1), (1.0, 1e-6, 0.5, 5), (4.0, 1e-7, 0.2, 10)])
def test_pure_split_agrees_with_dp_accounting(eps, delta, f, l0):
    """Laplace selections: the worst eps_0-DP mechanism (dp_accounting's from_privacy_parameters, a
    pessimistic PLD) composed with the l0 discrete Gaussians stays within the counts' delta share f*delta
    (up to 1% of discretisation error); the exact computation has none."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    share = C.split_pure(eps, delta, f, l0)
    delta_p = delta - share.delta_threshold
    interval = 1e-5
    rr = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(share.epsilon, 0.0), interval)
    pess = rr.compose(_pld_discrete(share.counts.sigma2, l0, interval, True)).get_delta_for_epsilon(eps)
    assert pess <= 1.01 * delta_p, (pess, delta_p)
    # and exactly (the RR pair has losses +-eps_0 with P-probabilities p and 1 - p)
    p = math.exp(share.epsilon) / (1 + math.exp(share.epsilon))
    exact = p * exact_delta_discrete_with_gaussian(share.counts.sigma2, l0, 0.0, eps - share.epsilon) + (
        1 - p
    ) * exact_delta_discrete_with_gaussian(share.counts.sigma2, l0, 0.0, eps + share.epsilon)
    assert 0.5 * delta_p <= exact <= delta_p, (exact, delta_p)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("accounting", ["gdp", "basic"])
def test_every_plan_with_counts_spends_exactly_the_budget(algorithm, accounting):
    """Recompute the total (eps, delta) from the public plans: selection rounds + counts + thresholds."""
    eps, delta, d0 = 1.5, 1e-6, 20
    params = SelectionParams(
        epsilon=eps, delta=delta, max_contributions=d0, release_counts=True, count_budget=0.3, accounting=accounting
    )
    variants = [params]
    if algorithm == "mad_sips" and accounting == "gdp":  # the adaptive cap (off by default with the keep table)
        variants += [params.replace(cap_quantile=0.98), params.replace(cap_quantile=0.98, threshold="gaussian")]
    for variant in variants:
        _check_counts_plan(algorithm, variant)


def _check_counts_plan(algorithm, params):
    eps, delta, d0, accounting = params.epsilon, params.delta, params.max_contributions, params.accounting
    rounds, counts = plan_rounds(algorithm, params), plan_counts(algorithm, params)
    spec = ALGORITHMS[algorithm]
    assert counts.l0 == d0 and counts.error_bound_95 > 0
    if counts.composition == "gdp":
        sens = math.sqrt(d0) if spec.calibration == "count_gaussian" else 1.0
        cap = plan_cap(algorithm, params)  # mad_sips's adaptive cap: its histogram is one more Gaussian
        candidates = [rounds] if cap is None else list(cap.rounds)
        assert (cap is not None) == (params.cap_quantile is not None and params.cap_quantile < 1)
        for rs in candidates:  # every cap the run may choose
            if rs[-1].noise in ("keep_table", "keep_rule"):  # a table or Policy Gaussian's l2 rule: the counts join
                from .test_mad_sips_table import _recomputed  # its RDP composition

                got_eps, got_delta = _recomputed(rs, None if cap is None else cap.noise_scale, counts)
                if rs[-1].noise == "keep_rule":  # and the rule's realisation reserve: a policy's 2^-64 per item on
                    # its worker; MAD's 2^-128 per item of any run (its rerouting has no public item bound)
                    if spec.weighting == "mad":
                        got_delta += l2_rule.realisation_reserve(eps, 2**64, 128)
                    else:
                        got_delta += l2_rule.realisation_reserve(eps, params.max_sequential_pairs)
                assert got_eps <= eps * (1 + 1e-9) and delta * 0.99 <= got_delta <= delta * (1 + 1e-9)
                continue
            sigmas = [r.noise_scale / sens for r in rs] + ([] if cap is None else [cap.noise_scale])
            gdp_delta = C.composed_delta_gdp(sigmas, counts.sigma_continuous, d0, eps)
            total = gdp_delta + sum(r.delta / 2 for r in rs)
            assert delta * (1 - 1e-6) <= total <= delta, total
    elif counts.composition == "pure":
        (r,) = rounds
        total = C.composed_delta_pure(r.epsilon, counts.sigma_continuous, d0, eps) + r.delta
        assert delta * (1 - 1e-6) <= total <= delta, total
    else:
        assert spec.shape in ("dp_sips", "mad2r", "mad_sips") and accounting == "basic"
        assert sum(r.epsilon for r in rounds) + counts.epsilon <= eps * (1 + 1e-12)
        assert sum(r.delta for r in rounds) + counts.delta <= delta * (1 + 1e-12)
        from dp_partition_beam.privacy.calibration import gaussian_delta

        assert gaussian_delta(counts.sigma_continuous, counts.epsilon, math.sqrt(d0)) <= counts.delta
    # the discrete noise adds exactly tau^2 (rounded up to 2^-32) to the continuous variance
    extra = counts.sigma2 - Fraction(counts.sigma_continuous) ** 2
    assert counts.tau2 <= extra < counts.tau2 + Fraction(1, 2**32)


def test_count_budget_trades_selection_noise_for_count_noise():
    sig, cnt = [], []
    for f in (0.1, 0.25, 0.5, 0.75):
        params = SelectionParams(epsilon=1.0, delta=1e-6, release_counts=True, count_budget=f)
        sig.append(plan_rounds("basic", params)[0].noise_scale)
        cnt.append(plan_counts("basic", params).noise_scale)
    assert sig == sorted(sig) and cnt == sorted(cnt, reverse=True)
    no_counts = plan_rounds("basic", SelectionParams(epsilon=1.0, delta=1e-6))[0].noise_scale
    assert no_counts < sig[0]


def test_without_release_counts_nothing_changes():
    params = SelectionParams(epsilon=1.0, delta=1e-6, count_budget=0.7)
    assert plan_counts("mad", params) is None
    assert plan_rounds("mad", params) == plan_rounds("mad", SelectionParams(epsilon=1.0, delta=1e-6))


# --------------------------------------------------------------------------------------------------
# the report's spread of the noise
# --------------------------------------------------------------------------------------------------


def _mp_pmf_cdf(sigma2: Fraction):
    mpmath.mp.dps = 40
    s2 = mpmath.mpf(sigma2.numerator) / sigma2.denominator
    r = int(40 * math.sqrt(float(sigma2))) + 5
    w = [mpmath.e ** (-mpmath.mpf(x * x) / (2 * s2)) for x in range(0, r)]
    z = w[0] + 2 * mpmath.fsum(w[1:])
    return w, z


@pytest.mark.parametrize("sigma2", [Fraction(9, 4), Fraction(10), Fraction(1234567, 1000), Fraction(86) ** 2])
def test_error_bound_and_std_are_exact(sigma2):
    w, z = _mp_pmf_cdf(sigma2)
    c = C.discrete_gaussian_error_bound(sigma2, 0.95)
    within = lambda c: (w[0] + 2 * mpmath.fsum(w[1 : c + 1])) / z  # noqa: E731
    assert within(c) >= 0.95 > within(c - 1)
    var = 2 * mpmath.fsum(x * x * wx for x, wx in enumerate(w)) / z
    assert C.discrete_gaussian_std(sigma2) == pytest.approx(float(mpmath.sqrt(var)), rel=1e-9)
    assert C.discrete_gaussian_std(sigma2) <= math.sqrt(float(sigma2))
    for k in (0, c // 2, c, 2 * c):
        assert C.discrete_gaussian_tail(sigma2, k) >= float(1 - within(k)) * (1 - 1e-9)


def test_large_sigma_uses_conservative_closed_forms():
    sigma2 = Fraction(3 * 10**5) ** 2
    c = C.discrete_gaussian_error_bound(sigma2)
    assert c == math.ceil(3e5 * 1.959963984540054 * (1 + 1e-12))
    assert C.discrete_gaussian_tail(sigma2, c) <= 0.05


# --------------------------------------------------------------------------------------------------
# sensitivity (property test) and parameters
# --------------------------------------------------------------------------------------------------

user_sets_strategy = st.dictionaries(
    st.integers(0, 40), st.lists(st.integers(0, 25), min_size=1, max_size=15), min_size=0, max_size=30
)


@settings(max_examples=200, deadline=None)
@given(
    user_sets=user_sets_strategy,
    added=st.lists(st.integers(0, 30), min_size=1, max_size=15),
    d0=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_count_vector_changes_by_at_most_one_in_at_most_delta0_coordinates(user_sets, added, d0, seed):
    """Neighbouring datasets D, D + {v} bounded with the same keyed subsample: the count vectors (over
    every item, as if all were released) differ by exactly +1 on v's capped items and 0 elsewhere, so
    by at most 1 in at most Delta_0 coordinates (l2 <= sqrt(Delta_0))."""
    base = {f"u{u}": [f"i{i}" for i in items] for u, items in user_sets.items()}
    neighbour = dict(base)
    neighbour["v"] = [f"i{i}" for i in added]
    items = {i for s in neighbour.values() for i in s}
    c0 = counts_kernels.holder_counts(bound_contributions(base, d0, seed), items)
    capped1 = bound_contributions(neighbour, d0, seed)
    c1 = counts_kernels.holder_counts(capped1, items)
    diff = {i: c1[i] - c0[i] for i in items}
    changed = {i for i, d in diff.items() if d != 0}
    assert all(diff[i] == 1 for i in changed)
    assert changed == set(capped1["v"]) and len(changed) <= d0
    assert math.sqrt(sum(d * d for d in diff.values())) <= math.sqrt(d0)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("count_budget", 0.0, "count_budget"),
        ("count_budget", 1.0, "count_budget"),
        ("count_budget", float("nan"), "count_budget"),
        ("count_budget", "half", "count_budget"),
        ("min_users", -1, "min_users"),
        ("min_users", 2.5, "min_users"),
        ("min_users", "3", "min_users"),
        ("release_counts", "yes", "release_counts"),
        ("release_counts", 1, "release_counts"),
    ],
)
def test_bad_count_parameters_name_the_parameter(field, value, match):
    kw = {"release_counts": True, field: value}
    with pytest.raises(ValueError, match=match):
        SelectionParams(epsilon=1.0, delta=1e-6, **kw)


def test_min_users_needs_release_counts():
    with pytest.raises(ValueError, match="min_users=5 .* needs release_counts=True"):
        SelectionParams(epsilon=1.0, delta=1e-6, min_users=5)
    assert SelectionParams(epsilon=1.0, delta=1e-6, release_counts=True, min_users=5).min_users == 5


def test_count_fields_have_help_for_the_cli():
    fields = SelectionParams.__dataclass_fields__
    for name in ("release_counts", "count_budget", "min_users"):
        assert fields[name].metadata["help"]


def test_random_neighbours_remove_direction_too():
    # Removal is the same relation read backwards: spot-check one random case for the sign.
    rng = random.Random(5)
    base = {f"u{u}": [f"i{rng.randrange(10)}" for _ in range(5)] for u in range(20)}
    smaller = {u: s for u, s in base.items() if u != "u3"}
    items = {i for s in base.values() for i in s}
    c_big = counts_kernels.holder_counts(bound_contributions(base, 3, 9), items)
    c_small = counts_kernels.holder_counts(bound_contributions(smaller, 3, 9), items)
    assert all(0 <= c_big[i] - c_small[i] <= 1 for i in items)
    assert sum(c_big[i] - c_small[i] for i in items) == len(bound_contributions({"u3": base["u3"]}, 3, 9)["u3"])
