"""Smoke test of benchmarks/bench_cli.py: whole commands on one generated TSV, timed from outside.

Checks the table (every tool's row, our seeded CLIs' released counts equal to the in-memory reference's on
the same file), not speed: the speed figures are the benchmark's own output (docs/columnar.md).
"""

import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_bench_cli_times_every_tool_on_one_tsv_and_prints_the_table(tmp_path):
    from benchmarks.bench_cli import write_zipf_tsv
    from dp_partition_beam.privacy.selection import SelectionParams
    from dp_partition_beam.transforms import reference

    tsv = tmp_path / "pairs.tsv"
    n = write_zipf_tsv(4e4, str(tsv))
    assert n > 30_000 and len(tsv.read_text().splitlines()) == n
    cmd = [sys.executable, "-m", "benchmarks.bench_cli", "--tsv", str(tsv), "--tools", "basic", "mad_sips"]
    cmd += ["opendp_gaussian", "--reps", "1"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = dict(re.findall(r"^\| (\w+) \| (.*) \|$", done.stdout, re.M))
    assert set(rows) >= {"basic", "mad_sips", "opendp_gaussian"}
    wall, rss, released, ratio = (c.strip() for c in rows["basic"].split("|"))
    assert float(wall) > 0 and float(rss.replace(",", "")) > 50 and ratio == "1.00"
    pairs = [tuple(line.split("\t")) for line in tsv.read_text().splitlines()]
    sets = reference.user_sets_from_pairs(pairs)
    for algorithm in ("basic", "mad_sips"):
        want = reference.select(sets, algorithm, SelectionParams(epsilon=1.0, delta=1e-5), seed=1)
        assert int(rows[algorithm].split("|")[2].strip().replace(",", "")) == len(want)
