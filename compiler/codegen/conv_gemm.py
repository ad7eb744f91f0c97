"""Which convolutions are plain GEMMs, decided from their static shapes at codegen time.

Two forms (groups == 1, NCHW), each with its three kernels in codegen_templates/cpu/conv_as_gemm.j2:

* "pixel": one output pixel per image (OH = OW = 1: ResNet-18's last stage at 32x32, where a 3x3
  pad-1 convolution sees a 1x1 input).  A kernel tap that lands in the padding for that pixel never
  meets real input (a *dead* tap); every live tap reads one input pixel.  When the live taps cover
  every input pixel, x of all images is one (N, C*H*W) row-major matrix and
      out (N, F) = x (N, C*H*W) @ Wl^T,   Wl[f, (c, h, w)] = W[f, c, tap(h, w)],
  one GEMM for the batch, its gradients two more.  Input pixels that no tap reads (a stride longer
  than the kernel: a strided 1x1 shortcut over 2x2) are left out: x's read pixels are gathered
  first ("gathered"), and dx is 0 at the others.
* "pointwise": a 1x1 kernel without padding (ResNet-50's bottlenecks and projection shortcuts): per
  image out_n (F, OH*OW) = W (F, C) @ x_n (C, OH*OW), with x_n subsampled first when strided; for
  one image, or at least 64 output pixels per image.

The NumPy reference multiplies the padding's zeros by the weights (compiler/ops/conv.py), so a NaN
or infinite weight at a dead tap makes that filter's outputs NaN, and a NaN or infinite dy makes
the dead taps' weight gradient NaN: the kernels reproduce both (see conv_as_gemm.j2).

Example:
    >>> conv_gemm_plan(dict(N=32, C=512, H=1, W=1, F=512, KH=3, KW=3, OH=1, OW=1, sh=1, sw=1,
    ...                     pt=1, pl=1, dh=1, dw=1, groups=1, padded=True))["pixel_taps"]
    [4]
"""
from __future__ import annotations

from typing import Any

POINTWISE_MIN_PIXELS = 64


def conv_gemm_plan(geo: dict[str, Any]) -> dict[str, Any] | None:
    """The GEMM form of a convolution with geometry `geo` (conv_context's keys), or None.

    `padded` says whether the convolution has any padding at all (pads are 4 numbers; the
    context keeps only top and left).
    """
    if geo["groups"] != 1:
        return None     # grouped convolutions keep the tiled kernels (one GEMM per group would do)
    if geo["OH"] == 1 and geo["OW"] == 1:
        read = _pixel_taps(geo)
        if not read:
            return None     # every tap in the padding (the general kernels write the zeros)
        kk = geo["KH"] * geo["KW"]
        pixels = sorted(read)
        taps = [read[p] for p in pixels]
        return {"form": "pixel", "pixels": pixels, "pixel_taps": taps,
                "dead_taps": sorted(set(range(kk)) - set(taps)),
                "tap_pixel": [taps.index(t) if t in taps else -1 for t in range(kk)],
                "gathered": len(pixels) < geo["H"] * geo["W"]}
    # Per image, the GEMM packs all of W for OH*OW columns: with fewer than 64 and several images
    # the tiled kernels, which take the images' pixels together, do better (a strided 1x1 shortcut
    # over 8x8, batch 32: 0.3 ms there against 1 ms).
    if geo["KH"] == geo["KW"] == 1 and not geo["padded"] and (geo["N"] == 1 or geo["P"] >= POINTWISE_MIN_PIXELS):
        return {"form": "pointwise", "strided": geo["sh"] != 1 or geo["sw"] != 1}
    return None


def _pixel_taps(geo: dict[str, Any]) -> dict[int, int]:
    """{input pixel (h * W + w): the tap (i * KW + j) that reads it} for the only output pixel."""
    at: dict[int, int] = {}
    for i in range(geo["KH"]):
        r = i * geo["dh"] - geo["pt"]
        for j in range(geo["KW"]):
            q = j * geo["dw"] - geo["pl"]
            if 0 <= r < geo["H"] and 0 <= q < geo["W"]:
                at[r * geo["W"] + q] = i * geo["KW"] + j
    return at
