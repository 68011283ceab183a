"""The package's structure: public API, families as subpackages, layer rules, one algorithm registry."""

import ast
import pathlib
import re

import pytest

from dp_partition_beam import privacy, transforms
from dp_partition_beam.privacy.selection import ALGORITHMS, SHAPES, SelectionParams, plan_rounds

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _imports(path: pathlib.Path):
    """Absolute module names imported by a file (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_public_api_is_declared_and_importable():
    from dp_partition_beam.privacy import BayesianParams, DPNEParams, SelectionParams  # noqa: F401
    from dp_partition_beam.transforms import DPNE, BayesianNgrams, SelectPartitions, reference  # noqa: F401

    for package in (privacy, transforms, transforms.reference):
        assert package.__all__, package.__name__
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    assert callable(reference.select) and callable(reference.dpne_reference)


def test_public_transforms_are_the_entry_points_only():
    """One Beam path per algorithm (issue 28): the public names are the three entry points, the public
    prior and the in-memory reference. The per-element duplicates (MADWeights, UserSetWeights, AddNoise,
    core/combiners.py) are gone, and the stages inside the entry points are not public."""
    assert transforms.__all__ == ["SelectPartitions", "DPNE", "BayesianNgrams", "PublicPrior", "reference"]
    for gone in ("transforms/selection/mad.py", "transforms/selection/basic.py", "transforms/core/combiners.py"):
        assert not (ROOT / gone).exists(), gone
    for name in ("MADWeights", "UserSetWeights", "AddNoise", "NoisyThreshold", "JoinValuesToSets"):
        assert not hasattr(transforms, name), name


def test_transforms_has_no_loose_family_module():
    """transforms/ holds only subpackages plus the package's __init__ and the reference facade."""
    loose = sorted(p.name for p in (ROOT / "transforms").glob("*.py"))
    assert loose == ["__init__.py", "reference.py"], loose
    families = sorted(p.name for p in (ROOT / "transforms").iterdir() if (p / "__init__.py").exists())
    assert families == ["bayesian", "core", "dpne", "selection", "testing"]


def _package_files(*parts):
    return sorted((ROOT.joinpath(*parts)).rglob("*.py"))


def test_beam_code_never_imports_a_reference_or_test_support():
    """Layer rule: Beam transforms and kernels import kernels, never an in-memory reference (the test
    oracle) and never transforms.testing (test support)."""
    for path in _package_files("transforms"):
        rel = path.relative_to(ROOT)
        if path.name == "reference.py" or rel.parts[1] == "testing" or rel == pathlib.Path("transforms/__init__.py"):
            continue
        bad = {
            m
            for m in _imports(path)
            if m.endswith(".reference") or m.startswith("dp_partition_beam.transforms.testing")
        }
        assert not bad, f"{rel} imports {sorted(bad)}"


def test_privacy_is_pure_math():
    for path in _package_files("privacy"):
        bad = {m for m in _imports(path) if m.split(".")[0] in ("apache_beam", "transforms", "pipelines")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_every_registry_entry_is_complete():
    """A new algorithm is one registry entry (+ its kernel, Beam transform and reference): the plan,
    both runners, the CLI choices, the audit and the docs table come from or are checked against it."""
    from dp_partition_beam.transforms.selection import reference as selection_reference
    from dp_partition_beam.transforms.selection import select
    from dp_partition_beam.transforms.testing import audit

    params = SelectionParams(epsilon=1.0, delta=1e-5, budget_split=(0.5, 0.5))
    tip_cases = {c.algorithm for c in audit.standard_cases() if c.name.endswith("/tip")}
    for name, spec in ALGORITHMS.items():
        assert spec.name == name and spec.shape in SHAPES
        assert (spec.shape in select._RUNNERS or spec.shape in select._COLUMNAR) and (
            spec.shape in selection_reference._RUNNERS
        )
        rounds = plan_rounds(name, params)
        assert rounds and all(r.weighting == spec.weighting for r in rounds)
        assert name in tip_cases
        assert set(spec.options) <= {f for f in SelectionParams.__dataclass_fields__}, spec.options


def test_readme_algorithm_table_lists_exactly_the_registry():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Algorithms\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^`([a-z0-9_]+)` \|", section, flags=re.M)
    assert rows == list(ALGORITHMS), rows


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_unknown_algorithm_names_the_choices(name):
    with pytest.raises(ValueError, match=name):
        plan_rounds(name + "_typo", SelectionParams(epsilon=1.0, delta=1e-5))
