"""The Flex Template files agree with the CLI they launch."""
import json
import os

from pipelines import select_partitions

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")


def test_select_partitions_metadata_matches_cli_flags():
    meta = json.load(open(os.path.join(TEMPLATES, "select_partitions_metadata.json")))
    parser = select_partitions.build_parser()
    flags = {a.dest: a for a in parser._actions}
    names = [p["name"] for p in meta["parameters"]]
    assert len(names) == len(set(names))
    for p in meta["parameters"]:
        assert p["name"] in flags, p["name"]
        # a CLI-required flag must not be optional in the template, and vice versa
        assert flags[p["name"]].required == (not p["isOptional"]), p["name"]
    required = {a.dest for a in parser._actions if a.required}
    assert required <= set(names)


def test_dockerfile_points_at_the_pipeline_and_setup_file():
    text = open(os.path.join(TEMPLATES, "Dockerfile")).read()
    assert "FLEX_TEMPLATE_PYTHON_PY_FILE=\"${WORKDIR}/pipelines/select_partitions.py\"" in text
    assert "FLEX_TEMPLATE_PYTHON_SETUP_FILE" in text
    for path in ("privacy", "transforms", "pipelines", "setup.py"):
        assert path in text
