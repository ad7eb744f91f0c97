"""Convolutions that are plain GEMMs (compiler/codegen/conv_gemm.py, codegen_templates/cpu/conv_as_gemm.j2):
one output pixel per image (a 3x3 pad-1 convolution over a 1x1 input: only the centre tap is live;
a strided one over 2x2 where four taps of nine are live) and 1x1 kernels, stride 1 and 2.  Values,
input and filter gradients against the reference executor on random inputs, gradients against
finite differences, NaN and infinity where the reference's padding zeros meet them, and the path is
the one generated for these shapes (and not for others)."""
# No `from __future__ import annotations`: the placeholder annotation names _source_of's argument.

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.codegen.conv_gemm import conv_gemm_plan
from tests.oracle import compile_case, finite_difference_check
from tests.test_ops import assert_outputs_match, rand


def _conv(strides=1, padding="SAME", groups=1):
    return lambda x, w: flow.nn.conv2d(x, w, strides=strides, padding=padding, groups=groups)


def _conv_bias_relu(strides=1, padding="SAME"):
    return lambda x, w, b: flow.nn.relu(flow.nn.bias_add(flow.nn.conv2d(x, w, strides=strides, padding=padding), b))


CASES = {
    # one output pixel per image
    "pixel_3x3_at_1x1": (_conv(), [rand(5, 6, 1, 1), rand(4, 6, 3, 3)]),
    "pixel_3x3_at_1x1_bias_relu": (_conv_bias_relu(), [rand(5, 6, 1, 1), rand(4, 6, 3, 3), rand(4)]),
    "pixel_strided_some_taps_dead": (_conv(strides=2), [rand(3, 4, 2, 2), rand(5, 4, 3, 3)]),
    "pixel_valid_all_taps_live": (_conv(padding="VALID"), [rand(4, 3, 3, 2), rand(6, 3, 3, 2)]),
    "pixel_batch_1": (_conv(), [rand(1, 7, 1, 1), rand(9, 7, 3, 3)]),
    # long tap tables in the source: 49 taps, 48 dead; 64 pixels read
    "pixel_7x7_at_1x1": (_conv(), [rand(2, 3, 1, 1), rand(4, 3, 7, 7)]),
    "pixel_8x8_valid": (_conv(padding="VALID"), [rand(3, 2, 8, 8), rand(4, 2, 8, 8)]),
    "pixel_strided_1x1_reads_one_pixel_of_four": (_conv(strides=2), [rand(4, 6, 2, 2), rand(5, 6, 1, 1)]),
    "pixel_strided_1x1_bias_relu": (_conv_bias_relu(strides=3), [rand(3, 4, 3, 3), rand(6, 4, 1, 1), rand(6)]),
    # 1x1 kernels: at least 64 output pixels per image, or one image
    "pointwise_stride_1": (_conv(padding="VALID"), [rand(2, 8, 8, 9), rand(7, 8, 1, 1)]),
    "pointwise_stride_1_bias_relu": (_conv_bias_relu(padding="VALID"), [rand(2, 8, 8, 8), rand(6, 8, 1, 1), rand(6)]),
    "pointwise_stride_2": (_conv(strides=2), [rand(2, 8, 17, 16), rand(5, 8, 1, 1)]),
    "pointwise_stride_2_bias_relu": (_conv_bias_relu(strides=2), [rand(3, 6, 16, 16), rand(10, 6, 1, 1), rand(10)]),
    "pointwise_batch_1": (_conv(padding="VALID"), [rand(1, 16, 5, 5), rand(8, 16, 1, 1)]),
    "pointwise_batch_1_strided": (_conv(strides=2), [rand(1, 4, 5, 6), rand(3, 4, 1, 1)]),
    # double precision (the GEMM's portable path)
    "pixel_float64": (_conv(strides=2), [rand(3, 4, 2, 2, dtype=np.float64), rand(5, 4, 3, 3, dtype=np.float64)]),
    "pointwise_float64": (_conv(strides=2), [rand(2, 3, 16, 16, dtype=np.float64),
                                             rand(4, 3, 1, 1, dtype=np.float64)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_equal_the_reference(name: str) -> None:
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", ["pixel_3x3_at_1x1", "pixel_strided_some_taps_dead",
                                  "pixel_strided_1x1_reads_one_pixel_of_four", "pointwise_stride_2",
                                  "pointwise_stride_1_bias_relu"])
def test_gradients_match_finite_differences(name: str) -> None:
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs)


def _same_specials(got: np.ndarray, want: np.ndarray) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_an_infinite_weight_at_a_dead_tap_makes_nan_as_in_the_reference() -> None:
    # The reference multiplies the padding's zeros by every tap's weight: 0 * inf is NaN for all the
    # outputs of that filter; the input gradient never sees it (those terms land in the cropped padding).
    x, w = rand(3, 4, 1, 1), rand(5, 4, 3, 3)
    w[1, 2, 0, 0] = np.inf       # dead tap of filter 1
    w[3, 0, 2, 1] = np.nan       # dead tap of filter 3
    w[4, 1, 1, 1] = np.inf       # the live (centre) tap of filter 4
    case = compile_case(_conv(), [x, w])
    assert np.isnan(case.reference[0][:, [1, 3]]).all()        # the reference's semantics, pinned
    assert np.isfinite(case.reference[0][:, [0, 2]]).all()
    for got, want in zip(case.compiled, case.reference):
        _same_specials(got, want)


def test_a_non_finite_dy_makes_the_dead_taps_filter_gradient_nan_as_in_the_reference() -> None:
    # dW at a dead tap is the reference's sum over images of dy * 0: NaN where a dy of that filter is
    # NaN or infinite, 0 otherwise.  dy = cotangent * m, so an infinite m[1, 2] makes dy[1, 2] infinite.
    x, w, m = rand(3, 4, 2, 2), rand(5, 4, 3, 3), rand(3, 5, 1, 1)
    m[1, 2] = np.inf
    case = compile_case(lambda x, w, m: flow.nn.conv2d(x, w, strides=2, padding="SAME") * m, [x, w, m])
    dw = case.reference[case.n_values + case.grad_inputs.index(1)]
    assert np.isnan(dw[2]).any() and np.isfinite(dw[[0, 1, 3, 4]]).all()    # the reference's semantics
    for got, want in zip(case.compiled, case.reference):
        _same_specials(got, want)


def test_nan_and_infinity_in_the_input_of_a_1x1_convolution_reach_the_outputs_they_touch() -> None:
    x, w = rand(2, 5, 16, 16), rand(4, 5, 1, 1)
    x[0, 1, 2, 2] = np.nan
    x[1, 3, 4, 10] = -np.inf
    x[1, 0, 1, 1] = np.inf         # skipped by the stride: the reference never reads it
    case = compile_case(_conv(strides=2), [x, w])
    for got, want in zip(case.compiled, case.reference):
        _same_specials(got, want)


def _plan(**geo):
    base = dict(N=2, C=3, H=1, W=1, F=4, KH=3, KW=3, OH=1, OW=1, P=1, sh=1, sw=1, pt=1, pl=1, dh=1, dw=1,
                groups=1, padded=True)
    return conv_gemm_plan({**base, **geo})


def test_the_plan_finds_the_live_taps() -> None:
    assert _plan() == {"form": "pixel", "pixels": [0], "pixel_taps": [4], "dead_taps": [0, 1, 2, 3, 5, 6, 7, 8],
                       "tap_pixel": [-1, -1, -1, -1, 0, -1, -1, -1, -1], "gathered": False}
    # ResNet-18's strided 3x3 over 2x2, pads (1, 0, 1, 0): taps (1..2, 1..2) read pixels (0..1, 0..1).
    strided = _plan(H=2, W=2, sh=2, sw=2)
    assert strided["pixel_taps"] == [4, 5, 7, 8] and strided["dead_taps"] == [0, 1, 2, 3, 6]
    assert not strided["gathered"]
    assert _plan(groups=2, C=4, F=4) is None                        # grouped: the tiled kernels
    # A strided 1x1 over 2x2 reads one pixel of four: x's read pixels are gathered.
    shortcut = _plan(H=2, W=2, KH=1, KW=1, sh=2, sw=2, pt=0, pl=0, padded=False)
    assert shortcut["pixels"] == [0] and shortcut["dead_taps"] == [] and shortcut["gathered"]
    assert _plan(H=4, W=4, OH=2, OW=2, P=4) is None                 # 3x3 with four output pixels
    assert _plan(N=1, H=8, W=8, KH=1, KW=1, OH=4, OW=4, P=16, sh=2, sw=2, pt=0, pl=0, padded=False) == \
        {"form": "pointwise", "strided": True}
    assert _plan(H=8, W=8, KH=1, KW=1, OH=4, OW=4, P=16, sh=2, sw=2, pt=0, pl=0, padded=False) is None
    assert _plan(H=8, W=8, KH=1, KW=1, OH=8, OW=8, P=64, pt=0, pl=0, padded=False) == \
        {"form": "pointwise", "strided": False}
    assert _plan(H=8, W=8, KH=1, KW=1, OH=10, OW=10, P=100, pt=1, pl=1) is None     # a padded 1x1 kernel
    assert _plan(KH=1, KW=1, sh=2, sw=2) is None        # the only tap in the padding


def _source_of(shape: tuple[int, ...], kernel: tuple[int, ...], strides: int = 1, padding: str = "SAME") -> str:
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def conv(x: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        w = flow.get_variable("as_gemm_w", shape=kernel, initializer=flow.ones_initializer())
        return flow.nn.conv2d(x, w, strides=strides, padding=padding)

    try:
        conv(np.zeros(shape, np.float32))
        return conv.compiled.generated.source
    finally:
        flow.clear_default_session()


def test_the_gemm_paths_are_generated_for_these_shapes_only() -> None:
    assert "One output pixel per image" in _source_of((2, 8, 1, 1), (4, 8, 3, 3))
    assert "1x1 kernel, strided" in _source_of((2, 8, 16, 16), (4, 8, 1, 1), strides=2)
    assert "1x1 kernel:" in _source_of((1, 8, 6, 6), (4, 8, 1, 1), padding="VALID")
    for shape, kernel in [((2, 8, 4, 4), (4, 8, 3, 3)), ((2, 8, 6, 6), (4, 8, 1, 1))]:
        general = _source_of(shape, kernel)
        assert "One output pixel per image" not in general and "1x1 kernel" not in general
