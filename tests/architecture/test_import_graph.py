"""The package's import graph: no cycle, the layer rule, no CLI importing another CLI (issue 15).

The graph is read from the source (``ast``): an edge M -> X for every ``import`` / ``from ...
import`` of one of our modules anywhere in M (module level or inside a function: a lazy import is
still a dependency), plus X's enclosing packages (importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__``), except M's own enclosing packages, which are already being imported when M runs.
Then one fresh interpreter imports every module.
"""

import ast
import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGES = ("privacy", "transforms", "pipelines")
CLIS = (
    "dp_partition_beam.pipelines.select_partitions",
    "dp_partition_beam.pipelines.extract_ngrams",
    "dp_partition_beam.pipelines.bayesian_ngrams",
    "dp_partition_beam.pipelines.bayesian_eval",
)


def _modules():
    """module name -> (path, is_package)."""
    out = {}
    for pkg in PACKAGES:
        for root, _, files in os.walk(os.path.join(REPO, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(root, f), REPO)[: -len(".py")].split(os.sep)
                is_pkg = rel[-1] == "__init__"
                name = ".".join(["dp_partition_beam", *(rel[:-1] if is_pkg else rel)])
                out[name] = (os.path.join(root, f), is_pkg)
    return out


def _ancestors(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _graph(modules):
    graph = {}
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)  # "from pkg import module"
        own = _ancestors(name) | {name}  # already being imported when this module runs
        edges = set()
        for t in targets:
            if t in modules:
                edges.add(t)
                edges.update(a for a in _ancestors(t) if a in modules)
        edges -= own
        graph[name] = edges
    return graph


def _find_cycle(graph):
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


MODULES = _modules()
GRAPH = _graph(MODULES)


def test_the_graph_sees_the_modules_and_their_imports():
    """Sanity of the scan itself: it finds the packages' modules and known edges."""
    assert len(MODULES) > 40 and set(CLIS) <= set(MODULES)
    assert "dp_partition_beam.pipelines.cli" in GRAPH["dp_partition_beam.pipelines.select_partitions"]
    assert "dp_partition_beam.pipelines.runner" in GRAPH["dp_partition_beam.pipelines.reporting"]
    assert "dp_partition_beam.transforms.selection.select" in GRAPH["dp_partition_beam.transforms"]


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_cli_imports_another_cli_and_nothing_imports_a_cli():
    for name, edges in GRAPH.items():
        bad = edges & (set(CLIS) - {name})
        assert not bad, f"{name} imports the CLI module(s) {sorted(bad)}"


def test_layers_privacy_imports_no_beam_code_and_beam_code_no_reference():
    """privacy/ is pure math (no transforms, no pipelines); Beam transforms never import a reference."""
    for name, edges in GRAPH.items():
        if name.startswith("dp_partition_beam.privacy"):
            assert not {e for e in edges if not e.startswith("dp_partition_beam.privacy")}, name
        if name.startswith("dp_partition_beam.transforms") and not name.startswith(
            "dp_partition_beam.transforms.testing"
        ):
            assert not {e for e in edges if e.startswith("dp_partition_beam.pipelines")}, name
    beam_modules = [
        "dp_partition_beam.transforms.selection.select",
        "dp_partition_beam.transforms.core.engine",
        "dp_partition_beam.transforms.selection.basic",
        "dp_partition_beam.transforms.selection.mad",
        "dp_partition_beam.transforms.selection.mad_sips",
        "dp_partition_beam.transforms.selection.policy",
        "dp_partition_beam.transforms.selection.counts",
        "dp_partition_beam.transforms.dpne.dpne",
        "dp_partition_beam.transforms.bayesian.bayesian",
    ]
    for name in beam_modules:
        assert not {e for e in GRAPH[name] if e.endswith("reference")}, name


def test_every_module_imports_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint('ok')"
    proc = subprocess.run(
        [sys.executable, "-c", code, *sorted(MODULES)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _bare_imports(path):
    """(line, statement) of each import of a bare top-level privacy/transforms/pipelines in a Python file."""
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.split(".")[0] in PACKAGES]
    return out


def test_no_bare_top_level_import_anywhere_in_the_tree():
    """Installed, the package is dp_partition_beam.{privacy,transforms,pipelines}; a bare ``import privacy``
    would load a second copy of a module from the checkout (or a stranger's package of that name)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    py = [f for f in tracked.split() if f.endswith(".py")]
    assert len(py) > 100
    bad = [f"{f}:{line}: {name}" for f in py for line, name in _bare_imports(os.path.join(REPO, f))]
    assert not bad, "bare imports (use dp_partition_beam.<package>):\n" + "\n".join(bad)
    # and in the commands the docs and scripts give (python -m pipelines.x, from privacy import ...)
    pattern = re.compile(r"(-m |^\s*from |^\s*import )(privacy|transforms|pipelines)\b", re.M)
    text = [f for f in tracked.split() if f.endswith((".md", ".sh", ".json")) or f.startswith(".ci/")]
    bad = [f for f in text if pattern.search(open(os.path.join(REPO, f), encoding="utf-8", errors="replace").read())]
    assert not bad, f"bare module names in commands or code blocks: {bad}"


def test_the_bare_import_scan_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import os\nfrom pipelines import cli\nimport transforms.core as c\nfrom dp_partition_beam import privacy\n"
    )
    assert _bare_imports(str(f)) == [(2, "pipelines"), (3, "transforms.core")]


def test_python_dash_m_runs_the_package_module():
    """`python -m dp_partition_beam.pipelines.NAME` runs NAME as ``__main__``; every CLI then calls the main
    of ``dp_partition_beam.pipelines.NAME`` (imported by that name), so the functions its pipeline pickles
    belong to a module an SDK worker in another process can import. Built from ``__main__``, Beam 2.62's dill
    pickled them by value without their globals: extract_ngrams failed on the standalone Flink cluster
    ("NameError: name 'json' is not defined"; the engine suite runs the CLIs this way)."""
    pipelines = os.path.join(REPO, "pipelines")
    clis = []
    for name in sorted(os.listdir(pipelines)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(pipelines, name), encoding="utf-8") as f:
            source = f.read()
        if 'if __name__ == "__main__":' not in source:
            continue
        module = name[:-3]
        clis.append(module)
        block = source.split('if __name__ == "__main__":', 1)[1]
        assert f"from dp_partition_beam.pipelines.{module} import main as package_main" in block, module
        assert block.strip().endswith("package_main()"), module
    assert {"select_partitions", "extract_ngrams", "bayesian_ngrams"} <= set(clis), clis
