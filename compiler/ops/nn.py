"""Row ops: softmax, sparse softmax cross-entropy (and its gradient), argmax.

Each works along the last axis with one kernel per op (each backend's `LOWERINGS` names its
template); the tracer transposes other axes to the end first.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _float_rows(op: str, x: TensorType) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: needs floating-point input, got {x.dtype}")
    if len(x.shape) < 1 or x.shape[-1] == 0:
        raise ShapeError(f"{op}: needs a non-empty last axis, got {x}")


def _infer_softmax(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    _float_rows("softmax", x)
    return TensorType(x.shape, x.dtype)


def softmax_reference(x):
    z = x - x.max(axis=-1, keepdims=True)
    ez = np.exp(z)
    return (ez / ez.sum(axis=-1, keepdims=True)).astype(x.dtype)


def _softmax_grad(e, node, dy):
    y = node.id
    last = len(e.type(y).shape) - 1
    dot = e.op("reduce_sum", e.op("multiply", dy, y), axes=(last,), keepdims=True)
    return [e.op("multiply", y, e.op("subtract", dy, dot))]


register(OpRule("softmax", "row", _infer_softmax, softmax_reference, _softmax_grad))


def _check_labels(op: str, labels: TensorType, logits: TensorType) -> None:
    _float_rows(op, logits)
    if labels.dtype not in ("int32", "int64"):
        raise ShapeError(f"{op}: labels must be int32 or int64, got {labels.dtype}")
    if labels.shape != logits.shape[:-1]:
        raise ShapeError(f"{op}: labels of shape {list(labels.shape)} do not match logits "
                         f"{list(logits.shape)} (expected labels {list(logits.shape[:-1])})")


def _infer_xent(inputs: list, attrs: dict) -> TensorType:
    logits, labels = inputs
    _check_labels("sparse_softmax_cross_entropy", labels, logits)
    return TensorType(logits.shape[:-1], logits.dtype)


def _picked(x, labels):
    if labels.size and (labels.min() < 0 or labels.max() >= x.shape[-1]):
        raise IndexError(f"label out of range [0, {x.shape[-1]})")
    return np.take_along_axis(x, labels[..., None].astype(np.int64), axis=-1)[..., 0]


def xent_reference(logits, labels):
    m = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=-1)) + m[..., 0]
    return (lse - _picked(logits, labels)).astype(logits.dtype)


def _xent_grad(e, node, dy):
    logits, labels = node.inputs
    return [e.op("sparse_softmax_cross_entropy_grad", logits, labels, dy), None]


# Logits first: the gradient flows to input 0; labels are data.
register(OpRule("sparse_softmax_cross_entropy", "row", _infer_xent, xent_reference, _xent_grad))


def _infer_xent_grad(inputs: list, attrs: dict) -> TensorType:
    logits, labels, dy = inputs
    _check_labels("sparse_softmax_cross_entropy_grad", labels, logits)
    if dy.shape != labels.shape:
        raise ShapeError(f"sparse_softmax_cross_entropy_grad: dy {dy} does not match labels {labels}")
    return TensorType(logits.shape, logits.dtype)


def xent_grad_reference(logits, labels, dy):
    p = softmax_reference(logits)
    _picked(p, labels)  # range check
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, labels[..., None].astype(np.int64), 1, axis=-1)
    return ((p - onehot) * dy[..., None]).astype(logits.dtype)


register(OpRule("sparse_softmax_cross_entropy_grad", "row", _infer_xent_grad, xent_grad_reference,
                differentiable=False))


def _infer_argmax(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    if len(x.shape) < 1 or x.shape[-1] == 0:
        raise ShapeError(f"argmax: needs a non-empty last axis, got {x}")
    return TensorType(x.shape[:-1], "int32")


register(OpRule("argmax", "row", _infer_argmax, lambda x: np.argmax(x, axis=-1).astype(np.int32), differentiable=False))
