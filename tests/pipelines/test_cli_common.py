"""What every CLI shares (issues 15 and 20): strict flags, one behaviour on empty input, seeds and
errors, quiet logs by default, flags generated from the parameter dataclasses, console scripts.

The subprocess tests run the real commands, as a user would: stderr is what the user sees.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from dp_partition_beam.pipelines import bayesian_eval, bayesian_ngrams, cli, extract_ngrams, registry, select_partitions
from dp_partition_beam.privacy import BayesianParams, DPNEParams, SelectionParams
from dp_partition_beam.privacy.selection import ALGORITHMS

from tests.support.pipeline_cases import PIPELINES, REPO, cli_args, cut_sample, sample_args

CLI_MODULES = {
    "select_partitions": select_partitions,
    "extract_ngrams": extract_ngrams,
    "bayesian_ngrams": bayesian_ngrams,
    "bayesian_eval": bayesian_eval,
}
PARAMS_OF = {"select_partitions": SelectionParams, "extract_ngrams": DPNEParams, "bayesian_ngrams": BayesianParams}
WARNING = "NOT differentially private"


def base_argv(name, tmp_path):
    """A complete, valid argument list of the CLI (inputs need not exist: the flag check comes first)."""
    if name == "bayesian_eval":
        return ["--private", str(tmp_path / "p.jsonl"), "--input_format", "jsonl", "--public", str(tmp_path / "pub")]
    spec = registry.get(name)
    return [
        f"--{spec.input_flag}",
        str(tmp_path / "in"),
        "--input_format",
        spec.input_format,
        "--output",
        str(tmp_path / "out" / "released"),
        "--report",
        str(tmp_path / "out" / "report.json"),
        *sample_args(spec),
    ]


def run_module(name, argv):
    return subprocess.run(
        [sys.executable, "-m", f"dp_partition_beam.pipelines.{name}", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


# --- strict flags (issue 20) ---------------------------------------------------------------------------

TYPOS = [
    ("select_partitions", ["--acounting", "basic"], "--acounting", "--accounting"),
    ("select_partitions", ["--max_contribution", "2"], "--max_contribution", "--max_contributions"),
    ("select_partitions", ["--budget-split", "0.5,0.5"], "--budget-split", "--budget_split"),
    ("select_partitions", ["--release_count"], "--release_count", "--release_counts"),
    ("extract_ngrams", ["--max_contribution", "2"], "--max_contribution", "--max_contributions"),
    ("extract_ngrams", ["--min_user", "3"], "--min_user", "--min_users"),
    ("extract_ngrams", ["--prunning=single"], "--prunning", "--pruning"),
    ("bayesian_ngrams", ["--mechansim", "laplace"], "--mechansim", "--mechanism"),
    ("bayesian_ngrams", ["--sensitivty=bound"], "--sensitivty", "--sensitivity"),
    ("bayesian_eval", ["--epsilon", "1"], "--epsilon", "--epsilons"),
    ("bayesian_eval", ["--job_name", "x"], "--job_name", None),  # in memory: Beam options do not apply
]


@pytest.mark.parametrize("name,extra,flag,suggestion", TYPOS, ids=[f"{t[0]}{t[1][0]}" for t in TYPOS])
def test_unknown_or_abbreviated_flag_stops_the_run_naming_it(name, extra, flag, suggestion, tmp_path, capsys):
    argv = base_argv(name, tmp_path) + extra
    with pytest.raises(SystemExit) as e:
        CLI_MODULES[name].run(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no usage block, no traceback
    assert f"unknown flag {flag} " in lines[0], err
    if suggestion:
        assert f"did you mean {suggestion}?" in lines[0], err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_abbreviation_of_our_flag_is_not_taken_for_it(tmp_path, capsys):
    """argparse's prefix matching would read --max_contribution 2 as --max_contributions 2."""
    parser = select_partitions.build_parser()
    argv = base_argv("select_partitions", tmp_path) + ["--max_contribution", "2"]
    args, extra = argparse.ArgumentParser.parse_known_args(parser, argv)  # argparse's parse, before our checks
    assert args.max_contributions == 20 and extra == ["--max_contribution", "2"]  # 20: the sample args
    with pytest.raises(SystemExit) as e:  # and the strict parse stops on it
        parser.parse_known_args(argv)
    assert e.value.code == 2 and "unknown flag --max_contribution " in capsys.readouterr().err


BEAM_OPTIONS = [
    ["--job_name", "x"],
    ["--job_name=x"],
    ["--direct_num_workers", "2"],
    ["--direct_running_mode", "multi_processing", "--direct_num_workers=2"],
    ["--runner", "FlinkRunner", "--flink_master=localhost:8081", "--parallelism", "2"],
    ["--runner=PortableRunner", "--job_endpoint", "localhost:8099", "--environment_type=LOOPBACK"],
    ["--experiments", "a", "--experiments=b"],
]


@pytest.mark.parametrize("name", ["select_partitions", "extract_ngrams", "bayesian_ngrams"])
@pytest.mark.parametrize("options", BEAM_OPTIONS, ids=[o[0] for o in BEAM_OPTIONS])
def test_beam_pipeline_options_pass_the_check(name, options, tmp_path):
    parser = CLI_MODULES[name].build_parser()
    _, extra = parser.parse_known_args(base_argv(name, tmp_path) + options)
    assert extra  # they are not ours ...
    assert cli.unknown_arg_message(parser, extra) is None  # ... but Beam knows them


def test_beam_option_with_a_bad_value_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        select_partitions.run(base_argv("select_partitions", tmp_path) + ["--direct_num_workers", "two"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--direct_num_workers" in err[0] and "'two'" in err[0], err


@pytest.mark.parametrize("name", ["select_partitions", "extract_ngrams", "bayesian_ngrams"])
def test_dataflow_options_pass_the_check(name, tmp_path):
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="the gcp extra is not installed")
    parser = CLI_MODULES[name].build_parser()
    dataflow = ["--runner", "DataflowRunner", "--project", "p", "--region", "r", "--temp_location", "gs://b/t"]
    dataflow += ["--setup_file=./setup.py", "--max_num_workers", "4", "--machine_type=n2-standard-4"]
    dataflow += ["--service_account_email", "a@b.iam.gserviceaccount.com", "--dataflow_service_options=x"]
    _, extra = parser.parse_known_args(base_argv(name, tmp_path) + dataflow)
    assert cli.unknown_arg_message(parser, extra) is None
    assert "--projet" in cli.unknown_arg_message(parser, extra + ["--projet", "q"])  # the check is live


def test_the_beam_parser_knows_every_option_class_beam_collects():
    """Same collection as PipelineOptions.get_all_options: every PipelineOptions subclass's flags."""
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = set(cli._flags_of(cli.beam_option_parser()))
    assert {"--runner", "--job_name", "--direct_num_workers", "--project", "--flink_master", "--render_port"} <= flags
    names = {cls.__name__ for cls in PipelineOptions.__subclasses__()}
    assert {"StandardOptions", "GoogleCloudOptions", "FlinkRunnerOptions", "SparkRunnerOptions"} <= names


@pytest.mark.parametrize("spec", PIPELINES, ids=[s.name for s in PIPELINES])
def test_flex_template_launch_arguments_pass_the_check(spec, tmp_path):
    """A Flex Template launcher passes the parameters the user set as --name=value (here: the required
    ones and those of the sample run), plus Beam options."""
    meta = json.load(open(os.path.join(REPO, "templates", spec.name, "metadata.json")))
    parser = spec.module().build_parser()
    sample = dict(zip(spec.sample_args[::2], spec.sample_args[1::2]))
    argv = []
    for p in meta["parameters"]:
        value = sample.get(f"--{p['name']}")
        if p["name"] in (spec.input_flag, "output", "report", "diagnostics", "public", "evaluate_against", "plots"):
            value = f"gs://bucket/{p['name']}"
        if p["name"] == "input_format":
            value = spec.input_format
        if value is None:
            assert p["isOptional"], p["name"]
            continue
        value = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        argv.append(f"--{p['name']}={value}")
    launcher = ["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t"]
    launcher += ["--staging_location=gs://b/s", "--job_name=j", "--setup_file=/template/setup.py"]
    args, extra = parser.parse_known_args(argv + launcher)
    assert cli.unknown_arg_message(parser, extra) is None, extra
    spec.module().params_from_args(args)  # and the values are valid parameters


# --- flags from the dataclass --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["select_partitions", "extract_ngrams", "bayesian_ngrams"])
def test_privacy_flags_are_the_params_fields_with_their_help(name):
    cls = PARAMS_OF[name]
    parser = CLI_MODULES[name].build_parser()
    actions = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(cls):
        a = actions.get(f.name)
        assert a is not None, f"--{f.name} missing"
        assert a.help.startswith(f.metadata["help"]), f.name
        if f.default is dataclasses.MISSING or f.name in ("epsilon", "delta"):  # the budget: no CLI default
            assert a.required or f.name in parser.required_where_used, f.name
            assert a.default is None, f.name
        elif isinstance(a, argparse._StoreTrueAction):
            assert f.default is False
        else:
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            assert a.default in (default, [default]), f.name
        if "choices" in f.metadata:
            assert tuple(a.choices) == tuple(f.metadata["choices"]), f.name


@pytest.mark.parametrize("name", list(PARAMS_OF))
def test_params_from_args_builds_the_dataclass_from_its_flags(name, tmp_path):
    """Fields not given on the command line take the dataclass default; a given flag sets its field."""
    cls, spec, module = PARAMS_OF[name], registry.get(name), CLI_MODULES[name]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    args, _ = module.build_parser().parse_known_args(base_argv(name, tmp_path))
    got = module.params_from_args(args)
    given = {flag[2:] for flag in spec.sample_args[::2]} & set(fields)
    kept = {k: getattr(got, k) for k, f in fields.items() if k in given or f.default is dataclasses.MISSING}
    assert got == cls(**kept)  # every other field has its default
    argv = base_argv(name, tmp_path)
    argv[argv.index("--delta") + 1] = "1e-9"
    args, _ = module.build_parser().parse_known_args(argv)
    assert module.params_from_args(args) == got.replace(delta=1e-9)


def test_list_flags_parse_into_the_dataclass(tmp_path):
    parser = extract_ngrams.build_parser()
    args, _ = parser.parse_known_args(base_argv("extract_ngrams", tmp_path))
    args.max_contributions = cli.int_list("5,6,7")
    assert extract_ngrams.params_from_args(args).max_contributions == (5, 6, 7)
    args.max_contributions = cli.int_list("9")
    assert extract_ngrams.params_from_args(args).max_contributions == 9
    parser = bayesian_ngrams.build_parser()
    dd = ["--mechanism", "bayesian_data_dependent", "--acknowledge_data_dependent", "--tune"]
    args, _ = parser.parse_known_args(base_argv("bayesian_ngrams", tmp_path) + dd)
    args.S_grid = cli.float_list("0.1,1")
    p = bayesian_ngrams.params_from_args(args)
    assert p.tune is True and p.S_grid == (0.1, 1.0)


def test_algorithm_choices_and_help_come_from_the_registry():
    action = {a.dest: a for a in select_partitions.build_parser()._actions}["algorithm"]
    assert tuple(action.choices) == tuple(ALGORITHMS)
    for spec in ALGORITHMS.values():
        assert spec.summary in action.help


# --- the three CLIs behave alike (issue 15 point 4) ----------------------------------------------------


def _empty_input(spec, tmp_path):
    path = tmp_path / f"empty.{spec.input_format}"
    path.write_text("", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("spec", PIPELINES, ids=[s.name for s in PIPELINES])
def test_empty_private_input_fails_alike_without_traceback(spec, tmp_path):
    path = _empty_input(spec, tmp_path)
    proc = run_module(spec.name, cli_args(spec, path, str(tmp_path / "out"), "--direct_running_mode", "in_memory"))
    assert proc.returncode == 3, proc.stderr
    assert f"error: input: no records in {path}" in proc.stderr
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "out" / "report.json")  # no pure-noise release


@pytest.mark.parametrize("spec", PIPELINES, ids=[s.name for s in PIPELINES])
def test_seeded_run_warns_and_default_run_is_quiet(spec, tmp_path):
    """Default log level: our progress, the seed warning and the summary; no Beam log line at all."""
    path = cut_sample(spec, tmp_path)
    proc = run_module(spec.name, cli_args(spec, path, str(tmp_path / "out"), "--direct_running_mode", "in_memory"))
    assert proc.returncode == 0, proc.stderr
    assert WARNING in proc.stderr  # cli_args passes --seed
    assert "apache_beam" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 6, proc.stderr
    assert "released" in proc.stdout


def test_log_level_info_brings_beam_logs_back(tmp_path):
    spec = registry.get("select_partitions")
    path = cut_sample(spec, tmp_path)
    argv = cli_args(spec, path, str(tmp_path / "out"), "--direct_running_mode", "in_memory", "--log_level", "INFO")
    proc = run_module(spec.name, argv)
    assert proc.returncode == 0, proc.stderr
    assert "INFO apache_beam" in proc.stderr


def test_sequential_size_guard_prints_one_line_no_beam_error(tmp_path):
    spec = registry.get("select_partitions")
    path = cut_sample(spec, tmp_path)
    argv = cli_args(spec, path, str(tmp_path / "out"), "--direct_running_mode", "in_memory")
    argv[argv.index("--algorithm") + 1] = "policy_gaussian"  # instead of the sample's (a flag is given once)
    argv += ["--max_sequential_pairs", "10"]
    proc = run_module(spec.name, argv)
    assert proc.returncode == 3, proc.stderr
    assert "error: input too large for a sequential algorithm" in proc.stderr
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr


def test_bayesian_eval_warns_on_its_seed(tmp_path):
    spec = registry.get("bayesian_ngrams")
    path = cut_sample(spec, tmp_path)
    public = os.path.join(REPO, "data", "bayesian_public_trigrams.tsv.gz")
    argv = ["--private", path, "--input_format", "jsonl", "--public", public, "--epsilons", "1", "--repeats", "1"]
    proc = run_module("bayesian_eval", argv + ["--mechanisms", "laplace"])
    assert proc.returncode == 0, proc.stderr
    assert WARNING in proc.stderr and proc.stderr.count(WARNING) == 1  # once, not once per repeat
    assert "laplace" in proc.stdout


# --- console scripts -------------------------------------------------------------------------------------

SCRIPTS = {
    "dp-select-partitions": "select_partitions",
    "dp-extract-ngrams": "extract_ngrams",
    "dp-bayesian-ngrams": "bayesian_ngrams",
    "dp-bayesian-eval": "bayesian_eval",
}


@pytest.mark.parametrize("script,name", SCRIPTS.items())
def test_console_scripts_are_installed_and_strict(script, name, tmp_path):
    path = os.path.join(os.path.dirname(sys.executable), script)
    assert os.path.isfile(path), f"{script} is not installed next to {sys.executable} (pip install -e .)"
    proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "--input_format" in proc.stdout, proc.stderr
    proc = subprocess.run(
        [path, *base_argv(name, tmp_path), "--nope", "1"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "unknown flag --nope" in proc.stderr, proc.stderr
