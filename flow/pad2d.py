"""`flow.reflection_pad2d`, `flow.replication_pad2d` and `flow.constant_pad2d` on NCHW Blobs.

`padding` is an int (every side) or OneFlow's four [left, right, top, bottom], each smaller than
the axis it pads.  Reflection and replication are gathers along H and then W at index vectors
computed from an iota (so the compiler folds them to constants); their gradient is the gathers'
scatter-add, which sums what a reflected or repeated element receives.  `constant_pad2d` is `flow.pad`.

Example:
    framed = flow.reflection_pad2d(images, padding=[2, 2, 1, 1])    # (N, C, H + 2, W + 4)
"""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import check_blob, iota
from flow.indexing import identity


def reflection_pad2d(x, padding, name: str | None = None) -> Blob:
    """`flow.reflection_pad2d(x, padding)`: x (NCHW) padded with its mirror image, the edge row or
    column not repeated (x[..., 1], x[..., 0] | x[..., 0], x[..., 1], ...).

    Example:
        y = flow.reflection_pad2d(x, padding=1)
    """
    return _gathered(x, padding, "flow.reflection_pad2d", _reflected, name)


def replication_pad2d(x, padding, name: str | None = None) -> Blob:
    """`flow.replication_pad2d(x, padding)`: x (NCHW) padded with copies of its edge rows and columns.

    Example:
        y = flow.replication_pad2d(x, padding=[1, 1, 2, 0])
    """
    return _gathered(x, padding, "flow.replication_pad2d", _replicated, name)


def constant_pad2d(x, padding, constant_value=0, name: str | None = None) -> Blob:
    """`flow.constant_pad2d(x, padding, constant_value=0)`: x (NCHW) padded with `constant_value`.

    Example:
        y = flow.constant_pad2d(x, padding=2, constant_value=1.5)
    """
    from flow.indexing import pad
    api = "flow.constant_pad2d"
    x = check_blob(x, api, "x")
    left, right, top, bottom = _sides(x, padding, api)
    return pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_value, name=name)


def _sides(x: Blob, padding, api: str) -> tuple[int, int, int, int]:
    """(left, right, top, bottom), checked as OneFlow asserts: each smaller than the axis it pads."""
    if len(x.shape) != 4:
        raise TraceError(f"{user_location()}: {api}: x must be 4-D NCHW, got {list(x.shape)}")
    if isinstance(padding, int) and not isinstance(padding, bool):
        sides = (padding,) * 4
    elif isinstance(padding, (list, tuple)) and len(padding) == 4 and all(
            isinstance(p, int) and not isinstance(p, bool) for p in padding):
        sides = tuple(padding)
    else:
        raise TraceError(f"{user_location()}: {api}: padding must be an int or [left, right, top, bottom], got "
                         f"{padding!r}")
    h, w = x.shape[2], x.shape[3]
    if min(sides) < 0 or max(sides[:2]) >= w or max(sides[2:]) >= h:
        raise TraceError(f"{user_location()}: {api}: padding {list(sides)} must be >= 0 and smaller than the "
                         f"width {w} (left, right) and height {h} (top, bottom)")
    return sides


def _reflected(size: int, before: int, after: int, api: str) -> Blob:
    """The source index of each padded position j: with i = j - before, (n - 1) - |(n - 1) - |i||
    (i for 0 <= i < n, -i before the start, 2(n - 1) - i past the end)."""
    from flow import math
    i = iota(size + before + after, "int32", api) - before
    last = size - 1
    return last - math.abs(last - math.abs(i))


def _replicated(size: int, before: int, after: int, api: str) -> Blob:
    """The source index of each padded position j: j - before, clamped to [0, n - 1]."""
    from flow import math
    i = iota(size + before + after, "int32", api) - before
    return math.minimum(math.maximum(i, 0), size - 1)


def _gathered(x, padding, api: str, index, name: str | None) -> Blob:
    x = check_blob(x, api, "x")
    left, right, top, bottom = _sides(x, padding, api)
    out = x
    for axis, (before, after) in ((2, (top, bottom)), (3, (left, right))):
        if before or after:
            rows = index(x.shape[axis], before, after, api)
            out = emit("gather", [out, rows], {"axis": axis, "batch_dims": 0}, api=api)
    return identity(out, name=name) if name else out
