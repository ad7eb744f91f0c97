"""The kernels made faster for the BERT benchmark (issue 15), against the NumPy reference executor
and finite differences.

* sparse softmax cross-entropy (codegen_templates/cpu/sparse_xent.cpp.j2): the row maximum and the
  exponentials in vector lanes, each e^(x - max) computed once and scaled in dx.  Loss alone, loss
  and gradient fused, rows wider than a vector, a case big enough for the OpenMP loop (BERT's masked-LM
  head is 160 rows of 30522), float64, NaN and infinities, labels at the first and last column.
* gelu and its gradient (flowc::gelu / gelu_grad in codegen_templates/cpu/flowc_runtime.h): a
  vectorised erf (within 4.5e-7 of erf), in pointwise loops and in GEMM epilogues, over the whole
  float range, NaN and infinities.
* flowc::exp_nonpositive (softmax, the loss above, gelu's gradient), now vectorised: softmax rows
  spread over the whole range of e^x down to its underflow cut-off.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
from tests.oracle import compile_case, finite_difference_check

rng = np.random.default_rng(151)


def _xent(logits: np.ndarray, labels: np.ndarray):
    def fn(x, y):
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x)
    return fn, [logits, labels]


def _logits(rows: int, cols: int, scale: float = 3.0, dtype=np.float32) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * scale).astype(dtype)


def _labels(rows: int, cols: int) -> np.ndarray:
    labels = rng.integers(0, cols, rows).astype(np.int32)
    labels[0], labels[-1] = 0, cols - 1              # the first and the last column
    return labels


XENT_CASES = {
    "narrow": _xent(_logits(5, 3), _labels(5, 3)),
    "one_column": _xent(_logits(3, 1), np.zeros(3, np.int32)),
    "odd_width": _xent(_logits(7, 37), _labels(7, 37)),
    "wide_spread": _xent(_logits(4, 301, scale=40.0), _labels(4, 301)),       # exp meets its underflow cut-off
    "parallel": _xent(_logits(9, 30_011), _labels(9, 30_011)),               # >= 2^18 logits: OpenMP rows
    "float64": _xent(_logits(6, 29, dtype=np.float64), _labels(6, 29)),
    "int64_labels": _xent(_logits(4, 19), _labels(4, 19).astype(np.int64)),
}


def _assert_close(got, want, rtol=2e-5, atol=2e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", list(XENT_CASES))
def test_xent_loss_and_gradient_match_the_reference(case):
    fn, inputs = XENT_CASES[case]
    both = compile_case(fn, inputs)                      # the loss and its gradient: the fused kernel
    assert both.grad_inputs == [0]
    _assert_close(both.compiled, both.reference)
    alone = compile_case(fn, inputs, grads=False)        # the loss alone
    _assert_close(alone.compiled, alone.reference)


@pytest.mark.parametrize("case", ["narrow", "odd_width", "float64"])
def test_xent_gradient_matches_finite_differences(case):
    fn, inputs = XENT_CASES[case]
    finite_difference_check(fn, inputs, rtol=1e-5, atol=1e-7)


def test_xent_nan_and_infinities_are_the_references():
    cols = 33
    x = _logits(7, cols)
    x[0, 5] = np.nan                 # NaN: that row's loss and gradient NaN
    x[1, 7] = np.inf                 # +inf: inf - inf inside log-sum-exp gives NaN, as NumPy
    x[2, :] = -np.inf                # every logit -inf: NaN
    x[3, 4] = -np.inf                # one -inf logit, not the label's: its probability 0, the row finite
    x[4, 2] = 1e30                   # a huge finite logit, the label's: loss 0, no overflow
    x[6, 8] = -np.inf                # the label's logit -inf: an infinite loss
    labels = np.array([5, 0, 1, 9, 2, 9, 8], np.int32)
    fn, inputs = _xent(x, labels)
    with np.errstate(all="ignore"):
        case = compile_case(fn, inputs)
    for got, want in zip(case.compiled, case.reference):
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-6)
    loss = case.compiled[0]
    assert np.isnan(loss[:3]).all() and np.isfinite(loss[3:6]).all() and loss[4] == 0.0 and loss[6] == np.inf


def test_xent_label_out_of_range_is_an_error_naming_the_op():
    fn, inputs = _xent(_logits(4, 10), np.array([0, 3, 10, 1], np.int32))
    with pytest.raises(Exception, match="(?i)label|range|sparse_softmax_cross_entropy"):
        compile_case(fn, inputs)


# --- gelu ------------------------------------------------------------------------------------------------

def _gelu_inputs(dtype=np.float32) -> np.ndarray:
    x = np.concatenate([np.linspace(-9, 9, 361), [0.0, -0.0, 1e-30, -1e-30, 3.9999, 4.0, 4.0001, -4.0, 40.0, -40.0,
                                                  3e38, -3e38]])
    return x.reshape(1, -1).repeat(3, 0).astype(dtype) * np.array([[1.0], [0.5], [-0.25]], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_and_its_gradient_match_the_reference_over_the_range(dtype):
    case = compile_case(lambda a: flow.math.gelu(a), [_gelu_inputs(dtype)])
    _assert_close(case.compiled, case.reference, rtol=1e-5, atol=1.5e-6)


def test_gelu_gradient_matches_finite_differences():
    x = np.linspace(-5, 5, 23).reshape(1, -1)
    finite_difference_check(lambda a: flow.math.gelu(a), [x], rtol=1e-5, atol=1e-7)


def test_gelu_nan_and_infinities_are_the_references():
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -2.0]], np.float32)
    with np.errstate(all="ignore"):
        case = compile_case(lambda a: flow.math.gelu(a), [x])
    for got, want in zip(case.compiled, case.reference):
        assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
        finite = np.isfinite(want)
        assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1.5e-6)
    assert np.isnan(case.compiled[0][0, 0]) and case.compiled[0][0, 1] == np.inf


def test_bias_and_gelu_in_the_gemm_epilogue_match_the_reference():
    """BERT's intermediate layer: gelu(x W + b) forward and backward, where the GEMM writes gelu
    (and, for the gradient, gelu_grad) in its epilogue."""
    x = (rng.standard_normal((37, 48)) * 1.5).astype(np.float32)
    w = (rng.standard_normal((48, 70)) * 0.4).astype(np.float32)
    b = rng.standard_normal(70).astype(np.float32)
    case = compile_case(lambda a, m, c: flow.math.gelu(flow.nn.bias_add(flow.matmul(a, m), c)), [x, w, b])
    assert case.grad_inputs == [0, 1, 2]
    _assert_close(case.compiled, case.reference, rtol=1e-4, atol=2e-5)


# --- exp_nonpositive through softmax ----------------------------------------------------------------------

def test_softmax_rows_spread_down_to_exps_underflow_match_the_reference():
    cols = 203
    x = np.stack([np.linspace(-88.0, 0.0, cols), np.linspace(-200.0, 1.0, cols), np.linspace(-1.0, 1.0, cols),
                  np.full(cols, -3.0), rng.standard_normal(cols) * 20.0]).astype(np.float32)
    case = compile_case(lambda a: flow.nn.softmax(a), [x])
    _assert_close(case.compiled, case.reference, rtol=2e-5, atol=1e-7)
