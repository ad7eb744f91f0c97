"""What a user sees when looking inside: FLOWC_DEBUG dumps, pass records, the flowc command."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import flow
import flow.typing as tp

ROOT = pathlib.Path(__file__).resolve().parent.parent


@flow.global_function(type="predict")
def affine(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float)) -> tp.Numpy:
    w = flow.get_variable("affine-w", shape=(3, 4), initializer=flow.ones_initializer())
    return flow.nn.relu(flow.matmul(x, w, transpose_b=True) + 1.0)


def test_flowc_debug_writes_ir_source_and_plan(monkeypatch, capsys):
    monkeypatch.setenv("FLOWC_DEBUG", "1")
    out = affine(np.ones((8, 4), np.float32))
    np.testing.assert_allclose(out, np.full((8, 3), 5.0))
    err = capsys.readouterr().err
    match = re.search(r"IR after each pass, step.cpp and the memory plan in (\S+);", err)
    assert match, err
    folder = pathlib.Path(match.group(1))
    names = sorted(p.name for p in folder.iterdir())
    assert "step.cpp" in names and "memory_plan.txt" in names
    assert any(n.endswith("fuse_epilogues.txt") for n in names), names
    assert "flowc_step" in (folder / "step.cpp").read_text()
    assert "arena peak" in (folder / "memory_plan.txt").read_text()


def test_pass_records_and_kernel_listing():
    step = affine.compiled
    names = [p.name for p in step.passes]
    assert names[0] == "simplify" and names[-1] == "plan_memory"
    assert all(p.seconds >= 0 and p.dump for p in step.passes)
    listing = step.program.format()
    assert "matmul" in listing and "arena peak" in listing
    # the generated source names the user's line for each kernel
    assert "test_debugging.py:" in step.generated.source


@pytest.mark.slow
def test_flowc_version_and_cache_info(tmp_path):
    env = {"FLOWC_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    version = subprocess.run([sys.executable, "-m", "flowc.cli", "--version"], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("flowc ")
    info = subprocess.run([sys.executable, "-m", "flowc.cli", "cache", "info"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert info.returncode == 0 and str(tmp_path) in info.stdout
