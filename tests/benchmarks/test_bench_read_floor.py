"""Smoke test of benchmarks/bench_read_floor.py: the reading floor's table, one row per setting, with every row
of the file read (the figures themselves are the benchmark's output, docs/columnar.md)."""

import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_bench_read_floor_reads_every_row_under_each_setting(tmp_path):
    from benchmarks.bench_cli import write_zipf_tsv

    tsv = tmp_path / "pairs.tsv"
    n = write_zipf_tsv(4e4, str(tsv))
    cmd = [sys.executable, "-m", "benchmarks.bench_read_floor", "--tsv", str(tsv), "--reps", "1"]
    cmd += ["--vector_mb", "1", "2", "--pools", "system"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (\w+) \| (\d+) MB \| ([\d.]+) \| ([\d,]+) \| ([\d,]+) \|$", done.stdout, re.M)
    assert [(pool, mb) for pool, mb, *_ in rows] == [("system", "1"), ("system", "2")]
    for _, _, wall, rss, read in rows:
        assert float(wall) > 0 and float(rss.replace(",", "")) > 50
        assert int(read.replace(",", "")) == n
