"""Two invariants that peers got wrong (issue 30 cites OpenDP 2949 and 2835; the comparison bug is OpenDP 2922).

1. **The comparison a release applies is the one its calibration assumed, at every threshold step.**
   Every threshold here is calibrated on the upper tail that includes rho (``P[w + noise >= rho]``), so
   every release step must keep an item exactly at rho and drop one just below it. OpenDP released at
   ``>=`` against a delta of the tail ``> rho`` (issue 2922): with discrete noise that misses the mass at
   rho. Checked three ways: the one release rule (``privacy.calibration.passes_threshold``) on ties, the
   calibrations' tail probabilities against that rule, and a scan of the package's source for any other
   comparison with a threshold (a new release step that compares on its own fails here).
2. **Normalisation happens before per-user bounding**: a user whose raw items normalise to one item
   contributes it once. What the package normalises: a ``(user, item)`` element, a string column and a
   binary column of an Arrow batch give the same key bytes (selection); DPNE's tokenizer NFKC-normalises
   and lowercases; the TSV reader drops a CR before LF and a UTF-8 BOM. Each is run twice with the same
   seed, once with every user's item in several raw forms and once in one form: the releases (with
   their counts of distinct holders, which would count a duplicate) must be identical.
"""

from __future__ import annotations

import ast
import math
import os
import pathlib
import re

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from dp_partition_beam.privacy import calibration, dpne
from dp_partition_beam.privacy.calibration import passes_threshold
from dp_partition_beam.privacy.selection import SelectionParams
from dp_partition_beam.transforms.dpne.dpne import DPNE
from dp_partition_beam.transforms.selection.select import SelectPartitions

from tests.support.beam_helpers import collect_branches
from tests.support.branch_cases import scoped

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED = 5

# --- 1. the comparison -----------------------------------------------------------------------------------


def test_the_release_rule_keeps_ties_and_drops_anything_below():
    for rho in (0.0, 1.0, 22.087, -3.5, 1e-300, 7.0 / 3.0):
        assert passes_threshold(rho, rho)
        assert not passes_threshold(math.nextafter(rho, -math.inf), rho)
        assert passes_threshold(math.nextafter(rho, math.inf), rho)
    noisy = np.array([2.0, math.nextafter(2.0, 0.0), 3.0, -1.0])
    assert passes_threshold(noisy, 2.0).tolist() == [True, False, True, False]


def test_the_calibrations_bound_the_tail_the_rule_releases():
    """gaussian_threshold bounds P[one of t novel items of weight h(t) is released] by delta/2 and
    laplace_threshold by delta (pure noise), with the release event {w + Z >= rho}; DPNE's rho_k gives
    P[Z_k >= rho_k] = q_k. Computed here on the inclusive tail (the noise is continuous, so the mass at
    rho is 0 and the bound is tight)."""
    sigma, delta, d0 = 3.7, 1e-5, 50
    t = np.arange(1, d0 + 1, dtype=float)
    rho = calibration.gaussian_threshold(sigma, delta, d0)
    tail = stats.norm.sf((rho - 1 / np.sqrt(t)) / sigma)  # P[h + sigma Z >= rho]
    worst = (-np.expm1(t * np.log1p(-tail))).max()
    assert worst == pytest.approx(delta / 2, rel=1e-6)
    b = 2.5
    rho_l = calibration.laplace_threshold(1.0 / b, delta, d0)
    tail_l = stats.laplace.sf(rho_l - 1 / t, scale=b)  # P[h + Lap(b) >= rho]
    assert (-np.expm1(t * np.log1p(-tail_l))).max() == pytest.approx(delta, rel=1e-6)  # Laplace: the full delta
    for s_prev, v in ((10, 1000), (500, 2000), (3000, 2000)):  # DPNE's level k: P[N(0, sigma^2) >= rho] = q
        sigma_k = 2.5
        q = dpne.spurious_probability(0.3, s_prev, v)
        assert stats.norm.sf(dpne.dpne_rho_k(sigma_k, 0.3, s_prev, v) / sigma_k) == pytest.approx(q, rel=1e-9)


#: Comparisons with a threshold that are not release steps: MAD2R's / MAD-SIPS's hopeless test and bias
#: (Alg. 4 lines 10-14) read already released noisy weights (post-processing), any comparison is fine.
NOT_RELEASE_STEPS = {
    ("transforms/selection/mad_kernels.py", "noisy_w1 + c_ub * sigma1 < (rho2 if rho_drop is None else rho_drop)"),
    ("transforms/selection/mad_kernels.py", "w_lb <= rho2"),
    ("transforms/selection/mad_kernels.py", "w1 + c_ub * sigma1 < (rho2 if rho_drop is None else rho_drop)"),
    ("transforms/selection/mad_sips.py", "noisy + c_ub * p.noise_scale < rho_drop(plans, self._round)"),
}
#: The release steps (Beam and the in-memory references): each calls passes_threshold.
RELEASE_STEPS = {
    "transforms/selection/basic.py": 1,  # NoisyThresholdFn: single rounds, DP-SIPS
    "transforms/selection/mad.py": 1,  # MAD2R's Round1StatusFn (round 2 and MAD: basic's NoisyThresholdFn)
    "transforms/selection/mad_sips.py": 1,  # MAD-SIPS's RoundStatusFn
    "transforms/core/noise.py": 1,  # the sequential policies' NoisyThreshold
    "transforms/dpne/dpne.py": 1,  # NoisyKeepFn (levels and the baselines; keep tables: KeepTable.keep)
    "transforms/selection/reference.py": 4,
    "transforms/dpne/reference.py": 2,  # noisy_release, level_mad_sips
    "transforms/dpne/dpne_kernels.py": 1,  # level_round_status (DPNE's MAD-SIPS rounds on Beam)
}
_THRESHOLD_NAME = re.compile(r"threshold|rho", re.I)


def _comparisons_with_a_threshold(repo=REPO):
    for root in ("transforms", "pipelines", "privacy"):
        for path in sorted((repo / root).rglob("*.py")):
            src = path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Compare) and any(
                    isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)) for op in node.ops
                ):
                    operands = [ast.get_source_segment(src, x) or "" for x in (node.left, *node.comparators)]
                    if any(_THRESHOLD_NAME.search(o) for o in operands):
                        yield str(path.relative_to(repo)), ast.get_source_segment(src, node), node.lineno


def test_every_release_step_uses_the_one_rule():
    found = list(_comparisons_with_a_threshold())
    own = [(p, s) for p, s, _ in found if p == "privacy/calibration.py" and s == "noisy >= rho"]
    assert len(own) == 1, "passes_threshold itself"
    others = [(p, s, line) for p, s, line in found if (p, s) not in NOT_RELEASE_STEPS and (p, s) not in own]
    assert not others, f"a comparison with a threshold outside passes_threshold: {others}"
    for rel, n in RELEASE_STEPS.items():
        calls = [
            node
            for node in ast.walk(ast.parse((REPO / rel).read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "passes_threshold"
        ]
        assert len(calls) == n, (rel, len(calls))


def test_the_keep_rules_keep_exactly_the_calibrated_bit_patterns():
    """The keep tables and the l1 curve draw no noise: their comparison is on 64 random bits, and it must keep
    exactly the number of bit patterns the proof assumed (``floor(F 2^64)`` of 2^64; the curve's upper piece
    drops ``ceil(v 2^64)``), so the patterns on either side of the limit decide as the calibration says."""
    from dp_partition_beam.privacy import thresholding as T
    from dp_partition_beam.privacy.selection import plan

    table = plan("basic", SelectionParams(1.0, 1e-5, max_contributions=20, threshold="optimal")).rounds[0].keep_table
    for w in (table.weight_for(0.01), table.weight_for(0.5), table.weight_for(0.99)):
        limit = int(np.ldexp(float(table.keep_probability(w)), 64))  # an exact integer: entries are multiples of 2^-64
        bits = np.array([limit - 1, limit], dtype=np.uint64)
        assert table.keep(np.full(2, w), bits).tolist() == [True, False]
    curve = T.calibrate_l1_curve(1.0, 1e-5)
    for w in (curve.weight_for(0.01), curve.weight_for(0.4), curve.weight_for(0.6), curve.weight_for(0.999)):
        lower, limit = curve.limits(np.array([w]))  # floor(u 2^64) / ceil(v 2^64) (tests/privacy/test_l1_curve.py)
        want = [True, False] if lower[0] else [False, True]  # below x*: keep iff bits < limit; above: drop iff
        bits = np.array([int(limit[0]) - 1, int(limit[0])], dtype=np.uint64)
        assert curve.keep(np.full(2, w), bits).tolist() == want, w
    # Policy Gaussian's l2 rule (privacy/l2_rule.py): keep iff bits < floor(f 2^64), in the quadratic start, at the
    # junction and on the knots
    rule = plan("policy_gaussian", SelectionParams(1.0, 1e-5, threshold="optimal")).rounds[0].keep_table
    for w in (0.5, rule.start, rule.weight_for(0.5), rule.weight_for(0.99)):
        limit = rule.limit(w)  # floor(f(W) 2^64), exact (tests/privacy/test_l2_rule.py recomputes it in fractions)
        assert abs(limit / 2.0**64 - float(rule.keep_probability(np.array([w]))[0])) <= 2.0**-50
        bits = np.array([limit - 1, limit], dtype=np.uint64)
        assert rule.keep(np.full(2, w), bits).tolist() == [True, False], w
    # MAD's l2 rule reads 128 bits: keep iff bits 2^64 + low < floor(f 2^128); at the 64-bit limit the low word
    # decides, with the same strict comparison
    wide = plan("mad", SelectionParams(1.0, 1e-5)).rounds[0].keep_table
    assert wide.realisation_bits == 128
    start = wide.limit(wide.start)  # f(W_s) is a knot, a multiple of 2^-64: no low word, the tie drops
    assert wide.limit_bits(wide.start, 128) == start << 64
    at_start = wide.keep(np.array([wide.start]), np.array([start], np.uint64), lambda idx: np.zeros(1, np.uint64))
    assert at_start.tolist() == [False]
    for w in (0.5, wide.start + 2.0**-20, wide.weight_for(0.5), wide.weight_for(0.99)):
        limit, low = wide.limit(w), wide.limit_bits(w, 128) % 2**64
        assert low > 0, w  # f(W) 2^64 is not an integer at these weights: the tie has a low word to decide
        bits = np.array([limit - 1, limit, limit, limit + 1], dtype=np.uint64)
        lows = {1: low - 1, 2: low}
        got = wide.keep(np.full(4, w), bits, lambda idx: np.array([lows[int(i)] for i in idx], dtype=np.uint64))
        assert got.tolist() == [True, True, False, False], w


def test_the_scan_finds_a_comparison_of_its_own(tmp_path):
    """The source scan is not vacuous: a release written as ``noisy > p.threshold`` is found."""
    fake = tmp_path / "transforms" / "selection"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("def f(noisy, p):\n    return noisy > p.threshold\n")
    assert list(_comparisons_with_a_threshold(tmp_path)) == [("transforms/selection/x.py", "noisy > p.threshold", 2)]


# --- 2. normalisation before per-user bounding -----------------------------------------------------------

USERS = [f"u{i:02d}" for i in range(60)]


FORM_ALGORITHMS = ["basic", "mad2r", "mad_sips", "policy_gaussian", "policy_laplace"]


def _select_branch(inputs, algorithm):
    params = SelectionParams(4.0, 1e-5, max_contributions=2, release_counts=True)

    def build(p):
        pcolls = [p | f"In{i}" >> beam.Create(x) for i, x in enumerate(inputs)]
        merged = pcolls[0] if len(pcolls) == 1 else pcolls | "Flatten" >> beam.Flatten()
        return merged | "Select" >> SelectPartitions(algorithm, params, seed=SEED, output_rounds=True)

    return scoped(build)


@pytest.fixture(scope="module")
def selection_forms():
    """Every algorithm on the data with "x" once per user and on its several forms, as labelled branches of ONE
    pipeline: {(algorithm, "once" | "forms"): sorted lines}."""
    once = [(u, "x") for u in USERS] + [(u, f"y{i % 6}") for i, u in enumerate(USERS)]
    as_string = pa.table({"user": USERS, "item": ["x"] * len(USERS)})
    as_binary = pa.table({"user": USERS, "item": pa.array([b"x"] * len(USERS), pa.binary())})
    inputs = {"once": [once], "forms": [once + [(u, "x") for u in USERS], [as_string, as_binary]]}
    builds = {f"{a}-{kind}": _select_branch(x, a) for a in FORM_ALGORITHMS for kind, x in inputs.items()}
    got = collect_branches(builds, fmt=repr)
    return {(a, kind): sorted(got[f"{a}-{kind}"]) for a in FORM_ALGORITHMS for kind in inputs}


@pytest.mark.parametrize("algorithm", FORM_ALGORITHMS)
def test_a_selection_item_in_several_forms_counts_once(algorithm, selection_forms):
    """Every user holds "x" as an element, as a string batch row and as a binary batch row (one item
    after normalisation to key bytes) and one item of its own group: the release (items, rounds, noisy
    counts of distinct holders) equals that of the data with "x" once per user. Delta_0 = 2: a raw
    duplicate that survived to the bounding would also crowd out the user's other item. (Both runs are
    branches of one pipeline with the other algorithms'.)"""
    want = selection_forms[(algorithm, "once")]
    assert any("'x'" in line for line in want), want  # "x" (60 holders) is released
    assert selection_forms[(algorithm, "forms")] == want, algorithm


def _dpne_branch(records):
    params = dpne.DPNEParams(epsilon=4, delta=1e-5, max_n=2, max_contributions=(2, 2), eta=0.3, release_counts=True)
    return scoped(
        lambda p: (p | "Create" >> beam.Create(records) | "DPNE" >> DPNE("dpne", params, seed=SEED, num_shards=2))[
            "counts"
        ]
    )


def test_a_dpne_token_in_several_forms_counts_once():
    """The tokenizer NFKC-normalises and lowercases: "Hello", "HELLO" and fullwidth "ＨＥＬＬＯ" are the
    word "hello". Each user writing all three (and "world") releases exactly what users writing "hello
    world" once release, counts included (Delta_1 = 2 would also let raw forms crowd out "world"). Both
    runs are branches of one pipeline."""
    plain = [(u, "hello world") for u in USERS]
    forms = [(u, t) for u in USERS for t in ("Hello world", "HELLO WORLD", "\uff28\uff25\uff2c\uff2c\uff2f world")]
    got = collect_branches(
        {"plain": _dpne_branch(plain), "forms": _dpne_branch(forms)},
        fmt=lambda kgc: f"{kgc[0]}\t{kgc[1][0]}\t{kgc[1][1]}",
    )
    want = sorted(got["plain"])
    assert any("\thello\t" in line for line in want) and any("\thello world\t" in line for line in want), want
    assert sorted(got["forms"]) == want


def test_a_tsv_line_in_several_forms_counts_once(tmp_path):
    """The TSV reader drops a CR before LF and a UTF-8 BOM: a file where every user's item "x" comes
    as "x\\r\\n" and as "x\\n" (after a BOM) releases what the clean file releases."""
    from dp_partition_beam.pipelines import select_partitions

    def run(name, data: bytes):
        path = tmp_path / f"{name}.tsv"
        path.write_bytes(data)
        out = tmp_path / name
        argv = ["--input", str(path), "--input_format", "tsv", "--epsilon", "4", "--delta", "1e-5"]
        argv += ["--max_contributions", "2", "--release_counts", "--seed", str(SEED)]
        argv += ["--output", str(out / "released"), "--report", str(out / "report.json")]
        assert select_partitions.run(argv + ["--direct_running_mode", "in_memory"]) == 0
        return sorted(
            line
            for f in sorted(os.listdir(out))
            if f.startswith("released")
            for line in open(out / f, encoding="utf-8")
        )

    clean = "user\titem\n" + "".join(f"{u}\tx\n{u}\ty{i % 6}\n" for i, u in enumerate(USERS))
    messy = "\ufeffuser\titem\r\n" + "".join(f"{u}\tx\r\n{u}\tx\n{u}\ty{i % 6}\r\n" for i, u in enumerate(USERS))
    want = run("clean", clean.encode())
    assert any(line.startswith("x\t") for line in want), want
    assert run("messy", messy.encode()) == want
