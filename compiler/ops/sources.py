"""Ops that bring values into a step: placeholders, variables, runtime scalars, views.

`input`, `variable` and `scalar` have no computation: their buffers are handed to
the compiled step by the runtime.  `reshape` is a view: it shares its input's
buffer, so it costs nothing at run time.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _declared(_inputs: list, attrs: dict) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


def _no_reference(*_args, **_kw):
    raise AssertionError("sources are bound by the executor, not computed")


register(OpRule("input", "source", _declared, _no_reference, differentiable=False))
register(OpRule("variable", "source", _declared, _no_reference))
register(OpRule("scalar", "source", _declared, _no_reference, differentiable=False))


def infer_reshape(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    shape = tuple(attrs["shape"])
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"reshape: cannot reshape {x} ({x.size} elements) to {list(shape)}")
    return TensorType(shape, x.dtype)


def _reshape_grad(e, node, dy):
    return [e.op("reshape", dy, shape=e.type(node.inputs[0]).shape)]


register(OpRule("reshape", "view", infer_reshape,
                lambda x, shape: np.reshape(x, shape), _reshape_grad))
