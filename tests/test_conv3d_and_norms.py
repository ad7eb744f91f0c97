"""OneFlow 0.3 ops composed of flowc's own (flow/conv3d.py, flow/instance_norm.py, flow/pixel_shuffle.py):
`flow.nn.conv3d` / `flow.layers.conv3d`, `flow.nn.InstanceNorm1d/2d/3d`, `flow.nn.GroupNorm` and
`flow.nn.PixelShuffle(v2)`, against NumPy references written here, with gradients against finite
differences."""
from __future__ import annotations

import itertools
import typing

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from tests.oracle import finite_difference_check

rng = np.random.default_rng(23)


def conv3d_reference(x, w, stride, dilation, pads, groups=1):
    """NCDHW x (N, C, D, H, W), w (O, C/groups, kd, kh, kw); pads ((before, after),) * 3; float64 loops."""
    x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + list(pads))
    n, c, *size = x.shape
    o, cg, *kernel = w.shape
    out_size = [(s - (k - 1) * d - 1) // st + 1 for s, k, d, st in zip(size, kernel, dilation, stride)]
    y = np.zeros((n, o, *out_size))
    per_group = o // groups
    for od, oh, ow in itertools.product(*(range(s) for s in out_size)):
        window = x[:, :, od * stride[0]: od * stride[0] + (kernel[0] - 1) * dilation[0] + 1: dilation[0],
                   oh * stride[1]: oh * stride[1] + (kernel[1] - 1) * dilation[1] + 1: dilation[1],
                   ow * stride[2]: ow * stride[2] + (kernel[2] - 1) * dilation[2] + 1: dilation[2]]
        for g in range(groups):
            part = window[:, g * cg:(g + 1) * cg]
            y[:, g * per_group:(g + 1) * per_group, od, oh, ow] = np.tensordot(
                part, w[g * per_group:(g + 1) * per_group], axes=([1, 2, 3, 4], [1, 2, 3, 4]))
    return y


X5 = rng.standard_normal((2, 4, 5, 6, 5)).astype(np.float32)
W5 = rng.standard_normal((6, 4, 3, 2, 3)).astype(np.float32)
W5_GROUPED = rng.standard_normal((6, 2, 2, 3, 1)).astype(np.float32)


def test_conv3d_against_numpy():
    @flow.global_function()
    def conv(x: tp.Numpy.Placeholder((2, 4, 5, 6, 5)), w: tp.Numpy.Placeholder((6, 4, 3, 2, 3)),
             wg: tp.Numpy.Placeholder((6, 2, 2, 3, 1))) -> typing.Tuple[(tp.Numpy,) * 5]:
        nn = flow.nn
        return (nn.conv3d(x, w, strides=1, padding="VALID"),
                nn.conv3d(x, w, strides=(2, 1, 2), padding="SAME"),
                nn.conv3d(x, w, strides=1, padding=[0, 0, (1, 2), 0, (2, 0)], dilations=(2, 1, 1)),
                nn.conv3d(x, wg, strides=(1, 2, 1), padding="SAME_UPPER", groups=2),
                nn.conv3d(flow.transpose(x, perm=[0, 2, 3, 4, 1]), flow.transpose(w, perm=[0, 2, 3, 4, 1]),
                          strides=1, padding="VALID", data_format="NDHWC"))
    valid, same, explicit, grouped, channels_last = conv(X5, W5, W5_GROUPED)
    ones = (1, 1, 1)
    np.testing.assert_allclose(valid, conv3d_reference(X5, W5, ones, ones, [(0, 0)] * 3), rtol=1e-4, atol=1e-4)
    # SAME is OneFlow's SAME_LOWER: the odd padding goes first (depth 5, kernel 3, stride 2: total 2)
    np.testing.assert_allclose(same, conv3d_reference(X5, W5, (2, 1, 2), ones, [(1, 1), (1, 0), (1, 1)]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(explicit, conv3d_reference(X5, W5, ones, (2, 1, 1), [(1, 2), (0, 0), (2, 0)]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grouped, conv3d_reference(X5, W5_GROUPED, (1, 2, 1), ones, [(0, 1), (0, 1), (0, 0)],
                                                         groups=2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(channels_last, valid.transpose(0, 2, 3, 4, 1), rtol=1e-5, atol=1e-5)


def test_conv3d_gradients_against_finite_differences():
    x = rng.standard_normal((1, 2, 4, 3, 3))
    w = rng.standard_normal((3, 2, 2, 2, 2))
    finite_difference_check(lambda x, w: flow.nn.conv3d(x, w, strides=(2, 1, 1), padding="SAME"), [x, w])


def test_layers_conv3d_makes_its_variables_and_trains():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 4, 5, 6, 5))) -> tp.Numpy:
        y = flow.layers.conv3d(x, 3, kernel_size=(3, 2, 3), padding="SAME", activation=flow.nn.relu, name="c3d",
                               bias_initializer=flow.constant_initializer(0.5))
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01])).minimize(loss)
        return y
    y = train(X5)
    variables = flow.get_all_variables()
    assert variables["c3d-weight"].numpy().shape == (3, 4, 3, 2, 3) and y.shape == (2, 3, 5, 6, 5)


def test_conv3d_names_a_bad_argument():
    @flow.global_function()
    def conv(x: tp.Numpy.Placeholder((2, 4, 5, 6, 5)), w: tp.Numpy.Placeholder((6, 4, 3, 2, 3))) -> tp.Numpy:
        return flow.nn.conv3d(x, w, strides=1, padding="VALID", groups=3)
    with pytest.raises(TraceError, match=r"do not fit groups=3"):
        conv(X5, W5)


def _instance_norm(v, eps):
    v = v.astype(np.float64)
    return (v - v.mean(axis=2, keepdims=True)) / np.sqrt(v.var(axis=2, keepdims=True) + eps)


def test_instance_and_group_norms_against_numpy():
    x3, x4 = rng.standard_normal((2, 3, 7)).astype(np.float32), rng.standard_normal((2, 4, 3, 5)).astype(np.float32)

    @flow.global_function(type="train")
    def norms(x3: tp.Numpy.Placeholder((2, 3, 7)), x4: tp.Numpy.Placeholder((2, 4, 3, 5)),
              x5: tp.Numpy.Placeholder((2, 4, 5, 6, 5))) -> typing.Tuple[(tp.Numpy,) * 5]:
        nn = flow.nn
        outs = (nn.InstanceNorm1d(x3, name="in1"), nn.InstanceNorm2d(x4, eps=1e-3, name="in2"),
                nn.InstanceNorm3d(x5, affine=False), nn.GroupNorm(x4, num_groups=2, name="gn"),
                nn.GroupNorm(x5, num_groups=4, affine=False))
        loss = sum(flow.math.reduce_mean(o * o) for o in outs)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return outs
    in1, in2, in3, gn, gn_plain = norms(x3, x4, X5)
    np.testing.assert_allclose(in1, _instance_norm(x3, 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(in2, _instance_norm(x4.reshape(2, 4, -1), 1e-3).reshape(x4.shape), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(in3, _instance_norm(X5.reshape(2, 4, -1), 1e-5).reshape(X5.shape), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(gn, _instance_norm(x4.reshape(2, 2, -1), 1e-5).reshape(x4.shape), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gn_plain, _instance_norm(X5.reshape(2, 4, -1), 1e-5).reshape(X5.shape), rtol=1e-4,
                               atol=1e-5)
    shapes = {name: value.numpy().shape for name, value in flow.get_all_variables().items()
              if not name.endswith("-momentum")}
    # OneFlow's variables: <name>_gamma / <name>_beta of shape (1, C, 1); GroupNorm's are per group
    assert shapes == {"in1_gamma": (1, 3, 1), "in1_beta": (1, 3, 1), "in2_gamma": (1, 4, 1), "in2_beta": (1, 4, 1),
                      "gn_gamma": (1, 2, 1), "gn_beta": (1, 2, 1)}


def test_group_norm_gradient_against_finite_differences():
    x = rng.standard_normal((2, 4, 3))
    finite_difference_check(lambda x: flow.nn.GroupNorm(x, num_groups=2, affine=False) * 1.5, [x])


def test_pixel_shuffle_against_numpy():
    x = rng.standard_normal((2, 24, 3, 2)).astype(np.float32)

    @flow.global_function()
    def shuffle(x: tp.Numpy.Placeholder((2, 24, 3, 2))) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return flow.nn.PixelShuffle(x, upscale_factor=2), flow.nn.PixelShufflev2(x, 2, 4)
    square, wide = shuffle(x)
    for out, (rh, rw) in ((square, (2, 2)), (wide, (2, 4))):
        want = np.zeros((2, 24 // (rh * rw), 3 * rh, 2 * rw), np.float32)
        for c, i, j in itertools.product(range(want.shape[1]), range(rh), range(rw)):
            want[:, c, i::rh, j::rw] = x[:, c * rh * rw + i * rw + j]
        np.testing.assert_array_equal(out, want)


def test_norm_and_shuffle_arguments_are_checked():
    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((2, 6, 3, 2))) -> tp.Numpy:
        return flow.nn.GroupNorm(x, num_groups=4)
    with pytest.raises(TraceError, match="the 6 channels must divide into num_groups=4"):
        bad(np.zeros((2, 6, 3, 2), np.float32))
    flow.clear_default_session()

    @flow.global_function()
    def bad_shuffle(x: tp.Numpy.Placeholder((2, 6, 3, 2))) -> tp.Numpy:
        return flow.nn.PixelShuffle(x, upscale_factor=2)
    with pytest.raises(TraceError, match="C divisible by 2 \\* 2"):
        bad_shuffle(np.zeros((2, 6, 3, 2), np.float32))


def test_pad2d_against_numpy():
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)

    @flow.global_function()
    def padded(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> typing.Tuple[(tp.Numpy,) * 4]:
        return (flow.reflection_pad2d(x, padding=[2, 4, 3, 1]), flow.replication_pad2d(x, padding=[4, 0, 1, 3]),
                flow.constant_pad2d(x, padding=2, constant_value=1.5), flow.reflection_pad2d(x, padding=1))
    reflected, replicated, constant, one = padded(x)
    np.testing.assert_array_equal(reflected, np.pad(x, ((0, 0), (0, 0), (3, 1), (2, 4)), mode="reflect"))
    np.testing.assert_array_equal(replicated, np.pad(x, ((0, 0), (0, 0), (1, 3), (4, 0)), mode="edge"))
    np.testing.assert_array_equal(constant, np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=1.5))
    np.testing.assert_array_equal(one, np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect"))


@pytest.mark.parametrize("pad", ["reflection", "replication"])
def test_pad2d_gradients_against_finite_differences(pad):
    x = rng.standard_normal((1, 2, 3, 4))
    function = getattr(flow, f"{pad}_pad2d")
    finite_difference_check(lambda x: function(x, padding=[3, 2, 2, 1]), [x])


def test_pad2d_padding_must_be_smaller_than_the_axis():
    @flow.global_function()
    def too_wide(x: tp.Numpy.Placeholder((1, 1, 3, 3))) -> tp.Numpy:
        return flow.reflection_pad2d(x, padding=[3, 0, 0, 0])
    with pytest.raises(TraceError, match=r"padding \[3, 0, 0, 0\] must be >= 0 and smaller than the width 3"):
        too_wide(np.zeros((1, 1, 3, 3), np.float32))
