"""flow.float16 end to end: dtype objects, storage, casts, compute in float32, checkpoints, CUDA.

Tolerance rule for float16 results: flowc computes every float16 op in float32 and rounds its result
to float16 (compiler/passes/float16.py), so a compiled float16 value is compared with a reference
computed op by op in float32 and rounded to float16 after each op; they may differ by one float16
ulp (2^-10 relative: float32 summation order can move a value across a rounding tie), and special
values (NaN, +-Inf, -0.0, 65504) must be equal.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.passes.float16 import compute_float16_in_float32, float16_nodes
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from tests.oracle import compile_case, trace_case

F16 = np.float16
ULP = 2.0 ** -10


def assert_half_close(got: np.ndarray, want: np.ndarray) -> None:
    """The module's tolerance rule: one float16 ulp, special values equal."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    same_special = (np.isnan(g) == np.isnan(w)).all() and (np.isinf(w) <= (g == w)).all()
    assert same_special, (got, want)
    finite = np.isfinite(w)
    np.testing.assert_allclose(g[finite], w[finite], rtol=ULP, atol=2.0 ** -24)


def half_ops(x, w, k):
    y = flow.matmul(x, w)                                     # float32 GEMM on float copies
    z = flow.math.exp(y) * 0.5 + flow.math.sigmoid(y)         # a fused chain, rounded per op
    s = flow.math.reduce_sum(z, axis=[1])                     # accumulates in float32
    big = x * 1000.0                                          # past 65504: infinity
    back = flow.cast(flow.cast(x, flow.float32) * 3.0, flow.float16)
    from_int = flow.cast(k, flow.float16)
    to_int = flow.cast(x * 10.0, flow.int32)
    return y, z, s, big, back, from_int, to_int


def half_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 5)).astype(F16)
    x[0, :4] = [np.nan, np.inf, -0.0, 65504.0]
    x[1, 0] = F16(6e-8)                                        # a subnormal half
    w = (rng.standard_normal((5, 3)) * 0.5).astype(F16)
    k = np.array([0, 1, -3, 2047, 2049, 70000], np.int32)     # 2049 rounds to even, 70000 overflows
    return [x, w, k]


def numpy_half_reference(x, w, k) -> list[np.ndarray]:
    """The same computation written directly in NumPy: float32 per op, rounded to float16."""
    def r(a):
        return np.asarray(a, np.float32).astype(F16)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    with np.errstate(all="ignore"):
        y = r(x32 @ w32)
        z = r(r(r(np.exp(y.astype(np.float32))).astype(np.float32) * 0.5).astype(np.float32)
              + r(1 / (1 + np.exp(-y.astype(np.float32)))).astype(np.float32))
        s = r(z.astype(np.float32).sum(axis=1))
        big = r(x32 * 1000.0)
        back = r(x32 * 3.0)
        from_int = r(k.astype(np.float32))
        ten = r(x32 * 10.0).astype(np.float64)      # saturating, NaN to 0 (flowc's float -> int rule)
        to_int = np.clip(np.nan_to_num(ten, nan=0.0, posinf=2**31 - 1, neginf=-2**31), -2**31, 2**31 - 1)
        to_int = to_int.astype(np.int32)
    return [y, z, s, big, back, from_int, to_int]


@pytest.fixture(scope="module")
def half_case():
    return compile_case(half_ops, half_inputs(), grads=False)


def test_float16_dtype_objects():
    assert flow.half is flow.float16 and flow.float16 == np.float16 and flow.float16 != flow.float32
    assert repr(flow.float16) == "flow.float16" and hash(flow.float16) == hash(np.dtype(np.float16))
    assert flow.convert_oneflow_dtype_to_numpy_dtype(flow.float16) == np.dtype(np.float16)
    assert flow.convert_oneflow_dtype_to_numpy_dtype(flow.int64) == np.dtype(np.int64)
    with pytest.raises(TypeError, match="flow dtype"):
        flow.convert_oneflow_dtype_to_numpy_dtype("float16")


def test_compiled_float16_equals_the_reference_and_numpy(half_case):
    got, want = half_case.compiled, half_case.reference
    direct = numpy_half_reference(*half_inputs())
    assert [g.dtype for g in got] == [F16] * 6 + [np.int32]
    for g, w, d in zip(got, want, direct):
        if g.dtype == F16:
            assert_half_close(g, w)
            assert_half_close(g, d)
        else:
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, d)
    big, from_int = got[3], got[5]
    assert np.isinf(big[0, 3]) and np.isnan(big[0, 0]) and np.signbit(big[0, 2]) and big[0, 2] == 0
    np.testing.assert_array_equal(from_int, np.array([0, 1, -3, 2047, 2048, np.inf], F16))


def test_no_kernel_computes_in_float16_and_other_graphs_are_untouched():
    graph, _, _ = trace_case(half_ops, half_inputs(), grads=False)
    assert float16_nodes(graph)                        # the traced graph has float16 ops ...
    lowered = lower(graph).graph
    assert not float16_nodes(lowered)                  # ... the lowered one only casts and buffers
    ops = {n.op for n in lowered.nodes if n.type.dtype == "float16"}
    assert ops <= {"input", "cast"}, ops
    plain, _, _ = trace_case(lambda a: flow.math.exp(a) * 2.0, [np.ones((3,), np.float32)], grads=False)
    assert compute_float16_in_float32(plain) is plain


def test_float16_variables_train_and_checkpoint(tmp_path):
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float16)) -> tp.Numpy:
        w = flow.get_variable("w16", shape=(4, 3), dtype=flow.float16,
                              initializer=flow.random_normal_initializer(seed=1))
        loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
        return loss

    x = np.random.default_rng(0).standard_normal((8, 4)).astype(F16)
    losses = [train(x).item() for _ in range(5)]
    before = {name: flow.get_all_variables()[name].numpy().copy() for name in train.graph.variables}
    (want_loss,), updates = run_reference(train.graph, [x], before, {"learning_rate:float16": 0.05})
    assert_half_close(train(x), want_loss)                      # one more step against the reference
    after = flow.get_all_variables()["w16"].numpy()
    assert after.dtype == F16 and losses[-1] < losses[0]
    assert_half_close(after, updates["w16"])
    flow.checkpoint.save(str(tmp_path / "ck"))
    assert "data_type: kFloat16" in (tmp_path / "ck" / "w16" / "meta").read_text()
    assert (tmp_path / "ck" / "w16" / "out").read_bytes() == after.astype("<f2").tobytes()
    train(x)
    flow.load_variables({"w16": np.zeros((4, 3), F16)})
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ck")))
    np.testing.assert_array_equal(flow.get_all_variables()["w16"].numpy(), after)
    flow.clear_default_session()


# --- CUDA: the emulator (fast) and nvcc (slow) ------------------------------------------------------

@pytest.fixture(scope="module")
def half_cuda():
    from tests.test_cuda_codegen import render
    graph, _, _ = trace_case(half_ops, half_inputs(), grads=False)
    program = lower(graph)
    return program, render(program, prefix="half_")


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
def test_float16_cuda_kernels_equal_the_reference_in_the_emulator(tmp_path_factory, half_cuda):
    from tests.test_cuda_codegen import Emulator, replay
    program, step = half_cuda
    assert "flowc::half" in step.source
    emulator = Emulator(tmp_path_factory.mktemp("half-emulator"))
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    feeds = half_inputs()
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    want, _ = run_reference(program.graph, feeds, {})
    assert status == 0
    for g, w in zip(got, want):
        if g.dtype == F16:
            assert_half_close(g, w)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_float16_cuda_step_compiles_with_nvcc(tmp_path, half_cuda):
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_cubin
    _, step = half_cuda
    res = build_cubin(step.source, "half", "sm_80", cache=KernelCache(tmp_path / "cache"))
    cubin = res.path.read_bytes()
    from tests.test_cuda_runtime_fixes import fatbin_entries
    assert sorted(fatbin_entries(cubin)) == [("elf", 80), ("ptx", 80)]      # a fat binary: SASS and PTX
    for launch in step.launches:
        assert launch.kernel.encode() in cubin
