"""The pipeline on Beam's portable job service (the path Flink/Spark runners take), offline."""
import glob
import os
import socket
import subprocess
import sys
import time

from test_cli_select import PAIRS, SETS, write_input
from privacy.params import SelectionParams
from transforms import reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _wait_for_port(port, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "job service exited"
        try:
            with socket.create_connection(("localhost", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("job service did not start")


def test_select_partitions_on_portable_runner_matches_reference(tmp_path):
    port = _free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, service)
        path = write_input(tmp_path, "jsonl")
        out = tmp_path / "portable"
        cmd = [sys.executable, "-m", "pipelines.select_partitions", "--input", path, "--input_format", "jsonl",
               "--output", str(out / "items"), "--report", str(out / "report.json"), "--algorithm", "mad2r",
               "--epsilon", "2", "--delta", "1e-4", "--max_contributions", "8", "--d_max", "6", "--seed", "8",
               "--runner", "PortableRunner", "--job_endpoint", f"localhost:{port}", "--environment_type", "LOOPBACK"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        items = {l.rstrip("\n") for p in glob.glob(str(out / "items*")) for l in open(p)}
        params = SelectionParams(2.0, 1e-4, max_contributions=8, d_max=6)
        assert items == reference.select(SETS, "mad2r", params, seed=8) and items
    finally:
        service.terminate()
        service.wait(timeout=30)
