"""The OpenDP peer (benchmarks/peer_opendp.py): what it releases, that it bounds each user, and that
benchmarks/run_all.py times it and reports it beside ours and PipelineDP.

OpenDP's noise cannot be seeded, so the release assertions hold with overwhelming probability; each
test states its false-failure rate, bounded from the threshold OpenDP resolved. Small delta (1e-10)
keeps the rate of an item held by one user being released (<= delta_t per user, OpenDP's own
threshold guarantee) far below one in a million.

Polars and OpenDP (the bench extra) are imported inside the tests: the minimum-versions lane, which
has no bench extra, collects this file before it deselects it (slow, tests/conftest.py).
"""

import math
import subprocess
import sys
import types

import pyarrow as pa
import pytest

from benchmarks import peer_opendp, run_all
from benchmarks.peer_opendp import OPENDP_MODE, OPENDP_TOOL, PRIORITY_SEED, release
from dp_partition_beam.transforms.testing.synthetic import zipf_table_of_chunk

EPSILON, DELTA, K = 1.0, 1e-10, 5
N_USERS = 300
COMMON = ("common0", "common1", "common2")


def _tail(sigds):
    """Sub-Gaussian tail bound exp(-t^2 / 2) at t standard deviations (holds for the integer Gaussian)."""
    return math.exp(-(sigds**2) / 2)


def _tiny_rows():
    """300 users: each holds the three common items (twice: duplicate rows) and one item of its own."""
    rows = []
    for u in range(N_USERS):
        rows += [(f"u{u}", c) for c in COMMON for _ in range(2)] + [(f"u{u}", f"own{u}")]
    return rows


def _write_tsv(rows, path):
    path.write_text("".join(f"{user}\t{item}\n" for user, item in rows))
    return str(path)


def _as(kind, rows, tmp_path):
    import polars as pl

    df = pl.DataFrame(rows, schema={"user": pl.String, "item": pl.String}, orient="row")
    if kind == "arrow":
        return df.to_arrow()
    if kind == "lazyframe":
        return df.lazy()
    if kind == "pairs":
        return rows
    return peer_opendp.scan_tsv(_write_tsv(rows, tmp_path / "pairs.tsv"))


@pytest.mark.parametrize("kind", ["arrow", "lazyframe", "pairs", "tsv"])
def test_every_input_kind_is_read_as_the_same_two_string_columns(kind, tmp_path):
    """release() reads its rows only through _lazy: an Arrow table, a LazyFrame, (user, item) pairs and a
    scanned tsv give the same frame, exactly (the release itself runs below on pairs and on the tsv scan)."""
    import polars as pl

    want = pl.DataFrame(_tiny_rows(), schema={"user": pl.String, "item": pl.String}, orient="row")
    got = peer_opendp._lazy(_as(kind, _tiny_rows(), tmp_path)).collect()
    assert got.schema == want.schema
    assert got.sort(["user", "item"]).equals(want.sort(["user", "item"]))


# the release on an in-memory frame (pairs; an Arrow table and a LazyFrame are the same frame, above) and on
# a lazily scanned file (another query plan for OpenDP); each release is ~4 CPU-s of OpenDP's scale search
@pytest.mark.parametrize("kind", ["pairs", "tsv"])
def test_items_of_every_user_are_released_and_items_of_one_user_never(kind, tmp_path):
    """False-failure rate: a common item (count 300) is missed (noisy count <= T) with probability
    <= exp(-t^2/2) at t = (300 - T) / sigma (asserted > 10: < 2e-22); an own item (count 1) is released
    (noise > T - 1) with probability <= delta_t (OpenDP's threshold guarantee, <= 1e-10 per user), 300
    of them: < 3e-8."""
    result = release(_as(kind, _tiny_rows(), tmp_path), EPSILON, DELTA, K)
    assert result.items == frozenset(COMMON)
    t = (N_USERS - result.threshold) / result.scale
    assert t > 10 and 3 * _tail(t) < 1e-20, (result.threshold, result.scale)
    assert N_USERS * result.calibration.delta_threshold < 3e-8
    # the guarantee OpenDP certifies is the one asked for, and little of it is wasted
    assert result.certified_epsilon <= EPSILON and 0.95 * EPSILON < result.certified_epsilon
    assert result.certified_delta == DELTA
    # the calibration's continuous estimate of the threshold is OpenDP's integer one
    assert abs(result.threshold - result.calibration.approx_threshold) <= 2


def test_a_users_contribution_is_bounded():
    """One user holds 10,000 distinct items nobody else holds, another repeats one row 500 times;
    300 others hold 'common'. Only 'common' is released: truncate_num_groups keeps 5 of the first
    user's items (count 1 each), truncate_per_group counts the second user once (without it, 500 >
    T). False failure: a count-1 item released, <= delta_t per user (< 1e-10); 'common' missed: < 2e-22."""
    rows = [(f"u{u}", "common") for u in range(N_USERS)]
    rows += [("whale", f"w{j}") for j in range(10_000)] + [("echo", "echoed")] * 500
    result = release(rows, EPSILON, DELTA, K)
    assert result.threshold < 500 and (N_USERS - result.threshold) / result.scale > 10
    assert result.items == frozenset({"common"})


def test_each_user_keeps_delta0_items_of_the_same_pseudo_random_order():
    """300 users all hold the same 1,000 items: each keeps the K = 5 items of lowest (hash, item), the
    same 5 for everyone, and exactly those are released (count 300; without the bound all 1,000
    would be; OpenDP's truncate_num_groups(K) alone would keep 4). False failure: one of the 5
    missed, <= 5 exp(-t^2/2) at t = (300 - T) / sigma > 10 (< 1e-21)."""
    import polars as pl

    items = [f"i{j}" for j in range(1_000)]
    df = pl.DataFrame({"user": [f"u{u}" for u in range(N_USERS) for _ in items], "item": items * N_USERS})
    result = release(df, EPSILON, DELTA, K)
    assert (N_USERS - result.threshold) / result.scale > 10
    order = pl.DataFrame({"item": items}).with_columns(pl.col("item").hash(seed=PRIORITY_SEED).alias("priority"))
    lowest = order.sort(["priority", "item"]).get_column("item").head(K).to_list()
    assert result.items == frozenset(lowest)


def test_calibration_splits_delta_and_minimises_the_threshold():
    from scipy.stats import norm

    dp = peer_opendp._opendp()
    space = dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float)

    def delta_at_one(rho):  # OpenDP's conversion of rho-zCDP at epsilon = 1
        gauss = dp.m.make_gaussian(*space, scale=1.0 / math.sqrt(2.0 * rho))
        return dp.c.make_zCDP_to_approxDP(gauss).map(1.0).delta(1.0)

    cal = peer_opendp.calibrate(1.0, 1e-5, 100)
    assert math.isclose(cal.delta_threshold + cal.delta_conversion, 1e-5)
    # rho is the largest that OpenDP converts to (1, delta_conversion)-DP: 0.1% more does not convert
    assert delta_at_one(cal.rho) <= cal.delta_conversion < delta_at_one(cal.rho * 1.001)

    assert cal.groups == 101  # OpenDP's bound: truncate_num_groups(101) keeps 100 items (peer_opendp)

    def threshold(share):  # 1 + sigma z: per-item tail p with 1 - (1 - p)^101 = delta_t
        rho = peer_opendp._rho_for(1.0, 1e-5 * (1 - share))
        return 1 + math.sqrt(101 / (2 * rho)) * norm.isf(1 - (1 - 1e-5 * share) ** (1 / 101))

    estimates = {share: threshold(share) for share in peer_opendp.DELTA_SPLITS}
    best = min(estimates, key=estimates.get)
    assert math.isclose(cal.delta_threshold, 1e-5 * best) and math.isclose(cal.approx_threshold, estimates[best])
    assert estimates[best] < estimates[0.05] - 5 and estimates[best] < estimates[0.95] - 5  # the split matters
    assert 200 < cal.approx_threshold < 250  # sigma ~ 42, per-item tail 4e-8: 1 + 5.4 sigma
    with pytest.raises(ValueError, match="epsilon"):
        peer_opendp.calibrate(0.0, 1e-5, 100)


def test_the_zipf_rows_are_the_packages_and_load_without_beam():
    table_of_chunk = peer_opendp.zipf_table_of_chunk_loader()
    assert table_of_chunk(3, 500).equals(zipf_table_of_chunk(3, 500))
    code = (
        "import sys; from benchmarks import peer_opendp; peer_opendp.zipf_table_of_chunk_loader()(0, 10); "
        "assert 'apache_beam' not in sys.modules, 'Beam imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=run_all.REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_run_all_times_the_peer_and_reports_its_row_and_ratios():
    """run_speed on a small size: the peer runs once (its own mode, whatever Beam modes are listed)
    in its own subprocess on the same rows as ours; the speed table carries its row and the ratio column."""
    cfg = dict(speed=[(2e4, ("basic", OPENDP_TOOL), ("reference",))], users_per_chunk=1_000, reps=1)
    rows = run_all.run_speed(cfg, ["basic", OPENDP_TOOL], log=lambda msg: None)
    assert not run_all.FAILURES
    by_tool = {(r["tool"], r["mode"]): r for r in rows}
    assert set(by_tool) == {("basic", "reference"), (OPENDP_TOOL, OPENDP_MODE)}
    peer, basic = by_tool[(OPENDP_TOOL, OPENDP_MODE)], by_tool[("basic", "reference")]
    assert peer["pairs"] == basic["pairs"] == sum(zipf_table_of_chunk(c, 1_000).num_rows for c in range(2))
    assert peer["wall_s"] > 0 and peer["peak_rss_mb"] > 50 and peer["released"] >= 1
    assert peer["equals_reference"] == "" and math.isclose(peer["speed_vs_opendp_gaussian"], 1.0)
    assert math.isclose(basic["speed_vs_opendp_gaussian"], basic["pairs_per_s"] / peer["pairs_per_s"])
    args = types.SimpleNamespace(quick=True, command_line="python -m benchmarks.run_all (test)")
    md = run_all.summary_markdown(args, dict(seeds=1), [], rows, run_all.fit_scaling(rows), 1.0, "now")
    assert "pairs/s / opendp_gaussian" in md
    assert any(line.startswith(f"| {OPENDP_TOOL} | ") and f"| {OPENDP_MODE} |" in line for line in md.splitlines())


def test_run_all_measures_the_peers_utility():
    """The utility part runs the peer on the same pairs. section62: 'heavy' (held by all 15,000 users) is
    the one item held by >= 200 users and is released (count 15,000 vs T ~ 225: certain)."""
    cfg = dict(utility=[("section62", (100,))], seeds=1, slow_peers=False)
    (row,) = run_all.run_utility(cfg, None, [OPENDP_TOOL], log=lambda msg: None)
    assert row["tool"] == OPENDP_TOOL and row["users"] == 15_000 and row["coverage_k200"] == 1.0
    assert 1 <= row["released_mean"] <= row["items"]
    assert OPENDP_TOOL in run_all.PEERS and run_all.tool_modes(OPENDP_TOOL, ("in_memory",)) == (OPENDP_MODE,)


def test_the_command_prints_time_items_and_memory(tmp_path):
    path = _write_tsv(_tiny_rows(), tmp_path / "pairs.tsv")
    out = tmp_path / "items.txt"
    cmd = [sys.executable, "-m", "benchmarks.peer_opendp", path, "--epsilon", "1", "--delta", "1e-10"]
    cmd += ["--max_contributions", "5", "--output", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=run_all.REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "released 3 items" in proc.stdout and "peak RSS" in proc.stdout and "wall " in proc.stdout
    assert out.read_text().split() == sorted(COMMON)  # false failure as in the tiny-dataset test


def test_arrow_tables_with_large_strings_are_accepted():
    import polars as pl

    table = pa.table({"user": pa.array(["a", "b"], pa.large_string()), "item": pa.array(["x", "y"], pa.large_string())})
    assert peer_opendp._lazy(table).collect_schema() == pl.Schema({"user": pl.String, "item": pl.String})
