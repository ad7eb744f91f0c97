"""flow/nd_indexing.py: gather_nd, scatter_nd, tensor_scatter_nd_update, tensor_scatter_nd_add and
dim_gather, composed from flowc's ops.

Values against NumPy on the reference executor (many shapes, cheap), gradients against finite
differences, then whole compiled jobs: one predict job for the values, one train job for the gradients
as SGD applies them, one for out-of-range indices, and the trace-time argument errors.
"""
from __future__ import annotations

import sys
import typing

import numpy as np
import pytest

import flow
import flow.typing as tp
from flow.nd_indexing import dim_gather, gather_nd, scatter_nd, tensor_scatter_nd_add, tensor_scatter_nd_update
from flowc.compiler.reference import run_reference
from tests.oracle import finite_difference_check, trace_case

rng = np.random.default_rng(23)


def coords(batch: tuple, lead: tuple, dtype, repeat: bool = True) -> np.ndarray:
    """Random coordinates into `lead`, shape batch + (K,); with `repeat`, the last one repeats the first."""
    ix = np.stack([rng.integers(0, n, batch) for n in lead], axis=-1).astype(dtype)
    flat = ix.reshape(-1, len(lead))
    if repeat and len(flat) > 1:
        flat[-1] = flat[0]
    return ix


def at(ix: np.ndarray) -> tuple:
    return tuple(np.moveaxis(ix, -1, 0))


def np_gather_nd(p, ix):
    return p[at(ix)]


def np_scatter_add(base, ix, u):
    out = base.copy()
    np.add.at(out, at(ix), u)
    return out


def np_update(p, ix, u):
    out = p.copy()
    out[at(ix)] = 0            # OneFlow 0.3's kernel: zero the indexed slices, then scatter-add
    np.add.at(out, at(ix), u)
    return out


def reference(fn, inputs):
    graph, _, _ = trace_case(fn, inputs, grads=False)
    values, _ = run_reference(graph, list(inputs), {})
    return values


# (params shape, batch shape of the coordinates, K, index dtype): K = 1 and K = rank, both index dtypes
ND_CASES = [((5,), (3,), 1, np.int32), ((4, 3), (6,), 1, np.int64), ((4, 3), (2, 3), 2, np.int32),
            ((3, 4, 2), (5,), 2, np.int64), ((2, 3, 4), (2, 2), 3, np.int64), ((3, 4, 2), (), 3, np.int32)]


def nd_inputs(shape, batch, k, dtype):
    p = rng.standard_normal(shape).astype(np.float32)
    ix = coords(batch, shape[:k], dtype)
    u = rng.standard_normal(batch + shape[k:]).astype(np.float32)
    return p, ix, u


@pytest.mark.parametrize("shape,batch,k,dtype", ND_CASES)
def test_nd_values_against_numpy(shape, batch, k, dtype):
    p, ix, u = nd_inputs(shape, batch, k, dtype)
    got = reference(lambda p, ix, u: (gather_nd(p, ix), scatter_nd(ix, u, shape), tensor_scatter_nd_update(p, ix, u),
                                      tensor_scatter_nd_add(p, ix, u)), [p, ix, u])
    want = [np_gather_nd(p, ix), np_scatter_add(np.zeros_like(p), ix, u), np_update(p, ix, u),
            np_scatter_add(p, ix, u)]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_repeated_coordinates_add_up_in_every_scatter():
    p = np.arange(6, dtype=np.float32).reshape(3, 2)
    ix = np.array([[1], [1], [2]], np.int32)
    u = np.array([[1, 2], [10, 20], [100, 200]], np.float32)
    spread, replaced, added = reference(lambda p, ix, u: (scatter_nd(ix, u, (3, 2)), tensor_scatter_nd_update(p, ix, u),
                                                          tensor_scatter_nd_add(p, ix, u)), [p, ix, u])
    np.testing.assert_array_equal(spread, [[0, 0], [11, 22], [100, 200]])
    np.testing.assert_array_equal(replaced, [[0, 1], [11, 22], [100, 200]])      # row 0 kept, row 1 the sum
    np.testing.assert_array_equal(added, [[0, 1], [13, 25], [104, 205]])


def test_a_replaced_slice_does_not_leak_nan():
    p = np.array([[np.nan, np.inf], [1, 2]], np.float32)
    (out,) = reference(lambda p, ix, u: tensor_scatter_nd_update(p, ix, u),
                       [p, np.array([[0]], np.int64), np.array([[5, 6]], np.float32)])
    np.testing.assert_array_equal(out, [[5, 6], [1, 2]])


# (input shape, dim, size of index along dim, index dtype)
DIM_CASES = [((5,), 0, 3, np.int32), ((3, 4), 1, 6, np.int64), ((3, 4), 0, 2, np.int32),
             ((2, 3, 4), -2, 5, np.int64), ((2, 3, 4), 2, 1, np.int32), ((2, 3, 4), 0, 3, np.int64)]


def dim_inputs(shape, dim, k, dtype):
    x = rng.standard_normal(shape).astype(np.float32)
    ishape = list(shape)
    ishape[dim] = k
    return x, rng.integers(0, shape[dim], ishape).astype(dtype)


@pytest.mark.parametrize("shape,dim,k,dtype", DIM_CASES)
def test_dim_gather_values_against_numpy(shape, dim, k, dtype):
    x, ix = dim_inputs(shape, dim, k, dtype)
    (got,) = reference(lambda x, ix: dim_gather(x, dim, ix), [x, ix])
    np.testing.assert_array_equal(got, np.take_along_axis(x, ix, axis=dim))


@pytest.mark.parametrize("case", [ND_CASES[1], ND_CASES[4]])
def test_nd_gradients_against_finite_differences(case):
    shape, batch, k, dtype = case
    p, ix, u = nd_inputs(shape, batch, k, dtype)
    finite_difference_check(lambda p, ix, u: (gather_nd(p, ix), scatter_nd(ix, u, shape),
                                              tensor_scatter_nd_update(p, ix, u), tensor_scatter_nd_add(p, ix, u)),
                            [p, ix, u], samples=24)


def test_dim_gather_gradient_against_finite_differences():
    x, ix = dim_inputs((2, 3, 4), 1, 5, np.int64)
    last = rng.integers(0, 4, (2, 3, 6)).astype(np.int32)      # repeats: their cotangents add up
    finite_difference_check(lambda x, ix, last: (dim_gather(x, 1, ix), dim_gather(x, -1, last)), [x, ix, last])


# --- whole jobs ------------------------------------------------------------------------------------

P = rng.standard_normal((4, 3)).astype(np.float32)
IX1 = np.array([[3], [0], [3]], np.int64)                      # K = 1, a repeat
IX2 = np.array([[[0, 2], [3, 1]], [[0, 2], [1, 1]]], np.int32)  # K = 2, (2, 2, 2), a repeat
U1 = rng.standard_normal((3, 3)).astype(np.float32)
U2 = rng.standard_normal((2, 2)).astype(np.float32)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
DI = np.array([[[2, 0, 1, 2]], [[1, 1, 0, 2]]], np.int32)      # along dim 1 of X: (2, 1, 4)


def test_a_predict_job_computes_each_function():
    @flow.global_function(type="predict")
    def nd(p: tp.Numpy.Placeholder((4, 3)), ix1: tp.Numpy.Placeholder((3, 1), dtype=flow.int64),
           ix2: tp.Numpy.Placeholder((2, 2, 2), dtype=flow.int32), u1: tp.Numpy.Placeholder((3, 3)),
           u2: tp.Numpy.Placeholder((2, 2)), x: tp.Numpy.Placeholder((2, 3, 4)),
           di: tp.Numpy.Placeholder((2, 1, 4), dtype=flow.int32)) -> typing.Tuple[(tp.Numpy,) * 10]:
        return (gather_nd(p, ix1), gather_nd(p, ix2), scatter_nd(ix1, u1, [4, 3]), scatter_nd(ix2, u2, (4, 3)),
                tensor_scatter_nd_update(p, ix1, u1), tensor_scatter_nd_add(p, ix2, u2), dim_gather(x, 1, di),
                scatter_nd(ix2, ix2, (4, 3, 2)),                         # integer updates, added exactly
                tensor_scatter_nd_add(scatter_nd(ix2, ix2, (4, 3, 2)), ix1, flow.constant(7, flow.int32, (3, 3, 2))),
                scatter_nd(ix1, flow.cast(u1, flow.float16), (4, 3)))     # float16: summed in float32
    got = nd(P, IX1, IX2, U1, U2, X, DI)
    zeros = np.zeros_like(P)
    want = [np_gather_nd(P, IX1), np_gather_nd(P, IX2), np_scatter_add(zeros, IX1, U1),
            np_scatter_add(zeros, IX2, U2), np_update(P, IX1, U1), np_scatter_add(P, IX2, U2),
            np.take_along_axis(X, DI, axis=1), np_scatter_add(np.zeros((4, 3, 2), np.int32), IX2, IX2),
            np_scatter_add(np_scatter_add(np.zeros((4, 3, 2), np.int32), IX2, IX2), IX1,
                           np.full((3, 3, 2), 7, np.int32)),
            np_scatter_add(zeros, IX1, U1.astype(np.float16).astype(np.float32)).astype(np.float16)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, g.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"result {i}")


W_SHAPES = [(2, 2), (4, 3), (4, 3), (4, 3), (2, 1, 4)]     # the cotangents of the train job's results


def test_a_train_job_applies_each_functions_gradient():
    # loss = sum(out_k * w_k): after one SGD step at rate 1 from zeros, each variable is minus its gradient
    w = [rng.standard_normal(s).astype(np.float32) for s in W_SHAPES]

    @flow.global_function(type="train")
    def train(ix1: tp.Numpy.Placeholder((3, 1), dtype=flow.int64),
              ix2: tp.Numpy.Placeholder((2, 2, 2), dtype=flow.int32),
              di: tp.Numpy.Placeholder((2, 1, 4), dtype=flow.int32),
              w0: tp.Numpy.Placeholder(W_SHAPES[0]), w1: tp.Numpy.Placeholder(W_SHAPES[1]),
              w2: tp.Numpy.Placeholder(W_SHAPES[2]), w3: tp.Numpy.Placeholder(W_SHAPES[3]),
              w4: tp.Numpy.Placeholder(W_SHAPES[4])) -> tp.Numpy:
        p = flow.get_variable("nd_p", shape=(4, 3), initializer=flow.zeros_initializer())
        u = flow.get_variable("nd_u", shape=(3, 3), initializer=flow.zeros_initializer())
        x = flow.get_variable("nd_x", shape=(2, 3, 4), initializer=flow.zeros_initializer())
        outs = [gather_nd(p, ix2), scatter_nd(ix1, u, (4, 3)), tensor_scatter_nd_update(p, ix1, u),
                tensor_scatter_nd_add(p, ix1, u), dim_gather(x, 1, di)]
        loss = flow.math.add_n([flow.math.reduce_sum(o * wk) for o, wk in zip(outs, [w0, w1, w2, w3, w4])])
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0])).minimize(loss)
        return loss

    train(IX1, IX2, DI, *w)
    replaced = w[2].copy()
    replaced[at(IX1)] = 0
    want_p = np_scatter_add(np.zeros((4, 3), np.float32), IX2, w[0]) + replaced + w[3]
    want_u = w[1][at(IX1)] + w[2][at(IX1)] + w[3][at(IX1)]
    want_x = np.zeros((2, 3, 4), np.float32)
    for b in range(2):
        for c in range(4):
            want_x[b, DI[b, 0, c], c] += w[4][b, 0, c]
    got = flow.get_all_variables()
    for var, want in [("nd_p", want_p), ("nd_u", want_u), ("nd_x", want_x)]:
        np.testing.assert_allclose(got[var].numpy(), -want, rtol=1e-5, atol=1e-6, err_msg=var)


def test_an_out_of_range_coordinate_fails_the_step_naming_the_users_line():
    line = {}

    @flow.global_function(type="predict")
    def pick(p: tp.Numpy.Placeholder((3, 3)), g: tp.Numpy.Placeholder((2, 2), dtype=flow.int32),
             s: tp.Numpy.Placeholder((2, 2), dtype=flow.int64), t: tp.Numpy.Placeholder((2, 1), dtype=flow.int32),
             d: tp.Numpy.Placeholder((3, 3), dtype=flow.int64)) -> typing.Tuple[(tp.Numpy,) * 4]:
        line["g"] = sys._getframe().f_lineno + 1
        picked = gather_nd(p, g)
        line["s"] = sys._getframe().f_lineno + 1
        spread = scatter_nd(s, flow.constant(1.0, shape=(2,)), (3, 3))
        line["t"] = sys._getframe().f_lineno + 1
        replaced = tensor_scatter_nd_update(p, t, flow.constant(1.0, shape=(2, 3)))
        line["d"] = sys._getframe().f_lineno + 1
        return picked, spread, replaced, dim_gather(p, 1, d)
    p = np.arange(9, dtype=np.float32).reshape(3, 3)
    good = dict(g=np.array([[0, 2], [2, 1]], np.int32), s=np.array([[1, 1], [1, 1]], np.int64),
                t=np.array([[2], [0]], np.int32), d=np.array([[2, 0, 1]] * 3, np.int64))
    out = pick(p, **good)
    np.testing.assert_array_equal(out[0], [2, 7])
    np.testing.assert_array_equal(out[1], [[0, 0, 0], [0, 2, 0], [0, 0, 0]])
    # [0, 5] flattens to position 5 of the 9, a valid [1, 2]: each coordinate is checked on its own;
    # the check is a gather's, so the message names flow.gather, at the user's line of the call
    for arg, bad in [("g", np.array([[0, 5], [2, 1]], np.int32)), ("g", np.array([[3, 0], [2, 1]], np.int32)),
                     ("s", np.array([[1, 1], [-1, 0]], np.int64)), ("t", np.array([[3], [0]], np.int32)),
                     ("d", np.array([[2, 0, 3]] * 3, np.int64))]:
        with pytest.raises(flow.StepError, match=rf"^test_nd_indexing.py:{line[arg]}: flow.gather: an index is out "
                                                 r"of range \[0, 3\)"):
            pick(p, **{**good, arg: bad})


def test_argument_errors_name_the_argument_and_the_line():
    @flow.global_function(type="predict")
    def bad_calls(p: tp.Numpy.Placeholder((4, 3)), ix: tp.Numpy.Placeholder((2, 2), dtype=flow.int32),
                  u: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        three = flow.constant(0, flow.int32, (2, 3))
        for bad, message in [(lambda: gather_nd(p, p), "gather_nd: indices must be int32 or int64, got float32"),
                             (lambda: gather_nd(p, three), r"last axis of indices \[2, 3\] has size 3, but must be "
                                                           r"in \[1, 2\], the rank of params \[4, 3\]"),
                             (lambda: gather_nd(2.0, ix), "argument 'params' must be a Blob"),
                             (lambda: scatter_nd(ix, u, [4]), r"the rank of shape \[4\]"),
                             (lambda: scatter_nd(ix, p, [4, 3]), r"updates must have shape \[2\] .* got \[4, 3\]"),
                             (lambda: scatter_nd(ix, u, [4, 0]), "positive dimensions"),
                             (lambda: scatter_nd(ix, u, "big"), "shape must be a sequence of ints"),
                             (lambda: tensor_scatter_nd_update(p, ix, three), r"updates must have shape \[2\]"),
                             (lambda: tensor_scatter_nd_add(p, ix, flow.constant(1, flow.int32, (2,))),
                              r"updates \(int32\) must have the dtype of params \(float32\)"),
                             (lambda: dim_gather(p, 2, three), r"dim 2 is out of range \[-2, 2\)"),
                             (lambda: dim_gather(p, 1, ix), r"index \[2, 2\] must have the shape of input "
                                                            r"\[4, 3\] except along dim 1"),
                             (lambda: dim_gather(p, 0, flow.constant(0, flow.int32, (4,))),
                              "must have the rank of input"),
                             (lambda: dim_gather(p, 0, p), "index must be int32 or int64")]:
            with pytest.raises(flow.TraceError, match=message) as info:
                bad()
            assert "test_nd_indexing.py:" in str(info.value), str(info.value)
        return p
    bad_calls(P, np.zeros((2, 2), np.int32), np.zeros(2, np.float32))
