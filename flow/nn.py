"""`flow.nn`: activations, bias, softmax and the cross-entropy loss."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, current, emit, user_location
from flow._fused_softmax import scale_mask_softmax
from flow._ops import along_last_axis, check_blob, from_nchw, pair, spatial_pads, to_nchw
from flow.math import relu as _relu
from flow.conv3d import conv3d  # noqa: F401 - OneFlow has it under flow.nn
from flow.instance_norm import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d  # noqa: F401 - OneFlow's names
from flow.pixel_shuffle import PixelShuffle, PixelShufflev2  # noqa: F401 - OneFlow has them under flow.nn
from flow.torch_conv import torch_conv2d_transpose  # noqa: F401 - OneFlow has it under flow.nn


def relu(x, name: str | None = None) -> Blob:
    """`flow.nn.relu(x)`: max(x, 0).

    Example:
        hidden = flow.nn.relu(flow.matmul(x, w, transpose_b=True))
    """
    return _relu(x, name)


def bias_add(value, bias, data_format: str | None = None, name: str | None = None) -> Blob:
    """`flow.nn.bias_add(value, bias, data_format=None)`: add a 1-D bias along the channel axis:
    axis 1 for None and any "NC..." format ("NCHW", "NCW", "NCDHW", "channels_first"), the last
    axis for any "N...C" format ("NHWC", "NWC", "NDHWC", "channels_last").

    Example:
        y = flow.nn.bias_add(flow.matmul(x, w, transpose_b=True), b)
    """
    api = "flow.nn.bias_add"
    x, b = check_blob(value, api, "value"), check_blob(bias, api, "bias")
    rank = len(x.shape)
    if data_format is None or data_format == "channels_first" or (
            isinstance(data_format, str) and data_format.startswith("NC")):
        axis = 1
    elif data_format == "channels_last" or (isinstance(data_format, str) and data_format.startswith("N")
                                            and data_format.endswith("C")):
        axis = rank - 1
    else:
        raise TraceError(f"{user_location()}: {api}: data_format must be of the form \"NC...\" or \"N...C\", "
                         f"got {data_format!r}")
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
    def row_softmax(v: Blob) -> Blob:
        fused = scale_mask_softmax(v, name or "", "flow.nn.softmax")      # softmax(scores * c + mask)
        return fused if fused is not None else emit("softmax", [v], name=name or "", api="flow.nn.softmax")
    return along_last_axis(x, -1 if axis is None else axis, "flow.nn.softmax", row_softmax)


def sparse_softmax_cross_entropy_with_logits(labels, logits, name: str | None = None) -> Blob:
    """`flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)`: per-sample loss, shape (N,).

    Example:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    """
    api = "flow.nn.sparse_softmax_cross_entropy_with_logits"
    lab, lg = check_blob(labels, api, "labels"), check_blob(logits, api, "logits")
    if len(lab.shape) == len(lg.shape) and lab.shape and lab.shape[-1] == 1:   # (N, 1) labels, as OneFlow allows
        lab = emit("reshape", [lab], {"shape": lab.shape[:-1]}, api=api)
    return emit("sparse_softmax_cross_entropy", [lg, lab], name=name or "", api=api)


def sparse_cross_entropy(labels=None, prediction=None, name: str | None = None) -> Blob:
    """`flow.nn.sparse_cross_entropy(labels, prediction)`: -log(prediction[..., label]) for probabilities
    `prediction` (a softmax's output), of the labels' shape; labels of prediction's rank end in an axis
    of 1, which is dropped, as in OneFlow.  The probability is clamped below at 1e-20 before the log
    (OneFlow's SafeLog), so a zero gives 46.05 rather than inf.

    Example:
        loss = flow.nn.sparse_cross_entropy(labels=labels, prediction=flow.nn.softmax(logits))
    """
    from flow import math
    api = "flow.nn.sparse_cross_entropy"
    lab, p = check_blob(labels, api, "labels"), check_blob(prediction, api, "prediction")
    if len(lab.shape) == len(p.shape) and lab.shape and lab.shape[-1] == 1:
        lab = emit("reshape", [lab], {"shape": lab.shape[:-1]}, api=api)
    if not p.shape or tuple(lab.shape) != tuple(p.shape[:-1]):
        raise TraceError(f"{user_location()}: {api}: labels {list(labels.shape)} must have prediction's shape "
                         f"{list(p.shape)} without its last axis (or with it as 1)")
    if not lab.type.dtype.startswith(("int", "uint")):
        raise TraceError(f"{user_location()}: {api}: labels must be integers (class indices), got {lab.type.dtype}")
    batch = len(lab.shape)
    picked = emit("gather", [p, lab], {"axis": batch, "batch_dims": batch}, api=api)
    return math.negative(math.log(math.maximum(picked, 1e-20)), name=name)


def conv2d(input, filters, strides, padding, data_format: str = "NCHW", dilations=None, groups: int = 1,
           name: str | None = None) -> Blob:
    """`flow.nn.conv2d(input, filters, strides, padding, data_format="NCHW", dilations=None, groups=1)`.

    `filters` is (out, in/groups, kh, kw) for NCHW and (out, kh, kw, in/groups) for NHWC;
    padding is "SAME", "SAME_LOWER", "SAME_UPPER", "VALID" or explicit.  As in OneFlow, "SAME" is
    "SAME_LOWER": an odd padding puts the extra row or column at the top or left (TensorFlow puts it
    at the bottom or right: use `flow.nn.compat_conv2d` or "SAME_UPPER" for that).

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
    """`flow.nn.max_pool2d(input, ksize, strides, padding, data_format="NCHW")`; "SAME" is "SAME_LOWER"
    (an odd padding row or column goes first), as in OneFlow.

    Example:
        pool1 = flow.nn.max_pool2d(conv1, ksize=2, strides=2, padding="SAME", name="pool1")
    """
    return _pool("max_pool2d", "flow.nn.max_pool2d", input, ksize, strides, padding, data_format, name)


def avg_pool2d(input, ksize, strides, padding, data_format: str = "NCHW", name: str | None = None) -> Blob:
    """`flow.nn.avg_pool2d(input, ksize, strides, padding, data_format="NCHW")`; padding is not counted, and
    "SAME" is "SAME_LOWER" (an odd padding row or column goes first), as in OneFlow.

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


# --- normalization, losses over probabilities, transposed and 1-D/3-D windows (issue 14) -------------

def moments(x, axes, keepdims: bool = False, name: str | None = None) -> tuple[Blob, Blob]:
    """`flow.nn.moments(x, axes, keepdims=False)`: the mean and the (biased) variance over `axes`.

    Example:
        mean, variance = flow.nn.moments(x, axes=[0])
    """
    from flow import math
    api = "flow.nn.moments"
    x = check_blob(x, api, "x")
    ax = list(_axes(x, axes, api))
    mean = math.reduce_mean(x, axis=ax, keepdims=True)
    centered = x - mean
    variance = math.reduce_mean(centered * centered, axis=ax, keepdims=keepdims)
    if not keepdims:
        mean = emit("reshape", [mean], {"shape": variance.shape}, api=api)
    return mean, variance


def _axes(x: Blob, axis, api: str) -> tuple[int, ...]:
    from flow._ops import axes
    return axes(x, axis, api)


def batch_normalization(x, mean, variance, offset=None, scale=None, variance_epsilon: float = 1e-5,
                        axis: int = 1, name: str | None = None) -> Blob:
    """`flow.nn.batch_normalization(x, mean, variance, offset=None, scale=None, variance_epsilon=1e-5,
    axis=1)`: `(x - mean) / sqrt(variance + variance_epsilon) * scale + offset`.

    `mean`, `variance`, `offset` and `scale` are 1-D along `axis` (OneFlow's rule, not TensorFlow's
    broadcasting), or have x's rank and broadcast against it.

    Example:
        mean, variance = flow.nn.moments(x, axes=[0, 2, 3])
        y = flow.nn.batch_normalization(x, mean, variance, axis=1)
    """
    from flow import math
    api = "flow.nn.batch_normalization"
    x = check_blob(x, api, "x")
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise TraceError(f"{user_location()}: {api}: axis {axis} is out of range for x of shape {list(x.shape)}")
    axis %= rank

    def param(value, arg: str) -> Blob:
        p = check_blob(value, api, arg)
        if len(p.shape) == 1 and rank != 1:
            if p.shape[0] != x.shape[axis]:
                raise TraceError(f"{user_location()}: {api}: {arg} of shape {list(p.shape)} does not match "
                                 f"axis {axis} of x {list(x.shape)}")
            kept = [1] * rank
            kept[axis] = p.shape[0]
            return emit("reshape", [p], {"shape": tuple(kept)}, api=api)
        if len(p.shape) != rank:
            raise TraceError(f"{user_location()}: {api}: {arg} must be 1-D or have x's rank {rank}, "
                             f"got shape {list(p.shape)}")
        return p

    out = (x - param(mean, "mean")) / math.sqrt(param(variance, "variance") + float(variance_epsilon))
    if scale is not None:
        out = out * param(scale, "scale")
    if offset is not None:
        out = out + param(offset, "offset")
    return out


def layer_norm(inputs, gamma=None, beta=None, begin_norm_axis: int = 1, begin_params_axis: int = -1,
               epsilon: float = 1e-5, name: str | None = None) -> Blob:
    """`flow.nn.layer_norm(inputs, gamma=None, beta=None, begin_norm_axis=1, begin_params_axis=-1,
    epsilon=1e-5)`: normalize over the axes from `begin_norm_axis` on (biased variance), then
    multiply by `gamma` and add `beta`, both shaped `inputs.shape[begin_params_axis:]`.

    Example:
        y = flow.nn.layer_norm(x, gamma, beta, begin_norm_axis=-1)
    """
    api = "flow.nn.layer_norm"
    x = check_blob(inputs, api, "inputs")
    rank = len(x.shape)
    if not -rank <= begin_norm_axis < rank:
        raise TraceError(f"{user_location()}: {api}: begin_norm_axis {begin_norm_axis} is out of range for "
                         f"inputs of shape {list(x.shape)}")
    first = begin_norm_axis % rank
    params_shape = params_shape_of(x, begin_params_axis, api)
    params = {}
    for value, arg in ((gamma, "gamma"), (beta, "beta")):
        if value is None:
            continue
        p = check_blob(value, api, arg)
        if tuple(p.shape) != params_shape:
            raise TraceError(f"{user_location()}: {api}: {arg} must have shape {list(params_shape)} "
                             f"(inputs.shape[{begin_params_axis}:]), got {list(p.shape)}")
        params[arg] = p
    # One fused kernel per row (compiler/ops/normalization.py); gamma and beta join it when they cover
    # exactly the normalized axes, and are applied by broadcasting after it otherwise.
    inside = params if begin_params_axis % rank == first else {}
    attrs = {"begin_norm_axis": first, "epsilon": float(epsilon), "scale": "gamma" in inside,
             "center": "beta" in inside}
    out = emit("layer_norm", [x] + list(inside.values()), attrs, name=name or "", api=api)
    for arg, p in params.items():
        if arg in inside:
            continue
        p = emit("reshape", [p], {"shape": (1,) * (rank - len(params_shape)) + params_shape}, api=api)
        out = out * p if arg == "gamma" else out + p
    return out


def params_shape_of(x: Blob, begin_params_axis: int, api: str) -> tuple[int, ...]:
    rank = len(x.shape)
    if not -rank <= begin_params_axis < rank:
        raise TraceError(f"{user_location()}: {api}: begin_params_axis {begin_params_axis} is out of range for "
                         f"inputs of shape {list(x.shape)}")
    return tuple(x.shape[begin_params_axis % rank:])


def softmax_cross_entropy_with_logits(labels, logits, name: str | None = None) -> Blob:
    """`flow.nn.softmax_cross_entropy_with_logits(labels, logits)`: `-sum(labels * log_softmax(logits))`
    over the last axis; `labels` holds a probability distribution per row (same shape and dtype as
    `logits`).  The result drops the last axis.

    Example:
        loss = flow.nn.softmax_cross_entropy_with_logits(labels=soft_targets, logits=logits)
    """
    from flow import math
    api = "flow.nn.softmax_cross_entropy_with_logits"
    lab, x = check_blob(labels, api, "labels"), check_blob(logits, api, "logits")
    if lab.shape != x.shape or lab.dtype != x.dtype:
        raise TraceError(f"{user_location()}: {api}: labels ({list(lab.shape)}, {lab.type.dtype}) must have the "
                         f"shape and dtype of logits ({list(x.shape)}, {x.type.dtype})")
    if not x.shape:
        raise TraceError(f"{user_location()}: {api}: logits must have at least one axis")
    last = len(x.shape) - 1
    shifted = x - math.reduce_max(x, axis=last, keepdims=True)      # exp never overflows
    log_probs = shifted - math.log(math.reduce_sum(math.exp(shifted), axis=last, keepdims=True))
    return math.negative(math.reduce_sum(lab * log_probs, axis=last, name=name))


def sigmoid_cross_entropy_with_logits(labels, logits, name: str | None = None) -> Blob:
    """`flow.nn.sigmoid_cross_entropy_with_logits(labels, logits)`: elementwise
    `-labels * log(sigmoid(logits)) - (1 - labels) * log(1 - sigmoid(logits))`, computed stably as
    `max(x, 0) - x * labels + log(1 + exp(-|x|))` (no overflow for large |x|; the loss of a
    confidently right logit is exact to about 6e-8 absolute).  The gradient is sigmoid(x) - labels,
    at x = 0 too.

    Example:
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=logits)
    """
    from flow import math
    api = "flow.nn.sigmoid_cross_entropy_with_logits"
    lab, x = check_blob(labels, api, "labels"), check_blob(logits, api, "logits")
    if lab.shape == x.shape and lab.type.dtype.startswith(("int", "uint")):
        # OneFlow's kernel takes integer labels too (the Wide & Deep benchmark feeds int32 ones)
        lab = emit("cast", [lab], {"dtype": x.type.dtype}, api=api)
    if lab.shape != x.shape or lab.dtype != x.dtype:
        raise TraceError(f"{user_location()}: {api}: labels ({list(lab.shape)}, {lab.type.dtype}) must have the "
                         f"shape of logits ({list(x.shape)}, {x.type.dtype}) and its dtype or an integer one")
    positive = math.relu(x)
    # -|x| written as x - 2 relu(x): the kinks of relu cancel, so the gradient at 0 is 1/2 - labels
    minus_abs = x - positive * 2.0
    return positive - x * lab + math.log(math.exp(minus_abs) + 1.0)


def compat_conv2d(input, filters, strides, padding, data_format: str = "NCHW", dilations=None, groups: int = 1,
                  name: str | None = None) -> Blob:
    """`flow.nn.compat_conv2d`: `flow.nn.conv2d` with TensorFlow's "SAME" (the odd padding row or
    column at the bottom or right, "SAME_UPPER").

    Example:
        y = flow.nn.compat_conv2d(x, w, strides=2, padding="SAME")
    """
    if isinstance(padding, str) and padding.upper() == "SAME":
        padding = "SAME_UPPER"
    return conv2d(input, filters, strides, padding, data_format, dilations, groups, name)


def conv2d_transpose(value=None, filter=None, output_shape=None, strides=None, padding: str = "VALID",  # noqa: A002
                     data_format: str = "NCHW", name: str | None = None, input=None, filters=None,  # noqa: A002
                     dilations=None) -> Blob:
    """`flow.nn.conv2d_transpose(value, filter, output_shape, strides, padding="VALID", data_format="NCHW",
    dilations=None)`: the gradient of `conv2d` with respect to its input.

    `filter` is (in_channels, out_channels, kh, kw) for NCHW and (in_channels, kh, kw, out_channels)
    for NHWC; `output_shape` is the full output shape in `data_format`.  With "VALID", a VALID
    convolution of `output_shape` must give `value`'s size; with "SAME", `ceil(output / stride)` must
    (TensorFlow's and OneFlow's rule; rows the windows do not reach are zero).
    `input` and `filters` are OneFlow's aliases of `value` and `filter`.

    Example:
        up = flow.nn.conv2d_transpose(x, w, output_shape=(1, 32, 64, 64), strides=2, padding="SAME")
    """
    api = "flow.nn.conv2d_transpose"
    if (value is None) == (input is None):
        raise TraceError(f"{user_location()}: {api}: pass exactly one of value and input")
    if (filter is None) == (filters is None):
        raise TraceError(f"{user_location()}: {api}: pass exactly one of filter and filters")
    x = check_blob(value if value is not None else input, api, "value")
    w = check_blob(filter if filter is not None else filters, api, "filter")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise TraceError(f"{user_location()}: {api}: value and filter must be 4-D, got {list(x.shape)} and "
                         f"{list(w.shape)}")
    if output_shape is None or len(output_shape) != 4:
        raise TraceError(f"{user_location()}: {api}: output_shape must hold 4 ints, got {output_shape!r}")
    out_shape = tuple(int(d) for d in output_shape)
    x = to_nchw(x, data_format, api)
    nhwc = data_format in ("NHWC", "channels_last")
    if nhwc:
        w = emit("transpose", [w], {"perm": (0, 3, 1, 2)}, api=api)
        out_shape = (out_shape[0], out_shape[3], out_shape[1], out_shape[2])
    if out_shape[0] != x.shape[0] or out_shape[1] != w.shape[1] or w.shape[0] != x.shape[1]:
        raise TraceError(f"{user_location()}: {api}: value {list(x.shape)} (NCHW), filter {list(w.shape)} "
                         f"(in, out, kh, kw) and output_shape {list(out_shape)} (NCHW) do not match")
    stride = pair(1 if strides is None else strides, api, "strides")
    dilation = pair(1 if dilations is None else dilations, api, "dilations")
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise TraceError(f"{user_location()}: {api}: padding must be \"SAME\" or \"VALID\", got {padding!r}")
    size, kernel = (out_shape[2], out_shape[3]), (w.shape[2], w.shape[3])
    # OneFlow's deconvolution puts the odd padding row or column after (SAME_UPPER), unlike its conv2d
    pads = spatial_pads("SAME_UPPER" if padding.upper() == "SAME" else "VALID", size, kernel, stride, dilation,
                        "NCHW", api)
    for axis, n in enumerate(size):
        lo, hi = pads[2 * axis], pads[2 * axis + 1]
        reached = (n + lo + hi - dilation[axis] * (kernel[axis] - 1) - 1) // stride[axis] + 1
        if reached != x.shape[2 + axis]:
            raise TraceError(f"{user_location()}: {api}: a {padding} convolution of output_shape "
                             f"{list(output_shape)} gives spatial size {reached} on axis {axis}, not the "
                             f"value's {x.shape[2 + axis]}")
    y = emit("conv2d_grad_input", [x, w], {"input_shape": out_shape, "strides": stride, "pads": pads,
                                           "dilation": dilation, "groups": 1}, name=name or "", api=api)
    return from_nchw(y, data_format, api)


def _sequence(value, n: int, api: str, arg: str) -> tuple[int, ...]:
    """An int, or a sequence of 1 or n ints (OneFlow's ksize and strides); None is 1 on every axis, as
    OneFlow's `_GetSequence` makes it (AP3D's 3-D pools pass strides=None)."""
    if value is None:
        return (1,) * n
    if not isinstance(value, (int, list, tuple)):
        raise TraceError(f"{user_location()}: {api}: {arg} must be a positive int or {n} of them, got {value!r}")
    items = [value] if isinstance(value, int) else list(value)
    if len(items) == 1:
        items = items * n
    if len(items) != n or not all(isinstance(v, int) and v > 0 for v in items):
        raise TraceError(f"{user_location()}: {api}: {arg} must be a positive int or {n} of them, got {value!r}")
    return tuple(items)


def _window_pads(padding, size, kernel, strides, data_format: str, api: str) -> list[tuple[int, int]]:
    """(before, after) per spatial axis for "SAME"/"SAME_UPPER"/"SAME_LOWER"/"VALID" or one pair per axis
    of the input's layout (batch and channel pairs must be 0).  "SAME" is OneFlow's "SAME_LOWER"."""
    n = len(size)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [(0, 0)] * n
        if mode not in ("SAME", "SAME_UPPER", "SAME_LOWER"):
            raise TraceError(f"{user_location()}: {api}: padding must be \"SAME\", \"SAME_LOWER\", "
                             f"\"SAME_UPPER\", \"VALID\" or explicit, got {padding!r}")
        out = []
        for d, k, s in zip(size, kernel, strides):
            total = max((-(-d // s) - 1) * s + k - d, 0)
            small = total // 2
            out.append((small, total - small) if mode == "SAME_UPPER" else (total - small, small))
        return out
    items = list(padding)
    if len(items) != n + 2:
        raise TraceError(f"{user_location()}: {api}: explicit padding needs {n + 2} (before, after) pairs, "
                         f"got {padding!r}")
    pairs = [(p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in items]
    spatial = pairs[2:] if data_format.startswith("NC") else pairs[1:-1]
    others = pairs[:2] if data_format.startswith("NC") else [pairs[0], pairs[-1]]
    if any(p != (0, 0) for p in others):
        raise TraceError(f"{user_location()}: {api}: padding of the batch and channel axes must be 0, got {padding!r}")
    return spatial


def _pool1d(op: str, api: str, input, ksize, strides, padding, data_format: str, name) -> Blob:
    x = check_blob(input, api, "input")
    if len(x.shape) != 3 or data_format not in ("NCW", "NWC"):
        raise TraceError(f"{user_location()}: {api}: input must be 3-D in \"NCW\" or \"NWC\", got "
                         f"{list(x.shape)} and {data_format!r}")
    if data_format == "NWC":
        x = emit("transpose", [x], {"perm": (0, 2, 1)}, api=api)
    (k,), (s,) = _sequence(ksize, 1, api, "ksize"), _sequence(strides, 1, api, "strides")
    ((lo, hi),) = _window_pads(padding, (x.shape[2],), (k,), (s,), data_format, api)
    if max(lo, hi) >= k:
        raise TraceError(f"{user_location()}: {api}: padding {(lo, hi)} leaves windows with no input")
    flat = emit("reshape", [x], {"shape": (x.shape[0], x.shape[1], 1, x.shape[2])}, api=api)
    y = emit(op, [flat], {"ksize": (1, k), "strides": (1, s), "pads": (0, 0, lo, hi)}, name=name or "", api=api)
    y = emit("reshape", [y], {"shape": (y.shape[0], y.shape[1], y.shape[3])}, api=api)
    return emit("transpose", [y], {"perm": (0, 2, 1)}, api=api) if data_format == "NWC" else y


def max_pool1d(input, ksize, strides, padding, data_format: str = "NWC", name: str | None = None) -> Blob:
    """`flow.nn.max_pool1d(input, ksize, strides, padding, data_format="NWC")` over a 3-D input.

    OneFlow 0.3.4 declares this function and raises NotImplementedError; flowc runs it (as a 2-D
    pool of height 1).

    Example:
        y = flow.nn.max_pool1d(x, ksize=2, strides=2, padding="VALID", data_format="NCW")
    """
    return _pool1d("max_pool2d", "flow.nn.max_pool1d", input, ksize, strides, padding, data_format, name)


def avg_pool1d(input, ksize, strides, padding, data_format: str = "NCW", name: str | None = None) -> Blob:
    """`flow.nn.avg_pool1d(input, ksize, strides, padding, data_format="NCW")`; padding does not count in
    the average.  OneFlow 0.3.4 declares it and raises NotImplementedError; flowc runs it.

    Example:
        y = flow.nn.avg_pool1d(x, ksize=3, strides=1, padding="SAME")
    """
    return _pool1d("avg_pool2d", "flow.nn.avg_pool1d", input, ksize, strides, padding, data_format, name)


def _pool3d(op: str, api: str, input, ksize, strides, padding, data_format: str, name) -> Blob:
    """A 3-D max or average pool as two 2-D pools: over (H, W), then over D.

    Both are separable: the max of a box is the max over D of the maxima over (H, W), and, because
    padding does not count, a box's average is the average over D of the averages over (H, W) (the
    count of real taps is the product of the per-axis counts).
    """
    x = check_blob(input, api, "input")
    if len(x.shape) != 5 or data_format not in ("NCDHW", "NDHWC"):
        raise TraceError(f"{user_location()}: {api}: input must be 5-D in \"NCDHW\" or \"NDHWC\", got "
                         f"{list(x.shape)} and {data_format!r}")
    if data_format == "NDHWC":
        x = emit("transpose", [x], {"perm": (0, 4, 1, 2, 3)}, api=api)
    kernel, stride = _sequence(ksize, 3, api, "ksize"), _sequence(strides, 3, api, "strides")
    pads = _window_pads(padding, x.shape[2:], kernel, stride, data_format, api)
    if any(max(p) >= k for p, k in zip(pads, kernel)):
        raise TraceError(f"{user_location()}: {api}: padding {pads} leaves windows with no input")
    n, c, d, h, w = x.shape
    planes = emit("reshape", [x], {"shape": (n, c * d, h, w)}, api=api)
    hw = emit(op, [planes], {"ksize": kernel[1:], "strides": stride[1:],
                             "pads": pads[1] + pads[2]}, api=api)
    oh, ow = hw.shape[2], hw.shape[3]
    columns = emit("reshape", [hw], {"shape": (n * c, 1, d, oh * ow)}, api=api)
    y = emit(op, [columns], {"ksize": (kernel[0], 1), "strides": (stride[0], 1), "pads": pads[0] + (0, 0)},
             name=name or "", api=api)
    y = emit("reshape", [y], {"shape": (n, c, y.shape[2], oh, ow)}, api=api)
    return emit("transpose", [y], {"perm": (0, 2, 3, 4, 1)}, api=api) if data_format == "NDHWC" else y


def max_pool3d(input, ksize, strides, padding, data_format: str = "NCDHW", ceil_mode: bool = False,
               name: str | None = None) -> Blob:
    """`flow.nn.max_pool3d(input, ksize, strides, padding, data_format="NCDHW")` over a 5-D input.

    Example:
        y = flow.nn.max_pool3d(x, ksize=2, strides=2, padding="VALID")
    """
    _no_ceil_mode(ceil_mode, "flow.nn.max_pool3d")
    return _pool3d("max_pool2d", "flow.nn.max_pool3d", input, ksize, strides, padding, data_format, name)


def avg_pool3d(input, ksize, strides, padding, data_format: str = "NCDHW", ceil_mode: bool = False,
               name: str | None = None) -> Blob:
    """`flow.nn.avg_pool3d(input, ksize, strides, padding, data_format="NCDHW")`; padding does not count.

    Example:
        y = flow.nn.avg_pool3d(x, ksize=3, strides=2, padding="SAME")
    """
    _no_ceil_mode(ceil_mode, "flow.nn.avg_pool3d")
    return _pool3d("avg_pool2d", "flow.nn.avg_pool3d", input, ksize, strides, padding, data_format, name)


def _no_ceil_mode(ceil_mode: bool, api: str) -> None:
    if ceil_mode:
        raise TraceError(f"{user_location()}: {api}: ceil_mode=True is not supported")


def conv1d(input, filters, strides, padding, data_format: str = "NCW", dilations=None, groups: int = 1,
           name: str | None = None) -> Blob:
    """`flow.nn.conv1d(input, filters, strides, padding, data_format="NCW", dilations=None, groups=1)`:
    a 2-D convolution of height 1.  `filters` is (out, in/groups, k) for "NCW" and (out, k, in) for "NWC".

    Example:
        y = flow.nn.conv1d(x, w, strides=1, padding="SAME")
    """
    api = "flow.nn.conv1d"
    x, w = check_blob(input, api, "input"), check_blob(filters, api, "filters")
    if len(x.shape) != 3 or len(w.shape) != 3 or data_format not in ("NCW", "NWC"):
        raise TraceError(f"{user_location()}: {api}: input and filters must be 3-D in \"NCW\" or \"NWC\", got "
                         f"{list(x.shape)}, {list(w.shape)} and {data_format!r}")
    if data_format == "NWC":
        x = emit("transpose", [x], {"perm": (0, 2, 1)}, api=api)
        w = emit("transpose", [w], {"perm": (0, 2, 1)}, api=api)
    (s,) = _sequence(strides, 1, api, "strides")
    (d,) = _sequence(1 if dilations is None else dilations, 1, api, "dilations")
    if isinstance(padding, str):
        pads2d: object = padding
    else:
        ((lo, hi),) = _window_pads(padding, (x.shape[2],), (w.shape[2],), (s,), data_format, api)
        pads2d = [[0, 0], [0, 0], [0, 0], [lo, hi]]
    x4 = emit("reshape", [x], {"shape": (x.shape[0], x.shape[1], 1, x.shape[2])}, api=api)
    w4 = emit("reshape", [w], {"shape": (w.shape[0], w.shape[1], 1, w.shape[2])}, api=api)
    y = conv2d(x4, w4, (1, s), pads2d, "NCHW", (1, d), groups, name)
    y = emit("reshape", [y], {"shape": (y.shape[0], y.shape[1], y.shape[3])}, api=api)
    return emit("transpose", [y], {"perm": (0, 2, 1)}, api=api) if data_format == "NWC" else y


# --- more activations and OneFlow 0.3's class-like losses (issue 14, names) -------------------------------
# Each is composed of existing ops, so CPU, CUDA and gradients come with them.

def _act_input(x, api: str) -> Blob:
    return check_blob(x, api, "x")


def elu(x, alpha: float = 1.0, name: str | None = None) -> Blob:
    """`flow.nn.elu(x, alpha=1.0)`: x where x > 0, else alpha * (exp(x) - 1).

    Example:
        y = flow.nn.elu(x, alpha=1.0)
    """
    from flow import indexing, math
    x = _act_input(x, "flow.nn.elu")
    # expm1 of min(x, 0): the unused branch never overflows, so its (masked) gradient is never inf * 0
    negative_part = math.expm1(math.minimum(x, 0.0)) * float(alpha)
    return indexing.where(x > 0.0, x, negative_part, name=name)


def hardsigmoid(x, name: str | None = None) -> Blob:
    """`flow.nn.hardsigmoid(x)`: 0 for x <= -3, 1 for x >= 3, x / 6 + 1/2 between.

    Example:
        gate = flow.nn.hardsigmoid(x)
    """
    from flow import math
    x = _act_input(x, "flow.nn.hardsigmoid")
    return math.clip_by_value(x * (1.0 / 6.0) + 0.5, 0.0, 1.0, name=name)


def hardswish(x, name: str | None = None) -> Blob:
    """`flow.nn.hardswish(x)`: 0 for x <= -3, x for x >= 3, x * (x + 3) / 6 between.

    Example:
        y = flow.nn.hardswish(x)
    """
    from flow import math
    x = _act_input(x, "flow.nn.hardswish")
    return math.multiply(x, math.clip_by_value(x + 3.0, 0.0, 6.0) * (1.0 / 6.0), name=name)


def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0, name: str | None = None) -> Blob:
    """`flow.nn.hardtanh(x, min_val=-1.0, max_val=1.0)`: x clipped to [min_val, max_val].

    Example:
        y = flow.nn.hardtanh(x, min_val=-2.0, max_val=2.0)
    """
    from flow import math
    x = _act_input(x, "flow.nn.hardtanh")
    if not float(min_val) < float(max_val):
        raise TraceError(f"{user_location()}: flow.nn.hardtanh: min_val ({min_val}) must be less than "
                         f"max_val ({max_val})")
    return math.clip_by_value(x, float(min_val), float(max_val), name=name)


def relu6(x, name: str | None = None) -> Blob:
    """`flow.nn.relu6(x)`: min(max(x, 0), 6).

    Example:
        y = flow.nn.relu6(x)
    """
    from flow import math
    return math.clip_by_value(_act_input(x, "flow.nn.relu6"), 0.0, 6.0, name=name)


def mish(x, name: str | None = None) -> Blob:
    """`flow.nn.mish(x)`: x * tanh(softplus(x)).

    Example:
        y = flow.nn.mish(x)
    """
    from flow import math
    x = _act_input(x, "flow.nn.mish")
    return math.multiply(x, math.tanh(math.softplus(x)), name=name)


def swish(x, beta: float = 1.0, name: str | None = None) -> Blob:
    """`flow.nn.swish(x, beta=1.0)`: x * sigmoid(beta * x).

    Example:
        y = flow.nn.swish(x, beta=1.0)
    """
    from flow import math
    x = _act_input(x, "flow.nn.swish")
    return math.multiply(x, math.sigmoid(x * float(beta)), name=name)


def logsoftmax(logits, axis: int | None = None, name: str | None = None) -> Blob:
    """`flow.nn.logsoftmax(logits, axis=None)`: log(softmax(logits)) along `axis` (the last one for None),
    computed as x - max - log(sum(exp(x - max))), so it neither overflows nor underflows.

    Example:
        log_probs = flow.nn.logsoftmax(logits)
    """
    from flow import math
    x = check_blob(logits, "flow.nn.logsoftmax", "logits")
    ax = -1 if axis is None else axis
    _axes(x, ax, "flow.nn.logsoftmax")
    return math.subtract(x, math.reduce_logsumexp(x, axis=ax, keepdims=True), name=name)


def softmax_grad(y, dy, axis: int | None = None, name: str | None = None) -> Blob:
    """`flow.nn.softmax_grad(y, dy, axis=None)`: the gradient of softmax given its output y:
    y * (dy - sum(dy * y)) along `axis` (the last one for None).

    Example:
        dx = flow.nn.softmax_grad(flow.nn.softmax(x), dy)
    """
    from flow import math
    api = "flow.nn.softmax_grad"
    y, dy = check_blob(y, api, "y"), check_blob(dy, api, "dy")
    ax = -1 if axis is None else axis
    _axes(y, ax, api)
    inner = math.reduce_sum(dy * y, axis=ax, keepdims=True)
    return math.multiply(y, dy - inner, name=name)


def tril(x, diagonal: int = 0, fill_value=0, name: str | None = None) -> Blob:
    """`flow.nn.tril(x, diagonal=0, fill_value=0)`, the same as `flow.math.tril`.

    Example:
        lower = flow.nn.tril(scores, fill_value=float("-inf"))
    """
    from flow.math import tril as math_tril
    return math_tril(x, diagonal, fill_value, name)


def fused_scale_tril(x, diagonal: int = 0, fill_value=0, scale=1, name: str | None = None) -> Blob:
    """`flow.nn.fused_scale_tril`, the same as `flow.math.fused_scale_tril`.

    Example:
        masked = flow.nn.fused_scale_tril(scores, fill_value=float("-inf"), scale=0.125)
    """
    from flow.math import fused_scale_tril as math_fused_scale_tril
    return math_fused_scale_tril(x, diagonal, fill_value, scale, name)


def _reduce_loss(loss: Blob, reduction: str, api: str, name: str | None) -> Blob:
    from flow import math
    if reduction == "mean":
        return math.reduce_mean(loss, name=name)
    if reduction == "sum":
        return math.reduce_sum(loss, name=name)
    if reduction == "none":
        return loss
    raise TraceError(f"{user_location()}: {api}: reduction must be \"none\", \"mean\" or \"sum\", got {reduction!r}")


def _loss_pair(input, target, api: str, first: str = "input", second: str = "target") -> tuple[Blob, Blob]:
    x, t = check_blob(input, api, first), check_blob(target, api, second)
    if x.shape != t.shape:
        raise TraceError(f"{user_location()}: {api}: {first} {list(x.shape)} and {second} {list(t.shape)} "
                         f"must have one shape")
    return x, t


def _check_reduction(reduction: str, api: str) -> None:
    if reduction not in ("none", "mean", "sum"):
        raise TraceError(f"{user_location()}: {api}: reduction must be \"none\", \"mean\" or \"sum\", "
                         f"got {reduction!r}")


def L1Loss(input, target, reduction: str = "mean", name: str | None = None) -> Blob:  # noqa: N802,A002
    """`flow.nn.L1Loss(input, target, reduction="mean")`: |target - input|, then its mean, sum ("sum")
    or nothing ("none").

    Example:
        loss = flow.nn.L1Loss(prediction, target, reduction="sum")
    """
    from flow import math
    api = "flow.nn.L1Loss"
    _check_reduction(reduction, api)
    x, t = _loss_pair(input, target, api)
    return _reduce_loss(math.abs(t - x), reduction, api, name)


def MSELoss(input, target, reduction: str = "mean", name: str | None = None) -> Blob:  # noqa: N802,A002
    """`flow.nn.MSELoss(input, target, reduction="mean")`: (input - target)^2, then its mean, sum or nothing.

    Example:
        loss = flow.nn.MSELoss(prediction, target)
    """
    from flow import math
    api = "flow.nn.MSELoss"
    _check_reduction(reduction, api)
    x, t = _loss_pair(input, target, api)
    return _reduce_loss(math.squared_difference(x, t), reduction, api, name)


def BCELoss(input, target, weight=None, reduction: str = "mean", name: str | None = None) -> Blob:  # noqa: N802,A002
    """`flow.nn.BCELoss(input, target, weight=None, reduction="mean")`:
    -weight * (target * log(input) + (1 - target) * log(1 - input)) for probabilities `input`,
    then its mean, sum or nothing.  As in OneFlow 0.3, log(0) is not clamped: an input of exactly 0
    or 1 on the wrong side gives inf.

    Example:
        loss = flow.nn.BCELoss(flow.math.sigmoid(logits), labels)
    """
    from flow import math
    api = "flow.nn.BCELoss"
    _check_reduction(reduction, api)
    x, t = _loss_pair(input, target, api)
    loss = math.negative(t * math.log(x) + (1.0 - t) * math.log(1.0 - x))
    if weight is not None:
        loss = loss * check_blob(weight, api, "weight")
    return _reduce_loss(loss, reduction, api, name)


def BCEWithLogitsLoss(input, target, weight=None, pos_weight=None, reduction: str = "mean",  # noqa: N802,A002
                      name: str | None = None) -> Blob:
    """`flow.nn.BCEWithLogitsLoss(input, target, weight=None, pos_weight=None, reduction="mean")`:
    BCELoss of sigmoid(input), computed stably as
    weight * ((1 - target) * input + (1 + (pos_weight - 1) * target) * softplus(-input)),
    then its mean, sum or nothing.  `pos_weight` weighs the positive term (broadcast along the last axis).

    Example:
        loss = flow.nn.BCEWithLogitsLoss(logits, labels, pos_weight=pw)
    """
    from flow import math
    api = "flow.nn.BCEWithLogitsLoss"
    _check_reduction(reduction, api)
    x, t = _loss_pair(input, target, api)
    log_weight = 1.0
    if pos_weight is not None:
        log_weight = (check_blob(pos_weight, api, "pos_weight") - 1.0) * t + 1.0
    loss = (1.0 - t) * x + math.softplus(math.negative(x)) * log_weight
    if weight is not None:
        loss = loss * check_blob(weight, api, "weight")
    return _reduce_loss(loss, reduction, api, name)


def KLDivLoss(input, target, log_target: bool = False, reduction: str = "mean",  # noqa: N802,A002
              name: str | None = None) -> Blob:
    """`flow.nn.KLDivLoss(input, target, log_target=False, reduction="mean")`: the pointwise
    Kullback-Leibler divergence of log-probabilities `input` from `target`:
    target * (log(target) - input), 0 where target <= 0; with log_target, exp(target) * (target - input).
    Then its mean over every element ("mean", as OneFlow 0.3: not a mean over the batch), sum or nothing.

    Example:
        loss = flow.nn.KLDivLoss(flow.nn.logsoftmax(logits), soft_targets, reduction="sum")
    """
    from flow import indexing, math
    api = "flow.nn.KLDivLoss"
    _check_reduction(reduction, api)
    x, t = _loss_pair(input, target, api)
    if log_target:
        loss = math.exp(t) * (t - x)
    else:
        positive = t > 0.0
        safe_t = indexing.where(positive, t, 1.0)        # log of a positive number, in both branches
        loss = indexing.where(positive, t * (math.log(safe_t) - x), 0.0)
    return _reduce_loss(loss, reduction, api, name)


def MarginRankingLoss(input1, input2, target, margin: float = 0.0, reduction: str = "mean",  # noqa: N802
                      name: str | None = None) -> Blob:
    """`flow.nn.MarginRankingLoss(input1, input2, target, margin=0.0, reduction="mean")`:
    max(0, -target * (input1 - input2) + margin), target being 1 or -1; then its mean, sum or nothing.

    Example:
        loss = flow.nn.MarginRankingLoss(score_a, score_b, order, margin=0.1)
    """
    from flow import math
    api = "flow.nn.MarginRankingLoss"
    _check_reduction(reduction, api)
    a, b = _loss_pair(input1, input2, api, "input1", "input2")
    t = check_blob(target, api, "target")
    return _reduce_loss(math.relu(math.negative(t) * (a - b) + float(margin)), reduction, api, name)


def _p_norm(x: Blob, p: float) -> Blob:
    """The p-norm of `x` over axis 1, the axis OneFlow 0.3.4's TripletMarginLoss reduces."""
    from flow import math
    if p == 2.0:
        return math.sqrt(math.reduce_sum(math.square(x), axis=1))
    if p == 1.0:
        return math.reduce_sum(math.abs(x), axis=1)
    return math.pow(math.reduce_sum(math.pow(math.abs(x), p), axis=1), 1.0 / p)


def TripletMarginLoss(anchor, positive, negative, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6,  # noqa: N802
                      swap: bool = False, reduction: str = "mean", name: str | None = None) -> Blob:
    """`flow.nn.TripletMarginLoss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False,
    reduction="mean")`: max(d(anchor, positive) - d(anchor, negative) + margin, 0), with d(a, b)
    the p-norm of a - b + eps over axis 1 (as OneFlow 0.3.4: axis 1 whatever the rank, so a
    (N, C, L) input gives an (N, L) loss before the reduction); `swap` uses min(d(a, n), d(p, n))
    as the negative distance (OneFlow 0.3.4 refuses swap=True; flowc computes it).  Then its mean
    over every remaining element, sum or nothing.

    Example:
        loss = flow.nn.TripletMarginLoss(a, pos, neg, margin=0.5)
    """
    from flow import math
    api = "flow.nn.TripletMarginLoss"
    _check_reduction(reduction, api)
    a, pos = _loss_pair(anchor, positive, api, "anchor", "positive")
    _, neg = _loss_pair(anchor, negative, api, "anchor", "negative")
    if len(a.shape) < 2:
        raise TraceError(f"{user_location()}: {api}: anchor must have at least two axes (the norm is over "
                         f"axis 1, as in OneFlow), got shape {list(a.shape)}")
    if float(p) <= 0:
        raise TraceError(f"{user_location()}: {api}: p must be positive, got {p}")
    p, eps = float(p), float(eps)
    d_pos = _p_norm(a - pos + eps, p)
    d_neg = _p_norm(a - neg + eps, p)
    if swap:
        d_neg = math.minimum(d_neg, _p_norm(pos - neg + eps, p))
    return _reduce_loss(math.relu(d_pos - d_neg + float(margin)), reduction, api, name)
