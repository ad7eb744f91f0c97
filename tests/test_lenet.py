"""LeNet (the seeds' recipe) end to end, dropout, and batch normalization."""

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from flowc.runtime.datasets import load_mnist_sample
from flowc.runtime.session import default_session
from tests.test_mlp import load_example

seed_train = load_example("seeds/synchronize_single_job")     # the seed's lenet() and train_job
seed_eval = load_example("seeds/synchronize_batch_job")       # its eval_job (same variable names)


def lenet_job(dtype, dropout_rate=0.5):
    config = flow.function_config()
    config.default_data_type(dtype)

    @flow.global_function(type="train", function_config=config)
    def lenet_train(images: tp.Numpy.Placeholder((9, 1, 28, 28), dtype=dtype),
                    labels: tp.Numpy.Placeholder((9,), dtype=flow.int32)) -> tp.Numpy:
        logits = seed_train.lenet(images, train=dropout_rate > 0)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return lenet_train


def test_one_train_step_equals_reference_with_the_same_dropout_mask():
    # float64, so that no max-pool window holds a near-tie that rounding could break differently
    # in the compiled code and the reference (which would route a gradient to another pixel).
    job = lenet_job(flow.double)
    (images, labels), _ = load_mnist_sample(9, 100)
    x, y = images[0].astype(np.float64), labels[0]
    graph = job.graph
    assert any(n.op == "dropout_mask" for n in graph.nodes)
    session = default_session()
    before = {name: session.value(name).copy() for name in graph.variables}
    ref_out, ref_updates = run_reference(graph, [x, y], before, {"learning_rate:float64": 0.1, "train_step": 0})
    loss = job(x, y)
    np.testing.assert_allclose(loss, ref_out[0], rtol=1e-4)
    for name, value in ref_updates.items():
        scale = max(float(np.max(np.abs(value))), 1e-30)
        err = float(np.max(np.abs(session.value(name) - value))) / scale
        assert err <= 1e-4, f"{name}: relative error {err:.3g}"


@flow.global_function(type="train")
def dropout_probe(x: tp.Numpy.Placeholder((4000,))) -> tp.Numpy:
    w = flow.get_variable("probe-w", shape=(1,), initializer=flow.ones_initializer())
    y = flow.nn.dropout(x * w, rate=0.25, seed=123)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(y)
    return y


@flow.global_function(type="predict")
def dropout_in_predict(x: tp.Numpy.Placeholder((4000,))) -> tp.Numpy:
    return flow.nn.dropout(x, rate=0.25, seed=123)


def test_dropout_scales_reproduces_and_changes_per_step():
    ones = np.ones(4000, np.float32)
    first, second = dropout_probe(ones), dropout_probe(ones)
    kept = first != 0
    assert abs(kept.mean() - 0.75) < 0.03
    np.testing.assert_allclose(first[kept], 1 / 0.75, rtol=1e-6)
    assert (first != second).any()                       # a new mask each step
    flow.clear_default_session()
    np.testing.assert_array_equal(dropout_probe(ones), first)   # same seed, same step: same mask
    np.testing.assert_array_equal(dropout_in_predict(ones), ones)   # predict jobs: identity


@flow.global_function(type="train")
def bn_train(x: tp.Numpy.Placeholder((6, 3, 4, 4))) -> tp.Numpy:
    y = flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn")
    loss = flow.math.reduce_mean(flow.math.square(y - 1.0))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return y


@flow.global_function(type="predict")
def bn_predict(x: tp.Numpy.Placeholder((6, 3, 4, 4))) -> tp.Numpy:
    return flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn")


def test_batch_norm_uses_batch_statistics_in_training_and_moving_ones_in_predict():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 3, 4, 4)) * 2 + 5).astype(np.float32)
    graph = bn_train.graph
    session = default_session()
    before = {name: session.value(name).copy() for name in graph.variables}
    ref_out, ref_updates = run_reference(graph, [x], before, {"learning_rate:float32": 0.1})
    y = bn_train(x)
    np.testing.assert_allclose(y, ref_out[0], rtol=1e-5, atol=1e-5)
    mean = x.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)          # gamma 1, beta 0 at first
    np.testing.assert_allclose(session.value("bn-moving_mean"), 0.1 * mean, rtol=1e-5)
    for name, value in ref_updates.items():
        np.testing.assert_allclose(session.value(name), value, rtol=1e-5, atol=1e-6, err_msg=name)
    moving_mean, moving_var = session.value("bn-moving_mean"), session.value("bn-moving_variance")
    gamma, beta = session.value("bn-gamma"), session.value("bn-beta")
    expected = ((x - moving_mean[:, None, None]) / np.sqrt(moving_var[:, None, None] + 0.001)
                * gamma[:, None, None] + beta[:, None, None])
    np.testing.assert_allclose(bn_predict(x), expected, rtol=1e-5, atol=1e-5)


def test_batch_norm_gradients_match_finite_differences():
    from tests.oracle import finite_difference_check

    def fn(x, g, b):
        mean = flow.math.reduce_mean(x, axis=[0, 2, 3], keepdims=True)
        var = flow.math.reduce_mean(flow.math.square(x - mean), axis=[0, 2, 3], keepdims=True)
        return (x - mean) / flow.math.sqrt(var + 0.001) * g + b
    rng = np.random.default_rng(4)
    finite_difference_check(fn, [rng.standard_normal((3, 2, 3, 3)), rng.standard_normal((1, 2, 1, 1)),
                                 rng.standard_normal((1, 2, 1, 1))], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_three_epochs_reach_94_percent_on_held_out_digits():
    (train_images, train_labels), (test_images, test_labels) = load_mnist_sample(100, 100)
    for _epoch in range(3):
        for images, labels in zip(train_images, train_labels):
            seed_train.train_job(images, labels)
    correct = total = 0
    for images, labels in zip(test_images, test_labels):
        out_labels, logits = seed_eval.eval_job(images, labels)
        correct += int(np.sum(np.argmax(logits, 1) == out_labels))
        total += len(out_labels)
    assert correct / total >= 0.94, f"held-out accuracy {correct / total:.3f}"
