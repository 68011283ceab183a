"""Strict flags of every CLI (issue 27, points 6, 9 and 10): a flag given twice, a typo in a required
flag, a flag the chosen algorithm does not read and a missing privacy budget each stop the command
before anything runs, with exit code 2 and one line on stderr (no usage block: that is for --help).

Every case runs the real command on a real input (a cut of the bundled sample), so a check that let it
through would run the pipeline and write the release: each case asserts that nothing was written.
"""

import dataclasses
import os
import runpy
import subprocess
import sys

import pytest

from dp_partition_beam.pipelines import bayesian_eval, bayesian_ngrams, cli, extract_ngrams, registry, select_partitions
from dp_partition_beam.privacy import bayesian, dpne, selection

from tests.support.pipeline_cases import REPO, UNSET_FLAG_EXAMPLES, cut_sample

MODULES = {
    "select_partitions": select_partitions,
    "extract_ngrams": extract_ngrams,
    "bayesian_ngrams": bayesian_ngrams,
    "bayesian_eval": bayesian_eval,
}
RELEASES = ("select_partitions", "extract_ngrams", "bayesian_ngrams")
DD = {"--mechanism": "bayesian_data_dependent", "--acknowledge_data_dependent": True}  # the paper's, opt-in
PUBLIC = os.path.join(REPO, "data", "bayesian_public_trigrams.tsv.gz")

#: The flags of a complete, valid seeded run of each CLI (paths added by ``argv``); a case changes them.
BASE = {
    "select_partitions": {"--algorithm": "mad2r", "--epsilon": "2", "--delta": "1e-4", "--max_contributions": "20"},
    "extract_ngrams": {"--max_n": "3", "--epsilon": "4", "--delta": "1e-6", "--max_contributions": "30"},
    "bayesian_ngrams": {"--n": "3", "--epsilon": "1", "--delta": "1e-5", "--C": "1", "--W": "100"},
    "bayesian_eval": {"--epsilons": "1", "--repeats": "1", "--mechanisms": "laplace"},
}


def _script(name):
    """The console script of a CLI module, the prog its errors start with: select_partitions -> dp-select-partitions."""
    return "dp-" + name.replace("_", "-")


def argv(name, tmp_path, changes=None, extra=()):
    """The CLI's arguments: its input (a cut of the bundled sample), outputs under ``tmp_path/out``, the
    flags of BASE with ``changes`` applied (a value None removes the flag), then ``extra`` as given."""
    spec = registry.get("bayesian_ngrams" if name == "bayesian_eval" else name)
    path = tmp_path / f"sample.{spec.input_format}"
    if not path.exists():
        cut_sample(spec, tmp_path)
    flags = {f"--{spec.input_flag}": str(path), "--input_format": spec.input_format}
    if name == "bayesian_eval":
        flags["--public"] = PUBLIC
    else:
        flags["--output"] = str(tmp_path / "out" / "released")
        flags["--report"] = str(tmp_path / "out" / "report.json")
        if name == "bayesian_ngrams":
            flags["--public"] = PUBLIC
        flags["--seed"] = "3"
        flags["--direct_running_mode"] = "in_memory"
    flags.update(BASE[name])
    flags.update(changes or {})
    out = []
    for flag, value in flags.items():
        if value is None:
            continue
        out += [flag] if value is True else [flag, value]
    return out + list(extra)


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def assert_one_line_error(name, tmp_path, capsys, args, message):
    """``run(args)`` exits 2 with exactly ``<prog>: error: <message>`` on stderr and writes nothing."""
    before = files_under(tmp_path)
    with pytest.raises(SystemExit) as e:
        MODULES[name].run(args)
    captured = capsys.readouterr()
    assert e.value.code == 2, captured.err
    assert captured.err.splitlines() == [f"{_script(name)}: error: {message}"], captured.err
    assert captured.out == ""
    assert files_under(tmp_path) == before  # nothing written, in out/ or anywhere else
    assert not (tmp_path / "out").exists()


# --- a flag given twice (point 6) ------------------------------------------------------------------------

REPEATED = [
    ("select_partitions", ["--epsilon", "50"], "--epsilon given twice (2 and 50); give each flag once"),
    (
        "select_partitions",
        ["--epsilon=50", "--epsilon=3"],
        "--epsilon given 3 times (2, 50 and 3); give each flag once",
    ),
    ("select_partitions", ["--algorithm=basic"], "--algorithm given twice (mad2r and basic); give each flag once"),
    (
        "select_partitions",
        ["--release_counts", "--release_counts=false"],
        "--release_counts given twice (true and false); give each flag once",
    ),
    (
        "select_partitions",
        ["--skip_bad_records", "--skip_bad_records"],
        "--skip_bad_records given twice (true and true); give each flag once",
    ),
    (
        "select_partitions",
        ["--runner", "DirectRunner", "--runner=DirectRunner"],
        "--runner given twice (DirectRunner and DirectRunner); give each flag once",
    ),
    (
        "select_partitions",
        ["--direct_running_mode", "multi_processing"],
        "--direct_running_mode given twice (in_memory and multi_processing); give each flag once",
    ),
    ("extract_ngrams", ["--max_n", "5"], "--max_n given twice (3 and 5); give each flag once"),
    ("extract_ngrams", ["--delta=1e-9"], "--delta given twice (1e-6 and 1e-9); give each flag once"),
    ("extract_ngrams", ["--beta", "-1", "--beta", "2"], "--beta given twice (-1 and 2); give each flag once"),
    ("bayesian_ngrams", ["--W", "200"], "--W given twice (100 and 200); give each flag once"),
    ("bayesian_ngrams", ["--epsilon", "0.5"], "--epsilon given twice (1 and 0.5); give each flag once"),
    (
        "bayesian_ngrams",
        ["--direct_num_workers", "1", "--direct_num_workers", "2"],
        "--direct_num_workers given twice (1 and 2); give each flag once",
    ),
    ("bayesian_eval", ["--repeats", "2"], "--repeats given twice (1 and 2); give each flag once"),
]


@pytest.mark.parametrize("name,extra,message", REPEATED, ids=[f"{c[0]}{c[1][0]}" for c in REPEATED])
def test_a_flag_given_twice_is_an_error(name, extra, message, tmp_path, capsys):
    assert_one_line_error(name, tmp_path, capsys, argv(name, tmp_path, extra=extra), message)


def test_flags_meant_to_be_repeated_still_are(tmp_path):
    """append-like options accumulate, they do not overwrite: Beam's --experiments, bayesian_eval's
    --distribution."""
    parser = select_partitions.build_parser()
    _, beam_args = parser.parse_known_args(argv("select_partitions", tmp_path, extra=["--experiments", "a"] * 2))
    assert beam_args == ["--direct_running_mode", "in_memory", "--experiments", "a", "--experiments", "a"]
    parser = bayesian_eval.build_parser()
    args, _ = parser.parse_known_args(argv("bayesian_eval", tmp_path, extra=["--distribution", "a=x"] * 2))
    assert args.distribution == ["a=x", "a=x"]


# --- a typo in a required flag is reported as the typo (point 9) ----------------------------------------

TYPOS = [
    ("select_partitions", {"--epsilon": None, "--epsilonn": "1"}, "--epsilonn", "--epsilon"),
    ("select_partitions", {"--delta": None, "--detla": "1e-5"}, "--detla", "--delta"),
    ("select_partitions", {"--report": None, "--reprot": "r.json"}, "--reprot", "--report"),
    (
        "extract_ngrams",
        {"--epsilon": None, "--delta": None, "--epsilom": "1", "--delta_": "1e-6"},
        "--epsilom",
        "--epsilon",
    ),
    ("bayesian_ngrams", {"--public": None, "--publc": PUBLIC}, "--publc", "--public"),
    ("bayesian_eval", {"--public": None, "--publik": PUBLIC}, "--publik", "--public"),
]


@pytest.mark.parametrize("name,changes,flag,suggestion", TYPOS, ids=[f"{c[0]}{c[2]}" for c in TYPOS])
def test_a_typo_in_a_required_flag_names_the_typo_not_the_missing_flag(
    name, changes, flag, suggestion, tmp_path, capsys
):
    where = (
        "not a flag of this command"
        if name == "bayesian_eval"
        else ("neither a flag of this command nor a Beam pipeline option")
    )
    message = f"unknown flag {flag} ({where}); did you mean {suggestion}?"
    assert_one_line_error(name, tmp_path, capsys, argv(name, tmp_path, changes), message)


# --- privacy budgets are required everywhere (point 10) -------------------------------------------------

MISSING = [
    ("select_partitions", {"--epsilon": None}, "the following arguments are required: --epsilon"),
    ("select_partitions", {"--delta": None}, "the following arguments are required: --delta"),
    (
        "extract_ngrams",
        {"--epsilon": None, "--delta": None},
        "the following arguments are required: --epsilon, --delta",
    ),
    ("extract_ngrams", {"--delta": None}, "the following arguments are required: --delta"),
    ("bayesian_ngrams", {"--epsilon": None}, "the following arguments are required: --epsilon"),
    ("bayesian_ngrams", {"--delta": None}, "--delta is required with --mechanism bayesian"),
    ("bayesian_ngrams", {"--delta": None, "--mechanism": "bayesian"}, "--delta is required with --mechanism bayesian"),
    (
        "bayesian_ngrams",
        {"--delta": None, "--mechanism": "bayesian_data_dependent", "--acknowledge_data_dependent": True},
        "--delta is required with --mechanism bayesian_data_dependent",
    ),
]


@pytest.mark.parametrize("name,changes,message", MISSING, ids=[f"{c[0]}-{'-'.join(c[1])}" for c in MISSING])
def test_the_privacy_budget_has_no_default(name, changes, message, tmp_path, capsys):
    assert_one_line_error(name, tmp_path, capsys, argv(name, tmp_path, changes), message)


@pytest.mark.parametrize("mechanism", ["laplace", "laplace_public"])
def test_pure_epsilon_mechanisms_take_no_delta(mechanism, tmp_path):
    """Without --delta the Laplace mechanisms parse (their params keep the dataclass default, unused)."""
    parser = bayesian_ngrams.build_parser()
    args, _ = parser.parse_known_args(argv("bayesian_ngrams", tmp_path, {"--delta": None, "--mechanism": mechanism}))
    assert args.delta is None
    params = bayesian_ngrams.params_from_args(args)
    assert params.epsilon == 1.0 and params.delta == bayesian.BayesianParams.__dataclass_fields__["delta"].default


def test_budget_flags_are_required_in_help_and_templates():
    for name in ("select_partitions", "extract_ngrams"):
        actions = {a.dest: a for a in MODULES[name].build_parser()._actions}
        assert actions["epsilon"].required and actions["delta"].required, name
        assert actions["epsilon"].default is None and actions["delta"].default is None
    actions = {a.dest: a for a in bayesian_ngrams.build_parser()._actions}
    assert actions["epsilon"].required and actions["epsilon"].default is None
    assert not actions["delta"].required and actions["delta"].default is None  # required with bayesian only
    assert "required with --mechanism bayesian, bayesian_data_dependent" in actions["delta"].help


# --- an option the chosen algorithm does not read (point 10) --------------------------------------------

UNUSED = [
    (
        "select_partitions",
        {"--algorithm": "basic", "--budget_split": "0.5,0.5"},
        "--budget_split is not used by --algorithm basic (it is used by: mad2r, dp_sips, mad_sips)",
    ),
    (
        "select_partitions",
        {"--count_budget": "0.3"},
        "--count_budget is not used by --algorithm mad2r without --release_counts",
    ),
    (
        "select_partitions",
        {"--count_budget": "0.3", "--release_counts": "false"},
        "--count_budget is not used by --algorithm mad2r without --release_counts",
    ),
    (
        "select_partitions",
        {"--min_users": "3"},
        "--min_users is not used by --algorithm mad2r without --release_counts",
    ),
    (
        "select_partitions",
        {"--min_users": "0"},
        "--min_users is not used by --algorithm mad2r without --release_counts",
    ),
    (
        "select_partitions",
        {"--cap_quantile": "0.9"},
        "--cap_quantile is not used by --algorithm mad2r (it is used by: mad_sips)",
    ),
    (
        "select_partitions",
        {"--algorithm": "basic", "--weight_cap": "0.3"},
        "--weight_cap is not used by --algorithm basic (it is used by: mad2r, mad_sips)",
    ),
    (
        "select_partitions",
        {"--algorithm": "mad_sips", "--threshold": "gaussian", "--weight_cap": "0.3"},
        "--weight_cap is not used by --algorithm mad_sips without a keep-table last round (--threshold optimal, or "
        "unset with --accounting gdp)",
    ),
    (
        "select_partitions",
        {"--algorithm": "mad_sips", "--accounting": "basic", "--cap_budget": "0.02"},
        "--cap_budget is not used by --algorithm mad_sips without the degree histogram (--cap_quantile below 1 "
        "with --accounting gdp, or --weight_cap auto, unset with a keep-table last round)",
    ),
    (
        "select_partitions",
        {"--algorithm": "mad_sips", "--cap_quantile": "1", "--weight_cap": "0.5", "--cap_budget": "0.02"},
        "--cap_budget is not used by --algorithm mad_sips without the degree histogram (--cap_quantile below 1 "
        "with --accounting gdp, or --weight_cap auto, unset with a keep-table last round)",
    ),
    (
        "select_partitions",
        {"--alpha": "3"},
        "--alpha is not used by --algorithm mad2r (it is used by: policy_gaussian, policy_laplace)",
    ),
    (
        "select_partitions",
        {"--algorithm": "mad", "--b_max": "3"},
        "--b_max is not used by --algorithm mad (it is used by: mad2r, mad_sips)",
    ),
    (
        "select_partitions",
        {"--algorithm": "dp_sips", "--d_max": "6"},
        "--d_max is not used by --algorithm dp_sips (it is used by: mad, mad2r, mad_sips)",
    ),
    (
        "select_partitions",
        {"--max_broadcast_items": "0"},
        "--max_broadcast_items is not used by --algorithm mad2r (it is used by: policy_gaussian, policy_laplace)",
    ),
    (
        "select_partitions",
        {"--algorithm": "policy_gaussian", "--max_users_per_key": "5"},
        "--max_users_per_key is not used by --algorithm policy_gaussian without --release_counts",
    ),
    (
        "extract_ngrams",
        {"--algorithm": "dpsu_all", "--eta": "0.1"},
        "--eta is not used by --algorithm dpsu_all (it is used by: dpne)",
    ),
    (
        "extract_ngrams",
        {"--sample_rate": "0.1"},
        "--sample_rate is not used by --algorithm dpne unless --vk_method is sample",
    ),
    (
        "extract_ngrams",
        {"--pruning": "single", "--vk_method": "sample"},
        "--vk_method is not used by --algorithm dpne unless --pruning is both",
    ),
    (
        "extract_ngrams",
        {"--beta": "3"},
        "--beta is not used by --algorithm dpne unless --weighting is mad (or, with dpne, --selection is mad_sips)",
    ),
    (
        "extract_ngrams",
        {"--algorithm": "dpsu_even", "--d_max": "8"},
        "--d_max is not used by --algorithm dpsu_even unless --weighting is mad "
        "(or, with dpne, --selection is mad_sips)",
    ),
    (
        "extract_ngrams",
        {"--max_n": "1", "--sigma_decay": "2"},
        "--sigma_decay is not used by --algorithm dpne unless --max_n is 2 or more (levels k >= 2)",
    ),
    (
        "extract_ngrams",
        {"--dpsu_single_length": "2"},
        "--dpsu_single_length is not used by --algorithm dpne (it is used by: dpsu_single)",
    ),
    (
        "extract_ngrams",
        {"--count_budget": "0.3"},
        "--count_budget is not used by --algorithm dpne without --release_counts",
    ),
    (
        "bayesian_ngrams",
        {"--mechanism": "laplace"},
        "--delta is not used by --mechanism laplace (it is used by: bayesian, bayesian_data_dependent)",
    ),
    (
        "bayesian_ngrams",
        {**DD, "--tune": True, "--S": "1"},
        "--S is not used by --mechanism bayesian_data_dependent with --tune",
    ),
    (
        "bayesian_ngrams",
        {**DD, "--rho_grid": "0.1,0.2"},
        "--rho_grid is not used by --mechanism bayesian_data_dependent without --tune",
    ),
    (
        "bayesian_ngrams",
        {**DD, "--tune_epsilon_fraction": "0.5"},
        "--tune_epsilon_fraction is not used by --mechanism bayesian_data_dependent without --tune",
    ),
    (
        "bayesian_ngrams",
        {"--tune": True},
        "--tune is not used by --mechanism bayesian (it is used by: bayesian_data_dependent)",
    ),
    (
        "bayesian_ngrams",
        {"--choice_epsilon_fraction": "0.3"},
        "--choice_epsilon_fraction is not used by --mechanism bayesian (it is used by: bayesian_data_dependent)",
    ),
    (
        "bayesian_ngrams",
        {"--acknowledge_data_dependent": True},
        "--acknowledge_data_dependent is not used by --mechanism bayesian (it is used by: "
        "bayesian_data_dependent, laplace_public)",
    ),
    (
        "bayesian_ngrams",
        {"--mechanism": "laplace_public", "--acknowledge_data_dependent": True, "--delta": None, "--tune": "false"},
        "--tune is not used by --mechanism laplace_public (it is used by: bayesian_data_dependent)",
    ),
    (
        "bayesian_ngrams",
        {"--mechanism": "laplace", "--delta": None, "--sensitivity": "bound"},
        "--sensitivity is not used by --mechanism laplace (it is used by: bayesian_data_dependent)",
    ),
]


@pytest.mark.parametrize("name,changes,message", UNUSED, ids=[f"{c[0]}-{'-'.join(c[1])}" for c in UNUSED])
def test_an_option_the_algorithm_does_not_use_is_an_error_naming_it(name, changes, message, tmp_path, capsys):
    assert_one_line_error(name, tmp_path, capsys, argv(name, tmp_path, changes), message)


def _bayesian_budget(mechanism, changes):
    """What a bayesian_ngrams run of ``mechanism`` needs besides its flags: no --delta for the Laplace
    mechanisms, the acknowledgement for the data-dependent ones."""
    if mechanism not in ("bayesian", "bayesian_data_dependent"):
        changes["--delta"] = None
    if mechanism in bayesian.DATA_DEPENDENT:
        changes["--acknowledge_data_dependent"] = True


TABLES = {
    "select_partitions": (selection.FIELD_USE, "algorithm", tuple(selection.ALGORITHMS)),
    "extract_ngrams": (dpne.FIELD_USE, "algorithm", dpne.DPNE_ALGORITHMS),
    "bayesian_ngrams": (bayesian.FIELD_USE, "mechanism", bayesian.MECHANISMS),
}


@pytest.mark.parametrize("name", RELEASES)
def test_the_parser_takes_its_table_from_the_privacy_module(name):
    """One table per family (privacy.<module>.FIELD_USE) decides; its names are flags and choices."""
    table, flag, algorithms = TABLES[name]
    parser = MODULES[name].build_parser()
    dests = {a.dest for a in parser._actions}
    assert parser.algorithm_dest == flag
    assert {k: v for k, v in parser.flag_use.items() if k in table} == table
    for dest, use in parser.flag_use.items():
        assert dest in dests, dest
        assert set(use.algorithms or ()) <= set(algorithms), dest
        for condition in use.conditions:
            assert {k for k, _ in condition.example} <= dests, dest


def _uses(name, dest, algorithm):
    """The flags under which ``algorithm`` reads ``dest`` (the examples of its conditions)."""
    flag_use = MODULES[name].build_parser().flag_use
    use = flag_use.get(dest)
    if use is None:
        return {}
    if use.algorithms is not None and algorithm not in use.algorithms:
        return None
    changes = {}
    for condition in use.conditions:
        for key, value in condition.example:
            key_use = flag_use.get(key)
            if key_use is not None and key_use.algorithms is not None and algorithm not in key_use.algorithms:
                continue  # a flag this algorithm never reads (bayesian's --tune): its default already holds
            changes[f"--{key}"] = True if value is True else ("false" if value is False else str(value))
    return changes


def _example_value(action):
    value = action.default
    if isinstance(value, list):
        return ",".join(map(str, value))
    if value is None or isinstance(value, bool):
        return UNSET_FLAG_EXAMPLES.get(action.dest, {"delta": "1e-5"}.get(action.dest, "true"))
    return str(value)


@pytest.mark.parametrize("name", RELEASES)
def test_every_flag_is_accepted_where_its_algorithm_reads_it(name, tmp_path):
    """The table rejects no legitimate use: each privacy flag, given with every algorithm that reads it
    (and the settings its conditions need), parses and makes valid parameters."""
    table, flag, algorithms = TABLES[name]
    parser = MODULES[name].build_parser()
    actions = {a.dest: a for a in parser._actions}
    checked = 0
    for dest in list(table) + ["max_broadcast_items", "max_users_per_key"] * (name == "select_partitions"):
        for algorithm in algorithms:
            changes = _uses(name, dest, algorithm)
            if changes is None:
                continue
            changes = {f"--{flag}": algorithm, **changes}
            if name == "bayesian_ngrams":
                _bayesian_budget(algorithm, changes)
            changes.setdefault(f"--{dest}", _example_value(actions[dest]))
            args, _ = MODULES[name].build_parser().parse_known_args(argv(name, tmp_path, changes))
            MODULES[name].params_from_args(args)
            checked += 1
    assert checked >= len(table)


@pytest.mark.parametrize("name", RELEASES)
def test_defaults_trip_nothing_for_any_algorithm(name, tmp_path):
    """Only flags on the command line count: a run (or a template launch) that sets nothing but the
    required flags parses for every algorithm."""
    _, flag, algorithms = TABLES[name]
    for algorithm in algorithms:
        changes = {f"--{flag}": algorithm}
        if name == "bayesian_ngrams":
            _bayesian_budget(algorithm, changes)
        args, _ = MODULES[name].build_parser().parse_known_args(argv(name, tmp_path, changes))
        assert getattr(args, flag) == algorithm
        MODULES[name].params_from_args(args)


# --- one line, usage only with --help (point 9) ---------------------------------------------------------

PARAMETER_ERRORS = [
    ("select_partitions", {"--epsilon": "500"}, "epsilon must be in (0, 100], got 500.0"),
    ("select_partitions", {"--budget_split": "0.5,0.6"}, "budget_split must sum to 1, got (0.5, 0.6) (sum 1.1)"),
    (
        "select_partitions",
        {"--algorithm": "best"},
        "argument --algorithm: invalid choice: 'best' (choose from "
        + ", ".join(f"'{a}'" for a in selection.ALGORITHMS)
        + ")",
    ),
    ("extract_ngrams", {"--max_n": "99"}, "max_n must be an integer in [1, 50], got 99"),
    ("extract_ngrams", {"--epsilon": "x"}, "argument --epsilon: invalid float value: 'x'"),
    ("bayesian_ngrams", {"--rho": "2"}, "rho must be in (0, 1], got 2.0"),
    ("bayesian_eval", {"--repeats": "0"}, "repeats must be >= 1, got 0"),
]


@pytest.mark.parametrize(
    "name,changes,message", PARAMETER_ERRORS, ids=[f"{c[0]}{list(c[1])[0]}" for c in PARAMETER_ERRORS]
)
def test_a_parameter_error_is_one_line_naming_parameter_value_and_range(name, changes, message, tmp_path, capsys):
    assert_one_line_error(name, tmp_path, capsys, argv(name, tmp_path, changes), message)


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy on an imported module
def test_the_real_command_prints_no_usage_block_but_help_does(name, tmp_path, capsys, monkeypatch):
    args = argv(name, tmp_path, extra=["--epsilon" if name != "bayesian_eval" else "--repeats", "1"])
    proc = subprocess.run(
        [sys.executable, "-m", f"dp_partition_beam.pipelines.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()  # one line: no usage block, no traceback
    assert line.startswith(f"{_script(name)}: error: ") and " given twice (" in line, line
    assert "usage:" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists()
    # --help through the same ``python -m`` entry (the module run as __main__), in this process: what it
    # checks (exit 0, the usage on stdout) does not depend on a fresh interpreter, which the error run
    # above needs (nothing else on its stderr) and which costs ~2.5 CPU-s of imports per run.
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", [_script(name), "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(f"dp_partition_beam.pipelines.{name}", run_name="__main__", alter_sys=False)
    out = capsys.readouterr().out
    assert e.value.code in (0, None) and out.startswith("usage: ")
    assert ("--epsilon EPSILON" if name != "bayesian_eval" else "--private PRIVATE") in out.split("\n\n")[0]


def test_help_shows_the_required_flags_as_required():
    """The required flags are relaxed while parsing (so an unknown flag is reported first): --help, which
    prints during the parse, still shows them as required."""
    parser = extract_ngrams.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_known_args(["--help"])
    usage = parser.format_usage()
    assert " --epsilon EPSILON" in usage and "[--epsilon EPSILON]" not in usage
    assert all(a.required for a in parser._actions if a.dest in ("epsilon", "delta", "input", "output", "report"))


def test_params_fields_without_a_flag_default_keep_the_dataclass_default():
    """params_from_args: None (a flag not given that has no CLI default) -> the dataclass default."""
    fields = {f.name: f for f in dataclasses.fields(bayesian.BayesianParams)}
    args = bayesian_ngrams.build_parser().parse_known_args(
        ["--private", "p", "--input_format", "jsonl", "--public", "q", "--output", "o", "--report", "r"]
        + ["--mechanism", "laplace", "--epsilon", "2"]
    )[0]
    params = cli.params_from_args(bayesian.BayesianParams, args)
    assert params.epsilon == 2.0 and params.delta == fields["delta"].default


def test_readme_table_lists_every_flag_of_the_tables():
    """docs/cli.md's "Command line" table of the flags each algorithm reads has a row for every entry."""
    text = open(os.path.join(REPO, "docs", "cli.md"), encoding="utf-8").read()
    section = text[text.index("## Command line") : text.index("## Running `select_partitions`")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().split(" | ")]
        if len(cells) == 3 and cells[0] in RELEASES:
            rows.setdefault(cells[0], set()).update(f.strip(" `") for f in cells[1].split(","))
    for name in RELEASES:
        assert rows[name] == {f"--{dest}" for dest in MODULES[name].build_parser().flag_use}, name
