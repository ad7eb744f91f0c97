"""Imports point one way: flowc.cli -> flow -> flowc.runtime -> flowc.compiler.

Inside the compiler, the code generators read the IR (compiler/ir.py, compiler/program.py) and
never the passes that produce it.  A test walks every import statement (lazy ones inside
functions too) and fails on an edge that points the wrong way, naming the file and line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# layer -> the folder that holds it; a layer may import itself and every layer after it.
LAYERS = [("flowc.cli", "flowc/cli"), ("flow", "flow"), ("flowc.runtime", "runtime"), ("flowc.compiler", "compiler")]
# (importing package, imported package) pairs refused inside the compiler.
FORBIDDEN_WITHIN = [("flowc.compiler.codegen", "flowc.compiler.passes")]


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, absolute names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def layer_of(module: str) -> int | None:
    for rank, (package, _) in enumerate(LAYERS):
        if module == package or module.startswith(package + "."):
            return rank
    return None


def upward_edges(root: Path = ROOT) -> list[str]:
    edges = []
    for rank, (package, folder) in enumerate(LAYERS):
        for path in sorted((root / folder).rglob("*.py")):
            for line, module in imports(path):
                target = layer_of(module)
                if target is not None and target < rank:
                    edges.append(f"{path.relative_to(root)}:{line} ({package}) imports {module}")
    return edges


def test_no_layer_imports_a_layer_above_it():
    assert upward_edges() == []


@pytest.mark.parametrize("importer, imported", FORBIDDEN_WITHIN)
def test_code_generators_read_the_ir_not_the_passes(importer, imported):
    folder = ROOT / importer.removeprefix("flowc.").replace(".", "/")
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}" for p in sorted(folder.rglob("*.py"))
           for line, m in imports(p) if m == imported or m.startswith(imported + ".")]
    assert bad == []


def test_the_old_top_level_names_are_never_imported():
    old = ("compiler", "runtime", "codegen_templates")
    folders = ("compiler", "runtime", "flow", "flowc/cli", "tests", "benchmarks", "examples")
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}" for folder in folders
           for p in sorted((ROOT / folder).rglob("*.py")) for line, m in imports(p) if m.split(".")[0] in old]
    assert bad == []


def test_the_walk_sees_an_upward_edge(tmp_path):
    """The check itself can fail: a compiler module importing the runtime lazily is reported."""
    for _, folder in LAYERS:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "compiler" / "bad.py").write_text("def f():\n    from flowc.runtime.job import JobFunction\n")
    assert upward_edges(tmp_path) == ["compiler/bad.py:2 (flowc.compiler) imports flowc.runtime.job"]
