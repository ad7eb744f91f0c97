"""Ops that only the optimizer update emits.

`select_nonzero(cond, a, b)`: `a` where `cond != 0`, else `b`, broadcasting like NumPy; the
output has `a`'s dtype (`a` and `b` agree), `cond` may have any dtype (NaN counts as nonzero,
as in C++).  The dynamic loss scale keeps every variable of a step whose gradients are not
finite, and LAMB takes its trust ratio only where both norms are positive.  No gradient flows
through it: it never lies between a variable and the loss.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _infer_select(inputs: list, attrs: dict) -> TensorType:
    cond, a, b = inputs
    if a.dtype != b.dtype:
        raise ShapeError(f"select_nonzero: the two branches have different dtypes {a.dtype} and {b.dtype}")
    try:
        shape = tuple(np.broadcast_shapes(cond.shape, a.shape, b.shape))
    except ValueError:
        raise ShapeError(f"select_nonzero: shapes {list(cond.shape)}, {list(a.shape)} and {list(b.shape)} "
                         "cannot be broadcast together") from None
    return TensorType(shape, a.dtype)


def _select_reference(cond, a, b):
    return np.where(cond != 0, a, b).astype(a.dtype, copy=False)


register(OpRule("select_nonzero", "pointwise", _infer_select, _select_reference, None,
                c_expr="(({0}) != 0 ? ({T})({1}) : ({T})({2}))", differentiable=False))
