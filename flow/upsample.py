"""`flow.layers.upsample_2d`: OneFlow 0.3's upsample op, composed of views, gathers and a lerp, so its
gradient is theirs (a sum over the copies, a scatter-add of the weights).

Nearest repeats each row and column `size` times (OneFlow's index floor(out / scale)).  Bilinear reads
the source coordinate (out + 0.5) / scale - 0.5, clamped at 0, and mixes its two neighbours, the last
row or column standing in for the one past the edge (OneFlow's kernel; PyTorch's align_corners=False).

Example:
    bigger = flow.layers.upsample_2d(feature_map, size=2)                       # NCHW, nearest
    smooth = flow.layers.upsample_2d(x, size=(2, 3), interpolation="bilinear")
"""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import check_blob, from_nchw, iota, to_nchw

API = "flow.layers.upsample_2d"


def _scales(size) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else ()
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in pair):
        raise TraceError(f"{user_location()}: {API}: size must be an int or a pair of ints >= 1 (the height and "
                         f"width scales), got {size!r}")
    return pair[0], pair[1]


def _repeat(x: Blob, axis: int, times: int) -> Blob:
    """Each slice of `axis` `times` times in a row: a view, a broadcast and a view."""
    if times == 1:
        return x
    shape = tuple(x.shape)
    spread = shape[:axis + 1] + (times,) + shape[axis + 1:]
    expanded = emit("reshape", [x], {"shape": shape[:axis + 1] + (1,) + shape[axis + 1:]}, api=API)
    tiled = emit("broadcast_to", [expanded], {"shape": spread}, api=API)
    return emit("reshape", [tiled], {"shape": shape[:axis] + (shape[axis] * times,) + shape[axis + 1:]}, api=API)


def _lerp(x: Blob, axis: int, times: int) -> Blob:
    """Bilinear along one axis: out[o] = (1 - t) x[lo] + t x[hi] at the source coordinate of o."""
    if times == 1:
        return x
    from flow import math
    size = x.shape[axis]
    out = size * times
    dtype = x.type.dtype
    positions = emit("cast", [iota(out, "int32", API)], {"dtype": dtype}, api=API)
    source = math.maximum((positions + 0.5) * (1.0 / times) - 0.5, 0.0)      # the kernel's order of operations
    low_float = math.floor(source)
    low = emit("cast", [low_float], {"dtype": "int32"}, api=API)
    high = math.minimum(low + 1, size - 1)
    weight = source - low_float
    weight = emit("reshape", [weight], {"shape": (out,) + (1,) * (len(x.shape) - axis - 1)}, api=API)
    below = emit("gather", [x, low], {"axis": axis, "batch_dims": 0}, api=API)
    above = emit("gather", [x, high], {"axis": axis, "batch_dims": 0}, api=API)
    return below + (above - below) * weight


def upsample_2d(x, size=(2, 2), data_format: str = "NCHW", interpolation: str = "nearest",
                name: str = "Upsample2D") -> Blob:
    """`flow.layers.upsample_2d(x, size=(2, 2), data_format="NCHW", interpolation="nearest")`: a 4-D
    blob's height and width times `size` (an int or (height_scale, width_scale)), by "nearest" or
    "bilinear" interpolation.

    Example:
        up = flow.layers.upsample_2d(x, size=2, interpolation="bilinear")
    """
    blob = check_blob(x, API, "x")
    height_scale, width_scale = _scales(size)
    if interpolation not in ("nearest", "bilinear"):
        raise TraceError(f"{user_location()}: {API}: interpolation must be \"nearest\" or \"bilinear\", "
                         f"got {interpolation!r}")
    if len(blob.shape) != 4 or str(data_format).upper() not in ("NCHW", "NHWC"):
        raise TraceError(f"{user_location()}: {API}: x must be 4-D in \"NCHW\" or \"NHWC\", got "
                         f"{list(blob.shape)} and {data_format!r}")
    if not blob.type.dtype.startswith("float"):
        raise TraceError(f"{user_location()}: {API}: x must be floating point, got {blob.type.dtype}")
    layout = str(data_format).upper()
    y = to_nchw(blob, layout, API)
    along = _repeat if interpolation == "nearest" else _lerp
    y = along(along(y, 2, height_scale), 3, width_scale)
    y = from_nchw(y, layout, API)
    return emit("reshape", [y], {"shape": y.shape}, name=name or "", api=API)
