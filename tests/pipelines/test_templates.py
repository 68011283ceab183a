"""The Flex Template files agree with the CLIs they launch (one metadata file per registered pipeline)."""

import argparse
import json
import os
import re
import shutil
import subprocess

import pytest

from dp_partition_beam.pipelines import cli, registry

from tests.support.pipeline_cases import UNSET_FLAG_EXAMPLES

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATES = os.path.join(REPO, "templates")
SPECS = {s.name: s for s in registry.PIPELINES}
# Values a demanding user could type and that must never pass a parameter's regex.
BAD_NUMBERS = ["", "abc", "1,5", "--epsilon", "1 2", "nan", "-1"]
# The documented Dataflow ParameterType enum (google.cloud.dataflow_v1beta3.types.ParameterType).
PARAM_TYPES = {
    "DEFAULT",
    "TEXT",
    "GCS_READ_BUCKET",
    "GCS_WRITE_BUCKET",
    "GCS_READ_FILE",
    "GCS_WRITE_FILE",
    "GCS_READ_FOLDER",
    "GCS_WRITE_FOLDER",
    "PUBSUB_TOPIC",
    "PUBSUB_SUBSCRIPTION",
    "BIGQUERY_TABLE",
    "JAVASCRIPT_UDF_FILE",
    "SERVICE_ACCOUNT",
    "MACHINE_TYPE",
    "KMS_KEY_NAME",
    "WORKER_REGION",
    "WORKER_ZONE",
    "BOOLEAN",
    "ENUM",
    "NUMBER",
    "KAFKA_TOPIC",
    "KAFKA_READ_TOPIC",
    "KAFKA_WRITE_TOPIC",
}


def metadata_path(name):
    return os.path.join(TEMPLATES, name, "metadata.json")


def load(name):
    with open(metadata_path(name)) as f:
        return json.load(f)


def actions(name):
    return {a.dest: a for a in SPECS[name].module().build_parser()._actions}


def as_text(value):
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def examples(spec):
    """A valid value for every flag of a sample launch (the registry's demo run + gs:// paths)."""
    ex = {
        spec.input_flag: "gs://bucket/in/*.jsonl.gz",
        "input_format": spec.input_format,
        "output": "gs://bucket/out/released",
        "report": "gs://bucket/out/report.json",
        "diagnostics": "gs://bucket/private/diagnostics.json",
    }
    args = list(spec.sample_args)
    for flag, value in zip(args[::2], args[1::2]):
        ex[flag.lstrip("-")] = value
    return ex


NAMES = [s.name for s in registry.PIPELINES]


def test_every_registered_pipeline_has_a_template_and_nothing_else_does():
    dirs = sorted(d for d in os.listdir(TEMPLATES) if os.path.isdir(os.path.join(TEMPLATES, d)))
    assert dirs == sorted(NAMES)


def test_documented_param_types_match_the_installed_dataflow_client():
    types = pytest.importorskip(
        "google.cloud.dataflow_v1beta3.types", reason="the gcp extra (google-cloud-dataflow-client) is not installed"
    )
    assert {e.name for e in types.ParameterType} >= PARAM_TYPES


@pytest.mark.parametrize("name", NAMES)
def test_metadata_is_complete_and_well_typed(name):
    meta = load(name)
    assert meta["name"] and meta["description"]
    names = [p["name"] for p in meta["parameters"]]
    assert len(names) == len(set(names))
    for p in meta["parameters"]:
        for key in ("name", "label", "helpText"):
            assert isinstance(p[key], str) and p[key].strip(), (p["name"], key)
        assert isinstance(p["isOptional"], bool)
        assert p.get("paramType", "TEXT") in PARAM_TYPES, p
        assert p["regexes"] and all(re.compile(r) for r in p["regexes"]), p["name"]


def launch(spec, values):
    """Parses a launch as the launcher passes it (--name=value, only the parameters set); returns the
    parameters built from it (validated)."""
    argv = [f"--{name}={as_text(value)}" for name, value in values.items()]
    parsed, unknown = spec.module().build_parser().parse_known_args(argv)
    assert unknown == []
    return spec.module().params_from_args(parsed)


@pytest.mark.parametrize("name", NAMES)
def test_metadata_parameters_are_the_cli_flags(name):
    """Every parameter is a flag the parser accepts as the launcher passes it (--name=value); every
    required flag is a non-optional parameter; no store_true flag (a launcher cannot pass it). A launch
    with the required parameters only works; so does a launch setting any one optional parameter
    together with the parameters that make the chosen algorithm read it (the parser's flag table),
    which are template parameters too."""
    spec, meta, acts = SPECS[name], load(name), actions(name)
    parser = spec.module().build_parser()
    ex = examples(spec)
    names = {p["name"] for p in meta["parameters"]}
    for p in meta["parameters"]:
        a = acts.get(p["name"])
        assert a is not None, f"{p['name']} is not a flag of pipelines.{name}"
        assert not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)), p["name"]
        assert a.help != argparse.SUPPRESS, p["name"]
        assert a.required == (not p["isOptional"]), p["name"]
    required = {a.dest for a in acts.values() if a.required}
    assert required <= names
    # the required parameters, and those required by the default algorithm only (bayesian's delta)
    base = {n: ex[n] for n in names if n in required or n in parser.required_where_used}
    launch(spec, base)  # defaults for everything else
    for n in parser.required_where_used:  # a parameter required by some algorithms is optional in the template
        assert next(p for p in meta["parameters"] if p["name"] == n)["isOptional"], n
    algorithm = parser.algorithm_dest
    for p in meta["parameters"]:
        if not p["isOptional"] or p["name"] in base:
            continue
        a = acts[p["name"]]
        value = ex.get(p["name"], a.default)
        if value is None or isinstance(value, bool):
            value = UNSET_FLAG_EXAMPLES.get(p["name"], "true")  # default None: unset
        values = dict(base)
        use = parser.flag_use.get(p["name"])
        if use is not None:  # an algorithm that reads it, and the settings it needs
            if use.algorithms is not None:
                values[algorithm] = use.algorithms[0]
            for condition in use.conditions:
                for key, v in condition.example:
                    key_use = parser.flag_use.get(key)
                    chosen = values.get(algorithm, acts[algorithm].default)
                    if key_use is None or key_use.algorithms is None or chosen in key_use.algorithms:
                        values[key] = v  # (a flag the algorithm never reads keeps its default: bayesian's tune)
            mechanism = values.get(algorithm, "bayesian")
            if name == "bayesian_ngrams" and mechanism in ("bayesian", "bayesian_data_dependent"):
                values["delta"] = "1e-5"
            if name == "bayesian_ngrams" and mechanism in ("bayesian_data_dependent", "laplace_public"):
                values["acknowledge_data_dependent"] = "true"  # their guarantee is data-dependent
            assert set(values) <= names, (p["name"], set(values) - names)
        values[p["name"]] = value
        launch(spec, values)


# CLI flags a template deliberately leaves out (templates/README.md): local-only options, and options that
# act on a run the launcher does not wait for. Boolean switches (store_true) cannot be passed by a launcher.
NOT_TEMPLATE_PARAMETERS = {"seed", "plots", "evaluate_against", "profile", "progress_interval"}


@pytest.mark.parametrize("name", NAMES)
def test_every_cli_flag_is_a_template_parameter_unless_documented_otherwise(name):
    """A flag added to a CLI must reach its template too (an algorithm's settings once did not: extract_ngrams'
    selection and MAD-SIPS flags, both thresholds): a template user would silently get the default."""
    meta = load(name)
    names = {p["name"] for p in meta["parameters"]}
    missing = {
        dest
        for dest, a in actions(name).items()
        if dest != "help"
        and a.help != argparse.SUPPRESS
        and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        and dest not in NOT_TEMPLATE_PARAMETERS
    } - names
    assert missing == set()
    readme = open(os.path.join(TEMPLATES, "README.md")).read()
    for flag in NOT_TEMPLATE_PARAMETERS:
        assert f"`--{flag}`" in readme, flag  # every exclusion is documented


@pytest.mark.parametrize("name", NAMES)
def test_metadata_lists_parameters_in_the_cli_order(name):
    order = list(actions(name))
    names = [p["name"] for p in load(name)["parameters"]]
    assert names == sorted(names, key=order.index)


INT_FLAGS_ALLOWING_ZERO = {"max_broadcast_items", "min_users"}


@pytest.mark.parametrize("name", NAMES)
def test_regexes_accept_defaults_and_examples_and_reject_bad_values(name):
    spec, meta, acts = SPECS[name], load(name), actions(name)
    ex = examples(spec)
    for p in meta["parameters"]:
        a = acts[p["name"]]

        def ok(v):
            return all(re.fullmatch(r, v) for r in p["regexes"])

        if a.default is not None:
            assert ok(as_text(a.default)), (p["name"], a.default)
        if p["name"] in ex:
            assert ok(ex[p["name"]]), (p["name"], ex[p["name"]])
        assert not ok(""), p["name"]
        assert not ok("two words"), p["name"]
        if a.choices:
            assert all(ok(c) for c in a.choices)
            assert not ok("not_a_choice") and not ok(a.choices[0] + "x") and not ok(a.choices[0].upper() + "!")
        if a.type in (int, float):
            for bad in BAD_NUMBERS:
                assert not ok(bad), (p["name"], bad)
        if a.type in cli.LIST_TYPES:  # comma-separated lists
            for bad in [b for b in BAD_NUMBERS if b != "1,5"] + ["1,,5", ",", "1,"]:
                assert not ok(bad), (p["name"], bad)
        if a.type is int:
            assert not ok("1.5"), p["name"]
            # 0 is meaningful only where the flag allows it (0 broadcast items = always the sharded join;
            # min_users 0 = no floor)
            assert ok("0") == (p["name"] in INT_FLAGS_ALLOWING_ZERO), p["name"]


def test_dockerfile_builds_any_registered_pipeline():
    text = open(os.path.join(TEMPLATES, "Dockerfile")).read()
    assert re.search(r"^FROM gcr\.io/dataflow-templates-base/python3\d+-template-launcher-base$", text, re.M)
    assert 'ENV FLEX_TEMPLATE_PYTHON_PY_FILE="${WORKDIR}/pipelines/${PIPELINE}.py"' in text
    assert 'ENV FLEX_TEMPLATE_PYTHON_SETUP_FILE="${WORKDIR}/setup.py"' in text
    assert re.search(r'pip install .*-e "\.\[gcp\]"', text)
    for path in ("privacy", "transforms", "pipelines", "setup.py", "README.md"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.M), path
    for name in NAMES:  # the PY_FILE the image points at exists for every pipeline
        assert os.path.isfile(os.path.join(REPO, "pipelines", f"{name}.py"))


def test_templates_readme_has_build_and_run_commands_for_every_pipeline():
    text = open(os.path.join(TEMPLATES, "README.md")).read()
    for name in NAMES:
        assert f"--metadata-file templates/{name}/metadata.json" in text
        assert f"gs://BUCKET/templates/{name}.json" in text
    assert "gcloud dataflow flex-template run" in text


@pytest.mark.parametrize("name", NAMES)
def test_gcloud_flex_template_build_print_only_accepts_metadata(name, tmp_path):
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.skip("gcloud is not installed on this machine")
    cmd = [
        gcloud,
        "dataflow",
        "flex-template",
        "build",
        f"gs://fake-bucket/templates/{name}.json",
        "--image",
        "gcr.io/fake-project/dp-partition-beam:test",
        "--sdk-language",
        "PYTHON",
        "--metadata-file",
        metadata_path(name),
        "--print-only",
        "--quiet",
    ]
    env = dict(os.environ, CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), CLOUDSDK_CORE_DISABLE_PROMPTS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if proc.returncode != 0 and re.search(r"credential|auth|network|connect|resolve", proc.stderr, re.I):
        pytest.skip(f"gcloud --print-only needs what this machine lacks: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    spec = json.loads(out[out.index("{") :]) if not out.startswith("{") else json.loads(out)
    assert spec["image"] == "gcr.io/fake-project/dp-partition-beam:test"
    assert spec["sdkInfo"]["language"] == "PYTHON"
    assert spec["metadata"] == load(name)  # gcloud parsed our file and kept every field
