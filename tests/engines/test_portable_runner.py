"""Every pipeline on Beam's portable job service (the Job API a Flink/Spark job server speaks), offline."""

import socket
import subprocess
import sys
import time

import pytest

from tests.support.pipeline_cases import IDS, PIPELINES, cli_args, cut_sample, released_lines, run_cli
from tests.support.ports import free_port


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


@pytest.fixture(scope="module")
def job_endpoint():
    port = free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, service)
        yield f"localhost:{port}"
    finally:
        service.terminate()
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(timeout=30)


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_portable_runner_releases_what_the_direct_runner_releases(spec, job_endpoint, tmp_path):
    path = cut_sample(spec, tmp_path)
    # the DirectRunner's release, in this process: it is only what the portable run must equal (a subprocess
    # cost a Python and Beam import, ~4 CPU-s a pipeline); the portable run stays a user's command line
    direct_argv = cli_args(
        spec, path, str(tmp_path / "direct"), "--runner", "DirectRunner", "--direct_running_mode", "in_memory"
    )
    assert spec.module().run([*direct_argv, "--progress_interval", "0"]) == 0
    portable = run_cli(
        spec,
        cli_args(
            spec,
            path,
            str(tmp_path / "portable"),
            "--runner",
            "PortableRunner",
            "--job_endpoint",
            job_endpoint,
            "--environment_type",
            "LOOPBACK",
        ),
    )
    assert portable.returncode == 0, portable.stderr[-3000:]
    want = released_lines(str(tmp_path / "direct"))
    assert want, "the sample run releases nothing: the comparison would be vacuous"
    assert released_lines(str(tmp_path / "portable")) == want
