"""Convolutions with few taps per output (Cg*KH*KW <= 32, a stem over 1-3 input channels) whose
output rows are a multiple of 32 pixels run with the filters as GEMM rows
(codegen_templates/cpu/conv2d.cpp.j2, `filters_as_rows`): values and gradients against the
reference, with and without a fused epilogue, grouped, with NaN and infinity in the input; and the
path is the one generated for such shapes (and not for LeNet's 28-pixel rows)."""
# No `from __future__ import annotations`: the placeholder annotation names _source_of's argument.

import numpy as np
import pytest

import flow
import flow.typing as tp
from tests.oracle import compile_case, finite_difference_check
from tests.test_ops import assert_outputs_match, rand


def _special(shape: tuple[int, ...]) -> np.ndarray:
    x = rand(*shape)
    x[0, 0, 3, 5] = np.nan
    x[-1, -1, 2, 31] = np.inf
    return x


def _conv(strides=1, padding="SAME", groups=1):
    return lambda x, w: flow.nn.conv2d(x, w, strides=strides, padding=padding, groups=groups)


def _conv_bias_relu(x, w, b):
    return flow.nn.relu(flow.nn.bias_add(flow.nn.conv2d(x, w, strides=1, padding="SAME"), b))


CASES = {
    "stem_same": (_conv(), [rand(2, 3, 6, 32), rand(8, 3, 3, 3)]),
    "stem_valid_64": (_conv(padding="VALID"), [rand(1, 2, 5, 66), rand(5, 2, 2, 3)]),
    "stem_bias_relu": (_conv_bias_relu, [rand(2, 3, 4, 32), rand(6, 3, 3, 3), rand(6)]),
    "grouped_depthwise": (_conv(groups=3), [rand(2, 3, 4, 32), rand(6, 1, 3, 3)]),
    "row_stride_2": (_conv(strides=[2, 1]), [rand(1, 1, 8, 32), rand(4, 1, 5, 5)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_the_reference(name: str) -> None:
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", ["stem_same", "stem_bias_relu", "grouped_depthwise"])
def test_gradients_match_finite_differences(name: str) -> None:
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs)


def test_nan_and_infinity_reach_the_outputs_they_touch() -> None:
    x, w = _special((1, 2, 6, 32)), rand(4, 2, 3, 3)
    case = compile_case(lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"), [x, w], grads=False)
    got, want = case.compiled[0], case.reference[0]
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


def _source_of(shape: tuple[int, ...], kernel: tuple[int, ...]) -> str:
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def stem(x: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        w = flow.get_variable("few_taps_w", shape=kernel, initializer=flow.ones_initializer())
        return flow.nn.conv2d(x, w, strides=1, padding="SAME")

    try:
        stem(np.zeros(shape, np.float32))
        return stem.compiled.generated.source
    finally:
        flow.clear_default_session()


def test_the_filters_as_rows_path_is_taken_where_it_pays() -> None:
    assert "Few taps per output" in _source_of((1, 3, 8, 32), (4, 3, 3, 3))
    assert "Few taps per output" not in _source_of((1, 1, 28, 28), (4, 1, 5, 5))     # LeNet's rows: tiles
    assert "Few taps per output" not in _source_of((1, 16, 8, 32), (4, 16, 3, 3))    # 144 taps: tiles


# Fewer images than threads: each image's pixel tiles are split between the threads (conv2d.cpp.j2's
# slices), with the epilogue on each slice's part of the rows.
SLICED = {
    "batch1_same_bias_relu": (_conv_bias_relu, [rand(1, 8, 9, 11), rand(6, 8, 3, 3), rand(6)]),
    "batch1_strided_grouped": (_conv(strides=2, groups=2), [rand(1, 8, 13, 10), rand(4, 4, 3, 3)]),
    "batch1_one_pixel_row": (_conv(padding="VALID"), [rand(1, 16, 3, 40), rand(5, 16, 3, 3)]),
}


@pytest.mark.parametrize("name", sorted(SLICED))
def test_single_images_split_between_threads_equal_the_reference(name: str) -> None:
    fn, inputs = SLICED[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


# Filter gradients at small output sizes take several images per sum (conv2d_grad_filter.cpp.j2's
# kChunk): whole chunks, a last partial chunk, padded and unpadded inputs, groups, strides.
SMALL_OUTPUTS = {
    "dw_1x1_pixels_padded": (_conv(), [rand(7, 6, 1, 1), rand(5, 6, 3, 3)]),
    "dw_2x2_strided": (_conv(strides=2), [rand(9, 4, 4, 4), rand(3, 4, 3, 3)]),
    "dw_4x4_grouped_valid": (_conv(padding="VALID", groups=2), [rand(5, 4, 6, 6), rand(6, 2, 3, 3)]),
    "dw_1x1_kernel": (_conv(padding="VALID"), [rand(11, 8, 3, 3), rand(4, 8, 1, 1)]),
}


@pytest.mark.parametrize("name", sorted(SMALL_OUTPUTS))
def test_filter_gradients_of_chunked_images_equal_the_reference(name: str) -> None:
    fn, inputs = SMALL_OUTPUTS[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


def test_filter_gradients_of_chunked_images_match_finite_differences() -> None:
    fn, inputs = SMALL_OUTPUTS["dw_2x2_strided"]
    finite_difference_check(fn, inputs)


# Input gradients of stride-1 convolutions with fewer than 64 pixels per image take every image's
# pixels as the rows of one sum (conv2d_grad_input.cpp.j2): padded and not, groups, dilation.
SMALL_INPUTS = {
    "dx_1x1_pixels": (_conv(), [rand(5, 6, 1, 1), rand(4, 6, 3, 3)]),
    "dx_3x3_grouped": (_conv(groups=2), [rand(7, 4, 3, 3), rand(6, 2, 3, 3)]),
    "dx_5x4_valid": (_conv(padding="VALID"), [rand(3, 3, 5, 4), rand(5, 3, 2, 2)]),
    "dx_dilated": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2),
                   [rand(4, 2, 6, 5), rand(3, 2, 3, 3)]),
}


@pytest.mark.parametrize("name", sorted(SMALL_INPUTS))
def test_input_gradients_over_all_images_equal_the_reference(name: str) -> None:
    fn, inputs = SMALL_INPUTS[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


def test_input_gradients_over_all_images_match_finite_differences() -> None:
    fn, inputs = SMALL_INPUTS["dx_3x3_grouped"]
    finite_difference_check(fn, inputs)


# Forward convolutions with fewer than 64 output pixels per image (several images) take every
# image's pixels as the rows of one sum (conv2d.cpp.j2), epilogue included.
SMALL_FORWARD = {
    "fwd_1x1_pixels_bias_relu": (_conv_bias_relu, [rand(5, 6, 1, 1), rand(4, 6, 3, 3), rand(4)]),
    "fwd_4x4_strided_grouped": (_conv(strides=2, groups=2), [rand(3, 4, 8, 7), rand(6, 2, 3, 3)]),
}


@pytest.mark.parametrize("name", sorted(SMALL_FORWARD))
def test_forward_over_all_images_equals_the_reference(name: str) -> None:
    fn, inputs = SMALL_FORWARD[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)
