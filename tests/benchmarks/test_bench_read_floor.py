"""Smoke test of benchmarks/bench_read_floor.py: the reading floor's table, one row per setting, with every row
of the file read (the figures themselves are the benchmark's output, docs/columnar.md)."""

import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_bench_read_floor_reads_every_row_under_each_setting(tmp_path):
    from dp_partition_beam.transforms.testing.synthetic import zipf_table_of_chunk

    # written here, not with bench_cli.write_zipf_tsv: pyarrow's CSV writer options differ across the
    # supported versions (the minimum-versions lane runs this test with pyarrow 10)
    table = zipf_table_of_chunk(0, 2_000, mean_degree=20.0)
    lines = [f"{u}\t{i}\n" for u, i in zip(table.column("user").to_pylist(), table.column("item").to_pylist())]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(lines), encoding="utf-8")
    n = len(lines)
    assert n > 30_000
    cmd = [sys.executable, "-m", "benchmarks.bench_read_floor", "--tsv", str(tsv), "--reps", "1"]
    cmd += ["--vector_mb", "1", "2", "--pools", "system"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (\w+) \| (\d+) MB \| ([\d.]+) \| ([\d,]+) \| ([\d,]+) \|$", done.stdout, re.M)
    assert [(pool, mb) for pool, mb, *_ in rows] == [("system", "1"), ("system", "2")]
    for _, _, wall, rss, read in rows:
        assert float(wall) > 0 and float(rss.replace(",", "")) > 50
        assert int(read.replace(",", "")) == n
