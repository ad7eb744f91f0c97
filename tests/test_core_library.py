"""The core library: the GEMM kernel and the precompiled prelude are built once per machine, and
step libraries leave the GEMM to it (which is what keeps a step's compile short)."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler import core_library


@pytest.mark.slow
def test_core_is_built_once_into_its_own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWC_CORE_DIR", str(tmp_path / "core"))
    first = core_library.ensure_core()
    assert first.compiled and first.library.is_file()
    assert (first.include_dir / f"{core_library.PRELUDE}.gch").is_file()
    core_library._ensure_core.cache_clear()          # as a new process would
    again = core_library.ensure_core()
    assert not again.compiled and again.library == first.library


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not installed")
def test_a_step_library_leaves_the_gemm_to_the_core():
    @flow.global_function(type="predict")
    def product(a: tp.Numpy.Placeholder((64, 96), dtype=flow.float),
                b: tp.Numpy.Placeholder((96, 80), dtype=flow.float)) -> tp.Numpy:
        return flow.nn.relu(flow.matmul(a, b))

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96), np.float32), rng.standard_normal((96, 80), np.float32)
    np.testing.assert_allclose(product(a, b), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    symbols = subprocess.run(["nm", "-D", "-C", str(product.compiled.library)], capture_output=True,
                             text=True, check=True).stdout
    undefined = [line for line in symbols.splitlines() if " U " in line and "gemm_f32_core" in line]
    assert undefined, "the step should call the core's gemm_f32_core, not contain its own GEMM"
    assert "f32_tile" not in symbols


def test_a_step_compiles_as_parallel_parts_that_partition_its_kernels(monkeypatch):
    import flowc.compiler.codegen.cpu as cpu
    monkeypatch.setattr(cpu, "COMPILE_PARTS", 2)

    @flow.global_function(type="predict")
    def chain(x: tp.Numpy.Placeholder((32, 48), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("parts-w", shape=(48, 48), initializer=flow.ones_initializer())
        h = flow.nn.relu(flow.matmul(x, w))
        return flow.math.reduce_sum(flow.nn.softmax(flow.matmul(h, w) * 0.001), axis=1) + flow.math.reduce_max(h)

    lowered = chain.lower()
    from flowc.compiler.pipeline import generate
    generated = generate(lowered.program)
    kernels = [k.name for k in lowered.program.kernels]
    assert len(kernels) >= cpu.MIN_KERNELS_TO_SPLIT and len(generated.parts) == 2
    for name in kernels:     # each kernel defined in exactly one part (the others may declare it)
        definition = re.compile(rf"FLOWC_KERNEL (void|int) {name}\([^;{{]*\) {{")
        assert sum(bool(definition.search(p)) for p in generated.parts) == 1, name
    assert [('extern "C" int flowc_step' in p) for p in generated.parts] == [False, True]
    x = np.random.default_rng(1).standard_normal((32, 48)).astype(np.float32)
    compiled = lowered.compile()
    assert 'extern "C" int flowc_step' in compiled.source()
    h = np.maximum(x @ np.ones((48, 48), np.float32), 0)
    z = (h @ np.ones((48, 48), np.float32)) * 0.001
    soft = np.exp(z - z.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    np.testing.assert_allclose(chain(x), soft.sum(1) + h.max(), rtol=1e-4)
