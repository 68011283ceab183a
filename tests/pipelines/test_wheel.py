"""The built wheel: it holds only ``dp_partition_beam``, and installed outside the checkout every console script runs.

A user installs the package next to their own code, which may well have folders named ``privacy``,
``transforms`` or ``pipelines`` (PyPI has distributions of the last two names). The wheel therefore puts
one name into site-packages, ``dp_partition_beam``, and the commands must work from any directory.

The test builds the wheel from the tracked files (a copy of ``git ls-files``, so nothing untracked sneaks
in), installs it without dependencies into a fresh virtual environment whose third-party packages
(apache-beam, numpy, ...) come from the test environment through a ``.pth`` line (a full dependency
install would download ~100 MB per run; the line adds a plain directory, so the editable install of the
checkout that lives there is not activated: ``dp_partition_beam`` can only come from the wheel, which the
test checks), and runs each console script from a temporary directory that holds a user's own
``privacy``/``transforms``/``pipelines`` packages, each of which raises on import.
"""

import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "data")
SCRIPTS = ("dp-select-partitions", "dp-extract-ngrams", "dp-bayesian-ngrams", "dp-bayesian-eval", "dp-verify-release")
WORDS_LINES, TEXT_LINES = 12_000, 200
DIRECT = ["--runner", "DirectRunner", "--direct_running_mode", "in_memory"]

pytestmark = pytest.mark.slow


def _run(argv, cwd, env, timeout=600):
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv[0]} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the tracked files."""
    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if os.path.isfile(os.path.join(REPO, rel)):
            os.makedirs(os.path.join(src, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), os.path.join(src, rel))
    out = tmp_path_factory.mktemp("wheelhouse")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)], src, os.environ)
    (whl,) = out.glob("dp_partition_beam-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """(bin directory, environment) of a fresh venv with the wheel installed."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    py = root / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    with open(os.path.join(purelib, "zz_test_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # third-party packages of the test environment
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    _run([py, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], str(root), env)
    return root / "bin", env


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """A user's working directory with their own privacy/transforms/pipelines packages and small inputs."""
    d = tmp_path_factory.mktemp("user")
    for name in ("privacy", "transforms", "pipelines"):
        os.makedirs(d / name)
        (d / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name} package was imported')\n")
    # cuts of the bundled samples, still gzipped: where the commands run and which package they import is
    # what is tested, not the data; the full samples made the runs ~3x the CPU. 12,000 tsv lines (100 users)
    # release 36 items at --epsilon 8 under --seed 3, 200 jsonl lines (200 users) 17 n-grams
    for name, lines in (("debian_words.tsv.gz", WORDS_LINES), ("debian_text.jsonl.gz", TEXT_LINES)):
        with gzip.open(os.path.join(DATA, name), "rt", encoding="utf-8") as f:
            head = "".join(itertools.islice(f, lines))
        with gzip.open(d / name, "wt", encoding="utf-8") as out:
            out.write(head)
    shutil.copy(os.path.join(DATA, "bayesian_public_trigrams.tsv.gz"), d / "bayesian_public_trigrams.tsv.gz")
    return d


def test_the_wheel_holds_only_dp_partition_beam(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"dp_partition_beam", wheel.name.split("-py")[0] + ".dist-info"}, tops
    for package in ("privacy", "transforms", "pipelines"):
        assert f"dp_partition_beam/{package}/__init__.py" in names
    assert "dp_partition_beam/transforms/core/randomness.py" in names
    assert not any("tests/" in n or "benchmarks/" in n for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in SCRIPTS:
        assert f"{script} = dp_partition_beam.pipelines." in text


def test_the_installed_package_comes_from_the_wheel_not_the_checkout(venv, user_dir):
    bindir, env = venv
    code = "import dp_partition_beam.transforms as t, dp_partition_beam.privacy as p; print(t.__file__, p.__file__)"
    files = _run([str(bindir / "python"), "-c", code], str(user_dir), env).stdout.split()
    assert len(files) == 2 and all(f.startswith(str(bindir.parent)) for f in files), files
    # the user's own packages of the same short names are still theirs
    proc = subprocess.run(
        [str(bindir / "python"), "-c", "import transforms"], cwd=user_dir, env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "the user's own transforms package" in proc.stderr


def test_every_console_script_runs_on_a_users_file_outside_the_checkout(venv, user_dir):
    """Each of SCRIPTS runs a release (or verifies or evaluates one) below; their --help is run on the editable
    install (tests/pipelines/test_cli_common.py), and here once through python -m."""
    bindir, env = venv
    # python -m puts the working directory first on sys.path: the user's own packages must not get in the way
    module = [str(bindir / "python"), "-m", "dp_partition_beam.pipelines.select_partitions", "--help"]
    assert "usage: dp-select-partitions" in _run(module, str(user_dir), env).stdout
    _run(
        [str(bindir / "dp-select-partitions"), "--input", "debian_words.tsv.gz", "--input_format", "tsv"]
        + ["--output", "out/items", "--report", "out/report.json", "--epsilon", "8", "--delta", "1e-5"]
        + ["--max_contributions", "100", "--seed", "3"]
        + DIRECT,
        str(user_dir),
        env,
    )
    report = json.loads((user_dir / "out" / "report.json").read_text())
    assert report["released"] > 0 and report["algorithm"] == "mad_sips"
    proc = _run([str(bindir / "dp-verify-release"), "out/report.json"], str(user_dir), env)
    assert proc.returncode == 0
    _run(
        [str(bindir / "dp-extract-ngrams"), "--input", "debian_text.jsonl.gz", "--input_format", "jsonl"]
        + ["--output", "out/ngrams", "--report", "out/ngrams.json", "--max_n", "3", "--epsilon", "4"]
        + ["--delta", "1e-7", "--max_contributions", "100", "--seed", "3"]
        + DIRECT,
        str(user_dir),
        env,
    )
    assert json.loads((user_dir / "out" / "ngrams.json").read_text())["released"] > 0
    bayes = ["--private", "debian_text.jsonl.gz", "--input_format", "jsonl"]
    bayes += ["--public", "bayesian_public_trigrams.tsv.gz", "--n", "3", "--C", "1", "--W", "100"]
    _run(
        [str(bindir / "dp-bayesian-ngrams"), *bayes, "--output", "out/probs", "--report", "out/bayes.json"]
        + ["--epsilon", "1", "--delta", "1e-5", "--seed", "3"]
        + DIRECT,
        str(user_dir),
        env,
    )
    assert (user_dir / "out" / "bayes.json").is_file()
    proc = _run(
        [str(bindir / "dp-bayesian-eval"), *bayes, "--epsilons", "1", "--repeats", "1", "--seed", "3"],
        str(user_dir),
        env,
    )
    assert proc.stdout.strip()
