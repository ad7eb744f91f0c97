"""Argument handling shared by the flow op functions: OneFlow's names in, IR nodes out."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.ops.reductions import normalize_axes
from flowc.compiler.ops import ShapeError
from flowc.compiler.trace import Blob, emit, user_location


def check_blob(x, api: str, arg: str) -> Blob:
    if not isinstance(x, Blob):
        raise TraceError(f"{user_location()}: {api}: argument {arg!r} must be a Blob (a placeholder or an op "
                         f"result), got {type(x).__name__}")
    return x


def axes(x: Blob, axis, api: str) -> tuple[int, ...]:
    try:
        return normalize_axes(axis, len(x.shape), api)
    except ShapeError as err:
        raise TraceError(f"{user_location()}: {err}") from None


def along_last_axis(x: Blob, axis: int, api: str, fn):
    """Apply a last-axis op along `axis` by moving that axis to the end and back."""
    (ax,) = axes(x, axis, api)
    last = len(x.shape) - 1
    if ax == last:
        return fn(x)
    # Move `axis` to the end keeping the others in order, so an op that drops the
    # last axis leaves the remaining axes in their original order.
    perm = [d for d in range(last + 1) if d != ax] + [ax]
    moved = fn(emit("transpose", [x], {"perm": tuple(perm)}, api=api))
    if len(moved.shape) == len(x.shape):
        inverse = [perm.index(d) for d in range(last + 1)]
        return emit("transpose", [moved], {"perm": tuple(inverse)}, api=api)
    return moved


def pair(value, api: str, arg: str) -> tuple[int, int]:
    """An int or a pair of ints (OneFlow accepts both for kernel sizes, strides, dilations); None is 1,
    as in OneFlow (MobileNetV3's pools pass strides=None)."""
    if value is None:
        return (1, 1)
    if isinstance(value, int):
        return (value, value)
    items = tuple(int(v) for v in value)
    if len(items) == 1:
        return (items[0], items[0])
    if len(items) != 2:
        raise TraceError(f"{user_location()}: {api}: {arg} must be an int or a pair, got {value!r}")
    return items


def spatial_pads(padding, size: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int],
                 dilation: tuple[int, int], data_format: str, api: str) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) for "SAME", "SAME_LOWER", "SAME_UPPER", "VALID" or explicit padding.

    The SAME modes pad so the output is ceil(input / stride).  When the padding is odd, "SAME_UPPER"
    puts the extra row or column at the bottom or right (TensorFlow's rule) and "SAME_LOWER" at the
    top or left; OneFlow's "SAME" is "SAME_LOWER" (its nn.conv2d and pools map one to the other;
    `flow.nn.compat_conv2d` is the TensorFlow-style convolution).  Explicit padding is an int, a pair
    (height, width), or one (before, after) pair per dimension of the input's layout.
    """
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return (0, 0, 0, 0)
        if mode in ("SAME", "SAME_UPPER", "SAME_LOWER"):
            pads = []
            for n, k, s, d in zip(size, kernel, strides, dilation):
                out = -(-n // s)
                total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
                small = total // 2     # SAME and SAME_LOWER put the odd row or column first
                pads += [small, total - small] if mode == "SAME_UPPER" else [total - small, small]
            top, bottom, left, right = pads
            return (top, bottom, left, right)
        raise TraceError(f"{user_location()}: {api}: padding must be \"SAME\", \"SAME_LOWER\", \"SAME_UPPER\", "
                         f"\"VALID\" or explicit, "
                         f"got {padding!r}")
    if isinstance(padding, int):
        return (padding, padding, padding, padding)
    items = list(padding)
    if len(items) == 4:       # one int or (before, after) pair per dimension of the layout, as OneFlow reads it
        per_dim = [_before_after(p, padding, api) for p in items]
        spatial = (2, 3) if data_format.startswith("NC") or data_format == "channels_first" else (1, 2)
        if any(per_dim[d] != (0, 0) for d in range(4) if d not in spatial):
            raise TraceError(f"{user_location()}: {api}: padding {padding!r} pads the batch or channel axis of "
                             f"{data_format!r}: only the spatial axes can be padded")
        (top, bottom), (left, right) = per_dim[spatial[0]], per_dim[spatial[1]]
        return (top, bottom, left, right)
    if len(items) == 2 and all(isinstance(p, int) for p in items):
        return (items[0], items[0], items[1], items[1])
    if len(items) == 2 and all(isinstance(p, (list, tuple)) for p in items):
        return (int(items[0][0]), int(items[0][1]), int(items[1][0]), int(items[1][1]))
    raise TraceError(f"{user_location()}: {api}: cannot read padding {padding!r}")


def _before_after(pad, padding, api: str) -> tuple[int, int]:
    """One dimension's entry of an explicit padding: an int (both sides) or a (before, after) pair."""
    if isinstance(pad, int):
        return (pad, pad)
    if isinstance(pad, (list, tuple)) and len(pad) == 2 and all(isinstance(p, int) for p in pad):
        return (pad[0], pad[1])
    raise TraceError(f"{user_location()}: {api}: cannot read padding {padding!r}: each entry must be an int or "
                     f"a (before, after) pair, got {pad!r}")


def to_nchw(x: Blob, data_format: str, api: str) -> Blob:
    if data_format in ("NCHW", "channels_first"):
        return x
    if data_format in ("NHWC", "channels_last"):
        return emit("transpose", [x], {"perm": (0, 3, 1, 2)}, api=api)
    raise TraceError(f"{user_location()}: {api}: data_format must be \"NCHW\" or \"NHWC\", got {data_format!r}")


def from_nchw(y: Blob, data_format: str, api: str) -> Blob:
    if data_format in ("NHWC", "channels_last"):
        return emit("transpose", [y], {"perm": (0, 2, 3, 1)}, api=api)
    return y


def iota(n: int, dtype: str, api: str) -> Blob:
    """The constant [0, 1, ..., n-1] of `dtype`, built from constants by doubling (log2(n) concats and
    one slice; the compiler folds it): there is no range op to lower."""
    out = emit("constant", [], {"value": 0, "shape": (1,), "dtype": dtype}, api=api)
    size = 1
    while size < n:
        out = emit("concat", [out, out + size], {"axis": 0}, api=api)
        size *= 2
    if size != n:
        out = emit("strided_slice", [out], {"start": (0,), "step": (1,), "shape": (n,)}, api=api)
    return out
