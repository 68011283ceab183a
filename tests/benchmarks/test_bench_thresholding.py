"""benchmarks/bench_thresholding.py prints its table, and the keep table releases more than the Gaussian."""

from benchmarks import bench_thresholding


def test_the_table_releases_more_in_expectation(capsys):
    bench_thresholding.main(["--data", "debian_b", "--epsilons", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| debian_b |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    gauss, table = float(cells[5].replace(",", "")), float(cells[6].replace(",", ""))
    assert table > 1.1 * gauss > 0, rows  # measured +20.7% (docs/thresholding.md)
    assert float(cells[4]) < float(cells[3])  # W50 below rho
