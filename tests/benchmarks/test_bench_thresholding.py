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


def test_the_l1_curve_releases_more_in_expectation(capsys):
    bench_thresholding.main(["--data", "debian_b", "--epsilons", "2", "--rule", "l1"])  # at 1 count_laplace: ~0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| debian_b |")]
    assert [r.split("|")[2].strip() for r in rows] == ["weighted_laplace", "count_laplace"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        laplace, curve = float(cells[6].replace(",", "")), float(cells[7].replace(",", ""))
        assert curve > 1.1 * laplace > 0, row  # measured +23.8% and +86.8% (docs/thresholding.md)
        assert float(cells[5]) < float(cells[4])  # W50 below rho
