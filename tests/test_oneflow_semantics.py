"""Semantics checked against OneFlow 0.3.4's source (docs/oneflow_compat_semantics.md has the table):
AMP lists and propagation, TripletMarginLoss's norm axis, layers.dense's default initializers."""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.trace import TraceError


def _amp_config():
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)
    return config


def _dtypes_by_op(graph) -> dict[str, set[str]]:
    by_op: dict[str, set[str]] = {}
    for n in graph.nodes:
        by_op.setdefault(n.op, set()).add(n.type.dtype)
    return by_op


def test_amp_black_list_is_empty_so_a_gray_op_fed_by_an_unlisted_op_joins_the_white_ops():
    """OneFlow 0.3.4's black list is empty: `exp` (on no list) stays float32 but does not make the
    gray `add` after it float32; the add lies between two matmuls, so it computes in float16.
    Softmax is gray there too."""
    flow.clear_default_session()

    @flow.global_function(function_config=_amp_config())
    def amp_gray_after_unlisted(a: tp.Numpy.Placeholder((4, 4)), b: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        m = flow.matmul(a, b)                            # white
        s = m + flow.math.exp(b)                         # gray, one input from an unlisted op
        p = flow.nn.softmax(flow.matmul(s, b))           # softmax: gray between two whites
        return flow.matmul(p, b)
    by_op = _dtypes_by_op(amp_gray_after_unlisted.graph)
    assert by_op["exp"] == {"float32"}
    assert by_op["add"] == {"float16"}
    assert by_op["softmax"] == {"float16"}
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((4, 4)).astype(np.float32) * 0.3 for _ in range(2))
    s = a @ b + np.exp(b)
    z = s @ b
    p = np.exp(z - z.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ b
    np.testing.assert_allclose(amp_gray_after_unlisted(a, b), want, rtol=1e-2, atol=1e-3)
    flow.clear_default_session()


def test_amp_white_spreads_through_a_clear_op_with_any_white_input():
    """OneFlow propagates white through clear ops when one input (not all) is white: the concat of a
    matmul and a float32 input computes in float16, and so does the relu after it."""
    flow.clear_default_session()

    @flow.global_function(function_config=_amp_config())
    def amp_clear_spread(a: tp.Numpy.Placeholder((4, 4)), b: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        c = flow.concat([flow.matmul(a, b), b], axis=1)  # clear: one white input, one float32 input
        return flow.nn.relu(c)
    by_op = _dtypes_by_op(amp_clear_spread.graph)
    assert by_op["concat"] == {"float16"}
    assert by_op["relu"] == {"float16"}
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(amp_clear_spread(a, b), np.maximum(np.concatenate([a @ b, b], 1), 0),
                               rtol=2e-3, atol=2e-3)
    flow.clear_default_session()


def _triplet_axis1(a, p, n, margin=1.0, eps=1e-6):
    def d(x, y):
        return np.sqrt(((x - y + eps) ** 2).sum(axis=1))
    return np.maximum(d(a, p) - d(a, n) + margin, 0)


def test_triplet_margin_loss_takes_the_norm_over_axis_1():
    """OneFlow 0.3.4 reduces axis 1 whatever the rank: an (N, C, L) input has an (N, L) loss."""
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def triplet_rank3(a: tp.Numpy.Placeholder((2, 3, 5)), p: tp.Numpy.Placeholder((2, 3, 5)),
                      n: tp.Numpy.Placeholder((2, 3, 5))) -> tp.Numpy:
        return flow.nn.TripletMarginLoss(a, p, n, margin=0.5, reduction="none")
    rng = np.random.default_rng(5)
    a, p, n = (rng.standard_normal((2, 3, 5)).astype(np.float32) for _ in range(3))
    got = triplet_rank3(a, p, n)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, _triplet_axis1(a, p, n, margin=0.5), rtol=1e-5, atol=1e-6)

    @flow.global_function(type="predict")
    def triplet_rank1(a: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
        return flow.nn.TripletMarginLoss(a, a, a)
    with pytest.raises(TraceError, match="at least two axes"):
        triplet_rank1.lower()
    flow.clear_default_session()


def test_dense_defaults_to_zero_weights_as_oneflow():
    """OneFlow 0.3.4's layers.dense initialises its kernel with constant 0 (and its bias with 0)
    when no initializer is given; conv2d's kernel stays Xavier-uniform."""
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def dense_defaults(x: tp.Numpy.Placeholder((2, 3)), img: tp.Numpy.Placeholder((1, 2, 4, 4))) -> tp.Numpy:
        flow.layers.conv2d(img, 3, kernel_size=3, name="sem_conv")
        return flow.layers.dense(x, 4, name="sem_dense")
    out = dense_defaults(np.ones((2, 3), np.float32), np.ones((1, 2, 4, 4), np.float32))
    np.testing.assert_array_equal(out, np.zeros((2, 4), np.float32))
    variables = flow.get_all_variables()
    assert not variables["sem_dense-weight"].numpy().any()
    assert not variables["sem_dense-bias"].numpy().any()
    conv = variables["sem_conv-weight"].numpy()
    fan_in, fan_out = 2 * 9, 3 * 9
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    assert conv.any() and np.abs(conv).max() <= limit
    flow.clear_default_session()


def test_get_variable_with_reuse_false_refuses_a_second_get_in_one_job():
    """OneFlow 0.3.4's get_variable asserts the variable is new in the job when reuse=False."""
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def reuse_false(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        a = flow.get_variable("reused", shape=(3,), initializer=flow.ones_initializer())
        b = flow.get_variable("reused", shape=(3,), initializer=flow.ones_initializer(), reuse=False)
        return x + a + b
    with pytest.raises(TraceError, match="'reused' already exists in job 'reuse_false'.*reuse=False"):
        reuse_false.lower()
    flow.clear_default_session()          # a call traces every job of the session, the failing one too

    @flow.global_function(type="predict")
    def reuse_default(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        a = flow.get_variable("shared", shape=(3,), initializer=flow.ones_initializer(), reuse=False)
        b = flow.get_variable("shared", shape=(3,), initializer=flow.ones_initializer())
        return x + a + b
    np.testing.assert_array_equal(reuse_default(np.zeros(3, np.float32)), [2.0, 2.0, 2.0])
    flow.clear_default_session()
