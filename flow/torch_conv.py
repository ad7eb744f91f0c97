"""`flow.nn.torch_conv2d_transpose`: OneFlow 0.3's PyTorch-style transposed convolution.

PyTorch's `ConvTranspose2d` describes the output by the padding the forward convolution had, not by
the output's shape as `flow.nn.conv2d_transpose` does.  Per spatial axis, with input size `n`,
kernel `k`, stride `s`, dilation `d`, `padding_needed` `P` (even: P / 2 rows on each side) and
`output_padding` `op`:

    out = (n - 1) * s - P + (k - 1) * d + 1 + op

It is the "full" transposed convolution (every input element scatters `k` taps, `d` apart, at
stride `s`: `(n - 1) * s + (k - 1) * d + 1` rows), with P / 2 rows cropped at the start and
P / 2 - op at the end; where `op` is larger than P / 2 the output runs past the full one and
those rows are zero (OneFlow's deconv2d kernel and PyTorch agree).

flowc has no deconvolution op of its own: `flow.nn.conv2d_transpose` is `conv2d_grad_input`, the
gradient of a convolution with respect to its input, whose `pads` crop the full output.  This
module emits that op with the crop P / 2 before and max(P / 2 - op, 0) after, then appends the
max(op - P / 2, 0) zero rows with `flow.pad`, so the cropped rows are never computed and the
gradients (a convolution and a filter gradient) are the op's own.

Example:
    up = flow.nn.torch_conv2d_transpose(x, w, output_padding=(1, 1), strides=2, padding_needed=(2, 2))
    # x (N, 16, 8, 8), w (16, 8, 3, 3): up is (N, 8, 16, 16), as nn.ConvTranspose2d(16, 8, 3, 2, 1, 1)
"""
from __future__ import annotations

from typing import Any

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import FLOAT_DTYPES
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import check_blob

_API = "flow.nn.torch_conv2d_transpose"


def _fail(message: str) -> TraceError:
    return TraceError(f"{user_location()}: {_API}: {message}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _two_ints(value: Any, arg: str, what: str, allow_int: bool, minimum: int) -> tuple[int, int]:
    """`value` as (height, width): a sequence of two ints (an int too where OneFlow takes one), each
    at least `minimum`; anything else is an error naming `arg`."""
    if allow_int and _is_int(value):
        value = (value, value)
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(_is_int(v) for v in value):
        form = "an int or a list of 2 ints" if allow_int else "a list of 2 ints (height, width)"
        raise _fail(f"{arg} must be {form}, got {value!r}")
    if min(value) < minimum:
        raise _fail(f"{arg} must be {what}, got {list(value)}")
    return int(value[0]), int(value[1])


def torch_conv2d_transpose(value=None, filter=None, output_padding=None, strides=None,  # noqa: A002
                           padding_needed=None, data_format: str = "NCHW", name: str | None = None,
                           input=None, filters=None, dilations=None) -> Blob:  # noqa: A002
    """`flow.nn.torch_conv2d_transpose(value, filter, output_padding, strides, padding_needed,
    data_format="NCHW", name=None, input=None, filters=None, dilations=None)`: a transposed
    convolution set up as PyTorch's `ConvTranspose2d` is.

    `filter` is (in_channels, out_channels, kh, kw) for "NCHW" and (in_channels, kh, kw, out_channels)
    for "NHWC" (no groups, as in OneFlow).  `strides` is an int or 2 ints; `padding_needed` is 2 even
    ints, the total padding of each spatial axis (PyTorch's `padding` is half of it); `output_padding`
    is 2 ints, the rows and columns added at the end; `dilations` (None: 1) is an int or 2 ints, and
    must be 1 for "NHWC" (OneFlow's rule).  Each output axis is
    `(in - 1) * stride - padding_needed + (k - 1) * dilation + 1 + output_padding`.
    `input` and `filters` are OneFlow's aliases of `value` and `filter`.

    Example:
        y = flow.nn.torch_conv2d_transpose(x, w, output_padding=[1, 1], strides=2, padding_needed=[2, 2])
    """
    if (value is None) == (input is None):
        raise _fail("pass exactly one of value and input")
    if (filter is None) == (filters is None):
        raise _fail("pass exactly one of filter and filters")
    x = check_blob(value if value is not None else input, _API, "value" if value is not None else "input")
    w = check_blob(filter if filter is not None else filters, _API, "filter" if filter is not None else "filters")
    if len(x.shape) != 4:
        raise _fail(f"value must be 4-D, got shape {list(x.shape)}")
    if len(w.shape) != 4:
        raise _fail(f"filter must be 4-D, got shape {list(w.shape)}")
    if x.type.dtype not in FLOAT_DTYPES or w.type.dtype != x.type.dtype:
        raise _fail(f"value and filter must be floating point of one dtype, got {x.type.dtype} and {w.type.dtype}")
    layout = data_format.upper() if isinstance(data_format, str) else data_format
    if layout not in ("NCHW", "NHWC"):
        raise _fail(f"data_format must be \"NCHW\" or \"NHWC\", got {data_format!r}")
    dilation = (1, 1) if dilations is None else _two_ints(dilations, "dilations", "positive", True, 1)
    if layout == "NHWC" and dilation != (1, 1):
        raise _fail(f"dilations must be 1 with data_format \"NHWC\" (OneFlow's rule), got {dilations!r}")
    stride = _two_ints(strides, "strides", "positive", True, 1)
    # OneFlow takes these as lists only: its deconv2d op has list attributes and no default for them
    needed = _two_ints(padding_needed, "padding_needed", "non-negative", False, 0)
    if needed[0] % 2 or needed[1] % 2:
        raise _fail(f"padding_needed must be even on each axis (half of it pads each side), got {list(needed)}")
    extra_rows = _two_ints(output_padding, "output_padding", "non-negative", False, 0)

    channels = x.shape[1] if layout == "NCHW" else x.shape[3]
    if w.shape[0] != channels:        # in_channels come first in both layouts (OneFlow's deconv2d)
        axes = "in_channels, out_channels, kh, kw" if layout == "NCHW" else "in_channels, kh, kw, out_channels"
        raise _fail(f"filter {list(w.shape)} ({axes}) needs value's {channels} channels as its in_channels, "
                    f"not {w.shape[0]}")
    if layout == "NHWC":            # flowc's convolutions are NCHW; the filter's channels move likewise
        x = emit("transpose", [x], {"perm": (0, 3, 1, 2)}, api=_API)
        w = emit("transpose", [w], {"perm": (0, 3, 1, 2)}, api=_API)

    computed: list[int] = []         # the output rows the op computes, per axis
    pads: list[int] = []             # (before, after) per axis: the crop of the full output
    zeros: list[int] = []            # the zero rows past the full output, per axis
    for axis in range(2):
        n, k, s, d = x.shape[2 + axis], w.shape[2 + axis], stride[axis], dilation[axis]
        full = (n - 1) * s + (k - 1) * d + 1
        before, op = needed[axis] // 2, extra_rows[axis]
        out = full - 2 * before + op
        if out < 1:
            raise _fail(f"padding_needed {list(needed)} crops all {full} rows of axis {axis} (input {n}, "
                        f"kernel {k}, stride {s}, dilation {d}); the output would have {out}")
        after = max(before - op, 0)
        if full - before - after < 1:
            raise _fail(f"padding_needed {list(needed)} crops all {full} rows of axis {axis}; only "
                        f"output_padding's zeros would be left")
        computed.append(full - before - after)
        pads += [before, after]
        zeros.append(max(op - before, 0))

    y = emit("conv2d_grad_input", [x, w], {"input_shape": (x.shape[0], w.shape[1], computed[0], computed[1]),
                                           "strides": stride, "pads": tuple(pads), "dilation": dilation,
                                           "groups": 1}, name=name or "", api=_API)
    if any(zeros):
        from flow.indexing import pad    # here, not at the top: flow.nn imports this module early
        y = pad(y, ((0, 0), (0, 0), (0, zeros[0]), (0, zeros[1])))
    return emit("transpose", [y], {"perm": (0, 2, 3, 1)}, api=_API) if layout == "NHWC" else y
