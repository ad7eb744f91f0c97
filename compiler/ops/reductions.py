"""Reductions over a set of axes: sum, max, min, prod.

`axes` is a sorted tuple of non-negative axes; `keepdims` keeps them as size 1.
Codegen handles reductions over one contiguous run of axes ((outer, reduced,
inner) form); the `split_reductions` pass rewrites any other axis set into a chain
of such reductions first.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def normalize_axes(axis, rank: int, op: str) -> tuple[int, ...]:
    """OneFlow's axis argument (None, int or sequence, negatives allowed) as sorted axes."""
    if axis is None:
        return tuple(range(rank))
    items = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = set()
    for a in items:
        a = int(a)
        if not -rank <= a < rank:
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor of rank {rank}")
        out.add(a % rank)
    return tuple(sorted(out))


def reduced_shape(shape: tuple, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _infer(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        (x,) = inputs
        axes = tuple(attrs["axes"])
        if any(not 0 <= a < len(x.shape) for a in axes):
            raise ShapeError(f"{op}: axes {list(axes)} out of range for {x}")
        if op in ("reduce_max", "reduce_min") and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{op}: cannot reduce an empty axis")
        return TensorType(reduced_shape(x.shape, axes, attrs["keepdims"]), x.dtype)
    return infer


def _expand_back(e, node, value):
    """A reduced value reshaped with kept dims and broadcast back to the input's shape."""
    x = e.type(node.inputs[0])
    axes = node.attr("axes")
    kept = e.op("reshape", value, shape=reduced_shape(x.shape, axes, True))
    return e.op("broadcast_to", kept, shape=x.shape)


def _sum_grad(e, node, dy):
    return [_expand_back(e, node, dy)]


def _extremum_grad(e, node, dy):
    # The gradient goes to the elements equal to the extremum, shared among ties.
    x = node.inputs[0]
    axes = node.attr("axes")
    mask = e.op("eq_mask", x, _expand_back(e, node, node.id))
    ties = e.op("reduce_sum", mask, axes=axes, keepdims=True)
    share = e.op("divide", e.op("reshape", dy, shape=e.type(ties).shape), ties)
    return [e.op("multiply", mask, share)]


def _prod_grad(e, node, dy):
    # d prod / d x_i = prod / x_i (inputs with zeros are not supported by this rule)
    return [e.op("divide", e.op("multiply", _expand_back(e, node, dy), _expand_back(e, node, node.id)),
                 node.inputs[0])]


def _ref(fn):
    return lambda x, axes, keepdims: np.asarray(fn(x, axis=tuple(axes), keepdims=keepdims), dtype=x.dtype)


# -0.0, not +0.0, is the identity of IEEE addition: a sum of negative zeros is -0.0, as in NumPy.
def _sum_reference(x, axes, keepdims):
    # from -0.0 for floats, like the kernels, so an empty sum is -0.0 there too
    initial = -0.0 if x.dtype.kind == "f" else 0
    return np.asarray(np.sum(x, axis=tuple(axes), keepdims=keepdims, initial=initial), dtype=x.dtype)


register(OpRule("reduce_sum", "reduction", _infer("reduce_sum"), _sum_reference, _sum_grad,
                c_expr="({0} + {1})", c_init="({T})-0.0"))
# np.max and np.min: NaN propagates (flowc::maximum/minimum, see compiler/ops/pointwise.py), and the
# identity is an infinity (not lowest()/max(), which would be the result of a row of infinities).
register(OpRule("reduce_max", "reduction", _infer("reduce_max"), _ref(np.max), _extremum_grad,
                c_expr="flowc::maximum({0}, {1})",
                c_init="(std::numeric_limits<{T}>::has_infinity ? -std::numeric_limits<{T}>::infinity() "
                       ": std::numeric_limits<{T}>::lowest())"))
register(OpRule("reduce_min", "reduction", _infer("reduce_min"), _ref(np.min), _extremum_grad,
                c_expr="flowc::minimum({0}, {1})",
                c_init="(std::numeric_limits<{T}>::has_infinity ? std::numeric_limits<{T}>::infinity() "
                       ": std::numeric_limits<{T}>::max())"))
register(OpRule("reduce_prod", "reduction", _infer("reduce_prod"), _ref(np.prod), _prod_grad,
                c_expr="({0} * {1})", c_init="({T})1"))
