"""Calls that real OneFlow 0.3 programs make, found by running programs of OneFlow-Benchmark and
Oneflow-Inc's model zoos on flowc: each against NumPy or against the form flowc had already.

Full reductions keep one axis (Re-ID's losses concatenate them, GE2E indexes `loss[0]`); batch_gather
is tested in tests/test_indexing_ops.py (BERT's pretraining)."""
from __future__ import annotations

import typing

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from tests.oracle import finite_difference_check

rng = np.random.default_rng(31)
X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)


def test_a_reduction_over_every_axis_has_shape_1_as_in_oneflow():
    @flow.global_function()
    def reduce(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> typing.Tuple[(tp.Numpy,) * 15]:
        m = flow.math
        return (m.reduce_sum(x), m.reduce_mean(x), m.reduce_max(x), m.reduce_min(x), m.reduce_prod(x * 0.1 + 1.0),
                m.reduce_any(x), m.reduce_all(x), m.reduce_euclidean_norm(x), m.reduce_logsumexp(x),
                m.reduce_variance(x), m.reduce_std(x), m.reduce_sum(x, axis=[0, 1, 2, 3]),
                m.reduce_sum(x, keepdims=True), m.reduce_sum(x, axis=[1, 3]),
                # Re-ID's losses: the maximum of each slice, concatenated
                flow.concat([m.reduce_max(flow.slice_v2(x, [(i, i + 1, 1)])) for i in range(2)]))
    want = [X.sum(), X.mean(), X.max(), X.min(), np.prod(X * 0.1 + 1.0), 1, int(np.all(X != 0)),
            np.sqrt((X * X).sum()), np.log(np.exp(X).sum()), X.var(), X.std(), X.sum()]
    got = reduce(X)
    for i, (value, expected) in enumerate(zip(got, want)):
        assert value.shape == (1,), (i, value.shape)
        np.testing.assert_allclose(value, [expected], rtol=2e-5, err_msg=f"result {i}")
    assert got[12].shape == (1, 1, 1, 1) and got[13].shape == (2, 4)
    np.testing.assert_allclose(got[14], X.reshape(2, -1).max(axis=1), rtol=1e-6)


def test_a_train_jobs_loss_is_indexed_as_oneflow_programs_do():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
        return loss
    x = rng.standard_normal((4, 3)).astype(np.float32)
    first = train(x)
    assert first.shape == (1,) and first[0] == pytest.approx(x.mean(), rel=1e-6)
    # d(mean(x * w))/dw = the column means / 3
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 1.0 - 0.5 * x.mean(axis=0) / 3, rtol=1e-6)


def test_parallel_cast_keeps_the_values_and_the_gradient():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())
        cast = flow.parallel_cast(x * w, distribute=flow.distribute.broadcast(),
                                  gradient_distribute=flow.distribute.split(0))
        loss = flow.math.reduce_sum(cast)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
        return cast
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(train(x), x)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 1.0 - 0.5 * x.sum(axis=0), rtol=1e-6)


def test_parallel_cast_checks_its_hints():
    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.parallel_cast(x, distribute="broadcast")
    with pytest.raises(TraceError, match=r"flow.parallel_cast: expected flow.distribute"):
        bad(np.zeros((4, 3), np.float32))


def test_current_global_function_desc_tells_train_from_predict_jobs():
    seen = {}
    config = flow.function_config()
    config.default_data_type(flow.float)

    def body(x, job):
        desc = flow.current_global_function_desc()
        seen[job] = (desc.IsTrainable(), desc.HasAttr("default_data_type"))
        return x * 2.0

    @flow.global_function(type="predict", function_config=config)
    def predict(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return body(x, "predict")

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(body(x * w, "train"))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    predict(np.ones(2, np.float32))
    train(np.ones(2, np.float32))
    assert seen == {"predict": (False, True), "train": (True, False)}
    with pytest.raises(TraceError, match="current_global_function_desc"):
        flow.current_global_function_desc()


def test_concat_takes_values_as_inceptions_programs_pass_them():
    @flow.global_function()
    def join(x: tp.Numpy.Placeholder((2, 3))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return flow.concat(values=[x, x * 2.0], axis=1, name="concat"), flow.concat([x, x * 2.0], axis=1)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    by_values, by_inputs = join(x)
    np.testing.assert_array_equal(by_values, np.concatenate([x, x * 2], axis=1))
    np.testing.assert_array_equal(by_values, by_inputs)

    @flow.global_function()
    def both(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.concat([x], values=[x])
    with pytest.raises(TraceError, match="not both"):
        both(x)


def test_a_padding_per_layout_axis_and_pools_without_strides():
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)

    @flow.global_function()
    def pads(x: tp.Numpy.Placeholder((2, 3, 4, 5)), w: tp.Numpy.Placeholder((3, 1, 3, 3))) \
            -> typing.Tuple[(tp.Numpy,) * 7]:
        nhwc = flow.transpose(x, perm=[0, 2, 3, 1], batch_axis_non_change=True)
        return (flow.nn.conv2d(x, w, 1, [0, 0, 1, 1], "NCHW", groups=3),        # MobileNetV3's form
                flow.nn.conv2d(x, w, 1, 1, "NCHW", groups=3),
                flow.nn.conv2d(x, w, 1, [0, 0, (1, 2), (0, 1)], "NCHW", groups=3),
                flow.nn.conv2d(x, w, 1, [[0, 0], [0, 0], [1, 2], [0, 1]], "NCHW", groups=3),
                flow.nn.max_pool2d(nhwc, ksize=2, strides=None, padding=[0, 1, 0, 0], data_format="NHWC"),
                flow.nn.avg_pool2d(x, ksize=[4, 4], strides=None, padding="VALID"),
                flow.nn.avg_pool2d(x, ksize=[4, 4], strides=1, padding="VALID"))
    flat, same, pairs, nested, max_pooled, avg_none, avg_one = pads(X, w)
    np.testing.assert_array_equal(flat, same)
    np.testing.assert_array_equal(pairs, nested)
    assert pairs.shape == (2, 3, 5, 4)
    padded = np.pad(X.transpose(0, 2, 3, 1), ((0, 0), (1, 1), (0, 0), (0, 0)), constant_values=-np.inf)
    want = np.max([padded[:, i:i + 5, j:j + 4] for i in (0, 1) for j in (0, 1)], axis=0)
    np.testing.assert_array_equal(max_pooled, want)
    np.testing.assert_array_equal(avg_none, avg_one)
    assert avg_none.shape == (2, 3, 1, 2)

    @flow.global_function()
    def pads_the_channels(x: tp.Numpy.Placeholder((2, 3, 4, 5)), w: tp.Numpy.Placeholder((3, 1, 3, 3))) -> tp.Numpy:
        return flow.nn.conv2d(x, w, 1, [0, 1, 1, 1], "NCHW", groups=3)
    with pytest.raises(TraceError, match="pads the batch or channel axis"):
        pads_the_channels(X, w)


def test_a_blob_in_an_if_names_the_none_test():
    @flow.global_function()
    def branch(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x if x else x * 2.0
    with pytest.raises(TraceError, match="is not None"):
        branch(np.ones(2, np.float32))


def test_sparse_cross_entropy_reads_the_labels_probability():
    @flow.global_function()
    def loss(p: tp.Numpy.Placeholder((4, 3)), labels: tp.Numpy.Placeholder((4, 1), dtype=flow.int32)) \
            -> typing.Tuple[tp.Numpy, tp.Numpy]:
        probabilities = flow.nn.softmax(p)
        return (flow.nn.sparse_cross_entropy(labels=labels, prediction=probabilities),
                flow.nn.sparse_cross_entropy(labels, flow.math.multiply(probabilities, 0.0)))
    p = rng.standard_normal((4, 3)).astype(np.float32)
    labels = np.array([[0], [2], [1], [2]], np.int32)
    softmax = np.exp(p) / np.exp(p).sum(axis=1, keepdims=True)
    got, of_zero = loss(p, labels)
    np.testing.assert_allclose(got, -np.log(softmax[np.arange(4), labels[:, 0]]), rtol=1e-6)
    np.testing.assert_allclose(of_zero, np.full(4, -np.log(np.float32(1e-20))), rtol=1e-6)    # clamped, finite


def test_sparse_cross_entropy_gradient_against_finite_differences():
    p = rng.uniform(0.2, 1.0, (3, 4))
    labels = np.array([3, 0, 3], np.int32)
    finite_difference_check(lambda p, labels: flow.nn.sparse_cross_entropy(labels, p), [p, labels])


def test_sigmoid_cross_entropy_takes_integer_labels_as_the_wide_and_deep_benchmark_feeds():
    @flow.global_function()
    def loss(x: tp.Numpy.Placeholder((4, 1)), y: tp.Numpy.Placeholder((4, 1), dtype=flow.int32)) \
            -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (flow.nn.sigmoid_cross_entropy_with_logits(y, x),
                flow.nn.sigmoid_cross_entropy_with_logits(flow.cast(y, flow.float), x))
    x = rng.standard_normal((4, 1)).astype(np.float32)
    as_int, as_float = loss(x, np.array([[1], [0], [0], [1]], np.int32))
    np.testing.assert_array_equal(as_int, as_float)


def _bilinear(x: np.ndarray, scale: int, axis: int) -> np.ndarray:
    """OneFlow's (and PyTorch's align_corners=False) source coordinates along one axis."""
    size = x.shape[axis]
    source = np.maximum((np.arange(size * scale, dtype=np.float32) + 0.5) * np.float32(1 / scale) - 0.5, 0)
    low = np.floor(source).astype(int)
    high = np.minimum(low + 1, size - 1)
    shape = [1] * x.ndim
    shape[axis] = -1
    t = (source - low).reshape(shape)
    return np.take(x, low, axis=axis) * (1 - t) + np.take(x, high, axis=axis) * t


def test_upsample_2d_nearest_and_bilinear_against_numpy():
    @flow.global_function()
    def up(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        nhwc = flow.transpose(x, perm=[0, 2, 3, 1])
        return (flow.layers.upsample_2d(x, size=(2, 3)),
                flow.layers.upsample_2d(x, size=(2, 3), interpolation="bilinear"),
                flow.layers.upsample_2d(nhwc, size=2, data_format="NHWC", interpolation="bilinear"))
    nearest, bilinear, nhwc = up(X)
    np.testing.assert_array_equal(nearest, X.repeat(2, axis=2).repeat(3, axis=3))
    np.testing.assert_allclose(bilinear, _bilinear(_bilinear(X, 2, 2), 3, 3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(nhwc, _bilinear(_bilinear(X, 2, 2), 2, 3).transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_upsample_2d_gradients_against_finite_differences(interpolation):
    x = rng.standard_normal((1, 2, 3, 2))
    finite_difference_check(lambda x: flow.layers.upsample_2d(x, size=(3, 2), interpolation=interpolation), [x])


def test_upsample_2d_names_a_bad_argument():
    @flow.global_function()
    def up(x: tp.Numpy.Placeholder((1, 1, 2, 2))) -> tp.Numpy:
        return flow.layers.upsample_2d(x, size=1.5)
    with pytest.raises(TraceError, match="upsample_2d: size must be an int or a pair"):
        up(np.zeros((1, 1, 2, 2), np.float32))


def test_an_optimizers_variables_may_be_a_callable_and_are_listed_by_variables():
    listed = []

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        a = flow.get_variable("a", shape=(3,), initializer=flow.ones_initializer())
        b = flow.get_variable("b", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * a * b)
        only_a = flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), variables=lambda: ["a"])
        only_a.minimize(loss)
        listed.extend([only_a.Variables(), flow.optimizer.SGD(0.1).Variables()])
        return loss
    x = np.array([1, 2, 3], np.float32)
    train(x)
    assert listed == [["a"], ["a", "b"]]
    values = flow.get_all_variables()
    np.testing.assert_allclose(values["a"].numpy(), 1 - 0.5 * x)
    np.testing.assert_array_equal(values["b"].numpy(), np.ones(3))


def test_slice_cuts_a_size_that_runs_past_the_end_as_oneflow_does():
    # SRGAN's total variation loss: flow.slice(images, [None, 0, 1, 0], [None, 3, hr, hr]) is images[:, :, 1:, :]
    @flow.global_function()
    def cut(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (flow.slice(x, [None, 0, 1, 0], [None, 3, 4, 5]), flow.slice(x, [None, -2, 0, 3], [None, 2, -1, 4]))
    past_end, negative_begin = cut(X)
    np.testing.assert_array_equal(past_end, X[:, :, 1:, :])
    np.testing.assert_array_equal(negative_begin, X[:, 1:, :, 3:])

    @flow.global_function()
    def too_long(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> tp.Numpy:
        return flow.slice(x, [None, 0, 0, 0], [None, 3, 5, 5])
    with pytest.raises(TraceError, match=r"size\[2\] = 5 is outside \[1, 4\]"):
        too_long(X)


def _margin_reference(x: np.ndarray, labels: np.ndarray, m1: float, m2: float, m3: float) -> np.ndarray:
    """OneFlow's combined margin: cos(m1 * acos(x) + m2) - m3 at each row's label, x elsewhere."""
    out = x.astype(np.float64).copy()
    for row, label in enumerate(labels):
        if 0 <= label < x.shape[1]:
            out[row, label] = np.cos(m1 * np.arccos(x[row, label]) + m2) - m3
    return out


@pytest.mark.parametrize("m1, m2, m3", [(1.0, 0.5, 0.0), (1.0, 0.0, 0.35), (1.35, 0.25, 0.1)],
                         ids=["arcface", "cosface", "combined"])
def test_combined_margin_loss_against_numpy(m1, m2, m3):
    @flow.global_function()
    def margin(x: tp.Numpy.Placeholder((5, 6)), labels: tp.Numpy.Placeholder((5,), dtype=flow.int32)) -> tp.Numpy:
        return flow.combined_margin_loss(x, labels, m1=m1, m2=m2, m3=m3) * 64.0
    cosines = rng.uniform(-0.95, 0.95, (5, 6)).astype(np.float32)
    cosines[1, 4] = np.nan                                  # off the label: stays NaN, reaches nothing else
    labels = np.array([2, 0, 5, 9, -1], np.int32)           # the last two out of range: rows unchanged
    got = margin(cosines, labels)
    np.testing.assert_allclose(got, 64.0 * _margin_reference(cosines, labels, m1, m2, m3), rtol=2e-6, atol=2e-5)
    assert np.isnan(got[1, 4]) and np.isfinite(np.delete(got[1], 4)).all()


def test_combined_margin_loss_gradient_against_finite_differences():
    cosines = rng.uniform(-0.9, 0.9, (4, 5))
    labels = np.array([1, 4, 0, 2], np.int32)
    finite_difference_check(lambda x, y: flow.combined_margin_loss(x, y, m1=1.2, m2=0.3, m3=0.2), [cosines, labels])


def test_combined_margin_loss_trains_an_arcface_head():
    @flow.global_function(type="train")
    def train(embedding: tp.Numpy.Placeholder((4, 3)), labels: tp.Numpy.Placeholder((4,), dtype=flow.int32)) \
            -> tp.Numpy:
        weight = flow.get_variable("fc7-weight", shape=(3, 5), initializer=flow.random_normal_initializer(seed=3))
        cosines = flow.matmul(flow.math.l2_normalize(embedding, axis=1), flow.math.l2_normalize(weight, axis=0))
        logits = flow.combined_margin_loss(cosines, labels, m2=0.5) * 8.0
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
        return loss
    embedding = rng.standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 3], np.int32)
    losses = [train(embedding, labels).item() for _ in range(8)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_combined_margin_loss_names_a_bad_argument():
    @flow.global_function()
    def margin(x: tp.Numpy.Placeholder((4, 5)), labels: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.combined_margin_loss(x, labels)
    with pytest.raises(TraceError, match="label must be integer class ids of shape"):
        margin(np.zeros((4, 5), np.float32), np.zeros(4, np.float32))


def test_the_activation_names_oneflows_model_files_import():
    # OneFlow-Benchmark's VGG: `import oneflow.core.operator.op_conf_pb2 as op_conf_util`, activation=op_conf_util.kRelu
    import flow.core.operator.op_conf_pb2 as op_conf_util
    assert (op_conf_util.kNone, op_conf_util.kTanH, op_conf_util.kSigmoid, op_conf_util.kRelu) == (0, 1, 2, 3)
    with pytest.raises(AttributeError, match="only OneFlow's ActivationType values.*'OperatorConf'"):
        op_conf_util.OperatorConf()


def test_constant_scalar_is_a_blob_of_shape_1():
    @flow.global_function()
    def scaled(x: tp.Numpy.Placeholder((3,))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return x * flow.constant_scalar(2.5, dtype=flow.float32, name="std"), flow.constant_scalar(7, dtype=flow.int32)
    product, seven = scaled(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(product, [2.5, 5.0, 7.5])
    assert seven.shape == (1,) and seven.dtype == np.int32 and seven[0] == 7


def test_watch_scope_watches_every_blob_made_inside_it():
    # oneflow-documentation's test_watch_scope.py: a dict of values and a dict of gradients
    values, diffs, called = {}, {}, []

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        with flow.watch_scope(values, diffs):
            hidden = flow.math.tanh(flow.layers.dense(x, 2, name="fc",
                                                      kernel_initializer=flow.random_normal_initializer(seed=1)),
                                    name="act")
        with flow.watch_scope(lambda value, blob: called.append((blob.op_name, value.numpy().shape))):
            loss = flow.math.reduce_mean(hidden * hidden, name="loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return loss
    x = rng.standard_normal((4, 3)).astype(np.float32)
    train(x)
    weight = flow.get_all_variables()["fc-weight"].numpy()
    act = values["act/out"]["blob"].numpy()
    np.testing.assert_allclose(act, np.tanh(x @ weight.T), rtol=1e-5, atol=1e-6)    # the bias starts at 0
    assert values["act/out"]["blob_def"].op_name == "act"
    assert set(values) == set(diffs) and {"fc-weight/out", "act/out"} <= set(values)
    # d mean(h^2) / dh with the backward pass seeded with ones: 2h / 8
    np.testing.assert_allclose(diffs["act/out"]["blob"].numpy(), 2 * act / act.size, rtol=1e-5, atol=1e-7)
    # the function saw the ops of the second block only: the square, the sum, the mean, named as asked
    assert called[0][1] == (4, 2) and called[-1] == ("loss", (1,))
    assert all(name != "act" for name, _ in called)


def test_watch_scope_takes_a_dict_or_a_function():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        with flow.watch_scope(["not", "a", "dict"]):
            return x * 2.0
    with pytest.raises(TraceError, match="blob_watcher must be a dict, a function or None, got list"):
        job(np.ones(3, np.float32))


def test_batch_normalization_add_relu_against_numpy_in_train_and_predict_jobs():
    # SCNet's default (fuse_bn_relu, fuse_bn_add_relu): OneFlow's fused layers, computed unfused
    addend = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3, 4, 5)), a: tp.Numpy.Placeholder((2, 3, 4, 5))) \
            -> typing.Tuple[tp.Numpy, tp.Numpy]:
        added = flow.layers.batch_normalization_add_relu(x, a, axis=1, momentum=0.9, epsilon=1e-3, name="bn",
                                                        gamma_name="my_gamma")
        alone = flow.layers.batch_normalization_relu(x * 2.0, axis=1, name="bn2")
        loss = flow.math.reduce_mean(added) + flow.math.reduce_mean(alone)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return added, alone

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> tp.Numpy:
        return flow.layers.batch_normalization_relu(x, axis=1, name="bn2", training=False)

    added, alone = train(X, addend)
    axes_ = (0, 2, 3)

    def normalized(v):
        return (v - v.mean(axis=axes_, keepdims=True)) / np.sqrt(v.var(axis=axes_, keepdims=True) + 1e-3)
    np.testing.assert_allclose(added, np.maximum(normalized(X) + addend, 0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(alone, np.maximum(normalized(2 * X), 0), rtol=1e-4, atol=1e-5)
    names = set(flow.get_all_variables())
    assert {"my_gamma", "bn-beta", "bn-moving_mean", "bn-moving_variance", "bn2-gamma"} <= names
    assert "bn-gamma" not in names
    # predict: the moving statistics, one momentum-0.99 step from (0, 1)
    count = X.size // 3
    mean = 0.01 * (2 * X).mean(axis=axes_)
    variance = 0.99 + 0.01 * (2 * X).var(axis=axes_) * count / (count - 1)
    want = np.maximum((X - mean.reshape(1, 3, 1, 1)) / np.sqrt(variance.reshape(1, 3, 1, 1) + 1e-3), 0)
    np.testing.assert_allclose(predict(X), want, rtol=1e-4, atol=1e-5)


def test_a_named_reduction_returns_the_blob_of_that_name():
    # OneFlow's reduce_* is one op: the Blob it returns is the named one, also when the result is one value
    names = {}

    @flow.global_function()
    def named(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        m = flow.math
        for blob in (m.reduce_sum(x, name="total"), m.reduce_mean(x, name="mean"),
                     m.reduce_mean(x, axis=1, name="rows"), m.reduce_any(x, name="any"),
                     m.reduce_euclidean_norm(x, axis=[0, 1], name="norm"),
                     m.reduce_sum(x, axis=0, keepdims=True, name="kept")):
            names[blob.op_name] = blob.shape
        return x
    named(np.ones((2, 3), np.float32))
    assert names == {"total": (1,), "mean": (1,), "rows": (2,), "any": (1,), "norm": (1,), "kept": (1, 3)}


def test_pool3d_strides_none_is_one_on_every_axis():
    # AP3D's NonLocal block: flow.nn.max_pool3d(..., ksize=[1, 2, 2], strides=None); OneFlow's _GetSequence: 1
    x = np.arange(32, dtype=np.float32).reshape(1, 1, 2, 4, 4)

    @flow.global_function()
    def pool(x: tp.Numpy.Placeholder((1, 1, 2, 4, 4))) -> tp.Numpy:
        return flow.nn.max_pool3d(x, ksize=[1, 2, 2], strides=None, padding="VALID", data_format="NCDHW")
    got = pool(x)
    want = np.maximum(np.maximum(x[..., :-1, :-1], x[..., 1:, :-1]), np.maximum(x[..., :-1, 1:], x[..., 1:, 1:]))
    np.testing.assert_array_equal(got, want)


def test_count_not_finite_elem_cnt_and_fused_scale_tril_against_numpy():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    x[0, 1], x[2, 3], x[1, 0] = np.nan, np.inf, -np.inf
    y = np.array([1.0, np.nan], np.float32)

    @flow.global_function()
    def numerics(x: tp.Numpy.Placeholder((3, 4)), y: tp.Numpy.Placeholder((2,))) -> typing.Tuple[(tp.Numpy,) * 6]:
        return (flow.count_not_finite(x), flow.multi_count_not_finite([x, y]), flow.count_not_finite(y * 0.0 + 1.0),
                flow.elem_cnt(x), flow.elem_cnt(y, dtype=flow.int64),
                flow.math.fused_scale_tril(flow.math.abs(x) + 1.0, diagonal=1, fill_value=-2.0, scale=3.0))
    one, both, after_nan, count, count64, tril = numerics(x, y)
    assert one.dtype == np.int64 and one.tolist() == [3] and both.tolist() == [4] and after_nan.tolist() == [1]
    assert count.tolist() == [12] and count.dtype == np.int32 and count64.dtype == np.int64 and count64[0] == 2
    want = np.where(np.arange(4)[None, :] - np.arange(3)[:, None] <= 1, (np.abs(x) + 1) * 3, -2.0)
    np.testing.assert_allclose(tril, want, rtol=1e-6)
