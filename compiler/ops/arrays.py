"""Concatenation and slicing along one axis (the slice is concat's gradient).

Both are copies viewed as (outer, axis, inner) blocks, one template each per backend
(see `LOWERINGS` in compiler/codegen/).
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _infer_concat(inputs: list, attrs: dict) -> TensorType:
    axis = attrs["axis"]
    first = inputs[0]
    if not 0 <= axis < len(first.shape):
        raise ShapeError(f"concat: axis {axis} is out of range for {first}")
    for t in inputs[1:]:
        if t.dtype != first.dtype or len(t.shape) != len(first.shape) or \
                any(a != b for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != axis):
            raise ShapeError(f"concat: {t} does not match {first} outside axis {axis}")
    size = sum(t.shape[axis] for t in inputs)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)


def _concat_grad(e, node, dy):
    axis, begin, grads = node.attr("axis"), 0, []
    for x in node.inputs:
        length = e.type(x).shape[axis]
        grads.append(e.op("slice_axis", dy, axis=axis, begin=begin, end=begin + length))
        begin += length
    return grads


def _infer_slice(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    axis, begin, end = attrs["axis"], attrs["begin"], attrs["end"]
    if not (0 <= axis < len(x.shape) and 0 <= begin < end <= x.shape[axis]):
        raise ShapeError(f"slice_axis: [{begin}, {end}) on axis {axis} is outside {x}")
    return TensorType(x.shape[:axis] + (end - begin,) + x.shape[axis + 1:], x.dtype)


def _slice_grad(e, node, dy):
    raise NotImplementedError("slice_axis is only used as concat's gradient")


register(OpRule("concat", "window", _infer_concat,
                lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_grad))
register(OpRule("slice_axis", "window", _infer_slice,
                lambda x, axis, begin, end: np.ascontiguousarray(np.take(x, range(begin, end), axis=axis)),
                None, differentiable=False))
