"""The output contract of the three release CLIs (issue 27): nothing destroyed, nothing mixed in,
nothing silently cut; a report written last that lists the shards of its release; interrupted and
failed runs leave nothing behind.

Every case asserts the exit code, the one ``error:`` line, and that nothing outside the declared
outputs changed (a snapshot of the whole working directory before and after: paths, kinds, bytes).
"""

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dp_partition_beam.pipelines import bayesian_ngrams, extract_ngrams, outputs, select_partitions

from tests.support.files import snapshot

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def pairs_tsv(path, users=60, items=("a", "b", "c")):
    path.write_text("".join(f"u{j}\t{i}\n" for j in range(users) for i in items), encoding="utf-8")
    return path


def select_argv(tmp_path, *extra, output=None, report=None):
    return [
        "--input",
        str(tmp_path / "in.tsv"),
        "--input_format",
        "tsv",
        "--output",
        str(output if output is not None else tmp_path / "out" / "items"),
        "--report",
        str(report if report is not None else tmp_path / "out" / "report.json"),
        "--epsilon",
        "4",
        "--delta",
        "1e-5",
        "--max_contributions",
        "4",
        "--seed",
        "1",
        "--direct_running_mode",
        "in_memory",
        *extra,
    ]


def run_cli(module, argv):
    """(exit code, stderr lines) of ``module.run(argv)`` in this process (SystemExit for parse errors)."""
    try:
        return module.run(argv)
    except SystemExit as e:
        return e.code


def error_lines(err: str):
    return [l for l in err.splitlines() if "error" in l.lower() or "Traceback" in l]


@pytest.fixture
def work(tmp_path):
    pairs_tsv(tmp_path / "in.tsv")
    (tmp_path / "out").mkdir()
    return tmp_path


# --- contract violations: exit 2, one line, nothing changed --------------------------------------------


def _violations(t):
    """(id, argv extra or path overrides, expected fragment of the message, set-up function)."""

    def keep_dir(name):
        def setup():
            (t / name / "sub").mkdir(parents=True)
            (t / name / "sub" / "f").write_text("precious")

        return setup

    def files(*names):
        def setup():
            for n in names:
                (t / n).write_text("old")

        return setup

    def nothing():
        return None

    return [
        ("report-is-dir", dict(report=t / "keep"), "is an existing directory", keep_dir("keep")),
        ("report-trailing-slash", dict(report=str(t / "keep") + "/"), "ends in '/'", keep_dir("keep")),
        ("report-empty", dict(report=""), "--report must not be empty", nothing),
        ("diagnostics-is-dir", dict(extra=["--diagnostics", str(t / "keep")]), "existing directory", keep_dir("keep")),
        ("report-is-input", dict(report=t / "in.tsv"), "is an input (--input", nothing),
        (
            "diagnostics-is-release-shard",
            dict(extra=["--diagnostics", str(t / "out" / "items-00000-of-00001")]),
            "is named like a shard of the release",
            nothing,
        ),
        (
            "report-equals-diagnostics",
            dict(extra=["--diagnostics", str(t / "out" / "report.json")]),
            "name the same file",
            nothing,
        ),
        ("input-starts-with-prefix", dict(output=t / "in"), "starts with the --output prefix", nothing),
        ("output-trailing-slash", dict(output=str(t / "out") + "/"), "ends in '/'", nothing),
        ("output-empty", dict(output=""), "--output must not be empty", nothing),
        (
            "old-shards-in-the-way",
            dict(),
            "output files of an earlier run are in the way",
            files("out/items-00000-of-00003", "out/items-00002-of-00003"),
        ),
        ("old-report-in-the-way", dict(), "in the way", files("out/report.json")),
        (
            "foreign-file-with-prefix",
            dict(extra=["--overwrite"]),
            "is not a release shard of this command",
            files("out/items.bak"),
        ),
        ("allowlist-is-report", dict(extra=["--allowlist", str(t / "out" / "report.json")]), "is an input", nothing),
        ("plots-is-a-file", dict(extra=["--plots", str(t / "in.tsv")]), "is an existing file", nothing),
    ]


CASE_IDS = [c[0] for c in _violations(__import__("pathlib").Path("/x"))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_contract_violations_stop_before_anything_runs(work, capsys, case):
    (name, over, fragment, setup) = next(c for c in _violations(work) if c[0] == case)
    setup()
    before = snapshot(work)
    argv = select_argv(work, *over.get("extra", []), output=over.get("output"), report=over.get("report"))
    code = run_cli(select_partitions, argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = error_lines(err)
    assert len(lines) == 1 and fragment in lines[0], err
    assert "Traceback" not in err
    assert snapshot(work) == before  # nothing deleted, created or rewritten


def test_input_glob_matching_the_release_is_refused(work, capsys):
    before = snapshot(work)
    argv = select_argv(work, output=work / "out" / "items", report=work / "report.json")
    argv[1] = str(work / "out" / "*")  # --input out/* would read this run's release next time
    (work / "out" / "old.tsv").write_text("u\ta\n")
    before = snapshot(work)
    assert run_cli(select_partitions, argv) == 2
    assert "would match --input" in capsys.readouterr().err
    assert snapshot(work) == before


@pytest.mark.parametrize(
    "module,argv_of",
    [
        (
            extract_ngrams,
            lambda t: [
                "--input",
                str(t / "in.jsonl"),
                "--input_format",
                "jsonl",
                "--output",
                str(t / "out" / "ngrams"),
                "--report",
                str(t / "keep"),
                "--max_n",
                "2",
                "--epsilon",
                "4",
                "--delta",
                "1e-5",
                "--direct_running_mode",
                "in_memory",
            ],
        ),
        (
            bayesian_ngrams,
            lambda t: [
                "--private",
                str(t / "in.jsonl"),
                "--input_format",
                "jsonl",
                "--public",
                str(t / "public.tsv"),
                "--output",
                str(t / "out" / "probs"),
                "--report",
                str(t / "keep"),
                "--n",
                "1",
                "--epsilon",
                "1",
                "--mechanism",
                "laplace",
                "--direct_running_mode",
                "in_memory",
            ],
        ),
    ],
    ids=["extract_ngrams", "bayesian_ngrams"],
)
def test_other_clis_keep_a_directory_named_as_report(work, capsys, module, argv_of):
    (work / "in.jsonl").write_text('{"user": "u", "text": "a b"}\n')
    (work / "public.tsv").write_text("a\t1\nb\t2\n")
    (work / "keep" / "sub").mkdir(parents=True)
    (work / "keep" / "sub" / "f").write_text("precious")
    before = snapshot(work)
    code = run_cli(module, argv_of(work))
    err = capsys.readouterr().err
    assert code == 2 and "is an existing directory" in err
    assert snapshot(work) == before


# --- the report: written last, listing its shards; --overwrite ----------------------------------------


def test_report_lists_the_shards_of_its_release(work, capsys):
    assert run_cli(select_partitions, select_argv(work)) == 0
    report = json.loads((work / "out" / "report.json").read_text())
    block = report["outputs"]
    files = sorted(str(p) for p in (work / "out").glob("items-*"))
    assert block["complete"] is True and block["num_shards"] == len(files) >= 1
    assert [s["path"] for s in block["shards"]] == files
    for shard in block["shards"]:
        data = open(shard["path"], "rb").read()
        assert shard["bytes"] == len(data) and shard["sha256"] == hashlib.sha256(data).hexdigest()
    assert block["release"] == str(work / "out" / "items") + "-?????-of-?????"
    out = capsys.readouterr().out
    assert block["release"] in out  # the summary names the shards' pattern, not PREFIX*


def test_overwrite_removes_only_the_earlier_runs_files(work, capsys):
    old = ["items-00000-of-00003", "items-00001-of-00003", "items-00002-of-00003", "report.json"]
    for name in old:
        (work / "out" / name).write_text("stale\n")
    (work / "out" / "notes.txt").write_text("mine")
    code = run_cli(select_partitions, select_argv(work, "--overwrite"))
    err = capsys.readouterr().err
    assert code == 0, err
    assert "--overwrite: removed 4 file(s)" in err
    names = sorted(p.name for p in (work / "out").iterdir())
    assert names == ["items-00000-of-00001", "notes.txt", "report.json"]
    assert (work / "out" / "notes.txt").read_text() == "mine"
    shards = json.loads((work / "out" / "report.json").read_text())["outputs"]["shards"]
    assert [os.path.basename(s["path"]) for s in shards] == ["items-00000-of-00001"]


def test_the_same_command_twice_needs_overwrite(work, capsys):
    argv = select_argv(work)
    assert run_cli(select_partitions, argv) == 0
    first = snapshot(work)
    assert run_cli(select_partitions, argv) == 2
    assert "in the way" in capsys.readouterr().err
    assert snapshot(work) == first
    assert run_cli(select_partitions, argv + ["--overwrite"]) == 0
    assert snapshot(work) == first  # same seed: the same release and report, rewritten


def test_contract_units():
    paths = outputs.RunPaths({"--input": "gs://b/in/*"}, ("--output", "gs://b/out/items"), {"--report": "gs://b/r"})
    assert outputs.check_contract(paths) == []  # remote: string checks only, nothing listed
    bad = outputs.RunPaths({"--input": "gs://b/in/*"}, ("--output", "gs://b/in/items"), {"--report": "gs://b/r"})
    with pytest.raises(outputs.OutputContractError, match="would match --input"):
        outputs.check_contract(bad)
    assert outputs.SHARD_SUFFIX.search("x-00001-of-00003") and not outputs.SHARD_SUFFIX.search("x-1-of-3")


# --- the file system fails: exit 3, one line, nothing left -------------------------------------------


def test_unwritable_output_directory_is_one_line(work, capsys):
    (work / "afile").write_text("x")
    before = snapshot(work)
    code = run_cli(select_partitions, select_argv(work, output=work / "afile" / "items", report=work / "r.json"))
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and f"cannot write to {work / 'afile'}: {work / 'afile'} is a file" in lines[0], err
    assert snapshot(work) == before


def _big_input(path, items=1500):
    # every item held by 12 users of its own, with a long name: the release (all items at epsilon 8) is
    # ~300 KB, more than the small file system below holds
    path.write_text(
        "".join(f"u{i}_{j}\t{'item-' + str(i).zfill(4) + '-' + 'x' * 200}\n" for i in range(items) for j in range(12)),
        encoding="utf-8",
    )


@pytest.fixture
def small_disk(tmp_path):
    """A 96 KiB tmpfs if this machine lets us mount one (root, as here and in CI), else None."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], capture_output=True)
    yield mnt if ok.returncode == 0 else None
    if ok.returncode == 0:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_full_disk_fails_with_one_line_and_leaves_nothing(tmp_path, capsys, small_disk, monkeypatch):
    _big_input(tmp_path / "in.tsv")
    target = small_disk if small_disk is not None else tmp_path / "out"
    target.mkdir(exist_ok=True)
    if small_disk is None:  # no mount here: inject ENOSPC into every file write of the sink
        from apache_beam.io import localfilesystem

        real = localfilesystem.LocalFileSystem._path_open

        def full(self, path, mode, *a, **k):
            f = real(self, path, mode, *a, **k)
            if "w" in mode and "beam-temp" in path:
                f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path))
            return f

        monkeypatch.setattr(localfilesystem.LocalFileSystem, "_path_open", full)
    before = snapshot(tmp_path)
    argv = select_argv(tmp_path, "--algorithm", "basic", output=target / "items", report=target / "report.json")
    argv[argv.index("--epsilon") + 1] = "8"
    code = run_cli(select_partitions, argv)
    err = capsys.readouterr().err
    assert code == 3, err
    lines = error_lines(err)
    assert len(lines) == 1 and "No space left on device" in lines[0], err
    assert "Traceback" not in err
    assert os.listdir(target) == []  # partial shards and beam-temp staging removed
    assert snapshot(tmp_path) == before


# --- interrupted runs: exit 128 + signal, one line, outputs absent or complete --------------------------

# Runs the CLI with a hook that sends the given signal to this process right after the release's shards
# are final and before the report is written (outputs.list_shards is the report's first step).
_DRIVER = """
import os, signal, sys, time
from dp_partition_beam.pipelines import outputs, select_partitions
real = outputs.list_shards
def list_shards(*a, **k):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(5)
    return real(*a, **k)
outputs.list_shards = list_shards
sys.exit(select_partitions.run(sys.argv[2:]))
"""


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_between_the_release_and_the_report_leaves_nothing(work, sig, code):
    before = snapshot(work)
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, sig, *select_argv(work)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == code, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: interrupted by {sig}; removed"), proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert snapshot(work) == before  # the finished shards went too: no release without its report


def _consistent(out_dir):
    """Either nothing of the run is left, or the report exists and lists exactly the shards there."""
    names = sorted(os.listdir(out_dir))
    if not names:
        return True
    if "report.json" not in names:
        return False
    shards = json.loads((out_dir / "report.json").read_text())["outputs"]["shards"]
    listed = sorted(os.path.basename(s["path"]) for s in shards)
    return names == sorted(listed + ["report.json"]) and all(
        hashlib.sha256(open(s["path"], "rb").read()).hexdigest() == s["sha256"] for s in shards
    )


def test_sigterm_at_any_moment_leaves_outputs_absent_or_complete(tmp_path):
    _big_input(tmp_path / "in.tsv", items=400)
    argv = select_argv(tmp_path)
    (tmp_path / "out").mkdir()
    cmd = [sys.executable, "-m", "dp_partition_beam.pipelines.select_partitions", *argv, "--progress_interval", "0"]
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=REPO, capture_output=True, check=True, timeout=300)
    full = time.monotonic() - t0
    for name in os.listdir(tmp_path / "out"):
        os.remove(tmp_path / "out" / name)
    outcomes = set()
    for fraction in (0.3, 0.6, 0.8, 0.9, 0.95):
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(full * fraction)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        # -15: the signal came while Python was importing the modules or shutting down (before or after
        # run_main, whose handler covers the whole run): the default action ends the process, with
        # nothing written yet or the run complete (checked below)
        assert proc.returncode in (0, 143, -15), err
        assert proc.returncode == 143 or "error" not in err, err
        assert "Traceback" not in err
        if proc.returncode == 143:
            assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM"), err
        assert _consistent(tmp_path / "out"), (fraction, os.listdir(tmp_path / "out"))
        assert not [n for n in os.listdir(tmp_path / "out") if n.startswith("beam-temp")]
        outcomes.add(proc.returncode)
        for name in os.listdir(tmp_path / "out"):
            os.remove(tmp_path / "out" / name)
    assert 143 in outcomes  # at least one signal landed during the run


def test_sigterm_stops_the_multi_processing_workers(tmp_path):
    # The DirectRunner's multi_processing SDK workers are processes of their own: an interrupted run
    # stops them and exits 143 instead of hanging on the runner's threads or leaving them running.
    from dp_partition_beam.pipelines.cli import _descendants

    _big_input(tmp_path / "in.tsv", items=3000)
    (tmp_path / "out").mkdir()
    argv = select_argv(tmp_path)
    argv[argv.index("--direct_running_mode") + 1] = "multi_processing"
    cmd = [sys.executable, "-m", "dp_partition_beam.pipelines.select_partitions", *argv, "--direct_num_workers", "2"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers, deadline = [], time.monotonic() + 120
    while not workers and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        for pid in _descendants(proc.pid):
            try:
                if b"sdk_worker_main" in open(f"/proc/{pid}/cmdline", "rb").read():
                    workers.append(pid)
            except OSError:
                pass
    assert workers, "no SDK worker process seen"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM"), err
    time.sleep(2)
    alive = []
    for pid in workers:
        try:
            state = open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue  # gone
        if state != b"Z":
            alive.append(pid)
    assert alive == []
    assert not [n for n in os.listdir(tmp_path / "out") if not n.startswith("items") and n != "report.json"]
    assert _consistent(tmp_path / "out")


def test_a_worker_started_after_the_signal_is_stopped_too():
    # CI's hang: SIGTERM stopped the first multi_processing worker, the runner started the second one
    # just after, and Beam's clean-up joined it forever. Here the "runner" starts a process while the
    # Interrupted unwinds: it must be stopped (SIGTERM, -15) within seconds, not run its 60 s.
    script = textwrap.dedent(
        """
        import os, signal, subprocess, time
        from dp_partition_beam.pipelines.cli import Interrupted, interruptible
        with interruptible():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except Interrupted:
                start = time.monotonic()
                late = subprocess.Popen(["sleep", "60"])
                late.wait(timeout=20)
                print(late.returncode, round(time.monotonic() - start, 1))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    code, seconds = done.stdout.split()
    assert int(code) == -signal.SIGTERM and float(seconds) < 5, done.stdout


def test_relative_paths_and_a_bare_input_glob_work_from_the_current_directory(work, capsys, monkeypatch):
    """A bare relative glob (``in*.tsv``) and a bare output prefix: Beam's file system matches such a
    pattern against nothing (it lists the directory ``''``), so the input was "no file matches" and a
    finished run failed its own shard listing (exit 3). The CLIs make local paths absolute first."""
    from dp_partition_beam.pipelines import verify

    monkeypatch.chdir(work)
    argv = select_argv(work, output="items", report="report.json")
    argv[argv.index("--input") + 1] = "in*.tsv"
    assert run_cli(select_partitions, argv) == 0, capsys.readouterr().err
    report = json.loads((work / "report.json").read_text())
    assert report["outputs"]["release"] == str(work / "items") + "-?????-of-?????"
    assert [s["path"] for s in report["outputs"]["shards"]] == [str(work / "items-00000-of-00001")]
    assert sorted((work / "items-00000-of-00001").read_text().split()) == ["a", "b", "c"]
    assert verify.run(["report.json"]) == 0


def test_verify_checks_a_release_against_its_report(work, capsys):
    from dp_partition_beam.pipelines import verify

    assert run_cli(select_partitions, select_argv(work)) == 0
    report = str(work / "out" / "report.json")
    capsys.readouterr()
    assert verify.run([report]) == 0
    assert "complete: 1 shard(s)" in capsys.readouterr().out
    shard = work / "out" / "items-00000-of-00001"
    shard.write_text(shard.read_text() + "injected\n")
    (work / "out" / "items-00001-of-00002").write_text("stray\n")
    assert verify.run([report]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "changed since the run" in err[0] and "not a shard of this run" in err[1]
    shard.unlink()
    assert verify.run([report]) == 1 and f"{shard}: missing" in capsys.readouterr().err
    assert verify.run([str(work / "in.tsv")]) == 3 and "cannot read the report" in capsys.readouterr().err


def test_missing_input_is_one_line_and_leaves_no_directory(tmp_path):
    # In a subprocess, as a user sees it: no Beam ERROR record or traceback before the one line, and the
    # output directories the run created are gone again.
    argv = select_argv(tmp_path, output=tmp_path / "new" / "deeper" / "items", report=tmp_path / "new" / "r.json")
    argv[1] = str(tmp_path / "nowhere" / "*.tsv")
    before = snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "dp_partition_beam.pipelines.select_partitions", *argv, "--progress_interval", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr
    seeded = "WARNING dp_partition_beam.transforms.core.randomness"
    lines = [l for l in proc.stderr.splitlines() if not l.startswith(seeded)]
    assert lines == [f"error: input: no file matches {tmp_path / 'nowhere' / '*.tsv'}"], proc.stderr
    assert snapshot(tmp_path) == before


def test_verify_is_installed_as_a_console_script(work):
    path = os.path.join(os.path.dirname(sys.executable), "dp-verify-release")
    assert os.path.isfile(path), "dp-verify-release is not installed (pip install -e .)"
    proc = subprocess.run([path, str(work / "nothing.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stderr.startswith("error: cannot read the report"), proc.stderr


def test_a_report_next_to_the_release_may_share_its_prefix(work, capsys):
    # --output out/ngrams --report out/ngrams_report.json: not a shard name, so allowed; on the next run it
    # is this run's own report (removed by --overwrite), not a foreign file under the prefix.
    argv = select_argv(work, report=work / "out" / "items_report.json")
    assert run_cli(select_partitions, argv) == 0
    assert run_cli(select_partitions, argv) == 2
    assert "in the way" in capsys.readouterr().err
    assert run_cli(select_partitions, argv + ["--overwrite"]) == 0
    assert sorted(p.name for p in (work / "out").iterdir()) == ["items-00000-of-00001", "items_report.json"]
