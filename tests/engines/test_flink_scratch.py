"""Flink's scratch directories stay inside what the engine tests own and are removed with them.

Flink puts each TaskManager's ``tm_*`` directory (every job's blobs, ~150 MB a job here) and its shuffle
files under ``io.tmp.dirs``, by default the JVM's /tmp. The engine suite's job servers and standalone
clusters left ~1 GB there per job server or TaskManager, 48 GB on this machine after two days of runs."""

import os
import re

from tests.support import engines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_flink_job_server_keeps_its_scratch_in_its_log_dir_and_removes_it(tmp_path):
    server = engines.JobServer("flink", str(tmp_path))
    config = (tmp_path / "flink-conf" / "config.yaml").read_text()
    assert f"io.tmp.dirs: {tmp_path / 'flink-tmp'}\n" in config
    assert os.path.isdir(server.tmp_dir)
    (tmp_path / "flink-tmp" / "tm_localhost:1-abc" / "blobStorage").mkdir(parents=True)
    server.stop()  # never started: stop() still removes the scratch
    assert not os.path.exists(server.tmp_dir)
    assert os.path.exists(tmp_path / "flink-conf" / "config.yaml")


def test_a_spark_job_server_has_no_flink_scratch(tmp_path):
    server = engines.JobServer("spark", str(tmp_path))
    assert server.tmp_dir is None
    assert not (tmp_path / "flink-tmp").exists()


def test_the_standalone_flink_cluster_keeps_its_scratch_in_the_cluster_dir_and_down_removes_it():
    with open(os.path.join(REPO, ".ci", "engines.sh"), encoding="utf-8") as f:
        script = f.read()
    config = script[script.index("flink_cluster_config() {") : script.index("flink_resources() {")]
    assert re.search(r"^io\.tmp\.dirs: \$CLUSTER/flink-tmp$", config, re.M)
    assert re.search(r"^web\.tmpdir: \$CLUSTER/flink-tmp$", config, re.M)
    down = script[script.index("cluster_down() {") :]
    down = down[: down.index("\n}\n")]
    assert 'rm -rf "$CLUSTER/flink-tmp"' in down
    assert down.index('stop "$name"') < down.index("rm -rf")  # after every process has stopped
