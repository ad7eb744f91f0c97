"""The staged library API: `job.lower()` gives text, `.compile()` a built step the job then runs."""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.stages import UnknownPassError, pass_names


def make_job(scale: float):
    @flow.global_function(type="predict")
    def affine(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("stages-w", shape=(3, 4), initializer=flow.ones_initializer())
        return flow.nn.relu(flow.matmul(x, w, transpose_b=True) * scale + 1.0)
    return affine


def test_lowered_prints_the_program_after_any_pass():
    lowered = make_job(2.0).lower()
    final = lowered.as_text()
    assert "kernels of affine" in final and "arena peak" in final
    early = lowered.as_text(after="simplify")
    assert "graph affine {" in early and "kernels of" not in early
    assert [r.name for r in lowered.passes] == pass_names()
    assert "fuse_epilogues" in lowered.passes_text()
    assert "matmul" in lowered.kernels_text() and "fused (" in lowered.kernels_text()
    with pytest.raises(UnknownPassError, match="unknown pass 'fusion'; the passes are: simplify, "):
        lowered.as_text(after="fusion")


def test_compile_builds_once_and_the_first_call_compiles_nothing():
    job = make_job(2.0)
    compiled = job.compile()
    assert 'extern "C" int flowc_step' in compiled.source()
    assert compiled.source_path.read_text() == compiled.source()
    assert compiled.memory_plan().peak_bytes == compiled.step.program.memory.arena_bytes
    assert "arena peak" in str(compiled.memory_plan())
    # lowered and generated now, or (a test cache kept across runs) taken from the job cache
    assert set(compiled.timings) >= {"trace", "compile"}
    assert {"passes", "codegen"} <= set(compiled.timings) or "job_cache" in compiled.timings
    before = flow.compile_cache_stats()
    out = job(np.ones((8, 4), np.float32))
    np.testing.assert_allclose(out, np.full((8, 3), 9.0))
    assert flow.compile_cache_stats() == before          # the call used the step compile() built


def test_a_second_compile_is_a_cache_hit_and_a_changed_job_says_why():
    first = make_job(2.0).compile()
    flow.clear_default_session()
    again = make_job(2.0).compile()
    assert again.from_cache and again.miss_reason is None and again.library == first.library
    flow.clear_default_session()
    # a constant no earlier run used, so the cache cannot have it even when kept across runs
    changed = make_job(float(np.random.default_rng().uniform(3.0, 4.0))).compile()
    assert not changed.from_cache
    assert changed.miss_reason == "cache miss for 'affine': source changed since the last build"


def test_lower_rejects_an_unknown_device():
    with pytest.raises(ValueError, match="device must be 'cpu' or .*, got 'tpu'"):
        make_job(1.0).lower(device="tpu")


def test_a_graph_pass_placed_after_fusion_is_refused(monkeypatch):
    from flowc.compiler import pipeline
    from flowc.compiler.passes import simplify

    @flow.global_function(type="predict")
    def late(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return flow.nn.relu(x) * 2.0

    passes = list(pipeline.PASSES)
    passes.insert(passes.index(next(p for p in passes if p[0] == "fuse_elementwise")) + 1,
                  ("simplify_late", pipeline._graph_pass(simplify.simplify)))
    monkeypatch.setattr(pipeline, "PASSES", passes)
    with pytest.raises(AssertionError, match="graph pass simplify runs after the kernels were formed"):
        late.lower()
