"""BERT's fused row kernels (compiler/ops/normalization.py, compiler/codegen/rows.py): layer_norm forward
and backward, the scaled masked softmax forward and backward.

Compiled CPU code against the NumPy reference on random inputs of several shapes (rows of length 1,
odd lengths, a case big enough for the OpenMP loops), gradients against finite differences, NaN and
infinities, the CUDA kernels in the emulator of tests/test_cuda_codegen.py, and the traced BERT using
the fused ops.
"""
from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.compiler.trace import emit
from tests.oracle import compile_case, cotangents, finite_difference_check, ops_of_cases, trace_case

# The CUDA templates these tests render (test_cuda_codegen's coverage check leaves them to us).
FUSED_CUDA_TEMPLATES = {f"{op}.cu.j2" for op in ("layer_norm", "layer_norm_grad", "layer_norm_gamma_grad",
                                                 "fused_scale_mask_softmax", "fused_scale_mask_softmax_grad")}

rng = np.random.default_rng(15)


def _normal(*shape, dtype=np.float32):
    return (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)


def numpy_layer_norm(x, gamma, beta, axis, eps=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x64 - mean) / np.sqrt(var + eps) * gamma + beta


def layer_norm_case(x, gamma=None, beta=None, axis=-1, params_axis=-1, eps=1e-5):
    """fn, inputs for flow.nn.layer_norm with the given params (None: left out)."""
    given = [a for a in (gamma, beta) if a is not None]

    def fn(x, *params):
        it = iter(params)
        return flow.nn.layer_norm(x, next(it) if gamma is not None else None, next(it) if beta is not None else None,
                                  begin_norm_axis=axis, begin_params_axis=params_axis, epsilon=eps)
    return fn, [x] + given


def softmax_case(x, mask, scale, reverse=False):
    def fn(x, m):
        scaled = (scale * x) if reverse else (x * scale)
        return flow.nn.softmax((m + scaled) if reverse else (scaled + m))
    return fn, [x, mask]


LAYER_NORM_CASES = {
    "rows_of_one": layer_norm_case(_normal(4, 1), _normal(1), _normal(1)),
    "odd_rows": layer_norm_case(_normal(3, 7), _normal(7), _normal(7)),
    "from_axis_1": layer_norm_case(_normal(2, 3, 5), _normal(3, 5), _normal(3, 5), axis=1, params_axis=1),
    "params_on_last_axis_only": layer_norm_case(_normal(2, 3, 5), _normal(5), _normal(5), axis=1, params_axis=-1),
    "no_gamma": layer_norm_case(_normal(5, 6), None, _normal(6)),
    "no_beta": layer_norm_case(_normal(5, 6), _normal(6), None),
    "no_params": layer_norm_case(_normal(3, 4, 9), axis=-1),
    "eps_0_1": layer_norm_case(_normal(6, 33), _normal(33), _normal(33), eps=0.1),
    "float64": layer_norm_case(_normal(3, 11, dtype=np.float64), _normal(11, dtype=np.float64),
                               _normal(11, dtype=np.float64)),
}
SOFTMAX_CASES = {
    "attention_mask": softmax_case(_normal(2, 3, 4, 5), _normal(2, 1, 4, 5), 0.125),
    "reversed_operands": softmax_case(_normal(2, 3, 4, 5), _normal(4, 5), 0.5, reverse=True),
    "row_mask": softmax_case(_normal(6, 7), _normal(7), 2.0),
    "rows_of_one": softmax_case(_normal(3, 1), _normal(3, 1), 0.3),
    "full_mask": softmax_case(_normal(3, 9), _normal(3, 9), -1.5),
    # BERT's mask: -10000 at masked positions; scores spread wide, so exp meets its underflow cut-off
    "bert_mask": softmax_case(_normal(2, 2, 3, 17) * 30, np.where(_normal(2, 1, 3, 17) > 0, 0, -10000)
                              .astype(np.float32), 0.35),
}
CASES = {**{f"layer_norm_{k}": v for k, v in LAYER_NORM_CASES.items()},
         **{f"softmax_{k}": v for k, v in SOFTMAX_CASES.items()}}


def covered_ops() -> set[str]:
    """Every op the cases above use, gradients included (tests/test_ops.py checks each op has a case)."""
    return ops_of_cases(CASES.values())


def assert_match(got, want, rtol=2e-5, atol=2e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_cpu_equals_the_reference(name):
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    ops = {n.op for n in case.graph.nodes}
    assert ("layer_norm" if name.startswith("layer_norm") else "fused_scale_mask_softmax") in ops
    assert "softmax" not in ops and "reduce_mean" not in ops
    assert_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_finite_differences(name):
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs, rtol=1e-5, atol=1e-7)


def test_the_reference_is_numpy_layer_norm_and_softmax():
    x, g, b = _normal(4, 2, 6), _normal(2, 6), _normal(2, 6)
    fn, inputs = layer_norm_case(x, g, b, axis=1, params_axis=1, eps=1e-3)
    graph, _, _ = trace_case(fn, inputs, grads=False)
    (got,), _ = run_reference(graph, inputs, {})
    np.testing.assert_allclose(got, numpy_layer_norm(x, g, b, 1, 1e-3), rtol=1e-6, atol=1e-6)
    x, m = _normal(2, 3, 4), _normal(2, 1, 4)
    graph, _, _ = trace_case(*softmax_case(x, m, 0.25), grads=False)
    (got,), _ = run_reference(graph, [x, m], {})
    z = x.astype(np.float64) * 0.25 + m
    want = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=1e-6)


def test_large_rows_run_the_parallel_loops():
    """Past PARALLEL_MIN_ELEMENTS the row loops run on OpenMP threads; the results are the same."""
    from flowc.compiler.codegen.cpu import PARALLEL_MIN_ELEMENTS
    rows = PARALLEL_MIN_ELEMENTS // 384 + 3
    for fn, inputs in (layer_norm_case(_normal(rows, 384), _normal(384), _normal(384)),
                       softmax_case(_normal(rows // 4, 4, 384), _normal(rows // 4, 1, 384), 0.125)):
        case = compile_case(fn, inputs)
        assert_match(case.compiled, case.reference, rtol=1e-4, atol=2e-5)


def test_nan_and_infinity_poison_only_their_row():
    x = _normal(4, 6)
    x[1, 2], x[2, 0] = np.nan, np.inf
    fn, inputs = layer_norm_case(x, _normal(6), _normal(6))
    case = compile_case(fn, inputs)
    assert_match(case.compiled, case.reference)
    y = case.compiled[0]
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all() and np.isfinite(y[[0, 3]]).all()
    # a fully masked row (-inf everywhere) is NaN, as NumPy's exp(-inf - -inf); -inf in part of a row is 0
    s, m = _normal(3, 5), np.zeros((3, 5), np.float32)
    m[0, :] = -np.inf
    m[1, 3] = -np.inf
    s[2, 1] = np.nan
    case = compile_case(*softmax_case(s, m, 0.5))
    assert_match(case.compiled, case.reference)
    p = case.compiled[0]
    assert np.isnan(p[0]).all() and p[1, 3] == 0 and np.isnan(p[2]).all()
    np.testing.assert_allclose(p[1].sum(), 1, rtol=1e-6)
    # a constant row with epsilon 0: 0 / 0, NaN as in the reference
    fn, inputs = layer_norm_case(np.ones((2, 3), np.float32), eps=0.0)
    case = compile_case(fn, inputs, grads=False)
    assert np.isnan(case.compiled[0]).all() and np.isnan(case.reference[0]).all()


def test_only_the_scaled_masked_pattern_is_fused():
    x, m = _normal(2, 5), _normal(2, 5)
    for fn, fused in ((lambda x, m: flow.nn.softmax(x + m), False),          # no scale: a plain softmax
                      (lambda x, m: flow.nn.softmax(x * m + m), False),       # a tensor factor, not a scale
                      (lambda x, m: flow.nn.softmax(x * 3.0 + m), True),
                      (lambda x, m: flow.nn.softmax(x * 3.0 + m, axis=0), False)):  # transposed first: not the pattern
        graph, _, _ = trace_case(fn, [x, m], grads=False)
        ops = [n.op for n in lower(graph).graph.nodes]
        assert ("fused_scale_mask_softmax" in ops) == fused and ("softmax" in ops) != fused
        case = compile_case(fn, [x, m])
        assert_match(case.compiled, case.reference)


def test_misuse_is_a_shape_error_naming_the_op():
    """The error names the user's line and the argument."""
    from flowc.compiler.errors import TraceError
    with pytest.raises(TraceError, match=r"test_fused_bert_kernels.py:\d+: .*fused_scale_mask_softmax: mask"):
        trace_case(lambda x, m: emit("fused_scale_mask_softmax", [x, m], {"scale": 1.0}),
                   [_normal(2, 5), _normal(2, 4)], grads=False)
    with pytest.raises(TraceError, match=r"test_fused_bert_kernels.py:\d+: .*layer_norm: gamma must be float32\[5\]"):
        trace_case(lambda x, g: emit("layer_norm", [x, g], {"begin_norm_axis": 1, "epsilon": 1e-5, "scale": True,
                                                             "center": False}),
                   [_normal(2, 5), _normal(4)], grads=False)


def test_bert_uses_the_fused_kernels():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "models"))
    import bert
    train, _ = bert.make_jobs(bert.CONFIGS["tiny"])
    program = train.lower().program
    ops = [n.op for n in program.graph.nodes]
    layers = bert.CONFIGS["tiny"].num_hidden_layers
    assert ops.count("fused_scale_mask_softmax") == layers and ops.count("fused_scale_mask_softmax_grad") == layers
    # embeddings, two per encoder layer, the masked-LM head: forward, dx and dgamma of each
    norms = 2 + 2 * layers
    assert ops.count("layer_norm") == ops.count("layer_norm_grad") == ops.count("layer_norm_gamma_grad") == norms
    assert "softmax" not in ops and "reduce_mean" not in ops
    assert len(program.kernels or []) < 270      # 365 before the fused kernels and clone_constants


# --- CUDA: in the emulator ----------------------------------------------------------------------

def test_cuda_kernels_equal_the_reference_in_the_emulator(tmp_path):
    from tests.test_cuda_codegen import Emulator, render, replay
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    picked = ["layer_norm_odd_rows", "layer_norm_params_on_last_axis_only", "layer_norm_no_beta",
              "layer_norm_rows_of_one", "softmax_attention_mask", "softmax_rows_of_one"]
    built = {}
    for i, name in enumerate(picked):
        fn, inputs = CASES[name]
        graph, _, _ = trace_case(fn, inputs, True)
        program = lower(graph)
        feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(i))
        built[name] = (program, render(program, prefix=f"fr{i}_"), feeds)
    # many rows: the gamma gradient's statistics in several shared-memory chunks
    fn, inputs = layer_norm_case(_normal(600, 3), _normal(3), _normal(3))
    graph, _, _ = trace_case(fn, inputs, True)
    program = lower(graph)
    built["many_rows"] = (program, render(program, prefix="frm_"),
                          list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(9)))
    assert FUSED_CUDA_TEMPLATES <= {t for _, step, _ in built.values() for t in step.templates}
    emulator = Emulator(tmp_path)
    lib = emulator.build("\n".join(step.source for _, step, _ in built.values()),
                         [la.kernel for _, step, _ in built.values() for la in step.launches])
    for name, (program, step, feeds) in built.items():
        got, status = replay(emulator, lib, program, step, feeds, {}, {})
        want, _ = run_reference(program.graph, feeds, {})
        assert status == 0, name
        assert_match(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.isfile("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc is not installed")
def test_the_cuda_kernels_compile_with_nvcc(tmp_path):
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_cubin
    from tests.test_cuda_codegen import render
    sources = []
    for i, name in enumerate(sorted(CASES)):
        fn, inputs = CASES[name]
        graph, _, _ = trace_case(fn, inputs, True)
        sources.append(render(lower(graph), prefix=f"nv{i}_").source)
    result = build_cubin("\n".join(sources), "fused_rows", "sm_90", cache=KernelCache(tmp_path / "cache"))
    assert b"layer_norm" in result.path.read_bytes()


def test_the_vectorised_exp_is_accurate_over_its_whole_range():
    """Rows (0, -t) for t from 0 past float's underflow: p = e^-t / (1 + e^-t) within 2 ulp-ish, 0 past
    ln(FLT_MIN) (NumPy's subnormals there are below 1.2e-38)."""
    t = np.linspace(0, 104, 2001, dtype=np.float32)
    x = np.stack([np.zeros_like(t), -t], axis=1)
    case = compile_case(*softmax_case(x, np.zeros((2,), np.float32), 1.0), grads=False)
    got, want = case.compiled[0][:, 1], case.reference[0][:, 1]
    normal = want > np.finfo(np.float32).tiny
    np.testing.assert_allclose(got[normal], want[normal], rtol=5e-7)
    assert np.all(np.abs(got[~normal] - want[~normal]) < 1.2e-38)


def test_a_shared_constant_is_a_literal_in_each_reader_not_a_kernel():
    """compiler/passes/constants.py: a (1,) constant read by two loops and a (3, 4) one broadcast into a
    mask are copied into their readers; no kernel computes a constant alone."""
    def fn(x, y):
        c = flow.constant(0.9, dtype=flow.float32, shape=(1,))
        zeros = flow.constant(0.0, dtype=flow.float32, shape=(3, 4))
        return x * c, flow.math.reduce_sum(flow.math.exp(y) * c, axis=[1]), zeros + flow.reshape(x, (2, 1, 4))
    inputs = [_normal(2, 4), _normal(3, 5)]
    graph, _, _ = trace_case(fn, inputs, grads=False)
    program = lower(graph)
    alone = [k.name for k in program.kernels or [] if k.kind == "pointwise"
             and all(program.graph.node(m).op == "constant" for m in k.members)]
    assert alone == []
    assert sum(program.graph.node(m).op == "constant" for k in program.kernels or [] for m in k.members) == 3
    case = compile_case(fn, inputs)
    assert_match(case.compiled, case.reference)


def test_bias_and_gelu_run_in_the_gemm_epilogue():
    """chain_epilogues (compiler/passes/fusion.py): the bias add's value is also read by gelu's gradient,
    so gelu was a loop of its own; it now runs in the GEMM's write-back, the bias add still stored."""
    w = _normal(6, 5) * 0.3
    b = _normal(5)

    def fn(x, w, b):
        return flow.math.gelu(flow.nn.bias_add(flow.matmul(x, w), b)) * 2.0
    inputs = [_normal(7, 6), w, b]
    graph, _, _ = trace_case(fn, inputs, grads=True)
    program = lower(graph)
    names = [k.name for k in program.kernels or []]
    assert any(n.startswith("matmul_") and "_add_gelu_multiply" in n for n in names), names
    assert not any(k.kind == "pointwise" and any(program.graph.node(m).op == "gelu" for m in k.members)
                   for k in program.kernels or [])
    case = compile_case(fn, inputs)
    assert_match(case.compiled, case.reference, rtol=1e-5, atol=1e-5)
    finite_difference_check(fn, inputs)


def test_auto_mixed_precision_treats_the_fused_ops_as_gray():
    """OneFlow 0.3.4's AMP gray list has layer_norm and softmax: between two matmuls they run in float16
    (computed in float32 between conversions), and the job still trains."""
    from flowc.runtime.session import default_session
    cfg = flow.FunctionConfig()
    cfg.enable_auto_mixed_precision(True)
    init = flow.random_normal_initializer(stddev=0.5)

    @flow.global_function(type="train", function_config=cfg)
    def amp_job(x: tp.Numpy.Placeholder((4, 8)), m: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        h = flow.layers.layer_norm(flow.layers.dense(x, 8, name="amp_d1", kernel_initializer=init),
                                   begin_norm_axis=-1, name="amp_ln")
        p = flow.nn.softmax(flow.matmul(h, h, transpose_b=True) * 0.5 + m)
        out = flow.layers.dense(flow.matmul(p, h), 3, name="amp_d2", kernel_initializer=init)
        loss = flow.math.reduce_mean(out * out)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    x, m = _normal(4, 8), np.zeros((4, 4), np.float32)
    losses = [amp_job(x, m).item() for _ in range(4)]
    assert losses[-1] < losses[0] and np.isfinite(losses).all()
    graph = amp_job._trace(default_session()).graph
    types = {n.op: n.type.dtype for n in graph.nodes}
    assert types["layer_norm"] == types["fused_scale_mask_softmax"] == types["layer_norm_grad"] == "float16"
