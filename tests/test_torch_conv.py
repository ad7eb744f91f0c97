"""`flow.nn.torch_conv2d_transpose` (flow/torch_conv.py): values against a scatter-add NumPy reference
written here, for several strides, paddings, output paddings and dilations, NCHW and NHWC; gradients
against finite differences; a train job that learns its filter; errors that name the argument."""
import typing

import numpy as np
import pytest

import flow
import flow.typing as tp
from flow.torch_conv import torch_conv2d_transpose
from flowc.compiler.errors import TraceError
from tests.oracle import finite_difference_check

rng = np.random.default_rng(31)


def transposed_conv_reference(x, w, stride, padding_needed, output_padding, dilation=(1, 1)):
    """NCHW x (N, C, H, W), w (C, O, kh, kw): every input element scatters w's taps into a full
    output ((n - 1) * s + (k - 1) * d + 1 per axis, extended with zeros past its end); PyTorch's
    output is its window starting at padding_needed / 2, of (n - 1) * s - P + (k - 1) * d + 1 + op rows."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    _, o, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    out = [(size - 1) * s - p + (k - 1) * d + 1 + op for size, s, p, k, d, op in
           zip((h, wd), stride, padding_needed, (kh, kw), dilation, output_padding)]
    before = [p // 2 for p in padding_needed]
    full = np.zeros((n, o, before[0] + out[0] + (h - 1) * sh + (kh - 1) * dh + 1,
                     before[1] + out[1] + (wd - 1) * sw + (kw - 1) * dw + 1))   # room past the end: zeros
    for i in range(h):
        for j in range(wd):
            for a in range(kh):
                for b in range(kw):
                    full[:, :, i * sh + a * dh, j * sw + b * dw] += x[:, :, i, j] @ w[:, :, a, b]
    return full[:, :, before[0]:before[0] + out[0], before[1]:before[1] + out[1]]


X = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
W = rng.standard_normal((3, 2, 3, 2)).astype(np.float32)
# (strides, padding_needed, output_padding, dilations): PyTorch's usual upsampling (stride 2, padding
# 1, output_padding 1), no padding, output padding past the crop (zero rows), a crop wider than the
# kernel, uneven strides, and dilation with an output padding not smaller than the stride.
CASES = [
    ((2, 2), (2, 2), (1, 1), None),
    ((1, 1), (0, 0), (0, 0), None),
    ((2, 3), (0, 2), (1, 2), None),
    ((3, 3), (4, 4), (2, 0), None),
    ((2, 1), (2, 0), (0, 0), (2, 3)),
    ((1, 1), (2, 2), (1, 1), (2, 2)),
]


def test_values_against_scatter_add_reference_nchw():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape), w: tp.Numpy.Placeholder(W.shape)
            ) -> typing.Tuple[(tp.Numpy,) * len(CASES)]:
        return tuple(torch_conv2d_transpose(x, w, output_padding=list(op), strides=list(s),
                                            padding_needed=list(p), dilations=d) for s, p, op, d in CASES)

    for (stride, needed, op, dilation), got in zip(CASES, job(X, W)):
        want = transposed_conv_reference(X, W, stride, needed, op, dilation or (1, 1))
        assert got.shape == want.shape, (stride, needed, op, dilation)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str((stride, needed, op, dilation)))


def test_pytorch_upsampling_shape_and_zero_rows():
    # nn.ConvTranspose2d(3, 2, kernel_size=(3, 2), stride=2, padding=1, output_padding=1) doubles H and W
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape), w: tp.Numpy.Placeholder(W.shape)
            ) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (torch_conv2d_transpose(x, w, output_padding=[1, 1], strides=2, padding_needed=[2, 2]),
                torch_conv2d_transpose(x, w, output_padding=[3, 0], strides=1, padding_needed=[0, 0]))

    up, padded = job(X, W)
    assert up.shape == (2, 2, 8, 9)           # (4 - 1) * 2 - 2 + 3 + 1 = 8, (5 - 1) * 2 - 2 + 2 + 1 = 9
    assert padded.shape == (2, 2, 4 + 2 + 3, 5 + 1)
    assert not padded[:, :, -3:].any()        # past the full output: OneFlow's and PyTorch's zeros


def test_nhwc_matches_nchw():
    x_nhwc, w_nhwc = X.transpose(0, 2, 3, 1), W.transpose(0, 2, 3, 1)    # filter (in, kh, kw, out)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(x_nhwc.shape), w: tp.Numpy.Placeholder(w_nhwc.shape)
            ) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (torch_conv2d_transpose(input=x, filters=w, output_padding=(1, 0), strides=(2, 3),
                                       padding_needed=(2, 0), data_format="NHWC"),
                torch_conv2d_transpose(x, w, (0, 2), 2, (0, 0), "nhwc", name="deconv_nhwc"))

    first, second = job(x_nhwc, w_nhwc)
    np.testing.assert_allclose(first, transposed_conv_reference(X, W, (2, 3), (2, 0), (1, 0)).transpose(0, 2, 3, 1),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second, transposed_conv_reference(X, W, (2, 2), (0, 0), (0, 2)).transpose(0, 2, 3, 1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, needed, op, dilation", [
    ((2, 2), (2, 2), (1, 1), None),
    ((2, 1), (0, 2), (2, 0), (1, 2)),
])
def test_gradients_against_finite_differences(stride, needed, op, dilation):
    x = rng.standard_normal((1, 2, 3, 3))
    w = rng.standard_normal((2, 2, 2, 3))
    finite_difference_check(lambda x, w: torch_conv2d_transpose(x, w, list(op), list(stride), list(needed),
                                                                dilations=dilation), [x, w])


def test_nhwc_gradients_against_finite_differences():
    x = rng.standard_normal((1, 3, 2, 2))
    w = rng.standard_normal((2, 2, 3, 3))
    finite_difference_check(lambda x, w: torch_conv2d_transpose(x, w, [1, 1], 2, [2, 2], "NHWC"), [x, w])


def test_train_job_learns_the_filter():
    target_w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32) * 0.5
    target = transposed_conv_reference(X, target_w, (2, 2), (2, 2), (1, 1)).astype(np.float32)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder(X.shape), y: tp.Numpy.Placeholder(target.shape)) -> tp.Numpy:
        w = flow.get_variable("deconv-weight", shape=(3, 2, 3, 3), initializer=flow.zeros_initializer())
        diff = torch_conv2d_transpose(x, w, output_padding=[1, 1], strides=2, padding_needed=[2, 2]) - y
        loss = flow.math.reduce_mean(diff * diff)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.2]), momentum=0.9).minimize(loss)
        return loss

    losses = [train(X, target).item() for _ in range(60)]
    assert losses[-1] < 0.02 * losses[0]


def _trace(fn, x_shape=(1, 3, 4, 4), w_shape=(3, 2, 3, 3)) -> None:
    """Trace `fn(x, w)` in a predict job (the errors are raised while tracing, at the user's line)."""
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(x_shape), w: tp.Numpy.Placeholder(w_shape)) -> tp.Numpy:
        return fn(x, w)

    job(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32))


@pytest.mark.parametrize("call, message", [
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], None, [0, 0]), "strides must be an int"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], [1, 1, 1], [0, 0]), "strides must be an int"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 0, [0, 0]), "strides must be positive"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [1, 2]), "padding_needed must be even"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, 2), "padding_needed must be a list of 2 ints"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, None), "padding_needed must be a list of 2 ints"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [-2, 0]), "padding_needed must be non-negative"),
    (lambda x, w: torch_conv2d_transpose(x, w, None, 1, [0, 0]), "output_padding must be a list of 2 ints"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, -1], 1, [0, 0]), "output_padding must be non-negative"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [0, 0], dilations="2"), "dilations must be an int"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [0, 0], data_format="NCWH"), "data_format must be"),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [0, 0], "NHWC", dilations=2),
     "dilations must be 1 with data_format \"NHWC\""),
    (lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [14, 14]), "crops all 6 rows of axis 0"),
    (lambda x, w: torch_conv2d_transpose(x, filter=w, filters=w, output_padding=[0, 0], strides=1,
                                         padding_needed=[0, 0]), "exactly one of filter and filters"),
    (lambda x, w: torch_conv2d_transpose(input=x, output_padding=[0, 0], strides=1, padding_needed=[0, 0]),
     "exactly one of filter and filters"),
    (lambda x, w: torch_conv2d_transpose(x, np.zeros((3, 2, 3, 3)), [0, 0], 1, [0, 0]), "'filter' must be a Blob"),
    (lambda x, w: torch_conv2d_transpose(flow.reshape(x, [3, 16]), w, [0, 0], 1, [0, 0]), "value must be 4-D"),
])
def test_errors_name_the_argument(call, message):
    with pytest.raises(TraceError, match="flow.nn.torch_conv2d_transpose") as info:
        _trace(call)
    assert message in str(info.value)
    assert "test_torch_conv.py" in str(info.value)         # at the user's line


def test_filter_channels_must_match_value():
    with pytest.raises(TraceError, match=r"filter \[2, 3, 3, 3\] \(in_channels, out_channels, kh, kw\) needs "
                                         r"value's 3 channels as its in_channels, not 2"):
        _trace(lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [0, 0]), w_shape=(2, 3, 3, 3))
    flow.clear_default_session()
    with pytest.raises(TraceError, match=r"filter \[3, 3, 3, 2\] \(in_channels, kh, kw, out_channels\) needs "
                                         r"value's 4 channels as its in_channels, not 3"):
        _trace(lambda x, w: torch_conv2d_transpose(x, w, [0, 0], 1, [0, 0], "NHWC"), (1, 5, 5, 4), (3, 3, 3, 2))
