"""Batch normalisation of train jobs as fused kernels (compiler/ops/batch_norm.py, issue 15).

The four ops (statistics, normalisation, the gradient's two sums, dx) compiled for the CPU against
the NumPy reference on random inputs: NCHW and NHWC, 2-D, batch 1, channel blocks with a remainder,
with and without gamma/beta, float64, a mean large against the spread (the variance's accuracy),
NaN and infinity, sizes past the OpenMP threshold.  Gradients against finite differences; the CUDA
kernels in the emulator; `flow.layers.batch_normalization` in train jobs (the moving statistics
over several steps against the NumPy rule and the reference executor, OneFlow's variable names in a
checkpoint) and in predict jobs (the normalisation still folds into the convolution's epilogue).
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)

import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.compiler.trace import emit
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import default_session
from tests.oracle import compile_case, cotangents, finite_difference_check, ops_of_cases, trace_case

# The CUDA templates these tests render (test_cuda_codegen's coverage check leaves them to us).
BATCH_NORM_CUDA_TEMPLATES = {f"{op}.cu.j2" for op in ("batch_norm_stats", "batch_norm", "batch_norm_grad_sums",
                                                      "batch_norm_grad")}

rng = np.random.default_rng(1515)


def _normal(*shape, dtype=np.float32, mean=0.5, std=2.0):
    return (rng.standard_normal(shape) * std + mean).astype(dtype)


def bn_case(x, axis, gamma=True, beta=True, eps=1e-3):
    """fn, inputs: the statistics and y of the fused ops on `x` (gamma/beta random when asked)."""
    channels = x.shape[axis]
    params = [p for p, on in ((_normal(channels, dtype=x.dtype), gamma), (_normal(channels, dtype=x.dtype), beta))
              if on]

    def fn(x, *ps):
        stats = emit("batch_norm_stats", [x], {"axis": axis})
        y = emit("batch_norm", [x, stats, *ps], {"axis": axis, "epsilon": eps, "scale": gamma, "center": beta})
        return y, stats
    return fn, [x] + params


def bn_relu_case(x, axis):
    """fn, inputs: relu(batch_norm(x) + z), the residual block's ending (an epilogue of batch_norm)."""
    fn, inputs = bn_case(x, axis)

    def with_relu(x, g, b, z):
        y, stats = fn(x, g, b)
        return flow.nn.relu(y + z), stats
    return with_relu, inputs + [_normal(*x.shape)]


def bn_then_relu_case(x, axis, gamma=True):
    """fn, inputs: relu(batch_norm(x)): the relu's gradient runs inside batch_norm's gradient kernels."""
    fn, inputs = bn_case(x, axis, gamma=gamma)

    def with_relu(x, *ps):
        y, stats = fn(x, *ps)
        return flow.nn.relu(y), stats
    return with_relu, inputs


CASES = {
    "nchw": bn_case(_normal(4, 3, 5, 5), 1),
    "nhwc": bn_case(_normal(4, 5, 5, 3), 3),
    "nhwc_channel_blocks": bn_case(_normal(2, 3, 3, 40), 3),     # 16 + 16 + 8 channels
    "batch_1": bn_case(_normal(1, 3, 4, 4), 1),
    "dense_2d": bn_case(_normal(8, 6), 1),
    "middle_axis": bn_case(_normal(2, 4, 3), 1),
    "no_gamma": bn_case(_normal(3, 2, 3, 3), 1, gamma=False),
    "no_beta": bn_case(_normal(3, 3, 3, 2), 3, beta=False),
    "no_params": bn_case(_normal(3, 2, 4, 2), 1, gamma=False, beta=False),
    "float64": bn_case(_normal(3, 2, 3, 3, dtype=np.float64), 1),
    "eps_0_1": bn_case(_normal(2, 4, 3, 3), 1, eps=0.1),
    "relu_epilogue_nchw": bn_relu_case(_normal(3, 4, 3, 3), 1),
    "relu_epilogue_nhwc": bn_relu_case(_normal(3, 3, 3, 4), 3),
    "relu_gradient_nchw": bn_then_relu_case(_normal(3, 4, 3, 3), 1),
    "relu_gradient_nhwc_no_gamma": bn_then_relu_case(_normal(3, 3, 3, 20), 3, gamma=False),
}


def covered_ops() -> set[str]:
    """Every op the cases above use, gradients included (tests/test_ops.py checks each op has a case)."""
    return ops_of_cases(CASES.values())


def assert_match(got, want, rtol=2e-5, atol=2e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_cpu_equals_the_reference(name):
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    ops = {n.op for n in case.graph.nodes}
    assert {"batch_norm_stats", "batch_norm", "batch_norm_grad_sums", "batch_norm_grad"} <= ops
    assert_match(case.compiled, case.reference)


def test_relu_and_a_residual_add_run_in_the_write_back():
    for name in ("relu_epilogue_nchw", "relu_epilogue_nhwc"):
        fn, inputs = CASES[name]
        graph, _, _ = trace_case(fn, inputs, grads=False)
        program = lower(graph)
        names = [k.name for k in program.kernels]
        assert any(n.startswith("batch_norm_") and n.endswith("_add_relu") for n in names), names
        # y, read only by the fused add, is never written to memory
        (y,) = [n.id for n in program.graph.nodes if n.op == "batch_norm"]
        assert y not in program.memory.storage
        case = compile_case(fn, inputs, grads=False)
        assert_match(case.compiled, case.reference)


def test_the_relu_gradient_runs_in_the_batch_norm_gradient_kernels():
    x = _normal(3, 4, 3, 3)
    x[0, 1, 0, 0] = np.nan                      # relu_grad's NaN where the relu's output is NaN
    for fn, inputs in (CASES["relu_gradient_nchw"], CASES["relu_gradient_nhwc_no_gamma"], bn_then_relu_case(x, 1)):
        graph, _, _ = trace_case(fn, inputs)
        lowered = lower(graph).graph
        assert "relu_grad" not in {n.op for n in lowered.nodes}
        assert all(n.attr("relu") for n in lowered.nodes if n.op in ("batch_norm_grad_sums", "batch_norm_grad"))
        case = compile_case(fn, inputs)
        np.testing.assert_array_equal(np.isnan(case.compiled[2]), np.isnan(case.reference[2]))
        assert_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", ["nchw", "nhwc", "dense_2d", "no_gamma", "no_params", "middle_axis",
                                  "relu_gradient_nchw", "relu_gradient_nhwc_no_gamma"])
def test_gradients_match_finite_differences(name):
    """Through y only: the statistics output passes no gradient (it feeds the moving averages)."""
    fn, inputs = CASES[name]
    finite_difference_check(lambda *args: fn(*args)[0], inputs, rtol=1e-5, atol=1e-7)


def test_the_reference_is_numpy_batch_norm():
    x, g, b = _normal(3, 4, 2, 5), _normal(4), _normal(4)
    fn, inputs = bn_case(x, 1)
    inputs[1:] = [g, b]
    graph, _, _ = trace_case(fn, inputs, grads=False)
    (y, stats), _ = run_reference(graph, inputs, {})
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    np.testing.assert_allclose(stats, np.stack([mean, var]), rtol=1e-6)
    c = (slice(None), None, None)
    want = (x64 - mean[c]) / np.sqrt(var[c] + 1e-3) * g[c] + b[c]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_a_large_mean_keeps_the_variance_accurate():
    """Values 1e4 + N(0, 1): float32 E[x^2] - E[x]^2 would lose every digit of the variance."""
    x = _normal(8, 3, 6, 6, mean=1e4, std=1.0)
    xt = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    for fn, inputs, axes in (bn_case(x, 1) + ((0, 2, 3),), bn_case(xt, 3) + ((0, 1, 2),)):
        case = compile_case(fn, inputs)
        y, stats = case.compiled[:2]
        x64 = inputs[0].astype(np.float64)
        np.testing.assert_allclose(stats[0], x64.mean(axis=axes), rtol=1e-7)
        np.testing.assert_allclose(stats[1], x64.var(axis=axes), rtol=1e-5)
        assert_match(case.compiled, case.reference, rtol=1e-4, atol=1e-4)


def test_nan_and_infinity_poison_only_their_channel():
    x = _normal(3, 4, 2, 2)
    x[1, 1, 0, 1], x[0, 2, 1, 1] = np.nan, np.inf
    x[0, 3, 0, 0] = np.inf                               # the channel's first value: the shift must skip it
    fn, inputs = bn_case(x, 1)
    case = compile_case(fn, inputs, grads=False)
    y, stats = case.compiled
    for c in (1, 2, 3):
        assert np.isnan(y[:, c]).all() and np.isnan(stats[1, c])
    assert np.isfinite(y[:, 0]).all()
    assert np.isnan(case.reference[0][:, 1:]).all()
    # the means: NaN where a NaN is, the reference's +inf where an infinity is
    np.testing.assert_array_equal(stats[0], case.reference[1][0])
    # with epsilon 0 a constant channel is 0 / 0: NaN, as in the reference
    fn, inputs = bn_case(np.ones((2, 2, 2, 2), np.float32), 1, eps=0.0)
    case = compile_case(fn, inputs, grads=False)
    assert np.isnan(case.compiled[0]).all() and np.isnan(case.reference[0]).all()


def test_large_inputs_run_the_parallel_loops():
    """Past PARALLEL_MIN_ELEMENTS the channel loops run on OpenMP threads; the results are the same."""
    from flowc.compiler.codegen.cpu import PARALLEL_MIN_ELEMENTS
    n = PARALLEL_MIN_ELEMENTS // (16 * 36 * 36) + 1
    for fn, inputs in (bn_case(_normal(n, 16, 36, 36), 1), bn_case(_normal(n, 36, 36, 20), 3)):
        case = compile_case(fn, inputs)
        assert_match(case.compiled, case.reference, rtol=1e-4, atol=1e-4)


def test_misuse_is_an_error_naming_the_op_and_the_argument():
    from flowc.compiler.autodiff import GradientError
    from flowc.compiler.errors import TraceError
    with pytest.raises(TraceError, match=r"test_batch_norm_op.py:\d+: .*batch_norm_stats: axis 4 is out of range"):
        trace_case(lambda x: emit("batch_norm_stats", [x], {"axis": 4}), [_normal(2, 3, 2, 2)], grads=False)
    with pytest.raises(TraceError, match=r"batch_norm: gamma must be float32\[3\]"):
        trace_case(lambda x, g: emit("batch_norm", [x, emit("batch_norm_stats", [x], {"axis": 1}), g],
                                     {"axis": 1, "epsilon": 1e-3, "scale": True, "center": False}),
                   [_normal(2, 3, 2, 2), _normal(4)], grads=False)
    with pytest.raises(TraceError, match=r"batch_norm_stats: x must be float32 or float64"):
        trace_case(lambda x: emit("batch_norm_stats", [x], {"axis": 1}), [np.ones((2, 3), np.int32)], grads=False)

    def foreign_stats(x, other):       # statistics of another tensor: the gradient rule refuses them
        return emit("batch_norm", [x, emit("batch_norm_stats", [other], {"axis": 1})],
                    {"axis": 1, "epsilon": 1e-3, "scale": False, "center": False})
    with pytest.raises(GradientError, match=r"batch_norm's gradient needs its statistics to be batch_norm_stats"):
        trace_case(foreign_stats, [_normal(2, 3), _normal(2, 3)])


# --- flow.layers.batch_normalization in jobs -------------------------------------------------------

SHAPE = (4, 3, 5, 5)


@flow.global_function(type="train")
def bn_train(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
    y = flow.layers.batch_normalization(x, axis=1, momentum=0.8, name="bn")
    loss = flow.math.reduce_mean(flow.math.square(y - 0.5))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


def test_train_jobs_use_the_fused_ops():
    @flow.global_function(type="train")
    def scaled_bn_train(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(1, 3, 1, 1), initializer=flow.ones_initializer())
        y = flow.layers.batch_normalization(x * w, axis=1, name="bn")     # x * w: dx is needed
        loss = flow.math.reduce_mean(flow.math.square(y - 0.5))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    ops = [n.op for n in scaled_bn_train.lower().program.graph.nodes]
    for op in ("batch_norm_stats", "batch_norm", "batch_norm_grad_sums", "batch_norm_grad"):
        assert ops.count(op) == 1, op
    assert "reduce_mean" not in ops[:ops.index("batch_norm")] and "sqrt" not in ops


def test_moving_statistics_after_several_steps_follow_oneflow_and_the_reference():
    session = default_session()
    graph = bn_train._trace(session).graph
    moving_mean, moving_var = np.zeros(3), np.ones(3)
    for step in range(3):
        x = _normal(*SHAPE, mean=step - 1.0, std=1.0 + step)
        before = {name: session.value(name).copy() for name in graph.variables}
        want, updates = run_reference(graph, [x], before, {"learning_rate:float32": 0.1})
        np.testing.assert_allclose(bn_train(x), want[0], rtol=1e-5, atol=1e-6)
        for name, value in updates.items():
            np.testing.assert_allclose(session.value(name), value, rtol=1e-5, atol=1e-6, err_msg=name)
        x64 = x.astype(np.float64)
        moving_mean = 0.8 * moving_mean + 0.2 * x64.mean(axis=(0, 2, 3))
        moving_var = 0.8 * moving_var + 0.2 * x64.var(axis=(0, 2, 3), ddof=1)     # unbiased, as cuDNN's
    np.testing.assert_allclose(session.value("bn-moving_mean"), moving_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(session.value("bn-moving_variance"), moving_var, rtol=1e-5)


def test_a_checkpoint_keeps_oneflow_variable_names(tmp_path):
    bn_train(_normal(*SHAPE))
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    saved = {p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()}
    assert {"bn-gamma", "bn-beta", "bn-moving_mean", "bn-moving_variance"} <= saved


def test_predict_jobs_still_fold_batch_norm_and_relu_into_the_convolution():
    @flow.global_function(type="predict")
    def conv_bn_relu(x: tp.Numpy.Placeholder((2, 3, 8, 8))) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, padding="SAME", use_bias=False, name="conv")
        return flow.nn.relu(flow.layers.batch_normalization(y, axis=1, name="conv_bn"))

    program = conv_bn_relu.lower().program
    names = [k.name for k in program.kernels]
    assert any(n.startswith("conv2d_") and n.endswith("_subtract_divide_multiply_add_relu") for n in names), names
    assert not any(n.op.startswith("batch_norm") for n in program.graph.nodes)


# --- CUDA: in the emulator ----------------------------------------------------------------------

def test_cuda_kernels_equal_the_reference_in_the_emulator(tmp_path):
    from tests.test_cuda_codegen import Emulator, render, replay
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    picked = {"nchw": CASES["nchw"], "nhwc_channel_blocks": CASES["nhwc_channel_blocks"],
              "no_gamma": CASES["no_gamma"], "no_params": CASES["no_params"],
              "relu_epilogue_nchw": CASES["relu_epilogue_nchw"], "relu_gradient": CASES["relu_gradient_nhwc_no_gamma"],
              "large_mean": bn_case(_normal(4, 2, 3, 3, mean=1e4, std=1.0), 1)}
    built = {}
    for i, (name, (fn, inputs)) in enumerate(picked.items()):
        graph, _, _ = trace_case(fn, inputs, True)
        program = lower(graph)
        feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(i))
        built[name] = (program, render(program, prefix=f"bn{i}_"), feeds)
    assert BATCH_NORM_CUDA_TEMPLATES <= {t for _, step, _ in built.values() for t in step.templates}
    emulator = Emulator(tmp_path)
    lib = emulator.build("\n".join(step.source for _, step, _ in built.values()),
                         [la.kernel for _, step, _ in built.values() for la in step.launches])
    for name, (program, step, feeds) in built.items():
        got, status = replay(emulator, lib, program, step, feeds, {}, {})
        want, _ = run_reference(program.graph, feeds, {})
        assert status == 0, name
        assert_match(got, want, rtol=1e-4, atol=1e-4)


def test_float16_and_mixed_precision_jobs_train_against_the_reference():
    """float16 inputs keep the composed form (the fused kernels are float32/float64); under AMP the
    fused ops are on no list and stay float32 between the float16 convolutions."""
    x16 = _normal(*SHAPE).astype(np.float16)

    @flow.global_function(type="train")
    def half_bn(x: tp.Numpy.Placeholder(SHAPE, dtype=flow.float16)) -> tp.Numpy:
        w = flow.get_variable("w16", shape=(1, 3, 1, 1), dtype=flow.float16, initializer=flow.ones_initializer())
        y = flow.layers.batch_normalization(x * w, axis=1, name="bn16")
        y32 = flow.cast(y, flow.float32)
        loss = flow.math.reduce_mean(y32 * y32)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    config = flow.function_config()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(type="train", function_config=config)
    def amp_conv_bn(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, padding="SAME", use_bias=False, name="amp_conv")
        y = flow.nn.relu(flow.layers.batch_normalization(y, axis=1, name="amp_bn"))
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    session = default_session()
    for job, x, fused, rtol in ((half_bn, x16, False, 2e-2), (amp_conv_bn, _normal(*SHAPE), True, 1e-2)):
        traced = job._trace(session)
        graph = traced.graph
        ops = {n.op for n in graph.nodes}
        assert ("batch_norm_stats" in ops) == fused and ("reduce_sum" in ops or fused)
        if fused:
            assert all(n.type.dtype == "float32" for n in graph.nodes if n.op.startswith("batch_norm"))
        before = {name: session.value(name).copy() for name in graph.variables}
        want, updates = run_reference(graph, [x], before, _runtime_scalars(traced, 0))
        np.testing.assert_allclose(job(x), want[0], rtol=rtol, atol=1e-3)
        for name, value in updates.items():
            np.testing.assert_allclose(session.value(name).astype(np.float32), value.astype(np.float32),
                                       rtol=rtol, atol=1e-3, err_msg=name)


def test_negative_zeros_keep_their_sign_as_in_the_reference():
    # A constant channel normalises to exact zeros: y = 0 * gamma + beta, so beta's -0.0 (or +0.0) is
    # y's sign; -0.0 inputs there and in the relu epilogue's add must come out as the reference's.
    x = _normal(2, 3, 2, 2)
    x[:, 0] = -0.0                                      # channel 0: all -0.0, mean -0.0 or 0, variance 0
    x[0, 1, 0, 0] = -0.0
    for fn, inputs in (bn_case(x, 1), bn_relu_case(x, 1), bn_then_relu_case(x, 1)):
        inputs[2][0] = -0.0                             # beta of the constant channel
        inputs[1][0] = -1.5                             # gamma negative: 0 * gamma is -0.0
        if len(inputs) > 3:
            inputs[3][:, 0] = -0.0                      # the residual added before the relu
        case = compile_case(fn, inputs)
        for got, want in zip(case.compiled, case.reference):
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        assert_match(case.compiled, case.reference)
