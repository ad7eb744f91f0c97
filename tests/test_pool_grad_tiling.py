"""Pooling gradients of windows that tile the input (stride = window, no padding, LeNet's case):
values against the reference executor, including inputs whose last rows and columns no window
covers, ties (the first maximum gets the gradient) and NaN; gradients against finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import flow
from tests.oracle import compile_case, finite_difference_check
from tests.test_ops import assert_outputs_match, rand


def _tied(shape: tuple[int, ...]) -> np.ndarray:
    """Values from a small set, so that most windows hold ties."""
    return np.random.default_rng(5).integers(0, 3, size=shape).astype(np.float32)


def _with_nan(shape: tuple[int, ...]) -> np.ndarray:
    x = rand(*shape)
    x[0, 0, 1, 2] = np.nan
    x[-1, -1, 0, 0] = np.nan
    return x


CASES = {
    "max_2x2_exact": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), [rand(2, 3, 8, 6)]),
    "max_2x2_leftover": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), [rand(2, 2, 7, 5)]),
    "max_3x2_leftover": (lambda x: flow.nn.max_pool2d(x, ksize=[3, 2], strides=[3, 2], padding="VALID"),
                         [rand(1, 2, 8, 7)]),
    "max_ties": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), [_tied((2, 2, 6, 6))]),
    "max_nan": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"), [_with_nan((2, 2, 6, 6))]),
    "max_nhwc": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID", data_format="NHWC"),
                 [rand(2, 5, 7, 3)]),
    "avg_2x2_leftover": (lambda x: flow.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID"), [rand(2, 2, 7, 5)]),
    "avg_3x3_exact": (lambda x: flow.nn.avg_pool2d(x, ksize=3, strides=3, padding="VALID"), [rand(1, 3, 9, 6)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_the_reference(name: str) -> None:
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    if name == "max_nan":       # NaN where the reference has NaN, the rest within tolerance
        for got, want in zip(case.compiled, case.reference):
            assert np.array_equal(np.isnan(got), np.isnan(want))
        case.compiled = [np.nan_to_num(g, nan=7.0) for g in case.compiled]
        case.reference = [np.nan_to_num(w, nan=7.0) for w in case.reference]
    assert_outputs_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", ["max_2x2_leftover", "max_3x2_leftover", "avg_2x2_leftover", "avg_3x3_exact"])
def test_gradients_match_finite_differences(name: str) -> None:
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs)


PADS_2_1 = [[0, 0], [0, 0], [2, 2], [1, 1]]
PADS_1_1 = [[0, 0], [0, 0], [1, 1], [1, 1]]

# The forward kernels' interior windows run without bounds tests and the edge ones with them
# (pool2d.cpp.j2): shapes whose windows cross every edge, overlap, or lie wholly in the padding.
FORWARD = {
    "max_3x3_s2_same": (lambda x: flow.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME"), [rand(1, 3, 11, 12)]),
    "avg_3x3_s2_same": (lambda x: flow.nn.avg_pool2d(x, ksize=3, strides=2, padding="SAME"), [rand(1, 3, 11, 12)]),
    "max_5x3_s1_pads": (lambda x: flow.nn.max_pool2d(x, ksize=[5, 3], strides=1, padding=PADS_2_1),
                        [rand(2, 2, 6, 4)]),
    "avg_2x2_s3_wide_pads": (lambda x: flow.nn.avg_pool2d(x, ksize=2, strides=3, padding=PADS_1_1),
                             [rand(1, 2, 7, 8)]),
    "max_nan": (lambda x: flow.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME"), [_with_nan((2, 2, 6, 6))]),
}


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_windows_at_the_edges_equal_the_reference(name: str) -> None:
    fn, inputs = FORWARD[name]
    case = compile_case(fn, inputs, grads=(name != "max_nan"))
    got, want = case.compiled, case.reference
    for g, w in zip(got, want):
        assert np.array_equal(np.isnan(g), np.isnan(w))
    assert_outputs_match([np.nan_to_num(g, nan=7.0) for g in got], [np.nan_to_num(w, nan=7.0) for w in want])
