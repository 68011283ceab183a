"""Offline checks of the remote submission paths: the Dataflow job graph (dry run), the package the
workers get (setup.py sdist, as Beam's stager builds it), and a Flex launch that does not wait."""

import json
import os
import subprocess
import sys
import tarfile

import apache_beam as beam
import pytest

from dp_partition_beam.pipelines import runner

from tests.support.pipeline_cases import IDS, PIPELINES, REPO, sample_args

# Builds each job's pipeline for DataflowRunner --dry_run=True (no job is sent) and prints, one JSON line per
# job, the Runner API graph the job would carry plus the artifacts staged for the workers. The jobs (a JSON
# list of [pipeline name, argv]) run one after another in ONE interpreter: each is its own beam.Pipeline with
# its own options and staging, and one process saves the ~5 CPU-s of importing Beam and the Dataflow client
# per job.
DRY_RUN = r"""
import json, sys
import apache_beam as beam
from apache_beam.portability.api import beam_runner_api_pb2
from dp_partition_beam.pipelines import registry, runner
for name, argv in json.loads(sys.argv[1]):
    spec = registry.get(name)
    m = spec.module()
    args, beam_args = m.build_parser().parse_known_args(argv)
    options = runner.pipeline_options(beam_args)
    p = beam.Pipeline(options=options)
    m.build_pipeline(p, args, m.params_from_args(args))
    result = p.run()
    result.wait_until_finish()
    job = result.job
    graph = job.proto_pipeline
    staged = []
    for env in graph.components.environments.values():
        for dep in env.dependencies:
            payload = beam_runner_api_pb2.ArtifactFilePayload.FromString(dep.type_payload)
            role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload)
            staged.append({"path": payload.path, "name": role.staged_name})
    print(json.dumps({
        "job_name": job.proto.name,
        "project": job.google_cloud_options.project,
        "location": job.google_cloud_options.region,
        "transforms": sorted(t.unique_name for t in graph.components.transforms.values()),
        "staged": staged,
        "state": str(result.state),
    }))
"""

DATAFLOW_ARGS = [
    "--runner",
    "DataflowRunner",
    "--dry_run=True",
    "--project",
    "fake-project",
    "--region",
    "us-central1",
    "--temp_location",
    "gs://fake-bucket/tmp",
]


def _argv(spec, *extra):
    return [
        f"--{spec.input_flag}",
        "gs://fake-bucket/in/*",
        "--input_format",
        spec.input_format,
        "--output",
        "gs://fake-bucket/out/released",
        "--report",
        "gs://fake-bucket/out/report.json",
        *sample_args(spec),
        *DATAFLOW_ARGS,
        "--setup_file",
        os.path.join(REPO, "setup.py"),
        *extra,
    ]


def _dry_runs(tmp_path, jobs):
    """Dry-runs ``jobs`` (``{key: (spec, argv)}``) in one subprocess; returns ``{key: its JSON line}``."""
    # No network here: a hang (credentials, metadata server) must fail the test, not stall the suite.
    env = dict(os.environ, GCE_METADATA_HOST="127.0.0.1:9", NO_GCE_CHECK="True")
    proc = subprocess.run(
        [sys.executable, "-c", DRY_RUN, json.dumps([[spec.name, argv] for spec, argv in jobs.values()])],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-len(jobs) :]
    assert len(lines) == len(jobs), proc.stdout[-3000:]
    return {key: json.loads(line) for key, line in zip(jobs, lines)}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """Every pipeline's dry run under its name, and the first pipeline's with --diagnostics under
    "diagnostics": four jobs, one subprocess."""
    pytest.importorskip(
        "apache_beam.runners.dataflow.internal.apiclient",
        reason="the gcp extra is not installed (pip install -e '.[gcp]')",
    )
    jobs = {s.name: (s, _argv(s)) for s in PIPELINES}
    jobs["diagnostics"] = (PIPELINES[0], _argv(PIPELINES[0], "--diagnostics", "gs://fake-bucket/private/diag.json"))
    return _dry_runs(tmp_path_factory.mktemp("dry_runs"), jobs)


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_dataflow_dry_run_builds_the_job_graph_with_the_pipeline_stages(spec, dry_runs):
    out = dry_runs[spec.name]
    assert out["project"] == "fake-project" and out["location"] == "us-central1"
    names = set(out["transforms"])
    for stage in spec.stages:
        assert stage in names, f"stage {stage} missing from the Dataflow graph"
    assert any(n.endswith("/Parse") and n.startswith(spec.stages[0]) for n in names)  # the file reader
    # No NON-PRIVATE diagnostics branch unless asked for.
    assert not any(n.startswith("Diag") for n in names)


def test_dataflow_dry_run_with_diagnostics_adds_only_the_diagnostics_branch(dry_runs):
    out, plain = dry_runs["diagnostics"], dry_runs[PIPELINES[0].name]
    added = set(out["transforms"]) - set(plain["transforms"])
    assert {"DiagWrite", "DiagCounter_records_read", "DiagCounter_users"} <= added
    assert set(plain["transforms"]) <= set(out["transforms"])  # the rest of the graph is unchanged


def _members(tar_path):
    with tarfile.open(tar_path) as tar:
        return {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}


def _package_files():
    want = set()
    for pkg in ("privacy", "transforms", "pipelines"):
        for f in os.listdir(os.path.join(REPO, pkg)):
            if f.endswith(".py"):
                want.add(f"{pkg}/{f}")
    return want


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_workers_get_every_module_in_the_staged_package(spec, dry_runs):
    staged = {s["name"]: s["path"] for s in dry_runs[spec.name]["staged"]}
    assert "workflow.tar.gz" in staged, staged  # --setup_file -> sdist staged for the workers
    members = _members(staged["workflow.tar.gz"])
    missing = _package_files() - members
    assert not missing, f"modules the workers would lack: {sorted(missing)}"
    assert "setup.py" in members


def test_setup_py_sdist_contains_every_package_module(tmp_path):
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tar,) = [p for p in os.listdir(tmp_path) if p.endswith(".tar.gz")]
    members = _members(os.path.join(tmp_path, tar))
    assert not (_package_files() - members)
    assert {"setup.py", "README.md"} <= members  # setup.py reads README.md on the worker


class _Result:
    def __init__(self, log):
        self.log = log

    def wait_until_finish(self, duration=None):
        self.log.append("waited")
        raise AssertionError("a Flex Template launcher must not wait for the job")


@pytest.mark.parametrize("spec", PIPELINES, ids=IDS)
def test_flex_template_launch_submits_without_waiting(spec, monkeypatch, capsys, tmp_path):
    log = []
    monkeypatch.setenv(runner.FLEX_TEMPLATE_ENV, f"/template/pipelines/{spec.name}.py")
    monkeypatch.setattr(beam.Pipeline, "run", lambda self, *a, **k: log.append("run") or _Result(log))
    argv = [
        f"--{spec.input_flag}",
        "gs://fake-bucket/in/*",
        "--input_format",
        spec.input_format,
        "--output",
        "gs://fake-bucket/out/released",
        "--report",
        "gs://fake-bucket/out/report.json",
        *sample_args(spec),
    ]
    assert spec.module().run(argv) == 0
    assert log == ["run"]
    assert "submitted without waiting" in capsys.readouterr().out


def test_local_runs_and_template_creation_wait_or_not_as_documented():
    from apache_beam.options.pipeline_options import PipelineOptions

    class A:
        no_wait = False

    assert runner.should_wait(PipelineOptions([]), A())
    assert not runner.should_wait(PipelineOptions(["--template_location", "gs://b/t.json"]), A())
    A.no_wait = True
    assert not runner.should_wait(PipelineOptions([]), A())
