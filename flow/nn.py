"""`flow.nn`: activations, bias, softmax and the cross-entropy loss."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, current, emit, user_location
from flow._ops import along_last_axis, check_blob, from_nchw, pair, spatial_pads, to_nchw
from flow.math import relu as _relu


def relu(x, name: str | None = None) -> Blob:
    """`flow.nn.relu(x)`: max(x, 0).

    Example:
        hidden = flow.nn.relu(flow.matmul(x, w, transpose_b=True))
    """
    return _relu(x, name)


def bias_add(value, bias, data_format: str | None = None, name: str | None = None) -> Blob:
    """`flow.nn.bias_add(value, bias, data_format=None)`: add a 1-D bias along the channel axis
    (axis 1, or the last axis for "NHWC"/"channels_last").

    Example:
        y = flow.nn.bias_add(flow.matmul(x, w, transpose_b=True), b)
    """
    api = "flow.nn.bias_add"
    x, b = check_blob(value, api, "value"), check_blob(bias, api, "bias")
    rank = len(x.shape)
    if data_format in (None, "NCHW", "channels_first", "NCW", "NCDHW"):
        axis = 1
    elif data_format in ("NHWC", "channels_last", "NWC", "NDHWC"):
        axis = rank - 1
    else:
        raise TraceError(f"{user_location()}: {api}: unknown data_format {data_format!r}")
    if rank < 2 or len(b.shape) != 1 or b.shape[0] != x.shape[axis]:
        raise TraceError(f"{user_location()}: {api}: bias of shape {list(b.shape)} does not match axis {axis} "
                         f"of value {list(x.shape)}")
    shape = [1] * rank
    shape[axis] = b.shape[0]
    b = emit("reshape", [b], {"shape": tuple(shape)}, api=api)
    return emit("add", [x, b], name=name or "", api=api)


def softmax(logits, axis: int | None = None, name: str | None = None) -> Blob:
    """`flow.nn.softmax(logits, axis=-1)`.

    Example:
        probs = flow.nn.softmax(logits)
    """
    x = check_blob(logits, "flow.nn.softmax", "logits")
    return along_last_axis(x, -1 if axis is None else axis, "flow.nn.softmax",
                           lambda v: emit("softmax", [v], name=name or "", api="flow.nn.softmax"))


def sparse_softmax_cross_entropy_with_logits(labels, logits, name: str | None = None) -> Blob:
    """`flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)`: per-sample loss, shape (N,).

    Example:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    """
    api = "flow.nn.sparse_softmax_cross_entropy_with_logits"
    lab, lg = check_blob(labels, api, "labels"), check_blob(logits, api, "logits")
    return emit("sparse_softmax_cross_entropy", [lg, lab], name=name or "", api=api)


def conv2d(input, filters, strides, padding, data_format: str = "NCHW", dilations=None, groups: int = 1,
           name: str | None = None) -> Blob:
    """`flow.nn.conv2d(input, filters, strides, padding, data_format="NCHW", dilations=None, groups=1)`.

    `filters` is (out, in/groups, kh, kw) for NCHW and (out, kh, kw, in/groups) for NHWC;
    padding is "SAME", "VALID" or explicit.

    Example:
        y = flow.nn.conv2d(x, w, strides=1, padding="SAME")
    """
    api = "flow.nn.conv2d"
    x, w = check_blob(input, api, "input"), check_blob(filters, api, "filters")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise TraceError(f"{user_location()}: {api}: input and filters must be 4-D, got {list(x.shape)} "
                         f"and {list(w.shape)}")
    x = to_nchw(x, data_format, api)
    if data_format in ("NHWC", "channels_last"):
        w = emit("transpose", [w], {"perm": (0, 3, 1, 2)}, api=api)
    kernel = (w.shape[2], w.shape[3])
    stride = pair(strides, api, "strides")
    dilation = pair(1 if dilations is None else dilations, api, "dilations")
    pads = spatial_pads(padding, (x.shape[2], x.shape[3]), kernel, stride, dilation, data_format, api)
    y = emit("conv2d", [x, w], {"strides": stride, "pads": pads, "dilation": dilation, "groups": int(groups)},
             name=name or "", api=api)
    return from_nchw(y, data_format, api)


def _pool(op: str, api: str, input, ksize, strides, padding, data_format, name) -> Blob:
    x = check_blob(input, api, "input")
    if len(x.shape) != 4:
        raise TraceError(f"{user_location()}: {api}: input must be 4-D, got {list(x.shape)}")
    x = to_nchw(x, data_format, api)
    kernel, stride = pair(ksize, api, "ksize"), pair(strides, api, "strides")
    pads = spatial_pads(padding, (x.shape[2], x.shape[3]), kernel, stride, (1, 1), data_format, api)
    if max(pads[0], pads[1]) >= kernel[0] or max(pads[2], pads[3]) >= kernel[1]:
        raise TraceError(f"{user_location()}: {api}: padding {pads} leaves windows with no input")
    y = emit(op, [x], {"ksize": kernel, "strides": stride, "pads": pads}, name=name or "", api=api)
    return from_nchw(y, data_format, api)


def max_pool2d(input, ksize, strides, padding, data_format: str = "NCHW", name: str | None = None) -> Blob:
    """`flow.nn.max_pool2d(input, ksize, strides, padding, data_format="NCHW")`.

    Example:
        pool1 = flow.nn.max_pool2d(conv1, ksize=2, strides=2, padding="SAME", name="pool1")
    """
    return _pool("max_pool2d", "flow.nn.max_pool2d", input, ksize, strides, padding, data_format, name)


def avg_pool2d(input, ksize, strides, padding, data_format: str = "NCHW", name: str | None = None) -> Blob:
    """`flow.nn.avg_pool2d(input, ksize, strides, padding, data_format="NCHW")`; padding is not counted.

    Example:
        pooled = flow.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")
    """
    return _pool("avg_pool2d", "flow.nn.avg_pool2d", input, ksize, strides, padding, data_format, name)


def dropout(x, rate: float, noise_shape=None, seed: int | None = None, name: str | None = None) -> Blob:
    """`flow.nn.dropout(x, rate, seed=None)`: in train jobs, zero each element with probability `rate`
    and scale the rest by 1/(1-rate); in predict jobs, `x` unchanged.

    The mask is a hash of (seed, train step, element index): reproducible under a seed (without one,
    the seed comes from the op's name), new every step, and reused by the backward pass.

    Example:
        hidden = flow.nn.dropout(hidden, rate=0.5, name="dropout")
    """
    api = "flow.nn.dropout"
    x = check_blob(x, api, "x")
    if not 0.0 <= float(rate) < 1.0:
        raise TraceError(f"{user_location()}: {api}: rate must be in [0, 1), got {rate}")
    if noise_shape is not None:
        raise TraceError(f"{user_location()}: {api}: noise_shape is not supported")
    ctx = current(api)
    name = name or ctx.unique_name("Dropout")
    if ctx.job_type != "train" or rate == 0.0:
        return x
    from flowc.runtime.initializers import seed_for
    seed = int(seed) if seed is not None else seed_for(name, ctx.session.seed)
    threshold = min(int(round(float(rate) * 2 ** 32)), 2 ** 32 - 1)
    step = emit("scalar", [], {"name": "train_step", "shape": (), "dtype": "int64"}, api=api)
    mask = emit("dropout_mask", [step], {"shape": x.shape, "dtype": x.type.dtype, "seed": seed % 2 ** 64,
                                         "threshold": threshold, "scale": 1.0 / (1.0 - float(rate)),
                                         "rate": float(rate)}, name=name, api=api)
    return emit("multiply", [x, mask], name=name, api=api)


def gelu(x, name: str | None = None) -> Blob:
    """`flow.nn.gelu(x)`: x * Phi(x) (the exact, erf form).

    Example:
        y = flow.nn.gelu(x)
    """
    return emit("gelu", [check_blob(x, "flow.nn.gelu", "x")], name=name or "", api="flow.nn.gelu")


def leaky_relu(x, alpha: float = 0.2, name: str | None = None) -> Blob:
    """`flow.nn.leaky_relu(x, alpha=0.2)`: x where x > 0, else alpha * x.

    Example:
        y = flow.nn.leaky_relu(x, alpha=0.1)
    """
    return emit("leaky_relu", [check_blob(x, "flow.nn.leaky_relu", "x")], {"alpha": float(alpha)},
                name=name or "", api="flow.nn.leaky_relu")
