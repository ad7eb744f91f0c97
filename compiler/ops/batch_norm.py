"""Batch normalisation of train jobs as four fused per-channel kernels (issue 15).

Built from smaller ops, one `flow.layers.batch_normalization` of a train job was ~12 forward and
~20 backward nodes (reductions and pointwise loops).  Here it is two kernels forward and two
backward.  A node of flowc's IR produces one value, so each pass over the data is one op:

* `batch_norm_stats(x)`: (2, C), row 0 the per-channel mean, row 1 the biased variance, over every
  axis but `axis` (one pass over x; the CPU kernel sums the shifted values and their squares in
  double, so a large mean costs no accuracy);
* `batch_norm(x, stats[, gamma][, beta])`: y = (x - mean) * rsqrt(var + epsilon) * gamma + beta;
* `batch_norm_grad_sums(x, stats, dy[, r])`: (2, C), row 0 sum(dy * xhat) (gamma's gradient), row 1
  sum(dy) (beta's gradient), xhat = (x - mean) * rsqrt(var + epsilon);
* `batch_norm_grad(x, stats[, gamma], dy, sums[, r])`: dx = gamma * rstd * (dy - sum(dy) / m
  - xhat * sum(dy * xhat) / m), m the elements per channel of the logical batch (attribute `count`:
  on each of several ranks, x is a share of the batch while the sums are over all of it).

When y's only reader is a relu, the gradient ops take the relu's output `r` after `dy` (attribute
`relu`) and use relu_grad(r, dy) in its place, so the relu's gradient is no pass of its own.

`batch_norm`'s gradient with respect to x is the total one, through the statistics too: its
`stats` input must be `batch_norm_stats` of the same x (the gradient rule checks it), and
`batch_norm_stats` itself passes no gradient.  The moving averages of OneFlow's normalization are
pointwise ops on the statistics (flow/layers.py).

The axis is given non-negative; x is viewed as (outer, C, inner): NCHW with axis 1 has inner H*W,
NHWC with axis 3 has inner 1.  float32 and float64 only (flow/layers.py keeps the composed form
for float16).  The references compute in float64 and round once; a NaN or an infinity in a channel
makes that channel's statistics, and so its outputs, NaN, as NumPy's do.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OPS, OpRule, ShapeError, register

DTYPES = ("float32", "float64")


def geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, channels, inner): `shape` seen as three axes around `axis`.

    Example:
        geometry((32, 64, 8, 8), 1) == (32, 64, 64)
    """
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, shape[axis], inner


def _check_x(op: str, x: TensorType, axis: int) -> int:
    if x.dtype not in DTYPES:
        raise ShapeError(f"{op}: x must be float32 or float64, got {x}")
    if not isinstance(axis, int) or not 0 <= axis < len(x.shape):
        raise ShapeError(f"{op}: axis {axis!r} is out of range for x {x}")
    outer, channels, inner = geometry(x.shape, axis)
    if outer * inner == 0 or channels == 0:
        raise ShapeError(f"{op}: x {x} has no elements per channel along axis {axis}")
    return channels


def _check(op: str, arg: str, t: TensorType, shape: tuple[int, ...], x: TensorType) -> None:
    if t.shape != shape or t.dtype != x.dtype:
        raise ShapeError(f"{op}: {arg} must be {x.dtype}{list(shape)}, got {t}")


def _channels(x: np.ndarray, axis: int) -> np.ndarray:
    """x in float64 as (C, outer * inner): one row per channel."""
    return np.moveaxis(x.astype(np.float64), axis, 0).reshape(x.shape[axis], -1)


def _unchannels(rows: np.ndarray, shape: tuple[int, ...], axis: int, dtype) -> np.ndarray:
    moved = (shape[axis],) + tuple(d for i, d in enumerate(shape) if i != axis)
    return np.moveaxis(rows.reshape(moved), 0, axis).astype(dtype)


def _xhat(x: np.ndarray, stats: np.ndarray, axis: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) * rstd per channel (C, m), and rstd (C, 1), in float64."""
    with np.errstate(all="ignore"):
        rstd = 1.0 / np.sqrt(stats[1].astype(np.float64) + epsilon)
        return (_channels(x, axis) - stats[0].astype(np.float64)[:, None]) * rstd[:, None], rstd[:, None]


# --- statistics ------------------------------------------------------------------------------------

def _infer_stats(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    return TensorType((2, _check_x("batch_norm_stats", x, attrs["axis"])), x.dtype)


def stats_reference(x, axis: int):
    rows = _channels(x, axis)
    with np.errstate(all="ignore"):
        mean = rows.mean(axis=1)
        var = ((rows - mean[:, None]) ** 2).mean(axis=1)
    return np.stack([mean, var]).astype(x.dtype)


register(OpRule("batch_norm_stats", "row", _infer_stats, stats_reference, differentiable=False))


# --- normalisation ---------------------------------------------------------------------------------

def _param_names(attrs: dict) -> list[str]:
    return [n for n, on in (("gamma", attrs["scale"]), ("beta", attrs["center"])) if on]


def _infer_batch_norm(inputs: list, attrs: dict) -> TensorType:
    x, stats, params = inputs[0], inputs[1], inputs[2:]
    channels = _check_x("batch_norm", x, attrs["axis"])
    _check("batch_norm", "stats", stats, (2, channels), x)
    names = _param_names(attrs)
    if len(params) != len(names):
        raise ShapeError(f"batch_norm: expected {2 + len(names)} inputs (x, stats{''.join(', ' + n for n in names)}),"
                         f" got {len(inputs)}")
    for name, p in zip(names, params):
        _check("batch_norm", name, p, (channels,), x)
    return TensorType(x.shape, x.dtype)


def batch_norm_reference(x, stats, *params, axis: int, epsilon: float, scale: bool, center: bool):
    xhat, _ = _xhat(x, stats, axis, epsilon)
    rest = list(params)
    with np.errstate(all="ignore"):
        if scale:
            xhat = xhat * rest.pop(0).astype(np.float64)[:, None]
        if center:
            xhat = xhat + rest.pop(0).astype(np.float64)[:, None]
    return _unchannels(xhat, x.shape, axis, x.dtype)


def _producer(e, node_id: int):
    return next(n for n in reversed(e.builder.nodes) if n.id == node_id)


def _batch_norm_grad(e, node, dy):
    from flowc.compiler.autodiff import GradientError
    x, stats = node.inputs[:2]
    source = _producer(e, stats)
    axis, epsilon = node.attr("axis"), node.attr("epsilon")
    if source.op != "batch_norm_stats" or source.inputs[0] != x or source.attr("axis") != axis:
        raise GradientError(f"{node.loc}: batch_norm's gradient needs its statistics to be batch_norm_stats "
                            f"of its own input along axis {axis}, got %{stats} ({source.op})")
    scale, center = node.attr("scale"), node.attr("center")
    gamma = node.inputs[2:3] if scale else ()
    dys = _relu_folded(e, node, dy)
    relu = len(dys) == 2
    sums = e.op("batch_norm_grad_sums", x, stats, *dys, axis=axis, epsilon=epsilon, relu=relu)
    outer, _, inner = geometry(e.type(x).shape, axis)
    grads: list = [e.op("batch_norm_grad", x, stats, *gamma, dys[0], sums, *dys[1:], axis=axis, epsilon=epsilon,
                        scale=scale, relu=relu, count=outer * inner), None]
    channels = e.type(stats).shape[1]
    for row, on in ((0, scale), (1, center)):
        if on:
            part = e.op("slice_axis", sums, axis=0, begin=row, end=row + 1)
            grads.append(e.op("reshape", part, shape=(channels,)))
    return grads


def _relu_folded(e, node, dy) -> tuple[int, ...]:
    """(g, r) when dy is relu_grad(r, g) with r = relu(y), y this batch_norm's output: the relu's gradient
    then runs inside the two gradient kernels (its own node is left to any other reader); else (dy,)."""
    source = _producer(e, dy)
    if source.op != "relu_grad":
        return (dy,)
    r, g = source.inputs
    relu = _producer(e, r)
    return (g, r) if relu.op == "relu" and relu.inputs == (node.id,) else (dy,)


register(OpRule("batch_norm", "row", _infer_batch_norm, batch_norm_reference, _batch_norm_grad))


# --- gradients -------------------------------------------------------------------------------------

def _infer_grad_sums(inputs: list, attrs: dict) -> TensorType:
    if len(inputs) != 3 + bool(attrs.get("relu")):
        raise ShapeError(f"batch_norm_grad_sums: expected x, stats, dy{', r' if attrs.get('relu') else ''}; "
                         f"got {len(inputs)} inputs")
    x, stats, dy = inputs[:3]
    channels = _check_x("batch_norm_grad_sums", x, attrs["axis"])
    _check("batch_norm_grad_sums", "stats", stats, (2, channels), x)
    for name, t in zip(("dy", "r"), inputs[2:]):
        _check("batch_norm_grad_sums", name, t, x.shape, x)
    return TensorType((2, channels), x.dtype)


def _masked(dy: np.ndarray, r: tuple) -> np.ndarray:
    """relu_grad(r, dy) when the relu's output r is given (the `relu` attribute), else dy."""
    if not r:
        return dy
    return np.asarray(OPS["relu_grad"].reference(r[0], dy))


def grad_sums_reference(x, stats, dy, *r, axis: int, epsilon: float, relu: bool = False):
    xhat, _ = _xhat(x, stats, axis, epsilon)
    d = _channels(_masked(dy, r), axis)
    with np.errstate(all="ignore"):
        return np.stack([(d * xhat).sum(axis=1), d.sum(axis=1)]).astype(x.dtype)


register(OpRule("batch_norm_grad_sums", "row", _infer_grad_sums, grad_sums_reference, differentiable=False))


def _infer_grad(inputs: list, attrs: dict) -> TensorType:
    relu = bool(attrs.get("relu"))
    if len(inputs) != 4 + bool(attrs["scale"]) + relu:
        raise ShapeError(f"batch_norm_grad: expected x, stats, {'gamma, ' if attrs['scale'] else ''}dy, sums"
                         f"{', r' if relu else ''}; got {len(inputs)} inputs")
    x, stats = inputs[0], inputs[1]
    dy, sums = inputs[-2 - relu], inputs[-1 - relu]
    channels = _check_x("batch_norm_grad", x, attrs["axis"])
    _check("batch_norm_grad", "stats", stats, (2, channels), x)
    if attrs["scale"]:
        _check("batch_norm_grad", "gamma", inputs[2], (channels,), x)
    _check("batch_norm_grad", "dy", dy, x.shape, x)
    _check("batch_norm_grad", "sums", sums, (2, channels), x)
    if relu:
        _check("batch_norm_grad", "r", inputs[-1], x.shape, x)
    count = attrs.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ShapeError(f"batch_norm_grad: count must be a positive int, got {count!r}")
    return TensorType(x.shape, x.dtype)


def grad_reference(x, stats, *rest, axis: int, epsilon: float, scale: bool, relu: bool = False,
                   count: int | None = None):
    if relu:
        rest, r = rest[:-1], rest[-1:]
    else:
        r = ()
    dy, sums = _masked(rest[-2], r), rest[-1].astype(np.float64)
    xhat, rstd = _xhat(x, stats, axis, epsilon)
    m = count or xhat.shape[1]
    with np.errstate(all="ignore"):
        g = rstd * (rest[0].astype(np.float64)[:, None] if scale else 1.0)
        dx = g * (_channels(dy, axis) - sums[1][:, None] / m - xhat * sums[0][:, None] / m)
    return _unchannels(dx, x.shape, axis, x.dtype)


register(OpRule("batch_norm_grad", "row", _infer_grad, grad_reference, differentiable=False))
