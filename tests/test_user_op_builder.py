"""`flow.user_op_builder` for OneFlow's built-in ops (flow/user_ops.py): each op type of the table
against NumPy, the batch norm that OneFlow's Pix2Pix and SRGAN build through it (train and predict
jobs, its moving averages), and the errors that name what does not fit."""
from __future__ import annotations

import typing

import numpy as np
import pytest

import flow
import flow.typing as tp
from flow.user_ops import BUILTIN_OPS
from flowc.compiler.errors import TraceError, UnsupportedError

rng = np.random.default_rng(41)
X = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
EPSILON, MOMENTUM = 1.001e-5, 0.997


def _built(op_type: str, inputs: dict, outputs: list[str], **attrs):
    builder = flow.user_op_builder(f"my_{op_type}").Op(op_type)
    for name, blob in inputs.items():
        builder = builder.Input(name, [blob])
    for name in outputs:
        builder = builder.Output(name)
    for name, value in attrs.items():
        builder = builder.Attr(name, value)
    return builder.Build().InferAndTryRun().RemoteBlobList()


def _pix2pix_batch_norm(x, name: str, training: bool):
    """As OneFlow's Pix2Pix builds it: its own variables in a namespace, then the op."""
    with flow.scope.namespace(name):
        shape = (x.shape[1],)
        beta = flow.get_variable("beta", shape=shape, initializer=flow.zeros_initializer())
        gamma = flow.get_variable("gamma", shape=shape, initializer=flow.random_uniform_initializer(0.5, 1.5))
        mean = flow.get_variable("moving_mean", shape=shape, initializer=flow.zeros_initializer(), trainable=False)
        variance = flow.get_variable("moving_variance", shape=shape, initializer=flow.ones_initializer(),
                                     trainable=False)
    return _built("normalization", {"x": x, "moving_mean": mean, "moving_variance": variance, "gamma": gamma,
                                    "beta": beta},
                  ["y", "mean", "inv_variance"] if training else ["y"],
                  axis=1, epsilon=EPSILON, training=training, momentum=MOMENTUM)


def test_the_pointwise_ops_against_numpy():
    @flow.global_function()
    def ops(x: tp.Numpy.Placeholder((4, 3, 2, 2)), b: tp.Numpy.Placeholder((3,))) -> typing.Tuple[(tp.Numpy,) * 7]:
        return (_built("leaky_relu", {"x": x}, ["y"], alpha=0.1)[0], _built("relu", {"in": x}, ["out"])[0],
                _built("sigmoid", {"in": x}, ["out"])[0], _built("tanh", {"x": x}, ["y"])[0],
                _built("identity", {"in": x}, ["out"])[0], _built("softmax", {"in": x}, ["out"])[0],
                _built("bias_add", {"a": x, "b": b}, ["out"], axis=1)[0])
    b = rng.standard_normal(3).astype(np.float32)
    leaky, relu, sigmoid, tanh, same, softmax, biased = ops(X, b)
    np.testing.assert_allclose(leaky, np.where(X > 0, X, 0.1 * X), rtol=1e-6)
    np.testing.assert_array_equal(relu, np.maximum(X, 0))
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-X)), rtol=1e-6)
    np.testing.assert_allclose(tanh, np.tanh(X), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(same, X)
    np.testing.assert_allclose(softmax, np.exp(X) / np.exp(X).sum(axis=-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(biased, X + b.reshape(1, 3, 1, 1), rtol=1e-6)


def test_pix2pixs_batch_norm_trains_and_predicts_as_oneflows_op():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3, 2, 2))) -> typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        y, mean, inv_variance = _pix2pix_batch_norm(x, "g_bn1", training=True)
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return y, mean, inv_variance

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((4, 3, 2, 2))) -> tp.Numpy:
        return _pix2pix_batch_norm(x, "g_bn1", training=False)[0]

    y, mean, inv_variance = train(X)
    gamma = flow.get_all_variables()["g_bn1-gamma"].numpy()
    axes = (0, 2, 3)
    want_mean, want_var = X.mean(axis=axes), X.var(axis=axes)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv_variance, 1 / np.sqrt(want_var + EPSILON), rtol=1e-5)
    normalized = (X - want_mean.reshape(1, 3, 1, 1)) / np.sqrt(want_var.reshape(1, 3, 1, 1) + EPSILON)
    np.testing.assert_allclose(y, normalized * gamma.reshape(1, 3, 1, 1), rtol=1e-4, atol=1e-5)
    # the moving averages, OneFlow's: momentum * moving + (1 - momentum) * batch (variance unbiased)
    values = flow.get_all_variables()
    count = X.size // 3
    moving_mean = (1 - MOMENTUM) * want_mean
    moving_var = MOMENTUM + (1 - MOMENTUM) * want_var * count / (count - 1)
    np.testing.assert_allclose(values["g_bn1-moving_mean"].numpy(), moving_mean, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(values["g_bn1-moving_variance"].numpy(), moving_var, rtol=1e-5)
    predicted = predict(X)
    np.testing.assert_allclose(predicted, (X - moving_mean.reshape(1, 3, 1, 1)) / np.sqrt(
        moving_var.reshape(1, 3, 1, 1) + EPSILON) * gamma.reshape(1, 3, 1, 1), rtol=1e-4, atol=1e-5)


def _job_building(build):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3, 2, 2))) -> tp.Numpy:
        return build(x)
    return job


@pytest.mark.parametrize("build, error, message", [
    (lambda x: flow.user_op_builder("mine").Op("my_custom_op").Input("in", [x]).Output("out").Build(),
     UnsupportedError, "flowc has no op 'my_custom_op'.*normalization"),
    (lambda x: flow.user_op_builder("act").Op("leaky_relu").Input("x", [x]).Output("y").Build(),
     TraceError, r"missing Attr\('alpha'\)"),
    (lambda x: flow.user_op_builder("act").Op("leaky_relu").Input("in", [x]).Output("y").Attr("alpha", 0.2).Build(),
     TraceError, "has no input 'in' .its inputs: x."),
    (lambda x: flow.user_op_builder("act").Op("leaky_relu").Input("x", [x]).Output("y").Attr("alpha", 1).Build(),
     TraceError, r"Attr\('alpha'\) takes a float, got 1"),
    (lambda x: flow.user_op_builder("act").Op("relu").Input("in", [x]).Output("out").Build().RemoteBlobList(),
     TraceError, r"call .InferAndTryRun\(\) before"),
    (lambda x: flow.user_op_builder("act").Op("relu").Input("in", [x, x]).Output("out").Build(),
     TraceError, "expected a list of one Blob"),
    (lambda x: _built("normalization", {"x": x, "moving_mean": x, "moving_variance": x}, ["y", "mean"],
                      axis=1, epsilon=0.1, training=False),
     TraceError, "with these attributes the op makes only y, not 'mean'"),
    (lambda x: _built("normalization", {"x": x, "moving_mean": x, "moving_variance": x}, ["y"],
                      axis=1, epsilon=0.1, training=False),
     TraceError, r"input 'moving_mean' has shape \[4, 3, 2, 2\]; it needs one value per channel"),
    (lambda x: _built("normalization", {"x": x, "moving_mean": flow.math.reduce_mean(x, axis=[0, 2, 3]),
                                        "moving_variance": flow.math.reduce_mean(x, axis=[0, 2, 3])}, ["y"],
                      axis=1, epsilon=0.1, training=True),
     TraceError, "in training the op updates 'moving_mean', so it must be a variable"),
], ids=["custom op", "missing attribute", "unknown input", "int for a float", "outputs before running",
        "two blobs", "training output", "parameter shape", "moving mean not a variable"])
def test_the_builder_names_what_does_not_fit(build, error, message):
    with pytest.raises(error, match=message):
        _job_building(build)(X)


def test_every_op_of_the_table_is_tested_here():
    assert set(BUILTIN_OPS) == {"normalization", "leaky_relu", "relu", "sigmoid", "tanh", "identity", "softmax",
                                "bias_add"}
