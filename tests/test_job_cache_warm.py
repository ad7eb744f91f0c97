"""The warm path (compiler/job_cache.py): a job the cache holds is neither lowered nor generated again.

The key covers the traced graph, the compiler's own files and the build's options; a hit gives the
same step (and results equal to the reference executor); a damaged entry is rebuilt, never loaded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.compiler import job_cache
from flowc.compiler.ir import Graph
from flowc.compiler.reference import run_reference
from flowc.runtime.executor import CpuLoadedStep
from flowc.runtime.session import Session
from tests.oracle import cotangents, trace_case

ROOT = Path(__file__).resolve().parent.parent


def _layers(x, w):
    return flow.math.tanh(flow.matmul(x, w) + 0.5) * 0.9


def _case() -> tuple[Graph, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3)).astype(np.float32)
    graph, _, _ = trace_case(_layers, [x, w])
    return graph, [x, w] + cotangents(graph, 2, np.random.default_rng(4))


def _key(graph: Graph, **options) -> str:
    args = dict(device="cpu", arch=None, check_numerics=False) | options
    parts = job_cache.job_key_parts(graph, **args)
    assert parts is not None
    return parts.key()


def _with_node(graph: Graph, index: int, **changes) -> Graph:
    nodes = list(graph.nodes)
    nodes[index] = dataclasses.replace(nodes[index], **changes)
    return Graph(graph.name, nodes, list(graph.outputs), dict(graph.assigns), dict(graph.variables),
                 dict(graph.scalars), list(graph.placeholders))


def test_the_key_changes_with_the_graph_and_the_build_options():
    graph, _ = _case()
    key = _key(graph)
    assert key == _key(_case()[0])                  # a graph traced again: the same key
    matmul = next(i for i, n in enumerate(graph.nodes) if n.op == "matmul")
    flipped = tuple((k, not v) if k == "transpose_b" else (k, v) for k, v in graph.nodes[matmul].attrs)
    assert _key(_with_node(graph, matmul, attrs=flipped)) != key
    assert _key(_with_node(graph, matmul, loc="other.py:7")) != key      # the line is in the source
    assert _key(graph, check_numerics=True) != key
    assert _key(graph, device="gpu", arch="sm_90") != key
    assert _key(graph, device="gpu", arch="sm_80") != _key(graph, device="gpu", arch="sm_90")


def test_the_compiler_digest_covers_every_compiler_source_and_template():
    names = {name for name, _ in job_cache.digested_files()}
    assert {"compiler/pipeline.py", "compiler/codegen/cpu.py", "compiler/passes/fusion.py",
            "codegen_templates/cpu/step.cpp.j2", "codegen_templates/cpu/flowc_gemm.h",
            "codegen_templates/cuda/step.cu.j2"} <= names


def test_a_graph_with_an_attribute_that_is_not_plain_is_not_keyed():
    graph, _ = _case()
    node = next(i for i, n in enumerate(graph.nodes) if n.attrs)
    odd = _with_node(graph, node, attrs=graph.nodes[node].attrs + (("zz", object()),))
    assert job_cache.job_key_parts(odd, "cpu", None, False) is None


def test_a_hit_runs_no_pass_and_equals_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(tmp_path))
    graph, feeds = _case()
    cold, _ = job_cache.compile_traced(graph, "cpu", None, False)
    assert cold.compiled and "passes" in cold.timings
    warm, miss = job_cache.compile_traced(_case()[0], "cpu", None, False)
    assert not warm.compiled and miss is None
    assert "passes" not in warm.timings and "job_cache" in warm.timings and warm.pass_records is None
    assert warm.generated.source == cold.generated.source and warm.library == cold.library
    got = CpuLoadedStep(warm, Session()).run(feeds)
    want, _ = run_reference(graph, feeds, {})
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert [r.name for r in warm.passes][-1] == "plan_memory"      # the records, made when asked for


def test_a_damaged_entry_is_rebuilt_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(tmp_path))
    graph, feeds = _case()
    job_cache.compile_traced(graph, "cpu", None, False)
    [pickled] = list(tmp_path.glob("*/*/job.pickle"))
    size = pickled.stat().st_size
    pickled.write_bytes(b"\x80\x05" + b"X" * (size - 2))      # same size, other bytes: the sha256 differs
    again, _ = job_cache.compile_traced(graph, "cpu", None, False)
    assert again.pass_records is not None       # lowered again, not taken from the damaged entry
    got = CpuLoadedStep(again, Session()).run(feeds)
    want, _ = run_reference(graph, feeds, {})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


WARM_SCRIPT = """
import json, sys
sys.path.insert(0, "examples")
import numpy as np, flow
import mlp_train_demo as demo
compiled = demo.train_job.compile()
x = np.ones((100, 1, 28, 28), np.float32); y = np.arange(100, dtype=np.int32) % 10
loss = demo.train_job(x, y)
print(json.dumps({"timings": sorted(compiled.timings), "from_cache": compiled.from_cache,
                  "loss": float(np.mean(loss)), "stats": flow.compile_cache_stats()}))
"""


@pytest.mark.slow
def test_a_new_process_takes_the_job_from_the_cache(tmp_path):
    env = dict(os.environ, FLOWC_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])
    cold, warm = run(), run()
    assert "passes" in cold["timings"] and not cold["from_cache"]
    assert "passes" not in warm["timings"] and warm["from_cache"] and warm["stats"]["compilations"] == 0
    assert warm["loss"] == cold["loss"]


@pytest.mark.slow
def test_flowc_compile_fills_the_job_cache_for_later_processes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "flowc.cli", "compile", "examples/mlp_train_demo.py", "--cache-dir", str(tmp_path)]
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert len(list(tmp_path.glob("*/*/job.pickle"))) == 2          # train_job and eval_job
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("passes and codegen: job cache") == 2 and "0 compiled" in again.stdout
