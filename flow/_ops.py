"""Argument handling shared by the flow op functions: OneFlow's names in, IR nodes out."""
from __future__ import annotations

from compiler.errors import TraceError
from compiler.ops.reductions import normalize_axes
from compiler.ops import ShapeError
from compiler.trace import Blob, emit, user_location


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
