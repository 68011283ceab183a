"""l1/l2-descent update policies (DPSU paper Alg. 3, 5): worked examples, contractivity (Definition 1.3,
Lemmas 4.1 and 5.2), sensitivity of the full histogram (Theorem 1.1, Lemma 4.2), the novel-item
bounds of Theorems 4.1 / 5.1, the secret order, the calibration plan, and the appendix C counterexample
(the greedy policy, written here only, is NOT offered by the package)."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from dp_partition_beam.privacy import calibration
from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds
from dp_partition_beam.transforms.selection import policy_kernels as PK

TOL = 1e-9


def l1(h1, h2):
    keys = set(h1) | set(h2)
    return math.fsum(abs(h1.get(k, 0.0) - h2.get(k, 0.0)) for k in keys)


def l2(h1, h2):
    keys = set(h1) | set(h2)
    return math.sqrt(math.fsum((h1.get(k, 0.0) - h2.get(k, 0.0)) ** 2 for k in keys))


# ------------------------------------------------------------------------------------------------
# Worked examples
# ------------------------------------------------------------------------------------------------


def test_l1_descent_water_filling_example():
    # Gamma = 2; gaps a 0.1, b 0.5, c 2, d above the cutoff (untouched).
    h = {"a": 1.9, "b": 1.5, "c": 0.0, "d": 2.0}
    PK.l1_descent_update(h, ["a", "b", "c", "d", "e"], 2.0)
    # raise all 4 below-cutoff items (a, b, c, new e) by 0.1 (cost 0.4): a reaches 2;
    # then b, c, e by 0.6/3 = 0.2 each (cost of reaching b's gap would be 0.4*3 = 1.2 > 0.6).
    assert h["a"] == 2.0 and h["d"] == 2.0
    assert h["b"] == pytest.approx(1.8) and h["c"] == pytest.approx(0.3) and h["e"] == pytest.approx(0.3)
    assert math.fsum([0.1, 0.3, 0.3, 0.3]) == pytest.approx(1.0)


def test_l1_descent_fills_everything_when_budget_suffices():
    h = {"a": 1.7, "b": 1.6}
    PK.l1_descent_update(h, ["a", "b"], 2.0)
    assert h == {"a": 2.0, "b": 2.0}  # total change 0.7 < 1: both set exactly to Gamma


def test_l2_descent_examples():
    h = {}
    PK.l2_descent_update(h, ["a", "b"], 3.0)
    assert h["a"] == h["b"] == pytest.approx(1 / math.sqrt(2))  # unit step along (3, 3)
    h = {"a": 2.9, "b": 2.5}
    PK.l2_descent_update(h, ["a", "b"], 3.0)  # distance sqrt(0.26) < 1: move to (Gamma, Gamma)
    assert h == {"a": 3.0, "b": 3.0}
    h = {"a": 0.0, "b": 2.0}
    PK.l2_descent_update(h, ["a", "b"], 2.0, budget=0.5)
    assert h == {"a": 0.5, "b": 2.0}  # the step points at (Gamma, Gamma): only a moves


def test_novel_items_get_at_most_1_over_t_and_1_over_sqrt_t():
    for t in (1, 2, 7, 50):
        items = [f"n{j}" for j in range(t)]
        for gamma in (0.01, 0.5, 3.0, 40.0):
            h = {}
            PK.l1_descent_update(h, items, gamma)
            assert max(h.values()) <= 1.0 / t + TOL  # Theorem 4.1, H_1[u] <= 1/|T|
            h = {}
            PK.l2_descent_update(h, items, gamma)
            assert max(h.values()) <= 1.0 / math.sqrt(t) + TOL  # Theorem 5.1, H_1[u] <= 1/sqrt|T|


# ------------------------------------------------------------------------------------------------
# Contractivity (Definition 1.3) on random pairs in the invariant sets
# ------------------------------------------------------------------------------------------------

GAMMA = 3.0
ITEMS = [f"i{j}" for j in range(8)]
# Weights in [0, Gamma] with many exact ties and exact cutoffs (the edge cases of the water filling).
weight = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.5, GAMMA]), st.floats(0.0, GAMMA))
histogram = st.dictionaries(st.sampled_from(ITEMS), weight, max_size=len(ITEMS))
user_items = st.lists(st.sampled_from(ITEMS), min_size=1, max_size=6, unique=True)
budget = st.sampled_from([1.0, 0.5, 1.0 / 3.0])


@settings(max_examples=400, deadline=None)
@given(
    histogram,
    st.dictionaries(st.sampled_from(ITEMS), st.floats(0.0, 1.0), max_size=4),
    user_items,
    budget,
    st.floats(0.0, 1.0),
)
def test_l1_descent_is_l1_contractive(g2, raw_diff, items, b, scale):
    """Lemma 4.1: I = {(G1, G2): G1 >= G2, ||G1 - G2||_1 <= 1} is invariant, and (phi(H), H) in I."""
    total = math.fsum(raw_diff.values())
    diff = {k: v * scale / total for k, v in raw_diff.items()} if total > 0 else {}
    g1 = dict(g2)
    for k, v in diff.items():  # G1 = G2 + nonnegative diff of l1 norm <= 1, kept <= Gamma
        g1[k] = min(GAMMA, g2.get(k, 0.0) + v)
    assert l1(g1, g2) <= 1.0 + TOL
    p1, p2 = dict(g1), dict(g2)
    PK.l1_descent_update(p1, items, GAMMA, b)
    PK.l1_descent_update(p2, items, GAMMA, b)
    assert all(p1.get(k, 0.0) >= p2.get(k, 0.0) - TOL for k in set(p1) | set(p2))  # stays ordered
    assert l1(p1, p2) <= l1(g1, g2) + TOL  # contraction (so stays within 1)
    # property 2: phi(H) >= H and ||phi(H) - H||_1 <= budget
    assert all(p2[k] >= g2.get(k, 0.0) for k in p2)
    assert l1(p2, g2) <= b + TOL
    assert all(v <= GAMMA for v in p2.values())


@settings(max_examples=400, deadline=None)
@given(
    histogram,
    st.dictionaries(st.sampled_from(ITEMS), st.floats(-1.0, 1.0), max_size=5),
    user_items,
    budget,
    st.floats(0.0, 1.0),
)
def test_l2_descent_is_l2_contractive(g2, raw_diff, items, b, scale):
    """Lemma 5.2: I = {(G1, G2): ||G1 - G2||_2 <= 1} is invariant (non-expansive), and ||phi(H) - H||_2 <= 1."""
    norm = math.sqrt(math.fsum(v * v for v in raw_diff.values()))
    g1 = dict(g2)
    if norm > 0:
        for k, v in raw_diff.items():
            g1[k] = min(GAMMA, max(0.0, g2.get(k, 0.0) + v * scale / norm))
    assert l2(g1, g2) <= 1.0 + TOL
    p1, p2 = dict(g1), dict(g2)
    PK.l2_descent_update(p1, items, GAMMA, b)
    PK.l2_descent_update(p2, items, GAMMA, b)
    assert l2(p1, p2) <= l2(g1, g2) + TOL
    assert l2(p2, g2) <= b + TOL
    assert all(g2.get(k, 0.0) - TOL <= v <= GAMMA for k, v in p2.items())


# ------------------------------------------------------------------------------------------------
# Full histograms of neighbouring datasets (Theorem 1.1; Lemma 4.2)
# ------------------------------------------------------------------------------------------------


def random_ordered_sets(rng: random.Random, n_users: int, n_items: int, max_degree: int):
    weights = [1.0 / (j + 1) for j in range(n_items)]
    out = []
    for _ in range(n_users):
        d = rng.randint(1, max_degree)
        out.append(sorted(set(rng.choices(range(n_items), weights=weights, k=d))))
    return out


@pytest.mark.parametrize(
    "policy,dist,novel_bound",
    [
        ("l1_descent", l1, lambda t: 1.0 / t),
        ("l2_descent", l2, lambda t: 1.0 / math.sqrt(t)),
    ],
)
def test_neighbouring_histograms_differ_by_at_most_one(policy, dist, novel_bound):
    """300 random neighbouring datasets; the extra user at a random position of the order, with
    private (novel) items and shared ones; cutoffs small enough that many items saturate."""
    rng = random.Random(20261121)
    worst = 0.0
    for case in range(300):
        sets = random_ordered_sets(rng, rng.randint(1, 60), rng.randint(3, 40), rng.randint(1, 12))
        shared = rng.sample(range(40), rng.randint(0, 6))
        novel = [f"new{j}" for j in range(rng.randint(0, 5))]
        extra = sorted(set(shared), key=str) + novel
        if not extra:
            extra = [0]
        pos = rng.randint(0, len(sets))
        gamma = rng.choice([0.3, 1.0, 2.0, 5.0, 50.0])
        passes = rng.choice([1, 1, 2, 3])
        without = PK.build_histogram(sets, policy, gamma, passes)
        with_user = PK.build_histogram(sets[:pos] + [extra] + sets[pos:], policy, gamma, passes)
        d = dist(with_user, without)
        assert d <= 1.0 + TOL, (case, d)
        worst = max(worst, d)
        if novel:
            assert set(novel) <= set(with_user) and not set(novel) & set(without)
            # only novel items are outside supp(H_2); Theorems 4.1 / 5.1 need them <= h(|T|)
            assert max(with_user[u] for u in novel) <= novel_bound(len(novel)) + TOL
    assert worst > 0.9  # the bound is tight on some cases: the test is not vacuous


def test_passes_split_the_budget():
    h1 = PK.build_histogram([["a", "b"], ["a"]], "l1_descent", 10.0, passes=1)
    h2 = PK.build_histogram([["a", "b"], ["a"]], "l1_descent", 10.0, passes=2)
    assert h1 == {"a": 1.5, "b": 0.5}
    assert h2 == {"a": 1.5, "b": 0.5}  # below the cutoff the passes add up to one pass
    h3 = PK.build_histogram([["a", "b"], ["a"]], "l1_descent", 1.2, passes=2)
    # pass 1: a=.25,b=.25 then a=.75; pass 2: a=1,b=.5 then a=1.2 (cutoff, 0.3 of 0.5 unused)
    assert h3 == pytest.approx({"a": 1.2, "b": 0.5})
    with pytest.raises(ValueError, match="passes"):
        PK.build_histogram([["a"]], "l1_descent", 1.0, passes=0)
    with pytest.raises(ValueError, match="policy"):
        PK.build_histogram([["a"]], "greedy", 1.0)


# ------------------------------------------------------------------------------------------------
# Appendix C: the greedy policy's sensitivity grows with the number of users
# ------------------------------------------------------------------------------------------------


def greedy_update(hist, items, gamma, budget=1.0):
    """Algorithm 9 (GREEDY POLICY), test-only: fill the item closest to the cutoff first."""
    gaps = sorted((gamma - hist.get(u, 0.0), str(u), u) for u in items if hist.get(u, 0.0) < gamma)
    for gap, _, u in gaps:
        if gap <= budget:
            hist[u] = hist.get(u, 0.0) + gap
            budget -= gap
        else:
            hist[u] = hist.get(u, 0.0) + budget
            break


def appendix_c_datasets(n_after: int, gamma: float):
    """Users in order: 100 users {w} and one {w, u2} so that H[u1] = 0 < H[u2] = 0.5 < 1 + H[u1];
    then user i = {u1} (only in D1); then n_after users {u1, u2}."""
    prefix = [["w"]] * int(gamma - 0.5) + [["w", "u2"]]
    suffix = [["u1", "u2"]] * n_after
    return prefix + [["u1"]] + suffix, prefix + suffix


def run_policy(update, ordered, gamma):
    h = {}
    for items in ordered:
        update(h, items, gamma)
    return h


def test_greedy_policy_sensitivity_grows_with_users_while_descent_stays_at_one():
    gamma = 100.5
    greedy_l1 = []
    for n in (5, 20, 80):
        d1, d2 = appendix_c_datasets(n, gamma)
        assert run_policy(greedy_update, d1[:102], gamma)["u2"] == 0.5  # the appendix's precondition
        g1, g2 = run_policy(greedy_update, d1, gamma), run_policy(greedy_update, d2, gamma)
        greedy_l1.append(l1(g1, g2))
        assert l1(g1, g2) >= n and l2(g1, g2) >= n  # D1 fills u1, D2 fills u2: Omega(N)
        for policy, dist in (("l1_descent", l1), ("l2_descent", l2)):
            h1 = PK.build_histogram(d1, policy, gamma)
            h2 = PK.build_histogram(d2, policy, gamma)
            assert dist(h1, h2) <= 1.0 + TOL
    assert greedy_l1[0] < greedy_l1[1] < greedy_l1[2]
    assert not hasattr(PK, "greedy_update") and "greedy" not in PK.POLICIES  # never offered


# ------------------------------------------------------------------------------------------------
# The secret order (Algorithm 2's random hash)
# ------------------------------------------------------------------------------------------------


def test_order_depends_only_on_the_key_and_ids():
    users = [(f"u{j}", [f"i{j}"]) for j in range(200)]
    secret = PK.order_secret(7)
    want = PK.order_users(users, secret)
    shuffled = list(users)
    random.Random(3).shuffle(shuffled)
    assert PK.order_users(shuffled, secret) == want  # input order does not matter
    assert PK.order_users(users, PK.order_secret(7)) == want  # seed -> same secret
    assert PK.order_users(users, PK.order_secret(8)) != want  # another seed, another order
    assert want != [items for _, items in users] and sorted(want) == sorted(i for _, i in users)
    assert PK.order_secret(None) != PK.order_secret(None)  # fresh OS entropy per run
    # adding a user does not reorder the others (what the proof of Theorem 1.1 relies on)
    more = PK.order_users(users + [("extra", ["x"])], secret)
    assert [s for s in more if s != ["x"]] == want


def test_histogram_does_not_depend_on_input_order():
    rng = random.Random(5)
    sets = [(f"u{j}", s) for j, s in enumerate(random_ordered_sets(rng, 300, 50, 8))]
    want = PK.policy_histogram(sets, "l2_descent", 4.0, seed=11)
    rng.shuffle(sets)
    assert PK.policy_histogram(sets, "l2_descent", 4.0, seed=11) == want
    assert PK.policy_histogram(sets, "l2_descent", 4.0, seed=12) != want  # the order matters


# ------------------------------------------------------------------------------------------------
# Calibration plan: Theorems 4.1 and 5.1, cutoff Gamma
# ------------------------------------------------------------------------------------------------


def test_plan_uses_theorem_4_1_and_5_1_thresholds_and_gamma():
    eps, delta, d0, alpha = 3.0, math.exp(-10), 50, 4.0
    params = SelectionParams(eps, delta, max_contributions=d0, alpha=alpha)
    t = np.arange(1, d0 + 1, dtype=float)
    (lap,) = plan_rounds("policy_laplace", params.replace(threshold="laplace"))  # the default is the l1 curve
    rho_lap = np.max(1 / t + (1 / eps) * np.log(1 / (2 * (1 - (1 - delta) ** (1 / t)))))  # Theorem 4.1
    assert lap.noise == "laplace" and lap.noise_scale == 1 / eps
    assert lap.threshold == pytest.approx(rho_lap, rel=1e-9)
    assert lap.cutoff == lap.threshold + alpha / eps  # Alg. 4: rho_Lap + alpha*lambda
    (gau,) = plan_rounds("policy_gaussian", params.replace(threshold="gaussian"))  # the default is the l2 rule
    sigma = calibration.analytic_gaussian_sigma(eps, delta / 2)
    assert gau.noise == "gaussian" and gau.noise_scale == sigma
    assert calibration.gaussian_delta(sigma, eps) <= delta / 2  # Theorem 5.1, first condition
    rho_g = np.max(1 / np.sqrt(t) + sigma * special.ndtri((1 - delta / 2) ** (1 / t)))  # Theorem 5.1
    assert gau.threshold == pytest.approx(rho_g, rel=1e-9)
    assert gau.cutoff == gau.threshold + alpha * sigma  # Alg. 6 with rho_Gauss (erratum), not rho_Lap
    assert gau.cutoff == pytest.approx(rho_g + alpha * sigma, rel=1e-9)
    assert gau.as_report()["cutoff"] == gau.cutoff


@pytest.mark.parametrize(
    "field,value,msg",
    [
        ("alpha", -1.0, "alpha must be in"),
        ("alpha", float("nan"), "alpha must be in"),
        ("passes", 0, "passes must be an integer"),
        ("passes", 1.5, "passes must be an integer"),
        ("max_sequential_pairs", 0, "max_sequential_pairs must be an integer"),
        ("max_sequential_pairs", "many", "max_sequential_pairs must be an integer"),
    ],
)
def test_parameter_validation(field, value, msg):
    with pytest.raises(ValueError, match=msg):
        SelectionParams(1.0, 1e-5, **{field: value})


def test_defaults_from_the_paper():
    p = SelectionParams(1.0, 1e-5)
    assert p.alpha == 5.0 and p.passes == 1 and p.max_sequential_pairs >= 1_000_000
