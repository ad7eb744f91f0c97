"""flow.nn and flow.layers of issue 14: normalization, the cross-entropies over probabilities,
conv2d_transpose, 1-D and 3-D pools, bias_add on any channel axis, dense on rank > 2, and
flow.scope.namespace.

Every op is checked three ways: the compiled C++ (values and gradients) against the reference
executor, the values against a NumPy implementation written here from OneFlow's definition (not
from the ops the API composes), and the gradients against central finite differences.  All the
ops share one compiled graph (one compile for the module); the same graph runs in the CUDA
emulator of tests/test_cuda_codegen.py.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.runtime.session import default_session
from tests.oracle import compile_case, cotangents, finite_difference_check, trace_case
from tests.test_ops import assert_outputs_match

rng = np.random.default_rng(14)


def rand(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)


def probabilities(*shape):
    p = rng.uniform(0.05, 1.0, size=shape)
    return (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)


# --- NumPy definitions (float64) -------------------------------------------------------------------------

def np_layer_norm(x, gamma, beta, begin_norm_axis, eps=1e-5):
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y * (1 if gamma is None else gamma) + (0 if beta is None else beta)


def np_batch_norm(x, mean, var, offset, scale, axis, eps):
    shape = [1] * x.ndim
    shape[axis] = -1

    def r(a):
        return np.asarray(a, np.float64).reshape(shape)
    return (x - r(mean)) / np.sqrt(r(var) + eps) * r(scale) + r(offset)


def np_softmax_xent(labels, logits):
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) + x.max(-1, keepdims=True)
    return -(labels * (x - lse)).sum(-1)


def np_sigmoid_xent(labels, logits):
    x = logits.astype(np.float64)
    return np.logaddexp(0.0, x) - x * labels      # -z log(s) - (1 - z) log(1 - s)


def np_conv_transpose(x, w, out_hw, strides, pads):
    """Scatter every input pixel times the kernel into the (padded) output, then crop."""
    n, _, h, wd = x.shape
    _, co, kh, kw = w.shape
    (sh, sw), (pt, pb, pl, pr) = strides, pads
    big = np.zeros((n, co, out_hw[0] + pt + pb + kh + sh, out_hw[1] + pl + pr + kw + sw))
    for i in range(h):
        for j in range(wd):
            big[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    return big[:, :, pt:pt + out_hw[0], pl:pl + out_hw[1]]


def np_pool(x, kernel, strides, pads, kind):
    """N-d pool over the trailing len(kernel) axes; pads are (before, after) per axis; padding never counts."""
    nd = len(kernel)
    lead = x.shape[:-nd]
    size = x.shape[-nd:]
    out_shape = [(s + lo + hi - k) // st + 1 for s, k, st, (lo, hi) in zip(size, kernel, strides, pads)]
    out = np.zeros(lead + tuple(out_shape))
    for idx in np.ndindex(*out_shape):
        box = tuple(slice(max(o * st - lo, 0), min(o * st - lo + k, s))
                    for o, st, (lo, _), k, s in zip(idx, strides, pads, kernel, size))
        window = x[(Ellipsis,) + box].reshape(lead + (-1,)).astype(np.float64)
        out[(Ellipsis,) + idx] = window.max(-1) if kind == "max" else window.mean(-1)
    return out


# --- every op in one graph ----------------------------------------------------------------------------------

# The sigmoid logits include 0 (where |x| has its kink) and large values of both signs.
SIG_LOGITS = np.concatenate([rand(3, 5, low=-4, high=4), np.array([[0.0, 30.0, -30.0, 0.0, 12.0]], np.float32)])

INPUTS = [
    rand(3, 5),                                   # 0 layer_norm, last axis
    rand(2, 3, 4), rand(4), rand(4),              # 1-3 layer_norm over axes 1.., params over the last axis
    rand(2, 3, 4), rand(3), rand(3, low=0.2, high=1.5), rand(3), rand(3),   # 4-8 batch_normalization
    probabilities(4, 5), rand(4, 5, low=-3, high=3),                       # 9-10 softmax cross-entropy
    rand(4, 5, low=0, high=1), SIG_LOGITS,                                  # 11-12 sigmoid cross-entropy
    rand(2, 4, 4, 4), rand(4, 3, 3, 3),           # 13-14 conv2d_transpose NCHW, SAME, stride 2
    rand(1, 3, 3, 2), rand(2, 3, 3, 3),           # 15-16 conv2d_transpose NHWC, VALID, stride 2
    rand(2, 3, 7),                                # 17 pools 1-D
    rand(1, 2, 5, 4, 5), rand(1, 4, 4, 5, 2),     # 18-19 pools 3-D (NCDHW, NDHWC)
    rand(2, 5, 3), rand(3), rand(2, 3, 2, 2), rand(3),   # 20-23 bias_add N...C and NC...
    rand(2, 3, 4),                                # 24 moments
]


def all_ops(*b):
    nn = flow.nn
    return (
        nn.layer_norm(b[0], begin_norm_axis=-1),
        nn.layer_norm(b[1], b[2], b[3], begin_norm_axis=1, begin_params_axis=-1),
        nn.batch_normalization(b[4], b[5], b[6], offset=b[7], scale=b[8], variance_epsilon=1e-3, axis=1),
        nn.softmax_cross_entropy_with_logits(b[9], b[10]),
        nn.sigmoid_cross_entropy_with_logits(b[11], b[12]),
        nn.conv2d_transpose(b[13], b[14], output_shape=(2, 3, 8, 8), strides=2, padding="SAME"),
        nn.conv2d_transpose(input=b[15], filters=b[16], output_shape=(1, 7, 7, 3), strides=2, padding="VALID",
                            data_format="NHWC"),
        nn.max_pool1d(b[17], ksize=2, strides=2, padding="VALID", data_format="NCW"),
        nn.avg_pool1d(b[17], ksize=3, strides=2, padding="SAME", data_format="NCW"),
        nn.max_pool1d(flow.transpose(b[17], perm=[0, 2, 1]), ksize=3, strides=1, padding="SAME"),   # NWC
        nn.max_pool3d(b[18], ksize=2, strides=2, padding="SAME"),
        nn.avg_pool3d(b[18], ksize=[3, 2, 2], strides=[1, 2, 1], padding="SAME"),
        nn.avg_pool3d(b[19], ksize=2, strides=1, padding="VALID", data_format="NDHWC"),
        nn.bias_add(b[20], b[21], data_format="NWC"),
        nn.bias_add(b[22], b[23], data_format="NCHW"),
        *nn.moments(b[24], axes=[0, 2]),
    )


def expected_values(x):
    same_1d = [(1, 1)]                    # size 7, k 3, s 2: out 4, total pad 2
    return [
        np_layer_norm(x[0], None, None, -1),
        np_layer_norm(x[1], x[2], x[3], 1),
        np_batch_norm(x[4], x[5], x[6], x[7], x[8], 1, 1e-3),
        np_softmax_xent(x[9], x[10]),
        np_sigmoid_xent(x[11], x[12]),
        np_conv_transpose(x[13], x[14], (8, 8), (2, 2), (0, 1, 0, 1)),
        np_conv_transpose(x[15].transpose(0, 3, 1, 2), x[16].transpose(0, 3, 1, 2), (7, 7), (2, 2),
                          (0, 0, 0, 0)).transpose(0, 2, 3, 1),
        np_pool(x[17], (2,), (2,), [(0, 0)], "max"),
        np_pool(x[17], (3,), (2,), same_1d, "avg"),
        np_pool(x[17], (3,), (1,), [(1, 1)], "max").transpose(0, 2, 1),
        # OneFlow's "SAME" is SAME_LOWER: an odd padding goes before
        np_pool(x[18], (2, 2, 2), (2, 2, 2), [(1, 0), (0, 0), (1, 0)], "max"),
        np_pool(x[18], (3, 2, 2), (1, 2, 1), [(1, 1), (0, 0), (1, 0)], "avg"),
        np_pool(x[19].transpose(0, 4, 1, 2, 3), (2, 2, 2), (1, 1, 1), [(0, 0)] * 3, "avg").transpose(0, 2, 3, 4, 1),
        x[20] + x[21],
        x[22] + x[23].reshape(1, 3, 1, 1),
        x[24].mean(axis=(0, 2)),
        x[24].astype(np.float64).var(axis=(0, 2)),
    ]


@pytest.fixture(scope="module")
def case():
    return compile_case(all_ops, INPUTS)


def test_compiled_values_and_gradients_equal_the_reference(case):
    assert case.grad_inputs == list(range(len(INPUTS)))      # every op passes gradients to every input
    assert_outputs_match(case.compiled, case.reference)


def test_values_equal_numpy_definitions(case):
    want = expected_values(INPUTS)
    assert case.n_values == len(want)
    for k, (got, expected) in enumerate(zip(case.compiled, want)):
        assert got.shape == expected.shape, k
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


def test_sigmoid_cross_entropy_gradient_is_sigmoid_minus_labels_at_zero_and_far_out():
    """d/dx at x = 0 (the kink of |x|) and at |x| = 30 (exp underflows) is sigmoid(x) - z."""
    z = np.array([0.25, 0.5, 0.75, 1.0], np.float32)
    x = np.array([0.0, 0.0, 30.0, -30.0], np.float32)
    case = compile_case(lambda lab, lg: flow.nn.sigmoid_cross_entropy_with_logits(lab, lg), [z, x])
    (cot,) = cotangents(case.graph, 2, np.random.default_rng(0))    # compile_case's cotangent (seed 0)
    dlogits = case.compiled[case.n_values + case.grad_inputs.index(1)]
    np.testing.assert_allclose(dlogits, (1 / (1 + np.exp(-x.astype(np.float64))) - z) * cot, atol=1e-7)
    np.testing.assert_allclose(case.compiled[0], np_sigmoid_xent(z, x), rtol=1e-6, atol=1e-7)


# One small case per op for finite differences (the reference executor in float64, no compiling).
FD_CASES = {
    "layer_norm": (lambda x, g, b: flow.nn.layer_norm(x, g, b, begin_norm_axis=1, begin_params_axis=1),
                   [rand(2, 3, 2), rand(3, 2), rand(3, 2)]),
    "batch_normalization": (lambda x, m, v, o, s: flow.nn.batch_normalization(x, m, v, o, s, 1e-3, axis=-1),
                            [rand(3, 4), rand(4), rand(4, low=0.2, high=1.5), rand(4), rand(4)]),
    "moments": (lambda x: flow.nn.moments(x, axes=[1], keepdims=True), [rand(3, 4)]),
    "softmax_cross_entropy": (lambda lab, x: flow.nn.softmax_cross_entropy_with_logits(lab, x),
                              [probabilities(3, 4), rand(3, 4, low=-3, high=3)]),
    "sigmoid_cross_entropy": (lambda lab, x: flow.nn.sigmoid_cross_entropy_with_logits(lab, x),
                              [rand(3, 4, low=0, high=1), rand(3, 4, low=-4, high=4)]),
    "conv2d_transpose": (lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(1, 2, 5, 5), strides=2,
                                                               padding="SAME"), [rand(1, 3, 3, 3), rand(3, 2, 3, 3)]),
    "max_pool3d": (lambda x: flow.nn.max_pool3d(x, ksize=2, strides=1, padding="VALID"), [rand(1, 1, 3, 3, 3)]),
    "avg_pool3d": (lambda x: flow.nn.avg_pool3d(x, ksize=2, strides=2, padding="SAME"), [rand(1, 2, 3, 3, 3)]),
    "conv1d": (lambda x, w: flow.nn.conv1d(x, w, strides=2, padding="SAME"), [rand(1, 2, 5), rand(3, 2, 3)]),
    "avg_pool1d": (lambda x: flow.nn.avg_pool1d(x, ksize=2, strides=1, padding="SAME", data_format="NWC"),
                   [rand(2, 5, 2)]),
}


@pytest.mark.parametrize("name", sorted(FD_CASES))
def test_gradient_matches_finite_differences(name):
    fn, inputs = FD_CASES[name]
    finite_difference_check(fn, inputs)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
def test_the_cuda_kernels_equal_the_reference_in_the_emulator(tmp_path):
    from tests.test_cuda_codegen import Emulator, render, replay
    graph, _, _ = trace_case(all_ops, INPUTS, True)
    program = lower(graph)
    step = render(program, prefix="nn14_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    feeds = list(INPUTS) + cotangents(graph, len(INPUTS), np.random.default_rng(0))
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    want, _ = run_reference(program.graph, feeds, {})
    assert status == 0
    assert_outputs_match(got, want)


# --- layers and namespaces in jobs ------------------------------------------------------------------------

X_LN = rand(4, 3, 5)


def test_layer_norm_layer_creates_oneflow_named_variables_and_trains_them():
    @flow.global_function(type="train")
    def ln_train(x: tp.Numpy.Placeholder((4, 3, 5))) -> tp.Numpy:
        y = flow.layers.layer_norm(x, begin_norm_axis=1, begin_params_axis=-1, name="ln")
        loss = flow.math.reduce_sum(y * x)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return y

    @flow.global_function(type="predict")
    def ln_plain(x: tp.Numpy.Placeholder((4, 3, 5))) -> tp.Numpy:
        return flow.layers.layer_norm(x, center=False, scale=False, begin_norm_axis=-1, name="bare")

    y = ln_train(X_LN)
    session = default_session()
    assert session.value("ln-gamma").shape == (5,) and session.value("ln-beta").shape == (5,)
    np.testing.assert_allclose(y, np_layer_norm(X_LN, None, None, 1), rtol=1e-5, atol=1e-6)
    # d loss / d beta = sum of x over every axis but the last; d / d gamma = sum of normalized * x
    normalized = np_layer_norm(X_LN, None, None, 1)
    np.testing.assert_allclose(session.value("ln-beta"), -0.1 * X_LN.sum(axis=(0, 1)), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(session.value("ln-gamma"), 1 - 0.1 * (normalized * X_LN).sum(axis=(0, 1)),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ln_plain(X_LN), np_layer_norm(X_LN, None, None, -1), rtol=1e-5, atol=1e-6)
    assert not any(name.startswith("bare") for name in session.variables)


def test_batch_normalization_moving_statistics_follow_oneflow_momentum():
    x = rand(6, 3, 2, 2, low=0, high=2)

    @flow.global_function(type="train")
    def bn_train(x: tp.Numpy.Placeholder((6, 3, 2, 2))) -> tp.Numpy:
        y = flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn")
        frozen = flow.layers.batch_normalization(x, axis=1, trainable=False, name="frozen")
        loss = flow.math.reduce_mean(y * y) + flow.math.reduce_mean(frozen)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(loss)
        return y

    @flow.global_function(type="predict")
    def bn_eval(x: tp.Numpy.Placeholder((6, 3, 2, 2))) -> tp.Numpy:
        return flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn")

    y = bn_train(x)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(y, np_batch_norm(x, mean, var, np.zeros(3), np.ones(3), 1, 1e-3), rtol=1e-4, atol=1e-5)
    session = default_session()
    np.testing.assert_allclose(session.value("bn-moving_mean"), 0.1 * mean, rtol=1e-5)
    # the moving variance takes the unbiased batch variance (m / (m - 1), m = 24 per channel), as OneFlow's
    # cuDNN kernel does
    var = var * 24 / 23
    np.testing.assert_allclose(session.value("bn-moving_variance"), 0.9 + 0.1 * var, rtol=1e-5)
    # trainable=False: OneFlow uses and keeps the moving statistics even in a train job
    np.testing.assert_array_equal(session.value("frozen-moving_mean"), np.zeros(3, np.float32))
    np.testing.assert_array_equal(session.value("frozen-moving_variance"), np.ones(3, np.float32))
    np.testing.assert_allclose(bn_eval(x), np_batch_norm(x, 0.1 * mean, 0.9 + 0.1 * var, np.zeros(3), np.ones(3), 1,
                                                         1e-3), rtol=1e-4, atol=1e-5)


def test_namespaces_prefix_variable_names_and_nest():
    @flow.global_function(type="predict")
    def spaced(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        with flow.scope.namespace("backbone"):
            with flow.scope.namespace("branch"):
                a = flow.get_variable("var", shape=(3,), initializer=flow.random_uniform_initializer())
            with flow.scope.namespace("branch"):
                b = flow.get_variable("var", shape=(3,), initializer=flow.random_uniform_initializer())
            h = flow.layers.dense(x, 4, name="dense1")
        c = flow.get_variable("backbone-branch-var", shape=(3,), initializer=flow.random_uniform_initializer())
        return flow.math.reduce_sum(a - b) + flow.math.reduce_sum(c - a) + flow.math.reduce_sum(h * 0.0)

    assert spaced(rand(2, 3)) == 0.0
    names = set(default_session().variables)
    assert {"backbone-branch-var", "backbone-dense1-weight", "backbone-dense1-bias"} <= names
    assert "var" not in names and "dense1-weight" not in names


def test_dense_on_rank_three_works_on_the_last_axis_and_accepts_model_distribute():
    x = rand(2, 3, 4)

    @flow.global_function(type="predict")
    def dense3(x: tp.Numpy.Placeholder((2, 3, 4))) -> tp.Numpy:
        return flow.layers.dense(x, 5, kernel_initializer=flow.random_uniform_initializer(), name="d3",
                                 model_distribute=None)

    y = dense3(x)
    session = default_session()
    w, b = session.value("d3-weight"), session.value("d3-bias")
    assert w.shape == (5, 4) and y.shape == (2, 3, 5)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-6)


def test_conv2d_transpose_trains_in_a_job():
    x = rand(2, 3, 4, 4)

    @flow.global_function(type="train")
    def deconv_train(x: tp.Numpy.Placeholder((2, 3, 4, 4))) -> tp.Numpy:
        w = flow.get_variable("deconv-w", shape=(3, 2, 3, 3), initializer=flow.random_uniform_initializer())
        y = flow.nn.conv2d_transpose(x, w, output_shape=(2, 2, 8, 8), strides=2, padding="SAME")
        loss = flow.math.reduce_sum(y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(loss)
        return loss

    deconv_train(x)
    w0 = default_session().value("deconv-w").copy()
    deconv_train(x)
    w1 = default_session().value("deconv-w").copy()
    # d sum(y) / d w[c, o, i, j]: the sum of x[:, c] over the pixels whose tap (i, j) lands in the output
    grad = np.zeros((3, 2, 3, 3))
    for i in range(3):
        for j in range(3):
            grad[:, :, i, j] = _tap_sum(x, i, j)[:, None]
    np.testing.assert_allclose(w0 - w1, 0.01 * grad, rtol=1e-4, atol=1e-6)


def _tap_sum(x, i, j):
    """Sum over n, h, w of x[n, c, h, w] where output row 2h + i and column 2w + j lie in [0, 8) after
    the SAME crop (top/left pad 0)."""
    rows = [h for h in range(4) if 0 <= 2 * h + i < 8]
    cols = [w for w in range(4) if 0 <= 2 * w + j < 8]
    return x[:, :, rows][:, :, :, cols].astype(np.float64).sum(axis=(0, 2, 3))


@pytest.mark.parametrize("call, message", [
    (lambda x: flow.nn.conv2d_transpose(x, flow.get_variable("w1", shape=(3, 2, 3, 3)), output_shape=(2, 2, 9, 9),
                                        strides=2, padding="SAME"), "output_shape"),
    (lambda x: flow.nn.bias_add(x, flow.get_variable("b1", shape=(3,)), data_format="HWCN"), "data_format"),
    (lambda x: flow.nn.max_pool3d(x, 2, 2, "VALID"), "5-D"),
    (lambda x: flow.nn.layer_norm(x, gamma=flow.get_variable("g1", shape=(3,))), "gamma"),
    (lambda x: _enter(flow.scope.namespace("")), "name"),
])
def test_misuse_names_the_argument_and_the_line(call, message):
    @flow.global_function(type="predict")
    def misuse(x: tp.Numpy.Placeholder((2, 3, 4, 4))) -> tp.Numpy:
        return call(x)

    with pytest.raises(TraceError, match=message) as err:
        misuse(rand(2, 3, 4, 4))
    assert "test_nn_layers.py:" in str(err.value)


def _enter(block):
    with block:
        pass


def test_sparse_cross_entropy_accepts_labels_with_a_trailing_one():
    logits, labels = rand(4, 3), np.array([[0], [2], [1], [2]], np.int32)
    case = compile_case(lambda y, x: flow.nn.sparse_softmax_cross_entropy_with_logits(y, x), [labels, logits])
    np.testing.assert_allclose(case.compiled[0], np_softmax_xent(np.eye(3)[labels[:, 0]], logits), rtol=1e-5)


def test_conv1d_is_a_convolution_along_the_width_in_both_layouts():
    x, w = rand(2, 3, 9), rand(4, 3, 3)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1)))     # SAME, k 3, stride 2 on 9: pads (1, 1)
    want = np.stack([np.einsum("ncw,fcw->nf", padded[:, :, 2 * o:2 * o + 3], w) for o in range(5)], axis=-1)
    case = compile_case(lambda a, b: (flow.nn.conv1d(a, b, 2, "SAME"),
                                      flow.nn.conv1d(flow.transpose(a, perm=[0, 2, 1]),
                                                     flow.transpose(b, perm=[0, 2, 1]), 2,
                                                     [[0, 0], [1, 1], [0, 0]], "NWC")), [x, w])
    assert_outputs_match(case.compiled, case.reference)
    np.testing.assert_allclose(case.compiled[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(case.compiled[1], want.transpose(0, 2, 1), rtol=1e-5, atol=1e-6)


def test_conv1d_layer_names_its_variables_and_adds_the_bias():
    x = rand(2, 7, 3)                                           # NWC

    @flow.global_function(type="predict")
    def conv1d_layer(x: tp.Numpy.Placeholder((2, 7, 3))) -> tp.Numpy:
        return flow.layers.conv1d(x, 4, kernel_size=3, padding="VALID", data_format="NWC",
                                  bias_initializer=flow.random_uniform_initializer(), name="c1")

    y = conv1d_layer(x)
    session = default_session()
    w, b = session.value("c1-weight"), session.value("c1-bias")
    assert w.shape == (4, 3, 3) and b.shape == (4,)            # (filters, k, in) for NWC
    want = np.stack([np.einsum("nkc,fkc->nf", x[:, o:o + 3].astype(np.float64), w) for o in range(5)], axis=1) + b
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_same_padding_puts_an_odd_row_first_as_oneflow_and_compat_conv2d_puts_it_last():
    """OneFlow maps "SAME" to "SAME_LOWER" in nn.conv2d and the pools; compat_conv2d is TensorFlow's."""
    x, w = rand(1, 2, 6, 5), rand(3, 2, 2, 2)          # k 2, stride 1: one padding row and column
    case = compile_case(lambda a, b: (flow.nn.conv2d(a, b, 1, "SAME"), flow.nn.compat_conv2d(a, b, 1, "SAME"),
                                      flow.nn.conv2d(a, b, 1, "SAME_UPPER"),
                                      flow.nn.max_pool2d(a, 2, 2, "SAME"), flow.nn.avg_pool2d(a, 3, 2, "SAME")),
                        [x, w], grads=False)

    def conv(pads):
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads[0], pads[1]))
        return np.stack([np.stack([np.einsum("nchw,fchw->nf", xp[:, :, i:i + 2, j:j + 2], w) for j in range(5)], -1)
                         for i in range(6)], -2)
    lower, upper = conv(((1, 0), (1, 0))), conv(((0, 1), (0, 1)))
    np.testing.assert_allclose(case.compiled[0], lower, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(case.compiled[1], upper, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(case.compiled[2], upper, rtol=1e-5, atol=1e-6)
    # max k2 s2 on 6x5: rows total 0, columns (3 - 1) * 2 + 2 - 5 = 1 -> (1, 0)
    np.testing.assert_allclose(case.compiled[3], np_pool(x, (2, 2), (2, 2), [(0, 0), (1, 0)], "max"), rtol=1e-6)
    # avg k3 s2 on 6x5: rows (3 - 1) * 2 + 3 - 6 = 1 -> (1, 0), columns 2 -> (1, 1)
    np.testing.assert_allclose(case.compiled[4], np_pool(x, (3, 3), (2, 2), [(1, 0), (1, 1)], "avg"), rtol=1e-5)
