"""Fused row kernels of BERT (issue 15): layer_norm and the scaled masked softmax, with their gradients.

Each op works on rows: the axes from `begin_norm_axis` on (layer_norm) or the last axis (softmax)
form one row, and one kernel makes one pass over each row (its statistics stay in registers or
L1).  Built from smaller ops the same computation is two reductions and several pointwise
kernels forward and more backward; see examples/models/README.md for the kernel counts.

* `layer_norm(x[, gamma][, beta])`: y = (x - mean) / sqrt(var + epsilon) * gamma + beta, the
  biased variance, gamma and beta shaped like a row (`scale` / `center` say which are given);
* `layer_norm_grad(x[, gamma], dy)`: dx, the statistics recomputed from x;
* `layer_norm_gamma_grad(x, dy)`: sum over rows of dy * (x - mean) / sqrt(var + epsilon)
  (beta's gradient is a plain `reduce_sum` of dy over the leading axes);
* `fused_scale_mask_softmax(x, mask)`: softmax(x * scale + mask) along the last axis, the mask
  broadcast over the leading axes (BERT's (B, 1, S, S) mask against (B, heads, S, S) scores);
* `fused_scale_mask_softmax_grad(y, dy)`: scale * y * (dy - sum(dy * y)).

The references compute in float64 and round once, as the compiled kernels accumulate in double
on the CPU; a NaN or an infinity in a row makes that row's result NaN, as NumPy's does.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _check_rows(op: str, x: TensorType, begin_norm_axis: int) -> tuple[int, ...]:
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: needs floating-point input, got {x.dtype}")
    if not 0 <= begin_norm_axis < len(x.shape):
        raise ShapeError(f"{op}: begin_norm_axis {begin_norm_axis} is out of range for {x}")
    row = tuple(x.shape[begin_norm_axis:])
    if int(np.prod(row)) == 0:
        raise ShapeError(f"{op}: needs non-empty rows, got {x} from axis {begin_norm_axis}")
    return row


def _check_param(op: str, arg: str, p: TensorType, x: TensorType, row: tuple[int, ...]) -> None:
    if p.shape != row or p.dtype != x.dtype:
        raise ShapeError(f"{op}: {arg} must be {x.dtype}{list(row)} (a row of {x}), got {p}")


def _infer_layer_norm(inputs: list, attrs: dict) -> TensorType:
    x, params = inputs[0], inputs[1:]
    row = _check_rows("layer_norm", x, attrs["begin_norm_axis"])
    names = [n for n, on in (("gamma", attrs["scale"]), ("beta", attrs["center"])) if on]
    if len(params) != len(names):
        raise ShapeError(f"layer_norm: expected {1 + len(names)} inputs (x, {', '.join(names) or 'no params'}), "
                         f"got {len(inputs)}")
    for name, p in zip(names, params):
        _check_param("layer_norm", name, p, x, row)
    return TensorType(x.shape, x.dtype)


def _rows(x: np.ndarray, begin_norm_axis: int) -> np.ndarray:
    return x.astype(np.float64).reshape(int(np.prod(x.shape[:begin_norm_axis], dtype=np.int64)), -1)


def _normalized(x: np.ndarray, begin_norm_axis: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) * rstd per row, and rstd (rows, 1), in float64."""
    r = _rows(x, begin_norm_axis)
    with np.errstate(all="ignore"):
        centered = r - r.mean(axis=1, keepdims=True)
        rstd = 1.0 / np.sqrt((centered * centered).mean(axis=1, keepdims=True) + epsilon)
        return centered * rstd, rstd


def layer_norm_reference(x, *params, begin_norm_axis: int, epsilon: float, scale: bool, center: bool):
    xhat, _ = _normalized(x, begin_norm_axis, epsilon)
    rest = list(params)
    with np.errstate(all="ignore"):
        if scale:
            xhat = xhat * rest.pop(0).astype(np.float64).reshape(1, -1)
        if center:
            xhat = xhat + rest.pop(0).astype(np.float64).reshape(1, -1)
    return xhat.reshape(x.shape).astype(x.dtype)


def _layer_norm_grad(e, node, dy):
    x = node.inputs[0]
    attrs = {k: node.attr(k) for k in ("begin_norm_axis", "epsilon")}
    scale, center = node.attr("scale"), node.attr("center")
    gamma = node.inputs[1:2] if scale else ()
    grads = [e.op("layer_norm_grad", x, *gamma, dy, scale=scale, **attrs)]
    if scale:
        grads.append(e.op("layer_norm_gamma_grad", x, dy, **attrs))
    if center:
        leading = tuple(range(attrs["begin_norm_axis"]))
        grads.append(e.op("reduce_sum", dy, axes=leading, keepdims=False) if leading else dy)
    return grads


register(OpRule("layer_norm", "row", _infer_layer_norm, layer_norm_reference, _layer_norm_grad))


def _infer_layer_norm_grad(inputs: list, attrs: dict) -> TensorType:
    x, dy = inputs[0], inputs[-1]
    row = _check_rows("layer_norm_grad", x, attrs["begin_norm_axis"])
    if len(inputs) != 2 + bool(attrs["scale"]):
        raise ShapeError(f"layer_norm_grad: expected x, {'gamma, ' if attrs['scale'] else ''}dy; "
                         f"got {len(inputs)} inputs")
    if attrs["scale"]:
        _check_param("layer_norm_grad", "gamma", inputs[1], x, row)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ShapeError(f"layer_norm_grad: dy {dy} does not match x {x}")
    return TensorType(x.shape, x.dtype)


def layer_norm_grad_reference(x, *rest, begin_norm_axis: int, epsilon: float, scale: bool):
    dy = _rows(rest[-1], begin_norm_axis)
    xhat, rstd = _normalized(x, begin_norm_axis, epsilon)
    with np.errstate(all="ignore"):
        g = dy * rest[0].astype(np.float64).reshape(1, -1) if scale else dy
        dx = rstd * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return dx.reshape(x.shape).astype(x.dtype)


register(OpRule("layer_norm_grad", "row", _infer_layer_norm_grad, layer_norm_grad_reference,
                differentiable=False))


def _infer_gamma_grad(inputs: list, attrs: dict) -> TensorType:
    x, dy = inputs
    row = _check_rows("layer_norm_gamma_grad", x, attrs["begin_norm_axis"])
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ShapeError(f"layer_norm_gamma_grad: dy {dy} does not match x {x}")
    return TensorType(row, x.dtype)


def layer_norm_gamma_grad_reference(x, dy, begin_norm_axis: int, epsilon: float):
    xhat, _ = _normalized(x, begin_norm_axis, epsilon)
    with np.errstate(all="ignore"):
        out = (_rows(dy, begin_norm_axis) * xhat).sum(axis=0)
    return out.reshape(x.shape[begin_norm_axis:]).astype(x.dtype)


register(OpRule("layer_norm_gamma_grad", "row", _infer_gamma_grad, layer_norm_gamma_grad_reference,
                differentiable=False))


# --- the scaled masked softmax ---------------------------------------------------------------------

def mask_broadcasts(mask: tuple, x: tuple) -> bool:
    """Does `mask` broadcast to `x` with whole rows (its last axis the length of x's)?"""
    if len(mask) > len(x) or not mask or mask[-1] != x[-1]:
        return False
    return all(m in (1, d) for m, d in zip(mask[::-1], x[::-1]))


def _infer_scale_mask_softmax(inputs: list, attrs: dict) -> TensorType:
    x, mask = inputs
    if x.dtype not in FLOAT_DTYPES or mask.dtype != x.dtype:
        raise ShapeError(f"fused_scale_mask_softmax: x {x} and mask {mask} must share a floating dtype")
    if not mask_broadcasts(mask.shape, x.shape):
        raise ShapeError(f"fused_scale_mask_softmax: mask {mask} does not broadcast to x {x} by whole rows")
    return TensorType(x.shape, x.dtype)


def scale_mask_softmax_reference(x, mask, scale: float):
    with np.errstate(all="ignore"):
        z = x.astype(np.float64) * scale + mask.astype(np.float64)
        z = z - z.max(axis=-1, keepdims=True)
        ez = np.exp(z)
        return (ez / ez.sum(axis=-1, keepdims=True)).astype(x.dtype)


def _scale_mask_softmax_grad(e, node, dy):
    x, mask = node.inputs
    dz = e.op("fused_scale_mask_softmax_grad", node.id, dy, scale=1.0)      # d/d(x * scale + mask)
    dx = e.op("fused_scale_mask_softmax_grad", node.id, dy, scale=node.attr("scale"))
    return [dx, e.sum_to(dz, mask)]


register(OpRule("fused_scale_mask_softmax", "row", _infer_scale_mask_softmax, scale_mask_softmax_reference,
                _scale_mask_softmax_grad))


def _infer_softmax_grad(inputs: list, attrs: dict) -> TensorType:
    y, dy = inputs
    if y.dtype not in FLOAT_DTYPES or (dy.shape, dy.dtype) != (y.shape, y.dtype) or not y.shape or y.shape[-1] == 0:
        raise ShapeError(f"fused_scale_mask_softmax_grad: y {y} and dy {dy} must be equal float tensors with rows")
    return TensorType(y.shape, y.dtype)


def scale_mask_softmax_grad_reference(y, dy, scale: float):
    y64, dy64 = y.astype(np.float64), dy.astype(np.float64)
    with np.errstate(all="ignore"):
        dot = (dy64 * y64).sum(axis=-1, keepdims=True)
        return (scale * y64 * (dy64 - dot)).astype(y.dtype)


register(OpRule("fused_scale_mask_softmax_grad", "row", _infer_softmax_grad, scale_mask_softmax_grad_reference,
                differentiable=False))
