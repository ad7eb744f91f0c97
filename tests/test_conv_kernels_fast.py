"""The CPU convolution kernels (conv_tiles in im2col.h) against the NumPy reference on random inputs.

Forward, input gradient and filter gradient of every kernel variant the templates choose between:
stride 1 (the input gradient as a flipped convolution of dy) and strides 2 and 3 (one convolution
per phase of the input pixels, phases without taps included), 1x1 with and
without padding (a padding larger than the flipped kernel's reach crops dy), dilation, groups,
depthwise, NHWC, filter and channel counts that are not multiples of the 16-wide panels, pixel
counts that are not multiples of the 6-row tiles, contractions longer than one panel of B, a fused
bias + ReLU epilogue, one image (no parallel loop), and float64 (the portable loops).  Several
convolutions share one graph, so each group below is one compilation.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from tests.oracle import compile_case
from tests.test_ops import assert_outputs_match

rng = np.random.default_rng(19)


def rand(*shape, dtype=np.float32):
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def pads(top, bottom, left, right):
    return [[0, 0], [0, 0], [top, bottom], [left, right]]


# name -> (function of (x, w), x, w): each a convolution whose value and both gradients are checked.
VARIANTS = {
    "lenet_conv2_like": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), rand(3, 32, 14, 14), rand(64, 32, 5, 5)),
    "filters_not_16": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), rand(2, 3, 9, 7), rand(20, 3, 3, 3)),
    "stride2_3x3": (lambda x, w: flow.nn.conv2d(x, w, 2, pads(1, 1, 1, 1)), rand(2, 8, 9, 9), rand(24, 8, 3, 3)),
    "stride2_1x1": (lambda x, w: flow.nn.conv2d(x, w, 2, "VALID"), rand(2, 8, 8, 8), rand(16, 8, 1, 1)),
    "strides_1_2": (lambda x, w: flow.nn.conv2d(x, w, [1, 2], "SAME"), rand(2, 5, 7, 8), rand(7, 5, 3, 3)),
    "1x1_stride1": (lambda x, w: flow.nn.conv2d(x, w, 1, "VALID"), rand(2, 19, 5, 3), rand(33, 19, 1, 1)),
    "1x1_padded": (lambda x, w: flow.nn.conv2d(x, w, 1, pads(1, 2, 2, 0)), rand(2, 3, 5, 5), rand(5, 3, 1, 1)),
    "dilated_uneven": (lambda x, w: flow.nn.conv2d(x, w, 1, pads(1, 0, 2, 1), dilations=2),
                       rand(2, 4, 8, 7), rand(18, 4, 3, 2)),
    "dilated_stride2": (lambda x, w: flow.nn.conv2d(x, w, 2, pads(2, 2, 2, 2), dilations=2),
                        rand(2, 3, 9, 9), rand(6, 3, 3, 3)),
    "stride3_1x1": (lambda x, w: flow.nn.conv2d(x, w, 3, "VALID"), rand(2, 4, 8, 7), rand(5, 4, 1, 1)),
    "stride3_2x2_padded": (lambda x, w: flow.nn.conv2d(x, w, [3, 2], pads(1, 0, 2, 1)),
                           rand(2, 3, 10, 9), rand(6, 3, 2, 2)),
    "strided_groups": (lambda x, w: flow.nn.conv2d(x, w, 2, pads(1, 1, 1, 1), groups=2),
                       rand(2, 4, 7, 8), rand(34, 2, 3, 3)),
    "groups": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=4), rand(2, 8, 6, 6), rand(36, 2, 3, 3)),
    "depthwise": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=6), rand(2, 6, 5, 5), rand(6, 1, 3, 3)),
    "nhwc": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", data_format="NHWC"), rand(2, 6, 6, 5), rand(17, 3, 3, 5)),
    "one_image": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), rand(1, 4, 6, 6), rand(8, 4, 3, 3)),
    "valid_crop": (lambda x, w: flow.nn.conv2d(x, w, 1, "VALID"), rand(2, 2, 7, 6), rand(3, 2, 4, 2)),
}
GROUPS = {
    "plain": ["lenet_conv2_like", "filters_not_16", "1x1_stride1", "valid_crop", "one_image"],
    "strided": ["stride2_3x3", "stride2_1x1", "strides_1_2", "dilated_stride2", "stride3_1x1",
                "stride3_2x2_padded", "strided_groups"],
    "layouts": ["1x1_padded", "dilated_uneven", "groups", "depthwise", "nhwc"],
}


def combined(names):
    fns = [VARIANTS[n][0] for n in names]

    def fn(*blobs):
        return tuple(f(blobs[2 * i], blobs[2 * i + 1]) for i, f in enumerate(fns))
    inputs = [a for n in names for a in VARIANTS[n][1:]]
    return fn, inputs


def test_groups_cover_every_variant():
    assert sorted(n for names in GROUPS.values() for n in names) == sorted(VARIANTS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_conv_values_and_gradients_match_reference(group):
    fn, inputs = combined(GROUPS[group])
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


def test_fused_bias_relu_epilogue():
    """A bias + ReLU epilogue on 20 filters: two panels, the second partly empty."""
    case = compile_case(lambda x, w, b: flow.nn.relu(flow.nn.bias_add(flow.nn.conv2d(x, w, 1, "SAME"), b)),
                        [rand(3, 5, 7, 7), rand(20, 5, 3, 3), rand(20)])
    assert_outputs_match(case.compiled, case.reference)


def test_float64_runs_the_portable_loops():
    """float64 convolutions (pack_panels / conv_tiles' generic loops), filters and channels not
    multiples of 16, stride 1 and 2."""
    def fn(x, w, y, v):
        return flow.nn.conv2d(x, w, 1, "SAME"), flow.nn.conv2d(y, v, 2, pads(1, 1, 1, 1))
    inputs = [rand(2, 3, 6, 5, dtype=np.float64), rand(18, 3, 3, 3, dtype=np.float64),
              rand(2, 4, 7, 7, dtype=np.float64), rand(5, 4, 3, 3, dtype=np.float64)]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_input_gradient_with_infinite_weight_matches_reference_nan_for_nan():
    """A non-finite weight: the stride-1 input gradient must not multiply it by dy's padding (the
    reference has no such term), so NaN appears exactly where the reference has it."""
    w = rand(4, 3, 3, 3)
    w[1, 2, 0, 2] = np.inf
    w[3, 0, 1, 1] = np.nan
    case = compile_case(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), [rand(2, 3, 5, 6), w])
    got, want = case.compiled[1], case.reference[1]          # d(x)
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_output_gradient_too_large_for_32_bit_offsets_is_refused():
    """Many filters on a small input: the input's padded group fits 32-bit offsets, the output
    gradient's (which the input gradient reads through conv_tiles) does not."""
    @flow.global_function(type="predict")
    def many_filters(x: tp.Numpy.Placeholder((1, 1, 1024, 1024))) -> tp.Numpy:
        w = flow.get_variable("many_filters_w", shape=(4096, 1, 3, 3), initializer=flow.zeros_initializer())
        return flow.nn.conv2d(x, w, strides=1, padding="SAME")

    with pytest.raises(flow.TraceError) as info:
        many_filters.lower()
    assert "output-gradient" in str(info.value) and "2**31" in str(info.value)
