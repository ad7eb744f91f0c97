"""Indexing ops: gather (and its scatter-add gradient), strided slices and slice updates, one-hot,
top-k, and the elementwise `where`.

Each kernel op works on a flattened view of its operands, computed here once for every backend:

* `gather(params, indices)`: params viewed as (B, O, A, I) -- the batch dims, the dims before
  `axis`, the gathered axis, the dims after it -- and indices as (B, K); the output is (B, O, K, I).
  An index outside [0, A) fails the step (a `StepError` naming the op), never reads out of bounds.
* `gather_grad(indices, dy)`: the scatter-add of dy into zeros shaped like params (the embedding
  backward).  Each output element sums its contributions in index order, so the result is
  deterministic on every backend.
* `strided_slice(x)` and `slice_update(x, update)`: a (start, step) per dim, steps may be negative.
* `one_hot(indices)`: an index outside [0, depth) gives a row of `off_value` (OneFlow's behaviour).
* `top_k(x)`: the int32 indices of the k largest along the last axis, largest first; ties keep the
  lower index first, a NaN counts as larger than every number (as np.argmax).
* `where(condition, x, y)`: pointwise, broadcasting like NumPy; nonzero (or NaN) conditions pick x.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType, numpy_dtype
from flowc.compiler.ops import OpRule, ShapeError, register
from flowc.compiler.ops.pointwise import broadcast_shape

INDEX_DTYPES = ("int32", "int64")


def _prod(dims) -> int:
    return int(np.prod(dims, dtype=np.int64)) if len(dims) else 1


# --- gather and its gradient ---------------------------------------------------------------

def gather_dims(params_shape: tuple, indices_shape: tuple, axis: int,
                batch_dims: int) -> tuple[int, int, int, int, int]:
    """(B, O, A, I, K) of a gather: see the module docstring."""
    return (_prod(params_shape[:batch_dims]), _prod(params_shape[batch_dims:axis]), params_shape[axis],
            _prod(params_shape[axis + 1:]), _prod(indices_shape[batch_dims:]))


def _check_gather(op: str, params_shape: tuple, indices: TensorType, axis: int, batch_dims: int) -> tuple:
    if indices.dtype not in INDEX_DTYPES:
        raise ShapeError(f"{op}: indices must be int32 or int64, got {indices.dtype}")
    if not 0 <= batch_dims <= min(len(indices.shape), axis):
        raise ShapeError(f"{op}: batch_dims {batch_dims} must be in [0, min(rank of indices, axis {axis})]")
    if not 0 <= axis < len(params_shape):
        raise ShapeError(f"{op}: axis {axis} is out of range for params of shape {list(params_shape)}")
    if tuple(params_shape[:batch_dims]) != tuple(indices.shape[:batch_dims]):
        raise ShapeError(f"{op}: the first {batch_dims} dims of params {list(params_shape)} and indices "
                         f"{list(indices.shape)} differ")
    return tuple(params_shape[:axis]) + tuple(indices.shape[batch_dims:]) + tuple(params_shape[axis + 1:])


def _infer_gather(inputs: list, attrs: dict) -> TensorType:
    params, indices = inputs
    shape = _check_gather("gather", params.shape, indices, attrs["axis"], attrs["batch_dims"])
    return TensorType(shape, params.dtype)


def _check_range(indices: np.ndarray, size: int) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise IndexError(f"gather: an index is out of range [0, {size})")


def _gather_reference(params, indices, axis, batch_dims):
    b, o, a, i, k = gather_dims(params.shape, indices.shape, axis, batch_dims)
    _check_range(indices, a)
    p = params.reshape(b, o, a, i)
    ix = indices.reshape(b, k).astype(np.int64)
    out = np.stack([p[n][:, ix[n], :] for n in range(b)]) if b else np.zeros((0, o, k, i), params.dtype)
    return out.reshape(_check_gather("gather", params.shape, _type_of(indices), axis, batch_dims))


def _type_of(a: np.ndarray) -> TensorType:
    return TensorType(a.shape, a.dtype.name)


def _gather_grad(e, node, dy):
    params, indices = node.inputs
    return [e.op("gather_grad", indices, dy, params_shape=e.type(params).shape, axis=node.attr("axis"),
                 batch_dims=node.attr("batch_dims")), None]


def _infer_gather_grad(inputs: list, attrs: dict) -> TensorType:
    indices, dy = inputs
    shape = tuple(attrs["params_shape"])
    expected = _check_gather("gather_grad", shape, indices, attrs["axis"], attrs["batch_dims"])
    if dy.shape != expected:
        raise ShapeError(f"gather_grad: dy {dy} does not match the gather's output {list(expected)}")
    return TensorType(shape, dy.dtype)


def _gather_grad_reference(indices, dy, params_shape, axis, batch_dims):
    b, o, a, i, k = gather_dims(params_shape, indices.shape, axis, batch_dims)
    out = np.zeros((b, o, a, i), dy.dtype)
    ix = indices.reshape(b, k).astype(np.int64)
    d = dy.reshape(b, o, k, i)
    for n in range(b):
        for kk in range(k):            # in index order, as the kernels add
            if 0 <= ix[n, kk] < a:
                out[n, :, ix[n, kk], :] += d[n, :, kk, :]
    return out.reshape(params_shape)


register(OpRule("gather", "window", _infer_gather, _gather_reference, _gather_grad))
register(OpRule("gather_grad", "window", _infer_gather_grad, _gather_grad_reference, differentiable=False))


# --- strided slices ------------------------------------------------------------------------

def _check_starts(op: str, x: TensorType, attrs: dict) -> tuple[int, ...]:
    start, step, shape = tuple(attrs["start"]), tuple(attrs["step"]), tuple(attrs["shape"])
    if not len(start) == len(step) == len(shape) == len(x.shape):
        raise ShapeError(f"{op}: start, step and shape need one entry per dim of {x}")
    for d, (b, s, n, size) in enumerate(zip(start, step, shape, x.shape)):
        last = b + (n - 1) * s
        if s == 0 or n < 0 or (n and not (0 <= b < size and 0 <= last < size)):
            raise ShapeError(f"{op}: dim {d}: {n} elements from {b} by {s} do not lie in [0, {size})")
    return shape


def _index(start, step, shape) -> tuple:
    return tuple(slice(b, b + n * s if b + n * s >= 0 else None, s) for b, s, n in zip(start, step, shape))


def _infer_strided_slice(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    return TensorType(_check_starts("strided_slice", x, attrs), x.dtype)


def _strided_slice_grad(e, node, dy):
    x = node.inputs[0]
    t = e.type(x)
    zeros = e.op("constant", value=0.0, shape=t.shape, dtype=t.dtype)
    return [e.op("slice_update", zeros, dy, **node.attr_dict)]


def _infer_slice_update(inputs: list, attrs: dict) -> TensorType:
    x, update = inputs
    shape = _check_starts("slice_update", x, attrs)
    if update.shape != shape or update.dtype != x.dtype:
        raise ShapeError(f"slice_update: update {update} does not match the slice {x.dtype}{list(shape)}")
    return TensorType(x.shape, x.dtype)


def _slice_update_reference(x, update, start, step, shape):
    out = x.copy()
    out[_index(start, step, shape)] = update
    return out


def _slice_update_grad(e, node, dy):
    x, update = node.inputs
    t = e.type(update)
    zeros = e.op("constant", value=0.0, shape=t.shape, dtype=t.dtype)
    return [e.op("slice_update", dy, zeros, **node.attr_dict), e.op("strided_slice", dy, **node.attr_dict)]


register(OpRule("strided_slice", "window", _infer_strided_slice,
                lambda x, start, step, shape: np.ascontiguousarray(x[_index(start, step, shape)]),
                _strided_slice_grad))
register(OpRule("slice_update", "window", _infer_slice_update, _slice_update_reference, _slice_update_grad))


# --- one-hot -------------------------------------------------------------------------------

def _infer_one_hot(inputs: list, attrs: dict) -> TensorType:
    (indices,) = inputs
    axis, depth = attrs["axis"], attrs["depth"]
    if indices.dtype not in INDEX_DTYPES:
        raise ShapeError(f"one_hot: indices must be int32 or int64, got {indices.dtype}")
    if depth < 1:
        raise ShapeError(f"one_hot: depth must be positive, got {depth}")
    if not 0 <= axis <= len(indices.shape):
        raise ShapeError(f"one_hot: axis {axis} is out of range for indices {indices}")
    return TensorType(indices.shape[:axis] + (depth,) + indices.shape[axis:], attrs["dtype"])


def _one_hot_reference(indices, depth, axis, on_value, off_value, dtype):
    outer, inner = _prod(indices.shape[:axis]), _prod(indices.shape[axis:])
    ix = indices.reshape(outer, 1, inner).astype(np.int64)
    hot = ix == np.arange(depth).reshape(1, depth, 1)
    out = np.where(hot, np.asarray(on_value).astype(numpy_dtype(dtype)),
                   np.asarray(off_value).astype(numpy_dtype(dtype)))
    return out.reshape(indices.shape[:axis] + (depth,) + indices.shape[axis:])


register(OpRule("one_hot", "window", _infer_one_hot, _one_hot_reference, differentiable=False))


# --- top-k ---------------------------------------------------------------------------------

def _infer_top_k(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    if len(x.shape) < 1 or x.shape[-1] == 0:
        raise ShapeError(f"top_k: needs a non-empty last axis, got {x}")
    if not 1 <= attrs["k"] <= x.shape[-1]:
        raise ShapeError(f"top_k: k {attrs['k']} must be in [1, {x.shape[-1]}]")
    return TensorType(x.shape[:-1] + (attrs["k"],), "int32")


def _top_k_reference(x, k):
    cols = x.shape[-1]
    rows = x.reshape(-1, cols)
    nan = np.isnan(rows) if rows.dtype.kind == "f" else np.zeros(rows.shape, bool)
    value = np.where(nan, 0, rows)
    idx = np.broadcast_to(np.arange(cols), rows.shape)
    out = np.empty((rows.shape[0], k), np.int32)
    for r in range(rows.shape[0]):
        # NaN first, then larger values, then the lower index (np.lexsort sorts by its last key first)
        order = np.lexsort((idx[r], -value[r].astype(np.float64), ~nan[r]))
        out[r] = order[:k]
    return out.reshape(x.shape[:-1] + (k,))


register(OpRule("top_k", "window", _infer_top_k, _top_k_reference, differentiable=False))


# --- where ---------------------------------------------------------------------------------

def _infer_where(inputs: list, attrs: dict) -> TensorType:
    cond, x, y = inputs
    if x.dtype != y.dtype:
        raise ShapeError(f"where: x and y have different dtypes {x.dtype} and {y.dtype}")
    shape = broadcast_shape(broadcast_shape(cond.shape, x.shape, "where"), y.shape, "where")
    return TensorType(shape, x.dtype)


def _where_grad(e, node, dy):
    cond, x, y = node.inputs
    zero = e.const(0.0, node.id)
    return [None, e.sum_to(e.op("where", cond, dy, zero), x), e.sum_to(e.op("where", cond, zero, dy), y)]


def _where_reference(cond, x, y):
    return np.where(cond != 0, x, y)


register(OpRule("where", "pointwise", _infer_where, _where_reference, _where_grad,
                c_expr="(({0}) != 0 ? {1} : {2})"))
