"""docs/architecture.md stays true of the code: every path it names exists, every test it names is defined,
and the ops its walkthrough adds are still hypothetical.

Paths are the backticked ones (`compiler/pipeline.py`, `codegen_templates/cpu/*.j2`, a folder, or
`tests/test_ops.py::test_name`) and those in its code blocks (the data-flow sketch).  A path with a
`<placeholder>` is a pattern, not a file, and is skipped.
"""
from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
FOLDERS = ("compiler", "runtime", "codegen_templates", "flow", "flowc", "tests", "docs", "examples", "benchmarks")
TOP_LEVEL_FILES = {"setup.cfg", "Makefile", "README.md", "pyproject.toml", "CHANGELOG.md"}
PATH_IN_CODE = re.compile(r"(?<![\w/.-])((?:" + "|".join(FOLDERS) + r")/[\w./*{},<>-]*)")
# What the walkthrough of "How to add an op" creates: files and ops that must not exist yet.
WALKTHROUGH_FILES = {"codegen_templates/cpu/log_softmax.cpp.j2", "codegen_templates/cuda/log_softmax.cu.j2"}
WALKTHROUGH_OPS = ("softsign", "log_softmax")


def mentioned_paths(text: str) -> set[str]:
    """Every repository path the document names, as written (globs and `::test` suffixes kept)."""
    fences = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    found = set()
    for token in re.findall(r"`([^`\n]+)`", prose):
        token = token.strip()
        if " " in token:
            continue
        if token.split("/")[0] in FOLDERS and "/" in token or token in TOP_LEVEL_FILES:
            found.add(token)
    for block in fences:
        found.update(p.rstrip(".,") for p in PATH_IN_CODE.findall(block))
    return {p for p in found if "<" not in p and ">" not in p}


def expand_braces(pattern: str) -> list[str]:
    """`a/{b,c}/d` -> [`a/b/d`, `a/c/d`]."""
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def missing(path: str) -> str | None:
    """Why `path` (as the document writes it) names nothing in the repository, or None."""
    file_part, _, test_name = path.partition("::")
    for pattern in expand_braces(file_part):
        if any(ch in pattern for ch in "*?["):
            if not list(ROOT.glob(pattern)):
                return f"{pattern} matches no file"
        elif not (ROOT / pattern).exists():
            return f"{pattern} does not exist"
    if test_name:
        tree = ast.parse((ROOT / file_part).read_text())
        if test_name not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}:
            return f"{file_part} defines no {test_name}"
    return None


def test_the_doc_names_paths():
    paths = mentioned_paths(DOC.read_text())
    assert {"compiler/pipeline.py", "compiler/backends.py", "tests/test_ops.py"} <= paths


def test_every_path_and_test_the_doc_names_exists():
    problems = sorted(f"{p}: {why}" for p in mentioned_paths(DOC.read_text()) - WALKTHROUGH_FILES
                      if (why := missing(p)))
    assert problems == [], "docs/architecture.md names what is not there:\n" + "\n".join(problems)


def test_the_walkthrough_example_is_still_hypothetical():
    """If an example op becomes real, the walkthrough must pick another one (it says they don't exist)."""
    from flowc.compiler.ops import OPS
    text = DOC.read_text()
    assert WALKTHROUGH_FILES <= mentioned_paths(text)
    real = [f for f in WALKTHROUGH_FILES if (ROOT / f).exists()] + [op for op in WALKTHROUGH_OPS if op in OPS]
    assert real == [], f"docs/architecture.md's walkthrough adds {real}, which now exist: pick another example op"


def test_the_checker_reports_a_missing_path_and_test():
    assert missing("compiler/no_such_module.py") == "compiler/no_such_module.py does not exist"
    assert missing("codegen_templates/{cpu,cuda}/*.j2") is None
    assert missing("tests/test_ops.py::no_such_test") == "tests/test_ops.py defines no no_such_test"
    assert mentioned_paths("see `compiler/x.py` and `runtime/<name>_executor.py`\n```\n  compiler/y.py  z\n```\n") \
        == {"compiler/x.py", "compiler/y.py"}
