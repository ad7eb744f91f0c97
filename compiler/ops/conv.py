"""2-D convolution and pooling, NCHW (the API transposes NHWC to NCHW and back).

Attributes are explicit: `strides` (sh, sw), `pads` (top, bottom, left, right),
`dilation` (dh, dw), `groups`; "SAME"/"VALID" are resolved by the API.  The
backward ops (`conv2d_grad_input`, `conv2d_grad_filter`, `max_pool2d_grad`,
`avg_pool2d_grad`) are ops of their own, each with a NumPy reference and a kernel.
All are window ops: each backend lowers them through its own templates (`LOWERINGS`).
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def out_size(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    return (size + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1


def _conv_geometry(x: tuple, w: tuple, attrs: dict, op: str) -> tuple[int, int]:
    if len(x) != 4 or len(w) != 4:
        raise ShapeError(f"{op}: input and weight must be 4-D (NCHW and (filters, in/groups, kh, kw)), "
                         f"got {list(x)} and {list(w)}")
    groups = attrs["groups"]
    if x[1] % groups or w[0] % groups or x[1] // groups != w[1]:
        raise ShapeError(f"{op}: {x[1]} input channels with groups={groups} do not match a weight of "
                         f"shape {list(w)} (expected {list(w[:1])} + [{x[1] // max(groups, 1)}, kh, kw])")
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = attrs["strides"], attrs["pads"], attrs["dilation"]
    oh = out_size(x[2], w[2], sh, pt, pb, dh)
    ow = out_size(x[3], w[3], sw, pl, pr, dw)
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{op}: a {w[2]}x{w[3]} kernel does not fit a {x[2]}x{x[3]} input with these pads")
    # The CPU kernels address one image's padded channel group with 32-bit offsets (im2col.h).
    padded = w[1] * (x[2] + pt + pb) * (x[3] + pl + pr)
    if padded >= 2 ** 31:
        raise ShapeError(f"{op}: one image's padded input group has {padded} elements; flowc's convolutions "
                         f"need fewer than 2**31 (split the channels into groups or the image into tiles)")
    # The input gradient reads one image's output-gradient group, padded by up to (k - 1) * d on
    # every side, through the same 32-bit offsets.
    dy_padded = (w[0] // groups) * (oh + 2 * (w[2] - 1) * dh) * (ow + 2 * (w[3] - 1) * dw)
    if dy_padded >= 2 ** 31:
        raise ShapeError(f"{op}: one image's padded output-gradient group has {dy_padded} elements; flowc's "
                         f"convolutions need fewer than 2**31 (split the filters into groups or the image "
                         f"into tiles)")
    return oh, ow


def _infer_conv(inputs: list, attrs: dict) -> TensorType:
    x, w = inputs
    if x.dtype != w.dtype or x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"conv2d: needs float input and weight of one dtype, got {x.dtype} and {w.dtype}")
    oh, ow = _conv_geometry(x.shape, w.shape, attrs, "conv2d")
    return TensorType((x.shape[0], w.shape[0], oh, ow), x.dtype)


def _windows(xp: np.ndarray, i: int, j: int, oh: int, ow: int, attrs: dict) -> np.ndarray:
    """xp[n, c, i*dh + sh*p, j*dw + sw*q] for p < oh, q < ow: the inputs under kernel tap (i, j)."""
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    return xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]


def _pad(x: np.ndarray, pads) -> np.ndarray:
    pt, pb, pl, pr = pads
    return np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))


def conv_reference(x, w, strides, pads, dilation, groups):
    attrs = {"strides": strides, "dilation": dilation}
    n, f, kh, kw = x.shape[0], w.shape[0], w.shape[2], w.shape[3]
    oh, ow = _conv_geometry(x.shape, w.shape, dict(attrs, pads=pads, groups=groups), "conv2d")
    xp = _pad(x, pads)
    cg, fg = w.shape[1], f // groups
    out = np.zeros((n, f, oh, ow), dtype=np.float64)
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                out[:, g * fg:(g + 1) * fg] += np.einsum(
                    "ncpq,fc->nfpq", _windows(xg, i, j, oh, ow, attrs), w[g * fg:(g + 1) * fg, :, i, j])
    return out.astype(x.dtype)


def conv_grad_input_reference(dy, w, input_shape, strides, pads, dilation, groups):
    attrs = {"strides": strides, "dilation": dilation}
    n, c, h, wd = input_shape
    f, cg, kh, kw = w.shape
    oh, ow = dy.shape[2], dy.shape[3]
    pt, pb, pl, pr = pads
    dxp = np.zeros((n, c, h + pt + pb, wd + pl + pr), dtype=np.float64)
    fg = f // groups
    for g in range(groups):
        dg = dxp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                _windows(dg, i, j, oh, ow, attrs)[...] += np.einsum(
                    "nfpq,fc->ncpq", dy[:, g * fg:(g + 1) * fg], w[g * fg:(g + 1) * fg, :, i, j])
    return dxp[:, :, pt:pt + h, pl:pl + wd].astype(dy.dtype)


def conv_grad_filter_reference(x, dy, filter_shape, strides, pads, dilation, groups):
    attrs = {"strides": strides, "dilation": dilation}
    f, cg, kh, kw = filter_shape
    oh, ow = dy.shape[2], dy.shape[3]
    xp = _pad(x, pads)
    fg = f // groups
    dw = np.zeros(filter_shape, dtype=np.float64)
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                dw[g * fg:(g + 1) * fg, :, i, j] = np.einsum(
                    "nfpq,ncpq->fc", dy[:, g * fg:(g + 1) * fg], _windows(xg, i, j, oh, ow, attrs))
    return dw.astype(x.dtype)


def _conv_attrs(node) -> dict:
    return {k: node.attr(k) for k in ("strides", "pads", "dilation", "groups")}


def _conv_grad(e, node, dy):
    x, w = node.inputs
    attrs = _conv_attrs(node)
    dx = e.op("conv2d_grad_input", dy, w, input_shape=e.type(x).shape, **attrs)
    dw = e.op("conv2d_grad_filter", x, dy, filter_shape=e.type(w).shape, **attrs)
    return [dx, dw]


def _infer_grad_input(inputs: list, attrs: dict) -> TensorType:
    dy, w = inputs
    return TensorType(tuple(attrs["input_shape"]), dy.dtype)


def _infer_grad_filter(inputs: list, attrs: dict) -> TensorType:
    x, dy = inputs
    return TensorType(tuple(attrs["filter_shape"]), x.dtype)


register(OpRule("conv2d", "window", _infer_conv, conv_reference, _conv_grad))
def _conv_grad_input_grad(e, node, dy):
    # conv2d_grad_input is linear in both inputs and is the adjoint of conv2d in its input: its
    # gradient is a convolution (for dy) and a filter gradient (for w).  flow.nn.conv2d_transpose
    # is this op, so it trains.
    grad_out, w = node.inputs
    attrs = _conv_attrs(node)
    d_grad_out = e.op("conv2d", dy, w, **attrs)
    dw = e.op("conv2d_grad_filter", dy, grad_out, filter_shape=e.type(w).shape, **attrs)
    return [d_grad_out, dw]


register(OpRule("conv2d_grad_input", "window", _infer_grad_input, conv_grad_input_reference, _conv_grad_input_grad))
register(OpRule("conv2d_grad_filter", "window", _infer_grad_filter, conv_grad_filter_reference, differentiable=False))


# --- pooling -------------------------------------------------------------------------------

def _infer_pool(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        (x,) = inputs
        if len(x.shape) != 4 or x.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: needs a 4-D float input (NCHW), got {x}")
        (kh, kw), (sh, sw), (pt, pb, pl, pr) = attrs["ksize"], attrs["strides"], attrs["pads"]
        oh, ow = out_size(x.shape[2], kh, sh, pt, pb, 1), out_size(x.shape[3], kw, sw, pl, pr, 1)
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"{op}: a {kh}x{kw} window does not fit a {x.shape[2]}x{x.shape[3]} input")
        return TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)
    return infer


def _pool_windows(x: np.ndarray, ksize, strides, pads, fill: float):
    """(N, C, OH, OW, KH*KW) windows of the padded input, and a mask of the real (unpadded) taps."""
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = ksize, strides, pads
    n, c, h, w = x.shape
    oh, ow = out_size(h, kh, sh, pt, pb, 1), out_size(w, kw, sw, pl, pr, 1)
    xp = np.full((n, c, h + pt + pb, w + pl + pr), fill, dtype=np.float64)
    xp[:, :, pt:pt + h, pl:pl + w] = x
    real = np.zeros((h + pt + pb, w + pl + pr), dtype=bool)
    real[pt:pt + h, pl:pl + w] = True
    taps, masks = [], []
    for i in range(kh):
        for j in range(kw):
            taps.append(xp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw])
            masks.append(real[i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw])
    return np.stack(taps, axis=-1), np.stack(masks, axis=-1)


def max_pool_reference(x, ksize, strides, pads):
    windows, _ = _pool_windows(x, ksize, strides, pads, -np.inf)
    return windows.max(axis=-1).astype(x.dtype)


def avg_pool_reference(x, ksize, strides, pads):
    # Padding does not count in the average (TensorFlow's and OneFlow's "SAME" rule).
    windows, real = _pool_windows(x, ksize, strides, pads, 0.0)
    return (windows.sum(axis=-1) / real.sum(axis=-1)).astype(x.dtype)


def _scatter_windows(dx_shape, ksize, strides, pads, per_tap) -> np.ndarray:
    """Sum per-tap contributions (N, C, OH, OW, KH*KW) back onto the input grid."""
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = ksize, strides, pads
    n, c, h, w = dx_shape
    oh, ow = per_tap.shape[2], per_tap.shape[3]
    dxp = np.zeros((n, c, h + pt + pb, w + pl + pr), dtype=np.float64)
    for t in range(kh * kw):
        i, j = divmod(t, kw)
        dxp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw] += per_tap[..., t]
    return dxp[:, :, pt:pt + h, pl:pl + w]


def max_pool_grad_reference(x, dy, ksize, strides, pads):
    windows, real = _pool_windows(x, ksize, strides, pads, -np.inf)
    # dy goes to the window's first NaN, else its first maximum (row-major, like the kernel), among
    # the real taps: a window of -inf does not send it into the padding.
    nan = np.isnan(windows) & real
    is_max = real & (windows == np.max(windows, axis=-1, keepdims=True))
    first_max = np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), np.argmax(is_max, axis=-1))
    per_tap = np.zeros(windows.shape)
    np.put_along_axis(per_tap, first_max[..., None], dy[..., None].astype(np.float64), axis=-1)
    return _scatter_windows(x.shape, ksize, strides, pads, per_tap).astype(x.dtype)


def avg_pool_grad_reference(dy, input_shape, ksize, strides, pads):
    zeros = np.zeros(input_shape)
    _, real = _pool_windows(zeros, ksize, strides, pads, 0.0)
    count = real.sum(axis=-1)
    per_tap = (dy / count)[..., None] * real
    return _scatter_windows(input_shape, ksize, strides, pads, per_tap).astype(dy.dtype)


def _pool_attrs(node) -> dict:
    return {k: node.attr(k) for k in ("ksize", "strides", "pads")}


def _max_pool_grad(e, node, dy):
    return [e.op("max_pool2d_grad", node.inputs[0], dy, **_pool_attrs(node))]


def _avg_pool_grad(e, node, dy):
    return [e.op("avg_pool2d_grad", dy, input_shape=e.type(node.inputs[0]).shape, **_pool_attrs(node))]


def _infer_max_pool_grad(inputs: list, attrs: dict) -> TensorType:
    x, dy = inputs
    return TensorType(x.shape, x.dtype)


def _infer_avg_pool_grad(inputs: list, attrs: dict) -> TensorType:
    (dy,) = inputs
    return TensorType(tuple(attrs["input_shape"]), dy.dtype)


register(OpRule("max_pool2d", "window", _infer_pool("max_pool2d"), max_pool_reference, _max_pool_grad))
register(OpRule("avg_pool2d", "window", _infer_pool("avg_pool2d"), avg_pool_reference, _avg_pool_grad))
register(OpRule("max_pool2d_grad", "window", _infer_max_pool_grad, max_pool_grad_reference, differentiable=False))
register(OpRule("avg_pool2d_grad", "window", _infer_avg_pool_grad, avg_pool_grad_reference, differentiable=False))
