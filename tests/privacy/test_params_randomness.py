"""Parameter validation and the randomness contract."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_partition_beam.privacy.selection import SelectionParams, plan_rounds, resolve_params
from dp_partition_beam.transforms.core import randomness


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": -1}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"epsilon": "x"}, "epsilon"),
        ({"delta": 0}, "delta"),
        ({"delta": 0.7}, "delta"),
        ({"max_contributions": 0}, "max_contributions"),
        ({"max_contributions": 2.5}, "max_contributions"),
        ({"d_max": 3}, "d_max"),
        ({"beta": -0.1}, "beta"),
        ({"b_min": 0.49}, "b_min"),
        ({"b_min": 1.01}, "b_min"),
        ({"b_max": 0.99}, "b_max"),
        ({"c_lb": -1}, "c_lb"),
        ({"c_ub": -1}, "c_ub"),
        ({"budget_split": (0.5, 0.6)}, "budget_split"),
        ({"budget_split": (1.2, -0.2)}, "budget_split"),
        ({"budget_split": ()}, "budget_split"),
        ({"accounting": "rdp"}, "accounting"),
    ],
)
def test_invalid_parameters_name_parameter_value_and_range(kwargs, name):
    args = {"epsilon": 1.0, "delta": 1e-5, **kwargs}
    with pytest.raises(ValueError) as e:
        SelectionParams(**args)
    msg = str(e.value)
    assert msg.startswith(name) and repr(kwargs[name])[:4] in msg
    assert "must" in msg


def test_params_are_frozen_and_defaults_are_the_papers():
    p = resolve_params("mad2r", SelectionParams(epsilon=1, delta=1e-5))
    assert (p.max_contributions, p.d_max, p.beta, p.b_min, p.b_max, p.c_lb, p.c_ub) == (
        100,
        50,
        2.0,
        0.5,
        2.0,
        1.0,
        3.0,
    )
    assert p.budget_split == (0.1, 0.9) and p.accounting == "gdp"
    with pytest.raises(Exception):
        p.epsilon = 2
    # budget_split and c_ub left unset take the algorithm's defaults; explicit values win
    unset = SelectionParams(epsilon=1, delta=1e-5)
    assert (unset.budget_split, unset.c_ub) == (None, None)
    q = resolve_params("mad_sips", unset)
    assert (q.budget_split, q.c_ub) == ((0.03, 0.07, 0.9), 1.5)  # docs/mad_sips.md, Defaults
    assert resolve_params("mad_sips", unset.replace(c_ub=3.0)).c_ub == 3.0
    assert resolve_params("dp_sips", unset).budget_split == (0.1, 0.9)


def test_plans_mad_tau_and_round_thresholds():
    p = SelectionParams(epsilon=1, delta=1e-5)
    (basic,) = plan_rounds("basic", p)
    (mad,) = plan_rounds("mad", p.replace(threshold="gaussian"))
    assert mad.noise_scale == basic.noise_scale and mad.threshold == basic.threshold  # Theorem 1.1
    assert mad.tau == pytest.approx(basic.threshold + 2.0 * basic.noise_scale)
    # the default, the l2 rule (docs/thresholding.md): tau is the weight it keeps with probability Phi(beta = 2)
    (rule,) = plan_rounds("mad", p)
    assert rule.noise == "keep_rule" and rule.keep_table.realisation_bits == 128
    kept = float(rule.keep_table.keep_probability(np.array([rule.tau]))[0])
    assert kept == pytest.approx(0.5 * math.erfc(-2.0 / math.sqrt(2.0)), abs=1e-9) and rule.tau < mad.tau
    assert plan_rounds("mad2r", p)[-1].noise == "keep_table"  # the default last round (issue 30)
    r1, r2 = plan_rounds("mad2r", p.replace(threshold="gaussian"))
    assert r2.threshold > r2.noise_scale  # sanity
    # gdp: sigma_r = sigma / sqrt(f_r)
    assert r1.noise_scale == pytest.approx(basic.noise_scale / math.sqrt(0.1))
    assert r2.noise_scale == pytest.approx(basic.noise_scale / math.sqrt(0.9))
    b1, b2 = plan_rounds("mad2r", p.replace(accounting="basic"))
    assert b1.noise_scale > r1.noise_scale and b2.noise_scale > r2.noise_scale
    assert (r1.delta, r2.delta) == pytest.approx((1e-6, 9e-6))


@given(st.text(max_size=20), st.integers(0, 5), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_keyed_draws_are_functions_of_seed_purpose_round_key(key, round_, seed):
    a = randomness.keyed_normal(seed, "noise", round_, [key])[0]
    assert a == randomness.keyed_normal(seed, "noise", round_, [key])[0]
    assert a != randomness.keyed_normal(seed, "noise", round_ + 1, [key])[0]
    assert a != randomness.keyed_normal(seed + 1, "noise", round_, [key])[0]
    assert a != randomness.keyed_normal(seed, "other", round_, [key])[0]


def test_encode_key_distinguishes_types_and_tuples():
    keys = ["1", 1, b"1", ("1",), ("1", "2"), ("12",), ("1", ("2",)), None, 1.0, True]
    assert len({randomness.encode_key(k) for k in keys}) == len(keys)


def test_keyed_normal_and_laplace_distributions():
    # 20,000 keys; moments within 5 standard errors (false-failure rate < 1e-5).
    keys = [f"k{j}" for j in range(20000)]
    z = randomness.keyed_normal(1, "noise", 1, keys)
    assert abs(z.mean()) < 5 / math.sqrt(len(z)) and abs(z.var() - 1) < 5 * math.sqrt(2 / len(z))
    lap = randomness.keyed_laplace(1, "noise", 1, keys)
    assert abs(lap.mean()) < 5 * math.sqrt(2 / len(z)) and abs(np.abs(lap).mean() - 1) < 5 / math.sqrt(len(z))


def test_subsample_seeded_is_order_independent_and_uniform():
    items = [f"i{j}" for j in range(10)]
    a = randomness.subsample(items, 4, "u", 0, seed=3, rng=None)
    b = randomness.subsample(list(reversed(items)), 4, "u", 0, seed=3, rng=None)
    assert a == b and len(a) == 4 and len(set(a)) == 4
    # inclusion frequency over seeds: 4000 draws, p = 0.4, 5-sigma band (false-failure < 1e-5)
    counts = dict.fromkeys(items, 0)
    for s in range(4000):
        for i in randomness.subsample(items, 4, "u", 0, seed=s, rng=None):
            counts[i] += 1
    sd = math.sqrt(4000 * 0.4 * 0.6)
    assert all(abs(c - 1600) < 5 * sd for c in counts.values())


def test_subsample_rejects_bad_k_and_missing_rng():
    with pytest.raises(ValueError, match="max_contributions"):
        randomness.subsample(["a"], 0, "u", 0, seed=1, rng=None)
    with pytest.raises(ValueError, match="rng"):
        randomness.subsample(["a"], 1, "u", 0, seed=None, rng=None)


def test_keyed_noise_draw_is_bitwise_standard_noise():
    """AddNoiseFn's per-item KeyedNoise == the array path the reference uses, and keyed_uniform
    == the plain formula (draw64 of the draw key and the key's fingerprint)."""
    import random as _random

    from dp_partition_beam.transforms.core import randomness as R

    rng = _random.Random(0)
    keys = [f"w{rng.randrange(10**6)}" for _ in range(5000)] + [("a", 1), 3, 2.5, "é", b"x", None]
    for kind in ("gaussian", "laplace"):
        for seed, rnd in ((1, 1), (2**64 + 7, 3)):
            noise = R.KeyedNoise(kind, seed, "noise", rnd)
            want = R.standard_noise(kind, keys, "noise", rnd, seed, None).tolist()
            assert [noise.draw(k) for k in keys] == want
    u = R.keyed_uniform(5, "noise", 2, keys)
    k = R.draw_key(5, "noise", 2)
    plain = [((R.draw64_of(k, R.key_fingerprint(key)) >> 11) + 0.5) / 2.0**53 for key in keys]
    assert u.tolist() == plain


@settings(max_examples=400, deadline=None)
@given(
    items=st.lists(
        st.one_of(
            st.text(max_size=4),
            st.integers(-3, 3),
            st.binary(max_size=2),
            st.tuples(st.integers(0, 2), st.text(max_size=2)),
        ),
        max_size=40,
    ),
    k=st.integers(1, 30),
    seed=st.integers(0, 50),
)
def test_subsample_canonical_order_and_distinct(items, k, seed):
    """subsample (str fast path included): distinct items in encode_key order; all of them when at most
    k are distinct, else k of them, and the same result for any input order."""
    from dp_partition_beam.transforms.core.randomness import encode_key, subsample

    got = subsample(items, k, "u", 0, seed, None)
    keys = [encode_key(x) for x in got]
    assert keys == sorted(set(keys))  # distinct, canonical order
    distinct = {encode_key(x) for x in items}
    assert set(keys) <= distinct and len(got) == min(k, len(distinct))
    assert subsample(list(reversed(items)), k, "u", 0, seed, None) == got
