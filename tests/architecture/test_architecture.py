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
    assert not (ROOT / "transforms/core/combiners.py").exists()
    from dp_partition_beam.transforms.selection import basic, mad

    # selection/basic.py and mad.py are now the columnar Beam code of their algorithm (step 2)
    assert not hasattr(mad, "MADWeightsColumnar") and not hasattr(basic, "UserSetWeights")
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
        bad = {
            m
            for m in _imports(path)
            if m.split(".")[0] == "apache_beam"
            or m.startswith(("dp_partition_beam.transforms", "dp_partition_beam.pipelines"))
        }
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
        # every round weights as the registry says, except a keep-table last round of a multi-round MAD algorithm
        # (biased Basic weights by design: docs/mad_sips.md; single-round MAD keeps its weights under the l2 rule)
        assert rounds and all(r.weighting == spec.weighting for r in rounds[:-1])
        last = rounds[-1]
        biased = last.keep_table is not None and spec.weighting == "mad" and len(rounds) > 1
        assert last.weighting == ("biased_basic" if biased else spec.weighting)
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


# --- files named by algorithm, one plan (issue 28 step 2; docs/design.md "Layout") ---------------------

PRODUCT = ("privacy", "transforms", "pipelines")


def _product_files():
    return [p for top in PRODUCT for p in _package_files(top)]


def test_no_product_file_is_named_by_execution_mode():
    """Files are named by algorithm (docs/design.md); the tests mirror them, so neither says "columnar"."""
    files = _product_files() + _package_files("tests") + _package_files("benchmarks")
    assert len(files) > 100
    bad = [str(p.relative_to(ROOT)) for p in files if "columnar" in p.name]
    assert not bad, bad


def test_kernels_are_pure():
    """Every ``*_kernels.py`` (and the engine's table kernels) imports no Beam: the math of an algorithm,
    scalar and vectorised forms side by side, callable from the Beam stages and the reference alike."""
    kernels = [p for p in _product_files() if p.name.endswith("_kernels.py")]
    kernels.append(ROOT / "transforms" / "core" / "tables.py")
    assert len(kernels) >= 7, kernels
    for path in kernels:
        bad = {m for m in _imports(path) if m.split(".")[0] == "apache_beam"}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_every_algorithm_module_has_its_kernels_beside_it():
    """``<algo>.py`` (Beam) comes with ``<algo>_kernels.py`` (pure) in selection/, dpne/ and bayesian/."""
    for family in ("selection", "dpne", "bayesian"):
        folder = ROOT / "transforms" / family
        for path in folder.glob("*_kernels.py"):
            assert (folder / path.name.replace("_kernels", "")).exists(), path


def test_runners_other_than_the_public_transform_are_private():
    from dp_partition_beam.transforms.selection import reference as selection_reference
    from dp_partition_beam.transforms.selection import select

    runners = [*select._COLUMNAR.values(), *select._RUNNERS.values(), *selection_reference._RUNNERS.values()]
    for runner in runners:
        assert runner.__name__.startswith("_"), runner


def test_the_runner_tables_have_one_row_per_shape():
    from dp_partition_beam.transforms.selection import reference as selection_reference
    from dp_partition_beam.transforms.selection import select

    assert not set(select._COLUMNAR) & set(select._RUNNERS)
    assert set(select._COLUMNAR) | set(select._RUNNERS) == set(SHAPES)
    assert set(selection_reference._RUNNERS) == set(SHAPES)


def _literals(path: pathlib.Path, names):
    """String constants of ``path`` (docstrings excluded) that are one of ``names``, with their line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None
    }
    return sorted(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in docs
    )


#: The generic places (files that are not one algorithm's own) and the algorithm or shape names they may
#: spell, as docs/design.md lists them: the two runner tables by shape (select.py, selection/reference.py),
#: select.py's choice of MAD's round transform within the one-round shape, and the CLI's default
#: --algorithm. Everything else about an algorithm comes from its registry row and its SelectionPlan.
GENERIC_NAMES = {
    "transforms/selection/select.py": ["dp_sips", "mad", "mad2r", "mad_sips", "sequential", "single"],
    "pipelines/select_partitions.py": ["mad_sips"],
}
GENERIC_FILES = (
    "transforms/selection/select.py",
    "transforms/selection/counts.py",
    "transforms/core/engine.py",
    "transforms/core/tables.py",
    "transforms/reference.py",
    "pipelines/select_partitions.py",
    "pipelines/outputs.py",
    "pipelines/reporting.py",
    "pipelines/cli.py",
    "pipelines/observability.py",
    "pipelines/runner.py",
)


def test_adding_an_algorithm_needs_its_own_files_and_one_registry_row():
    """Count the generic places that name a selection algorithm or shape: exactly those docs/design.md
    lists. A new special case in generic code (as MAD-SIPS's adaptive cap once was in select.py,
    reference.release, the CLI and the report writer) fails here."""
    names = set(ALGORITHMS) | set(SHAPES)
    found = {f: _literals(ROOT / f, names) for f in GENERIC_FILES}
    assert {f: v for f, v in found.items() if v} == GENERIC_NAMES
    # the in-memory reference names the shapes in its runner table only (one row each), not in release()
    ref = ROOT / "transforms" / "selection" / "reference.py"
    release = next(n for n in ast.parse(ref.read_text(encoding="utf-8")).body if getattr(n, "name", None) == "release")
    assert not [n.value for n in ast.walk(release) if isinstance(n, ast.Constant) and n.value in names]
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert "Adding a selection algorithm, the complete list of places" in design


def test_one_plan_is_computed_once_and_shared():
    from dp_partition_beam.privacy.selection import SelectionPlan, plan
    from dp_partition_beam.transforms.selection.select import SelectPartitions

    params = SelectionParams(epsilon=1.0, delta=1e-5, release_counts=True)
    for name in ALGORITHMS:
        p = plan(name, params)
        assert isinstance(p, SelectionPlan) and p == plan(name, params)
        select = SelectPartitions(name, params, seed=1)
        assert select.plan == p and select.rounds is select.plan.rounds and select.counts is select.plan.counts
        assert p.rounds == plan_rounds(name, params) and p.params.budget_split is not None
        chosen = None if p.weight_caps is None else 1.0  # mad_sips chooses its weight cap (the default 'auto')
        report = p.as_report(None if p.cap is None else p.cap.grid[-1], chosen)
        assert [r["round"] for r in report["rounds"]] == [r.index for r in p.rounds]
        assert report["counts"]["min_users"] == 0
    with pytest.raises(TypeError, match="SelectionParams"):
        plan("basic", {"epsilon": 1.0})
