"""End-to-end tests of ``dp-bayesian-ngrams`` and ``dp-bayesian-eval`` (run as ``python -m`` modules)."""

import glob
import gzip
import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dp_partition_beam.pipelines import bayesian_eval, bayesian_ngrams
from dp_partition_beam.privacy.bayesian import BayesianParams
from dp_partition_beam.transforms.bayesian.reference import release

from tests.transforms.bayesian.test_bayesian_beam import PRIOR, TEXTS


def write_private(tmp_path, fmt):
    rows = [(u, t) for u, docs in TEXTS.items() for t in docs]
    if fmt == "jsonl":
        path = tmp_path / "private.jsonl"
        path.write_text("".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in rows), encoding="utf-8")
    elif fmt == "tsv":  # one line per record: the tsv format has no line breaks inside a text
        path = tmp_path / "private.tsv"
        path.write_text("".join(f"{u}\t{line}\n" for u, t in rows for line in t.split("\n")), encoding="utf-8")
    else:
        path = tmp_path / "private.parquet"
        pq.write_table(pa.table({"user": [u for u, _ in rows], "text": [t for _, t in rows]}), path)
    return str(path)


def write_public(tmp_path, lines=None, name="public.tsv.gz"):
    path = tmp_path / name
    if lines is None:
        lines = [f"{g}\t{a:g}" for g, a in zip(PRIOR.vocab, PRIOR.alpha)]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def run_cli(tmp_path, private, fmt, public, *extra, name="out"):
    out, report = tmp_path / name / "probs", tmp_path / name / "report.json"
    # the budget is required (delta by the Gaussian mechanisms only); extra may set it, once
    mechanism = extra[extra.index("--mechanism") + 1] if "--mechanism" in extra else "bayesian"
    gaussian = mechanism in ("bayesian", "bayesian_data_dependent")
    budget = {"--epsilon": "1", "--delta": "1e-5"} if gaussian else {"--epsilon": "1"}
    argv = [
        "--private",
        private,
        "--input_format",
        fmt,
        "--public",
        public,
        "--output",
        str(out),
        "--report",
        str(report),
        "--n",
        "2",
        "--C",
        "2",
        "--W",
        "6",
        *(a for flag, value in budget.items() if flag not in extra for a in (flag, value)),
        "--direct_running_mode",
        "in_memory",
        *extra,
    ]
    code = bayesian_ngrams.run(argv)
    lines = [l.rstrip("\n") for p in sorted(glob.glob(str(out) + "*")) for l in open(p, encoding="utf-8")]
    dist = {l.split("\t")[0]: float(l.split("\t")[1]) for l in lines}
    rep = json.loads(report.read_text()) if report.exists() else None
    return code, dist, rep


REFERENCE_ARGS = ("--epsilon", "2", "--S", "0.5", "--rho", "0.4", "--seed", "4")
REFERENCE_PARAMS = BayesianParams(n=2, C=2, W=6, epsilon=2.0, S=0.5, rho=0.4)
DD_ARGS = ("--mechanism", "bayesian_data_dependent", "--acknowledge_data_dependent")


@pytest.fixture(scope="module")
def jsonl_release(tmp_path_factory):
    """One seeded jsonl CLI run, shared: the reference equality below reads its result and the eval test
    scores its output files (one BayesianNgrams pipeline, ~2 CPU-s, instead of one per test)."""
    tmp_path = tmp_path_factory.mktemp("jsonl_release")
    private, public = write_private(tmp_path, "jsonl"), write_public(tmp_path)
    code, dist, rep = run_cli(tmp_path, private, "jsonl", public, *REFERENCE_ARGS)
    return {"run": (code, dist, rep), "private": private, "public": public, "probs": tmp_path / "out" / "probs"}


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_cli_default_equals_reference_and_reports_a_worst_case_guarantee(tmp_path, fmt, request):
    if fmt == "jsonl":
        code, dist, rep = request.getfixturevalue("jsonl_release")["run"]
    else:
        code, dist, rep = run_cli(tmp_path, write_private(tmp_path, fmt), fmt, write_public(tmp_path), *REFERENCE_ARGS)
    assert code == 0
    want, _ = release(TEXTS, "bayesian", PRIOR, REFERENCE_PARAMS, seed=4)
    assert dist == want
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    assert rep["sensitivity"] == "data-independent" and rep["guarantee_kind"] == "worst-case (epsilon, delta)-DP"
    assert rep["S"] == 0.5 and rep["rho"] == 0.4 and rep["epsilon"] == 2.0 and rep["delta"] == 1e-5
    assert rep["private"] is False  # seeded
    assert rep["noise"] == "discrete_gaussian" and rep["l2_sensitivity"] == math.sqrt(3 * 4)  # W=6, C=2


def test_cli_data_dependent_needs_the_acknowledgement_and_names_no_worst_case_budget(tmp_path, capsys):
    """The paper's mechanism runs only with --acknowledge_data_dependent; its report says guarantee_kind
    'data-dependent', has no epsilon/delta field (data_dependent_epsilon, ...) and its summary line says
    NOT worst-case DP; the stderr warning names the outlier risk."""
    private, public = write_private(tmp_path, "jsonl"), write_public(tmp_path)
    with pytest.raises(SystemExit) as e:
        run_cli(tmp_path, private, "jsonl", public, "--mechanism", "bayesian_data_dependent", name="no_ack")
    assert e.value.code == 2 and "--acknowledge_data_dependent" in capsys.readouterr().err
    code, dist, rep = run_cli(tmp_path, private, "jsonl", public, *DD_ARGS, *REFERENCE_ARGS, name="dd")
    out, err = capsys.readouterr()
    assert code == 0
    params = REFERENCE_PARAMS.replace(acknowledge_data_dependent=True)
    assert dist == release(TEXTS, "bayesian_data_dependent", PRIOR, params, seed=4)[0]
    assert rep["guarantee_kind"] == "data-dependent" and rep["private"] is False
    assert "NOT a worst-case" in rep["guarantee"] and "outlier" in err
    budget = {k for k in rep if "epsilon" in k or "delta" in k}
    assert budget and all(k.startswith("data_dependent_") for k in budget), budget
    assert rep["data_dependent_epsilon"] == 2.0 and rep["data_dependent_delta"] == 1e-5
    summary = [l for l in out.splitlines() if l.startswith("released")]
    assert len(summary) == 1 and "NOT worst-case DP" in summary[0] and "privately" not in summary[0]
    assert "gamma" not in json.dumps(rep) and "sigma_ps" not in rep  # data-dependent values stay out
    with pytest.raises(SystemExit) as e:  # the acknowledgement is for the data-dependent mechanisms only
        run_cli(tmp_path, private, "jsonl", public, "--acknowledge_data_dependent", name="ack_default")
    assert e.value.code == 2 and "acknowledge_data_dependent" in capsys.readouterr().err


def test_cli_tsv_tune_and_laplace(tmp_path):
    private = write_private(tmp_path, "tsv")
    public = write_public(tmp_path)
    code, dist, rep = run_cli(
        tmp_path,
        private,
        "tsv",
        public,
        *DD_ARGS,
        "--tune",
        "--S_grid",
        "0.01,1",
        "--rho_grid",
        "0.3,0.7",
        "--tune_epsilon_fraction",
        "0.25",
        "--seed",
        "1",
        name="t",
    )
    assert code == 0 and set(dist) == set(PRIOR.vocab)
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-12)
    assert rep["data_dependent_epsilon_tune"] == 0.25 and rep["data_dependent_epsilon_release"] == 0.75
    assert rep["tune_candidates"] == 4
    assert (rep["S"], rep["rho"]) in {(0.01, 0.3), (0.01, 0.7), (1.0, 0.3), (1.0, 0.7)}
    code, dist, rep = run_cli(tmp_path, private, "tsv", public, "--mechanism", "laplace", name="l")
    assert code == 0 and rep["sensitivity"] == "data-independent" and rep["laplace_scale"] == 6.0
    assert rep["delta"] == 0.0 and rep["private"] is True
    assert math.fsum(dist.values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["a b\tx"], "count must be a number"),
        (["a b\t-1"], "finite and >= 0"),
        (["a b c\t1"], "n-gram of 2 words"),
        (["a b\t1", "a b\t2"], "duplicate n-gram"),
        (["a b 1"], "expected n-gram<TAB>count"),
    ],
)
def test_bad_public_file_is_a_parameter_error(tmp_path, capsys, lines, message):
    with pytest.raises(SystemExit) as e:
        run_cli(tmp_path, write_private(tmp_path, "jsonl"), "jsonl", write_public(tmp_path, lines))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "public.tsv.gz:" in err


def test_bad_parameters_and_bad_private_record(tmp_path, capsys):
    public = write_public(tmp_path)
    with pytest.raises(SystemExit) as e:
        run_cli(tmp_path, write_private(tmp_path, "jsonl"), "jsonl", public, "--rho", "2")
    assert e.value.code == 2 and "rho must be in" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user": "a", "text": "fix bug"}\n{"user": "b"}\n', encoding="utf-8")
    code, _, _ = run_cli(tmp_path, str(bad), "jsonl", public, name="bad")
    assert code == 3 and "bad.jsonl:2" in capsys.readouterr().err
    diag = tmp_path / "diag.json"
    code, dist, rep = run_cli(
        tmp_path, str(bad), "jsonl", public, "--skip_bad_records", "--diagnostics", str(diag), name="skip"
    )
    assert code == 0 and "diagnostics_non_private" not in rep  # the exact count is not in the report
    assert json.loads(diag.read_text())["counts"]["malformed_records"] == 1


def test_eval_command_prints_kl_per_mechanism(jsonl_release, capsys):
    """dp-bayesian-eval scores each mechanism at each epsilon, the public prior and a release of
    dp-bayesian-ngrams (the shared jsonl run's files, named by their prefix)."""
    private, public = jsonl_release["private"], jsonl_release["public"]
    assert jsonl_release["run"][0] == 0
    capsys.readouterr()
    assert (
        bayesian_eval.run(
            [
                "--private",
                private,
                "--input_format",
                "jsonl",
                "--public",
                public,
                "--n",
                "2",
                "--epsilons",
                "0.5,4",
                "--repeats",
                "2",
                "--C",
                "2",
                "--W",
                "6",
                "--distribution",
                f"cli={jsonl_release['probs']}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    rows = [l.split() for l in out.splitlines()[3:]]
    names = [(r[0], r[1]) for r in rows]
    for mech in ("bayesian", "bayesian_data_dependent", "laplace", "laplace_public"):
        assert (mech, "0.5") in names and (mech, "4") in names
    assert ("public", "-") in names and ("cli", "-") in names
    kl = {(r[0], r[1]): float(r[2]) for r in rows}
    assert all(v >= 0 and math.isfinite(v) for v in kl.values())
    assert kl[("laplace", "4")] < kl[("laplace", "0.5")]  # seeds 0-1 (deterministic): 0.18 vs 3.4 nats


def _eval(private, public, *extra):
    argv = ["--private", private, "--input_format", "jsonl", "--public", public, "--n", "2", "--C", "2", "--W", "6"]
    return bayesian_eval.run(argv + ["--epsilons", "1", "--repeats", "1", *extra])


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated_public", "truncated gzip stream"),
        ("missing_private", "--private: no file matches"),
        ("truncated_distribution", "truncated gzip stream"),
        ("bad_probability", "expected n-gram<TAB>probability"),
        ("no_shards", "--distribution: no file matches"),
    ],
)
def test_eval_data_errors_are_one_line_and_exit_3(tmp_path, capsys, damage, message):
    """A damaged or missing input file of dp-bayesian-eval is a data error (exit 3, one ``error:`` line), as in
    the release commands; a --distribution prefix means the release's shards, not every file it starts."""
    private = write_private(tmp_path, "jsonl")
    public = write_public(tmp_path)
    extra = []
    if damage == "truncated_public":
        data = open(public, "rb").read()
        open(public, "wb").write(data[: len(data) // 2])
    elif damage == "missing_private":
        private = str(tmp_path / "nope.jsonl")
    else:
        gram = PRIOR.vocab[0]
        shard = tmp_path / "rel-00000-of-00001"
        shard.write_text(f"{gram}\t0.5\n" if damage != "bad_probability" else f"{gram}\thalf\n")
        extra = ["--distribution", f"x={tmp_path / 'rel'}"]
        if damage == "truncated_distribution":  # a compressed copy, named by a glob
            (tmp_path / "copy.gz").write_bytes(gzip.compress(shard.read_bytes())[:-6])
            extra = ["--distribution", f"x={tmp_path / '*.gz'}"]
        if damage == "no_shards":  # a file that merely starts with the prefix is not a shard of the release
            shard.rename(tmp_path / "rel.txt")
    capsys.readouterr()
    assert _eval(private, public, *extra) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_eval_reads_a_release_by_its_shards(tmp_path, capsys):
    """The happy path of the check above: the same shard, undamaged, is scored (exit 0, a row named x)."""
    private = write_private(tmp_path, "jsonl")
    public = write_public(tmp_path)
    (tmp_path / "rel-00000-of-00001").write_text(f"{PRIOR.vocab[0]}\t1\n")
    (tmp_path / "rel.txt").write_text("not a shard: never read\n")
    assert _eval(private, public, "--distribution", f"x={tmp_path / 'rel'}") == 0
    assert any(line.split()[:1] == ["x"] for line in capsys.readouterr().out.splitlines())


def test_eval_ceiling_prints_the_best_grid_point_per_epsilon(tmp_path, capsys):
    private, public = write_private(tmp_path, "jsonl"), write_public(tmp_path)
    assert _eval(private, public, "--mechanisms", "bayesian_data_dependent", "--ceiling") == 0
    rows = {l.split()[0]: l.split() for l in capsys.readouterr().out.splitlines()[3:]}
    assert rows["ceiling"][1] == "1" and rows["ceiling"][4].startswith("S=") and rows["ceiling"][5].startswith("rho=")
    # the ceiling is Algorithm 1's best grid point; the data-dependent mechanism's own choice is a grid point
    assert float(rows["ceiling"][2]) <= float(rows["bayesian_data_dependent"][2])
