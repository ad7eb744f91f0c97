"""`flow.nn.PixelShuffle` and `flow.nn.PixelShufflev2`: sub-pixel convolution's rearrangement.

(B, C * rh * rw, H, W) becomes (B, C, H * rh, W * rw): output pixel (h * rh + i, w * rw + j) of
channel c is input channel c * rh * rw + i * rw + j at (h, w), as OneFlow's reshape-transpose-reshape
computes it.

Example:
    up = flow.nn.PixelShuffle(features, upscale_factor=2)          # (1, 12, 8, 8) -> (1, 3, 16, 16)
"""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, user_location
from flow._ops import check_blob


def PixelShuffle(input, upscale_factor: int, name: str | None = None) -> Blob:  # noqa: N802,A002
    """`flow.nn.PixelShuffle(input, upscale_factor)`: PixelShufflev2 with one factor for both axes.

    Example:
        up = flow.nn.PixelShuffle(x, upscale_factor=2)
    """
    return PixelShufflev2(input, upscale_factor, upscale_factor, name=name)


def PixelShufflev2(input, h_upscale_factor: int, w_upscale_factor: int, name: str | None = None  # noqa: N802,A002
                   ) -> Blob:
    """`flow.nn.PixelShufflev2(input, h_upscale_factor, w_upscale_factor)`: (B, C * rh * rw, H, W) ->
    (B, C, H * rh, W * rw).

    Example:
        up = flow.nn.PixelShufflev2(x, h_upscale_factor=2, w_upscale_factor=4)
    """
    from flow.array_ops import reshape, transpose
    api = "flow.nn.PixelShufflev2"
    x = check_blob(input, api, "input")
    rh, rw = h_upscale_factor, w_upscale_factor
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in (rh, rw)):
        raise TraceError(f"{user_location()}: {api}: the upscale factors must be positive ints, got {rh!r}, {rw!r}")
    if len(x.shape) != 4 or x.shape[1] % (rh * rw):
        raise TraceError(f"{user_location()}: {api}: input must be 4-D (B, C, H, W) with C divisible by "
                         f"{rh} * {rw}, got {list(x.shape)}")
    b, c, h, w = x.shape
    channels = c // (rh * rw)
    out = transpose(reshape(x, [b, channels, rh, rw, h, w]), perm=[0, 1, 4, 2, 5, 3])
    return reshape(out, [b, channels, h * rh, w * rw], name=name)
