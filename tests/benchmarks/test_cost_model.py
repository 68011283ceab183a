"""benchmarks/cost_model.py: its constants agree with the measurements of docs/scaling.md, and its flags
behave as the doc says."""

import re
from pathlib import Path

import pytest

from benchmarks.cost_model import MEASURED, Cluster, measured_machine, predict

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


def measured_rows():
    """(algorithm, pairs, engine) -> (wall s, machine CPU s) of the doc's first table."""
    rows = {}
    for m in re.finditer(
        r"^\| (\w+) \| ([\d,]+) \| (direct|flink_cluster) \| ([\d.]+) \| (\d+) \|", DOC.read_text(), re.M
    ):
        rows[(m[1], int(m[2].replace(",", "")), m[3])] = (float(m[4]), float(m[5]))
    return rows


@pytest.mark.parametrize("algorithm", sorted(MEASURED))
def test_the_constants_are_the_docs_4m_to_16m_slope(algorithm):
    rows = measured_rows()
    (w4, c4), (w16, c16) = (rows[(algorithm, n, "flink_cluster")] for n in (4_002_901, 16_001_588))
    m = MEASURED[algorithm]
    millions = (16_001_588 - 4_002_901) / 1e6
    assert m.cpu_s_per_m == pytest.approx((c16 - c4) / millions, abs=0.01)
    assert m.fixed_s == pytest.approx(w4 - (w16 - w4) / millions * 4.002901, abs=0.1)


@pytest.mark.parametrize("algorithm", sorted(MEASURED))
def test_the_model_reproduces_the_2_core_cluster_it_was_measured_on(algorithm):
    """The cluster was CPU-bound on its 2 cores: job start + CPU / 2 gives the measured 16M wall time
    within 10% (the model's compute term, with efficiency 1 and no network)."""
    wall16, _ = measured_rows()[(algorithm, 16_001_588, "flink_cluster")]
    m = MEASURED[algorithm]
    assert predict(m, measured_machine(m), 16_001_588)["wall_h"] * 3600 == pytest.approx(wall16, rel=0.10)


def test_side_inputs_stop_fitting_where_the_doc_says():
    c = Cluster()
    for algorithm in ("mad2r", "mad_sips"):
        assert predict(MEASURED[algorithm], c, 1e9)["fits"]
        assert not predict(MEASURED[algorithm], c, 1e10)["fits"]
    assert predict(MEASURED["basic"], c, 8e11)["fits"]
    # the doc's way out: one SDK process per worker instead of 8, and a highmem worker
    assert not predict(MEASURED["mad_sips"], Cluster(memory_gb=64), 1e10)["fits"]
    assert predict(MEASURED["mad_sips"], Cluster(sdk_processes=1, memory_gb=64), 1e10)["fits"]


def test_more_workers_shorten_the_run_but_not_the_work():
    m = MEASURED["mad_sips"]
    small, big = predict(m, Cluster(workers=100), 8e11), predict(m, Cluster(workers=400), 8e11)
    assert big["cpu_h"] == small["cpu_h"] and big["shuffle_tb"] == small["shuffle_tb"]
    assert big["wall_h"] < small["wall_h"] / 3
