"""Smoke test of benchmarks/run_all.py: a reduced --quick run writes well-formed result files.

Checks the files and their contents (columns, ranges, Beam == reference under a seed), not speed:
speed targets are read from the benchmark's own tables (BENCHMARKS.md).
"""

import csv
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOLS = ["basic", "mad", "pdp_gaussian"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run_all",
        "--quick",
        "--out",
        str(out),
        "--seeds",
        "2",
        "--utility",
        "debian_words:5,100",
        "--sizes",
        "20000",
        "40000",
        "--modes",
        "reference",
        "in_memory",
        "--tools",
        *TOOLS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def _rows(out, name):
    with open(os.path.join(out, name), newline="") as f:
        return list(csv.DictReader(f))


def test_utility_csv(results):
    out, _ = results
    rows = _rows(out, "utility.csv")
    assert {(r["tool"], int(r["max_contributions"])) for r in rows} == {(t, k) for t in TOOLS for k in (5, 100)}
    for r in rows:
        assert r["dataset"] == "debian_words" and int(r["users"]) == 1754 and int(r["seeds"]) == 2
        assert 0 <= float(r["released_mean"]) <= int(r["items"])
        assert float(r["released_std"]) >= 0
        covs = [float(r[f"coverage_k{k}"]) for k in (10, 20, 50, 100, 200)]
        assert all(0.0 <= c <= 1.0 for c in covs), covs
    # our seeded reference is deterministic: basic at Delta_0 = 100 releases some items, all frequent
    basic = next(r for r in rows if r["tool"] == "basic" and r["max_contributions"] == "100")
    assert float(basic["released_mean"]) > 0 and float(basic["coverage_k200"]) > float(basic["coverage_k10"])


def test_speed_and_scaling_csv(results):
    out, _ = results
    rows = _rows(out, "speed.csv")
    modes = {(r["tool"], r["mode"]) for r in rows}
    assert modes == {
        ("basic", "reference"),
        ("basic", "in_memory"),
        ("mad", "reference"),
        ("mad", "in_memory"),
        ("pdp_gaussian", "in_memory"),
    }
    assert len(rows) == 2 * len(modes)
    for r in rows:
        assert float(r["wall_s"]) > 0 and float(r["pairs_per_s"]) > 0 and float(r["peak_rss_mb"]) > 10
        assert float(r["cpu_s"]) > 0
        assert math.isclose(float(r["pairs_per_s"]) * float(r["wall_s"]), int(r["pairs"]), rel_tol=1e-6)
        if r["tool"] == "basic":
            assert math.isclose(float(r["time_vs_basic"]), 1.0)
        if r["mode"] == "in_memory" and not r["tool"].startswith("pdp_"):
            assert r["equals_reference"] == "yes", r  # seeded Beam == in-memory reference
    scaling = _rows(out, "scaling.csv")
    assert {(r["tool"], r["mode"]) for r in scaling} == modes
    assert all(math.isfinite(float(r["exponent"])) for r in scaling)


def test_markdown_and_plots(results):
    out, stdout = results
    md = open(os.path.join(out, "summary.md")).read()
    for heading in ("## Utility", "## Speed", "## Scaling", "## Targets (issues 8 and 16)"):
        assert heading in md
    assert "basic >= 5x PipelineDP Gaussian pairs/s" in md and "mad <= 2.0x basic's wall time" in md
    assert md in stdout  # the tables are printed too
    for png in ("coverage.png", "scaling.png"):
        with open(os.path.join(out, png), "rb") as f:
            data = f.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_utility_only_keeps_the_speed_results(results, tmp_path):
    """--utility_only re-measures the utility tables and reuses (never re-times) the last run's speed tables."""
    import shutil

    out, _ = results
    again = tmp_path / "again"
    shutil.copytree(out, again)
    before = {name: (again / name).read_bytes() for name in ("speed.csv", "scaling.csv", "scaling.png")}
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run_all",
        "--utility_only",
        "--out",
        str(again),
        "--seeds",
        "1",
        "--utility",
        "section62:100",
        "--tools",
        "basic",
        "pdp_gaussian",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {name: (again / name).read_bytes() for name in before} == before
    rows = _rows(again, "utility.csv")
    assert {(r["dataset"], r["tool"], r["seeds"]) for r in rows} == {
        ("section62", "basic", "1"),
        ("section62", "pdp_gaussian", "1"),
    }
    md = (again / "summary.md").read_text()
    speed_md = open(os.path.join(out, "summary.md")).read()
    first = speed_md.splitlines()[0]
    assert (
        md.startswith("Utility tables: Measured ")
        and "Speed and scaling tables (not re-measured): " + first[: first.index(" cores.")] in md
    )
    # the speed and scaling tables are the earlier run's, unchanged
    speed_part = speed_md[speed_md.index("## Speed") : speed_md.index("## Targets")]
    assert speed_part in md and "utility part only." in md.splitlines()[0]
