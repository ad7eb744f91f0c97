"""Compile time that scales (issue 15): equal kernels share one function, the optimizer's loops too.

The generated step of a job with repeated structure has fewer C++ functions than kernels, and still
computes what the NumPy reference executor computes.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.compiler.codegen.dedup import KernelTable, kernel_signature
from flowc.compiler.pipeline import generate, lower
from flowc.compiler.reference import run_reference
from tests.oracle import compile_case, cotangents, trace_case

ROOT = Path(__file__).resolve().parent.parent

KERNEL = """// k3_add: %3 add @a.py:1
FLOWC_KERNEL void k3_add(const float* FLOWC_RESTRICT b1, float* FLOWC_RESTRICT b3) {
  for (int64_t i = 0; i < 8; ++i) { const float v3 = b1[i] + 1.0f; b3[i] = v3; }
}
"""


def renamed(text: str, mapping: dict[str, str]) -> str:
    for old, new in mapping.items():
        text = text.replace(old, new)
    return text


def test_kernels_equal_up_to_node_ids_comments_and_name_have_one_signature():
    other = renamed(KERNEL, {"k3_add": "k9_add", "b1": "b7", "b3": "b9", "v3": "v9", "@a.py:1": "@b.py:99",
                             "%3": "%9"})
    assert kernel_signature(KERNEL, "k3_add") == kernel_signature(other, "k9_add")


def test_kernels_that_compute_differently_have_different_signatures():
    for change in ({"1.0f": "2.0f"}, {"< 8": "< 9"}, {"const float* FLOWC_RESTRICT b1": "const float* b1"},
                   {"b1[i] + 1.0f": "b3[i] + 1.0f"}):
        assert kernel_signature(renamed(KERNEL, change), "k3_add") != kernel_signature(KERNEL, "k3_add"), change


def test_the_table_keeps_the_first_of_equal_kernels_and_counts_every_call():
    table = KernelTable()
    assert table.add(KERNEL, "k3_add") == ("k3_add", True)
    other = renamed(KERNEL, {"k3_add": "k9_add", "b1": "b5", "b3": "b6", "v3": "v6"})
    assert table.add(other, "k9_add") == ("k3_add", False)
    assert table.sources == [KERNEL] and table.calls == 2


def _repeated_layers(x, w):
    h = x
    for _ in range(8):              # eight layers of one shape: the middle ones share their functions
        h = flow.math.tanh(flow.matmul(h, w) + 0.5) * 0.9
    return h


def test_repeated_layers_share_functions_and_equal_the_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = (rng.standard_normal((5, 5)) * 0.5).astype(np.float32)
    graph, _, _ = trace_case(_repeated_layers, [x, w])
    program = lower(graph)
    step = generate(program)
    assert step.kernel_functions < len(program.kernels) / 2, (step.kernel_functions, len(program.kernels))
    case = compile_case(_repeated_layers, [x, w])
    for got, want in zip(case.compiled, case.reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bert_tiny_train_step_has_far_fewer_functions_than_kernels():
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    try:
        import bert
    finally:
        sys.path.remove(str(ROOT / "examples" / "models"))
    train, _ = bert.make_jobs(bert.CONFIGS["tiny"])
    program = train.lower().program
    step = generate(program)
    # 365 kernels in 149 functions when this was written; the optimizer's per-variable loops are
    # functions of their own, shared by the variables of one shape.
    assert step.kernel_functions < len(program.kernels) / 2
    assert step.source.count("FLOWC_KERNEL void optimizer_update_loop") < len(train.graph.assigns) / 2


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
def test_cuda_launches_of_equal_kernels_share_a_function_and_equal_the_reference(tmp_path):
    """The CUDA step of the repeated layers: fewer __global__ functions than launches, every launch
    names a function of the source, and the launch list replayed in the CPU emulation of CUDA
    (tests/test_cuda_codegen.py) equals the reference executor."""
    from tests.test_cuda_codegen import Emulator, render, replay
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = (rng.standard_normal((5, 5)) * 0.5).astype(np.float32)
    graph, _, _ = trace_case(_repeated_layers, [x, w])
    program = lower(graph)
    step = render(program, prefix="scaling_")
    assert step.kernel_functions < len(step.launches) / 2
    defined = set(re.findall(r"__global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(", step.source))
    assert len(defined) == step.kernel_functions and {la.kernel for la in step.launches} <= defined
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    feeds = [x, w] + cotangents(graph, 2, np.random.default_rng(2))
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    want, _ = run_reference(graph, feeds, {})
    assert status == 0
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_a_long_compile_shows_its_progress_on_a_terminal_only(monkeypatch):
    from flowc.compiler import build_progress
    monkeypatch.setattr(build_progress, "SHOW_AFTER_S", 0.0)
    terminal = _Terminal(tty=True)
    progress = build_progress.CompileProgress("'bert_train'", 2, terminal)
    progress.update(1)
    progress.finish()
    assert "compiling 'bert_train': 1/2 parts done" in terminal.text
    assert terminal.text.rstrip().splitlines()[-1].lstrip("\r").startswith("flowc: compiled 'bert_train' in 2 parts")
    log = _Terminal(tty=False)
    quiet = build_progress.CompileProgress("'bert_train'", 2, log)
    quiet.update(1)
    quiet.finish()
    assert log.text == ""


def test_a_quick_compile_shows_nothing():
    from flowc.compiler import build_progress
    terminal = _Terminal(tty=True)
    progress = build_progress.CompileProgress("'job'", 2, terminal)
    progress.update(2)
    progress.finish()
    assert terminal.text == ""
