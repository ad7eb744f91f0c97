"""`flow.nn.conv3d` and `flow.layers.conv3d`, composed of 2-D convolutions.

A 3-D convolution is the sum, over the kernel's depth taps, of 2-D convolutions: for tap `kd`, the
input's depth slices `kd * dilation + stride * t` (t = 0 .. depth_out - 1) each meet the kernel's
slice `kd`.  Putting those slices into the batch makes each tap one `conv2d` over
(N * depth_out) images, so a (3, 3, 3) kernel is three convolutions, and their gradients, CPU and
GPU kernels are conv2d's own.  The depth padding is an explicit zero pad first.

Example:
    y = flow.nn.conv3d(video, w, strides=1, padding="SAME")                 # (N, C, D, H, W)
    y = flow.layers.conv3d(video, 16, 3, padding="SAME", activation=flow.nn.relu, name="c3d")
"""
from __future__ import annotations

from typing import Callable

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, current, emit, user_location
from flow._ops import check_blob

_CHANNELS_LAST = ("NDHWC", "channels_last")
_CHANNELS_FIRST = ("NCDHW", "channels_first")


def conv3d(input, filters, strides, padding, data_format: str = "NCDHW", dilations=None, groups: int = 1,  # noqa: A002
           name: str | None = None) -> Blob:
    """`flow.nn.conv3d(input, filters, strides, padding, data_format="NCDHW", dilations=None, groups=1)`.

    `filters` is (out, in/groups, kd, kh, kw) for "NCDHW" and (out, kd, kh, kw, in) for "NDHWC"
    (which, as in OneFlow, takes no groups); padding is "SAME" (OneFlow's "SAME_LOWER"),
    "SAME_UPPER", "VALID", or one int or (before, after) pair per axis of the layout.

    Example:
        y = flow.nn.conv3d(x, w, strides=(1, 2, 2), padding="VALID")
    """
    from flow.indexing import pad, slice_v2
    from flow.nn import _sequence, _window_pads, conv2d
    api = "flow.nn.conv3d"
    x, w = check_blob(input, api, "input"), check_blob(filters, api, "filters")
    if len(x.shape) != 5 or len(w.shape) != 5 or data_format not in _CHANNELS_FIRST + _CHANNELS_LAST:
        raise TraceError(f"{user_location()}: {api}: input and filters must be 5-D in \"NCDHW\" or \"NDHWC\", got "
                         f"{list(x.shape)}, {list(w.shape)} and {data_format!r}")
    if data_format in _CHANNELS_LAST:
        if groups != 1:
            raise TraceError(f"{user_location()}: {api}: data_format {data_format!r} takes no groups (OneFlow's rule)")
        x = emit("transpose", [x], {"perm": (0, 4, 1, 2, 3)}, api=api)
        w = emit("transpose", [w], {"perm": (0, 4, 1, 2, 3)}, api=api)
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups or w.shape[0] % groups \
            or w.shape[1] * groups != x.shape[1]:
        raise TraceError(f"{user_location()}: {api}: input of {x.shape[1]} channels and filters {list(w.shape)} "
                         f"(NCDHW) do not fit groups={groups!r}")
    stride = _sequence(strides, 3, api, "strides")
    dilation = _sequence(1 if dilations is None else dilations, 3, api, "dilations")
    kernel = w.shape[2:]
    reach = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilation))    # the window's extent with dilation
    pads = _window_pads(padding, x.shape[2:], reach, stride, data_format, api)
    (front, back), (sd, sh, sw), (dd, dh, dw) = pads[0], stride, dilation
    depth_out = (x.shape[2] + front + back - reach[0]) // sd + 1
    if depth_out < 1:
        raise TraceError(f"{user_location()}: {api}: the kernel's depth {kernel[0]} (dilated {reach[0]}) does not "
                         f"fit the input's depth {x.shape[2]} with padding {pads[0]}")
    if front or back:
        x = pad(x, ((0, 0), (0, 0), (front, back), (0, 0), (0, 0)))
    n, c, _, h, wd = x.shape
    whole = (None, None, None)
    total: Blob | None = None
    for tap in range(kernel[0]):
        start = tap * dd
        # the depth slices this tap meets, one per output depth, moved into the batch
        taps = slice_v2(x, [whole, whole, (start, start + sd * (depth_out - 1) + 1, sd)])
        images = emit("reshape", [emit("transpose", [taps], {"perm": (0, 2, 1, 3, 4)}, api=api)],
                      {"shape": (n * depth_out, c, h, wd)}, api=api)
        w_tap = emit("reshape", [slice_v2(w, [whole, whole, (tap, tap + 1, 1)])],
                     {"shape": (w.shape[0], w.shape[1], kernel[1], kernel[2])}, api=api)
        part = conv2d(images, w_tap, (sh, sw), [(0, 0), (0, 0), pads[1], pads[2]], "NCHW", (dh, dw), groups)
        total = part if total is None else total + part
    assert total is not None
    y = emit("reshape", [total], {"shape": (n, depth_out, w.shape[0], total.shape[2], total.shape[3])}, api=api)
    if data_format in _CHANNELS_LAST:       # (N, depth_out, O, H, W) -> NDHWC; the returned op carries the name
        return emit("transpose", [y], {"perm": (0, 1, 3, 4, 2)}, name=name or "", api=api)
    return emit("transpose", [y], {"perm": (0, 2, 1, 3, 4)}, name=name or "", api=api)


def conv3d_layer(inputs, filters: int, kernel_size=1, strides=1, padding="VALID", data_format: str = "NCDHW",
          dilation_rate=None, activation: Callable | None = None, use_bias: bool = True, groups: int = 1,
          kernel_initializer=None, bias_initializer=None, kernel_regularizer=None, bias_regularizer=None,
          trainable: bool = True, name: str | None = None, weight_name=None, bias_name=None) -> Blob:
    """`flow.layers.conv3d`: a 3-D convolution with its own weight `<name>-weight` of shape
    (filters, in/groups, kd, kh, kw) ("NDHWC": (filters, kd, kh, kw, in)) and bias `<name>-bias`;
    Xavier-uniform kernel initializer by default, as in OneFlow.

    Example:
        y = flow.layers.conv3d(x, 16, 3, padding="SAME", activation=flow.nn.relu, name="c3d")
    """
    from flow.layers import _convolution_layer
    from flow.nn import _sequence
    api = "flow.layers.conv3d"
    x = check_blob(inputs, api, "inputs")
    if len(x.shape) != 5 or data_format not in _CHANNELS_FIRST + _CHANNELS_LAST:
        raise TraceError(f"{user_location()}: {api}: inputs must be 5-D in \"NCDHW\" or \"NDHWC\", got "
                         f"{list(x.shape)} and {data_format!r}")
    if not isinstance(filters, int) or not isinstance(groups, int) or groups <= 0 or filters <= 0 or filters % groups:
        raise TraceError(f"{user_location()}: {api}: filters must be a positive multiple of groups={groups}, "
                         f"got {filters!r}")
    channels_first = data_format in _CHANNELS_FIRST
    channels = x.shape[1] if channels_first else x.shape[4]
    if channels % groups:
        raise TraceError(f"{user_location()}: {api}: {channels} input channels are not divisible by groups={groups}")
    kd, kh, kw = _sequence(kernel_size, 3, api, "kernel_size")
    name = name or current(api).unique_name("Conv3d")
    shape = (filters, channels // groups, kd, kh, kw) if channels_first else (filters, kd, kh, kw, channels)
    return _convolution_layer(x, name, shape, filters, data_format, use_bias, activation,
                              lambda weight: conv3d(x, weight, strides, padding, data_format, dilation_rate,
                                                    groups, name),
                              kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                              trainable, weight_name, bias_name)
