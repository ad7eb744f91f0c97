"""`flow.layers`: layers that create their own variables."""
from __future__ import annotations

from typing import Callable

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, current, emit, user_location
from flow._ops import check_blob
from flow.variables import get_variable
from flow.upsample import upsample_2d  # noqa: F401 - OneFlow has it under flow.layers
from flow.conv3d import conv3d_layer as conv3d  # noqa: F401 - OneFlow has it under flow.layers
from flowc.runtime import initializers


def dense(inputs, units: int, activation: Callable | None = None, use_bias: bool = True,
          kernel_initializer=None, bias_initializer=None, kernel_regularizer=None, bias_regularizer=None,
          trainable: bool = True, name: str | None = None, model_distribute=None) -> Blob:
    """`flow.layers.dense`: `activation(inputs @ weight^T + bias)`, OneFlow's weight layout (units, in).

    Variables are `<name>-weight` and `<name>-bias`.  An input of rank > 2 is transformed along its
    last axis, (..., in) -> (..., units), as in OneFlow.  `model_distribute` (broadcast, split(0),
    auto) says how several devices hold the weight and bias: one device holds all of them; on several
    MPI ranks `split(0)` gives each rank its share of the units (model parallelism, docs/distributed.md).
    Without `kernel_initializer` the weight starts at zeros, as in OneFlow 0.3.4 (its layers.dense
    defaults to `constant_initializer(0)`; pass an initializer to break the symmetry, as OneFlow's
    examples do); the bias starts at zeros too.

    Example:
        hidden = flow.layers.dense(x, 512, activation=flow.nn.relu, name="hidden",
                                   kernel_initializer=flow.truncated_normal(0.1))
    """
    api = "flow.layers.dense"
    x = check_blob(inputs, api, "inputs")
    if not isinstance(units, int) or units <= 0:
        raise TraceError(f"{user_location()}: {api}: units must be a positive int, got {units!r}")
    if len(x.shape) < 2:
        raise TraceError(f"{user_location()}: {api}: inputs must have rank >= 2 (batch, features), "
                         f"got shape {list(x.shape)}")
    name = name or current(api).unique_name("Dense")
    flat = x
    if len(x.shape) > 2:   # OneFlow applies the layer to the last axis: (..., in) -> (..., units)
        flat = emit("reshape", [x], {"shape": (_prod(x.shape[:-1]), x.shape[-1])}, api=api)
    weight = get_variable(f"{name}-weight", shape=(units, flat.shape[1]), dtype=x.dtype,
                          initializer=kernel_initializer or initializers.constant_initializer(0),
                          regularizer=kernel_regularizer, trainable=trainable, distribute=model_distribute)
    out = emit("matmul", [flat, weight], {"transpose_a": False, "transpose_b": True}, name=name, api=api)
    if use_bias:
        bias = get_variable(f"{name}-bias", shape=(units,), dtype=x.dtype,
                            initializer=bias_initializer or initializers.constant_initializer(0),
                            regularizer=bias_regularizer, trainable=trainable, distribute=model_distribute)
        out = emit("add", [out, bias], name=name, api=api)
    if activation is not None:
        out = activation(out)
    if len(x.shape) > 2:
        out = emit("reshape", [out], {"shape": tuple(x.shape[:-1]) + (units,)}, api=api)
    return out


def _prod(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def conv2d(inputs, filters: int, kernel_size=1, strides=1, padding="VALID", data_format: str = "NCHW",
           dilation_rate=1, groups: int = 1, activation: Callable | None = None, use_bias: bool = True,
           kernel_initializer=None, bias_initializer=None, kernel_regularizer=None, bias_regularizer=None,
           trainable: bool = True, name: str | None = None, weight_name=None, bias_name=None) -> Blob:
    """`flow.layers.conv2d`: a convolution with its own weight `<name>-weight` of shape
    (filters, in/groups, kh, kw) (NHWC: (filters, kh, kw, in/groups)) and bias `<name>-bias`.
    The default kernel initializer is Xavier-uniform, as in OneFlow.

    Example:
        conv1 = flow.layers.conv2d(images, 32, 5, padding="SAME", activation=flow.nn.relu, name="conv1")
    """
    from flow import nn
    from flow._ops import pair
    api = "flow.layers.conv2d"
    x = check_blob(inputs, api, "inputs")
    if len(x.shape) != 4:
        raise TraceError(f"{user_location()}: {api}: inputs must be 4-D, got shape {list(x.shape)}")
    if not isinstance(filters, int) or filters <= 0 or filters % groups:
        raise TraceError(f"{user_location()}: {api}: filters must be a positive multiple of groups={groups}, "
                         f"got {filters!r}")
    channels_first = data_format in ("NCHW", "channels_first")
    channels = x.shape[1] if channels_first else x.shape[3]
    if channels % groups:
        raise TraceError(f"{user_location()}: {api}: {channels} input channels are not divisible by "
                         f"groups={groups}")
    kh, kw = pair(kernel_size, api, "kernel_size")
    name = name or current(api).unique_name("Conv2d")
    shape = (filters, channels // groups, kh, kw) if channels_first else (filters, kh, kw, channels // groups)
    return _convolution_layer(x, name, shape, filters, data_format, use_bias, activation,
                              lambda weight: nn.conv2d(x, weight, strides, padding, data_format, dilation_rate,
                                                       groups, name),
                              kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                              trainable, weight_name, bias_name)


def _variable_name(ctx, blob: Blob) -> str:
    """The full name (namespaces included) of the variable `blob` is the value of."""
    return next(name for name, node in ctx.variable_nodes.items() if node == blob.id)


def batch_normalization(inputs, axis: int = -1, momentum: float = 0.99, epsilon: float = 0.001,
                        center: bool = True, scale: bool = True, beta_initializer=None, gamma_initializer=None,
                        beta_regularizer=None, gamma_regularizer=None, moving_mean_initializer=None,
                        moving_variance_initializer=None, trainable: bool = True, training: bool = True,
                        name: str | None = None) -> Blob:
    """`flow.layers.batch_normalization`: normalize over every axis but `axis`.

    In train jobs (with `training=True` and `trainable=True`) it normalises with the batch's mean and
    biased variance, and each step updates `<name>-moving_mean` / `<name>-moving_variance` by
    `moving = momentum * moving + (1 - momentum) * batch`, the batch variance unbiased there (as
    OneFlow's cuDNN kernel does); float32 and float64 run as two fused kernels forward and two
    backward (compiler/ops/batch_norm.py), float16 as reductions and pointwise ops.  Predict jobs
    use the moving values (pointwise ops, which fold into a convolution's epilogue).
    Variables: `<name>-gamma`, `<name>-beta`, `<name>-moving_mean`, `<name>-moving_variance`.

    Example:
        y = flow.layers.batch_normalization(conv1, axis=1, name="bn1")
    """
    return _batch_norm_layer("flow.layers.batch_normalization", inputs, axis, momentum, epsilon, center, scale,
                             beta_initializer, gamma_initializer, beta_regularizer, gamma_regularizer,
                             moving_mean_initializer, moving_variance_initializer, trainable, training, name)


def batch_normalization_add_relu(inputs, addend=None, axis: int = -1, momentum: float = 0.99, epsilon: float = 0.001,
                                 center: bool = True, scale: bool = True, beta_initializer=None,
                                 gamma_initializer=None, beta_regularizer=None, gamma_regularizer=None,
                                 moving_mean_initializer=None, moving_variance_initializer=None,
                                 trainable: bool = True, training: bool = True, name: str = "BatchNorm",
                                 gamma_name: str | None = None, beta_name: str | None = None,
                                 moving_mean_name: str | None = None, moving_variance_name: str | None = None
                                 ) -> Blob:
    """`flow.layers.batch_normalization_add_relu`: relu(batch_normalization(inputs) + addend), OneFlow's
    fused layer, computed as its unfused form (what OneFlow itself runs on the CPU).  `gamma_name`,
    `beta_name`, `moving_mean_name`, `moving_variance_name` name the variables instead of
    `<name>-gamma`, ...; `addend=None` leaves out the sum.

    Example:
        y = flow.layers.batch_normalization_add_relu(conv2, addend=shortcut, axis=1, name="bn2")
    """
    from flow import nn
    api = "flow.layers.batch_normalization_add_relu"
    names = {"gamma": gamma_name, "beta": beta_name, "moving_mean": moving_mean_name,
             "moving_variance": moving_variance_name}
    out = _batch_norm_layer(api, inputs, axis, momentum, epsilon, center, scale, beta_initializer, gamma_initializer,
                            beta_regularizer, gamma_regularizer, moving_mean_initializer, moving_variance_initializer,
                            trainable, training, name, names)
    if addend is not None:
        addend = check_blob(addend, api, "addend")
        if addend.shape != out.shape:
            raise TraceError(f"{user_location()}: {api}: addend of shape {list(addend.shape)} must have the shape of "
                             f"inputs, {list(out.shape)}")
        out = out + addend
    return nn.relu(out)


def batch_normalization_relu(inputs, axis: int = -1, momentum: float = 0.99, epsilon: float = 0.001,
                             center: bool = True, scale: bool = True, beta_initializer=None, gamma_initializer=None,
                             beta_regularizer=None, gamma_regularizer=None, moving_mean_initializer=None,
                             moving_variance_initializer=None, trainable: bool = True, training: bool = True,
                             name: str = "BatchNorm") -> Blob:
    """`flow.layers.batch_normalization_relu`: relu(batch_normalization(inputs)), OneFlow's fused layer.

    Example:
        y = flow.layers.batch_normalization_relu(conv1, axis=1, name="bn1")
    """
    return batch_normalization_add_relu(inputs, None, axis, momentum, epsilon, center, scale, beta_initializer,
                                        gamma_initializer, beta_regularizer, gamma_regularizer,
                                        moving_mean_initializer, moving_variance_initializer, trainable, training,
                                        name)


def _batch_norm_layer(api: str, inputs, axis: int, momentum: float, epsilon: float, center: bool, scale: bool,
                      beta_initializer, gamma_initializer, beta_regularizer, gamma_regularizer, moving_mean_initializer,
                      moving_variance_initializer, trainable: bool, training: bool, name: str | None,
                      names: dict[str, str | None] | None = None) -> Blob:
    """The batch-norm layers' variables (`<name>-<role>`, or the name `names[role]` gives), then
    `_normalize`."""
    x = check_blob(inputs, api, "inputs")
    ctx = current(api)
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise TraceError(f"{user_location()}: {api}: axis {axis} is out of range for shape {list(x.shape)}")
    axis %= rank
    channels = x.shape[axis]
    name = name or ctx.unique_name("BatchNorm")

    def variable(role: str, initializer, regularizer=None, trainable: bool = trainable) -> Blob:
        given = (names or {}).get(role)
        return get_variable(given or f"{name}-{role}", shape=(channels,), dtype=x.dtype, initializer=initializer,
                            regularizer=regularizer, trainable=trainable)
    mm_var = variable("moving_mean", moving_mean_initializer or initializers.zeros_initializer(), trainable=False)
    mv_var = variable("moving_variance", moving_variance_initializer or initializers.ones_initializer(),
                      trainable=False)
    training = ctx.job_type == "train" and training and trainable   # OneFlow: trainable=False never trains
    gamma = variable("gamma", gamma_initializer or initializers.ones_initializer(), gamma_regularizer) if scale \
        else None
    beta = variable("beta", beta_initializer or initializers.zeros_initializer(), beta_regularizer) if center \
        else None
    return _normalize(x, axis, momentum, epsilon, gamma, beta, mm_var, mv_var, training, name, api)


def _normalize(x: Blob, axis: int, momentum: float, epsilon: float, gamma: Blob | None, beta: Blob | None,
               mm_var: Blob, mv_var: Blob, training: bool, name: str, api: str) -> Blob:
    """OneFlow's `normalization` op over every axis but `axis` (non-negative), with the variables
    given: in training, the batch's statistics and the moving averages' update (an assign of
    `mm_var` and `mv_var`, which must be variables); otherwise the moving statistics.  The layer
    above and `flow.user_op_builder(...).Op("normalization")` both end here."""
    from flow import math
    from flow.array_ops import reshape
    ctx = current(api)
    rank, channels = len(x.shape), x.shape[axis]
    kept = [1] * rank
    kept[axis] = channels
    reduce_axes = [d for d in range(rank) if d != axis]
    if training and x.type.dtype in _FUSED_DTYPES:
        return _fused_batch_norm(x, axis, momentum, epsilon, gamma, beta, mm_var, mv_var, name, api)
    if training:   # float16: the composed form (the fused kernels are float32 and float64)
        mean = math.reduce_mean(x, axis=reduce_axes, keepdims=True)
        centered = x - mean
        var = math.reduce_mean(centered * centered, axis=reduce_axes, keepdims=True)
        _update_moving(ctx, mm_var, mv_var, reshape(mean, [channels]), reshape(var, [channels]),
                       momentum, x.type.size // channels)
    else:
        centered, var = x - reshape(mm_var, kept), reshape(mv_var, kept)
    out = centered / math.sqrt(var + epsilon)
    if gamma is not None:
        out = out * reshape(gamma, kept)
    if beta is not None:
        out = out + reshape(beta, kept)
    return out


# The dtypes of the fused kernels (compiler/ops/batch_norm.py).
_FUSED_DTYPES = ("float32", "float64")


def _fused_batch_norm(x: Blob, axis: int, momentum: float, epsilon: float, gamma, beta, mm_var: Blob,
                      mv_var: Blob, name: str, api: str) -> Blob:
    """A train job's batch normalisation: the statistics in one pass, y in another (two kernels); the
    gradient is two more (compiler/ops/batch_norm.py)."""
    from flow.array_ops import reshape
    ctx = current(api)
    channels = x.shape[axis]
    stats = emit("batch_norm_stats", [x], {"axis": axis}, name=f"{name}-stats", api=api)
    params = [p for p in (gamma, beta) if p is not None]
    out = emit("batch_norm", [x, stats, *params],
               {"axis": axis, "epsilon": float(epsilon), "scale": gamma is not None, "center": beta is not None},
               name=name, api=api)

    def row(i: int) -> Blob:
        return reshape(emit("slice_axis", [stats], {"axis": 0, "begin": i, "end": i + 1}, api=api), [channels])
    _update_moving(ctx, mm_var, mv_var, row(0), row(1), momentum, x.type.size // channels)
    return out


def _update_moving(ctx, mm_var: Blob, mv_var: Blob, mean: Blob, var: Blob, momentum: float, count: int) -> None:
    """OneFlow's moving averages (cuDNN's, which its normalization op calls with factor 1 - momentum):
    moving = momentum * moving + (1 - momentum) * batch, the variance unbiased (times m / (m - 1),
    m the elements per channel; m = 1 keeps the biased one, 0, rather than dividing by zero)."""
    unbiased = var * (count / (count - 1)) if count > 1 else var
    # keyed by the variables' full names: under flow.scope.namespace("a") they are "a-<name>-moving_mean"
    ctx.assigns[_variable_name(ctx, mm_var)] = (mm_var * momentum + mean * (1 - momentum)).id
    ctx.assigns[_variable_name(ctx, mv_var)] = (mv_var * momentum + unbiased * (1 - momentum)).id


def layer_norm(inputs, center: bool = True, scale: bool = True, trainable: bool = True, begin_norm_axis: int = 1,
               begin_params_axis: int = -1, epsilon: float = 1e-5, name: str | None = None) -> Blob:
    """`flow.layers.layer_norm`: normalize over the axes from `begin_norm_axis` on (mean and biased
    variance of each sample), then scale by `<name>-gamma` (ones) and shift by `<name>-beta` (zeros),
    both of shape `inputs.shape[begin_params_axis:]`.  `center=False` / `scale=False` leave out beta /
    gamma.  The same in train and predict jobs.

    Example:
        y = flow.layers.layer_norm(x, begin_norm_axis=-1, name="ln1")
    """
    from flow import nn
    api = "flow.layers.layer_norm"
    x = check_blob(inputs, api, "inputs")
    params_shape = nn.params_shape_of(x, begin_params_axis, api)
    name = name or current(api).unique_name("LayerNorm")
    if not center and not scale:
        trainable = False
    beta = gamma = None
    if center:
        beta = get_variable(f"{name}-beta", shape=params_shape, dtype=x.dtype,
                            initializer=initializers.constant_initializer(0.0), trainable=trainable)
    if scale:
        gamma = get_variable(f"{name}-gamma", shape=params_shape, dtype=x.dtype,
                             initializer=initializers.constant_initializer(1.0), trainable=trainable)
    return nn.layer_norm(x, gamma, beta, begin_norm_axis, begin_params_axis, epsilon, name)


def conv1d(inputs, filters: int, kernel_size=1, strides=1, padding="VALID", data_format: str = "NCW",
           dilation_rate=None, groups: int = 1, activation: Callable | None = None, use_bias: bool = True,
           kernel_initializer=None, bias_initializer=None, kernel_regularizer=None, bias_regularizer=None,
           trainable: bool = True, name: str | None = None, weight_name=None, bias_name=None) -> Blob:
    """`flow.layers.conv1d`: a 1-D convolution with its own weight `<name>-weight` of shape
    (filters, in/groups, k) ("NWC": (filters, k, in)) and bias `<name>-bias`; Xavier-uniform kernel
    initializer by default, as in OneFlow.

    Example:
        y = flow.layers.conv1d(x, 16, 3, padding="SAME", activation=flow.nn.relu, name="c1")
    """
    from flow import nn
    api = "flow.layers.conv1d"
    x = check_blob(inputs, api, "inputs")
    if len(x.shape) != 3 or data_format not in ("NCW", "NWC"):
        raise TraceError(f"{user_location()}: {api}: inputs must be 3-D in \"NCW\" or \"NWC\", got "
                         f"{list(x.shape)} and {data_format!r}")
    if not isinstance(filters, int) or not isinstance(groups, int) or groups <= 0 or filters <= 0 or filters % groups:
        raise TraceError(f"{user_location()}: {api}: filters must be a positive multiple of groups={groups}, "
                         f"got {filters!r}")
    channels = x.shape[1] if data_format == "NCW" else x.shape[2]
    if channels % groups or (data_format == "NWC" and groups != 1):
        raise TraceError(f"{user_location()}: {api}: {channels} input channels do not fit groups={groups} "
                         f"({data_format})")
    (k,) = nn._sequence(kernel_size, 1, api, "kernel_size")
    name = name or current(api).unique_name("Conv1d")
    shape = (filters, channels // groups, k) if data_format == "NCW" else (filters, k, channels)
    return _convolution_layer(x, name, shape, filters, data_format, use_bias, activation,
                              lambda weight: nn.conv1d(x, weight, strides, padding, data_format, dilation_rate,
                                                       groups, name),
                              kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                              trainable, weight_name, bias_name)


def prelu(inputs, alpha_initializer=None, alpha_regularizer=None, shared_axes=None, trainable: bool = True,
          name: str = "PRelu", model_distribute=None) -> Blob:
    """`flow.layers.prelu(inputs, alpha_initializer=None, alpha_regularizer=None, shared_axes=None,
    trainable=True, name="PRelu")`: x where x > 0, else alpha * x, with a learned `alpha` of shape
    inputs.shape[1:] (1 along each of `shared_axes`, which count from the batch axis 0) in the variable
    `<name>-alpha`, zeros unless told.  As in OneFlow the default name is the fixed "PRelu": two
    unnamed prelu layers share one alpha.  `model_distribute` is accepted; every rank holds the whole alpha.

    Example:
        y = flow.layers.prelu(conv1, shared_axes=[2, 3], name="prelu1")      # one alpha per channel
    """
    from flow import indexing
    api = "flow.layers.prelu"
    x = check_blob(inputs, api, "inputs")
    if len(x.shape) < 2:
        raise TraceError(f"{user_location()}: {api}: inputs must have a batch axis and at least one more, "
                         f"got shape {list(x.shape)}")
    if not isinstance(name, str) or not name:
        raise TraceError(f"{user_location()}: {api}: name must be a non-empty string, got {name!r}")
    alpha_shape = list(x.shape[1:])
    for axis in shared_axes or ():
        if not isinstance(axis, int) or not 1 <= axis < len(x.shape):
            raise TraceError(f"{user_location()}: {api}: shared_axes must hold axes in [1, {len(x.shape)}), "
                             f"got {shared_axes!r}")
        alpha_shape[axis - 1] = 1
    alpha = get_variable(f"{name}-alpha", shape=tuple(alpha_shape), dtype=x.dtype,
                         initializer=alpha_initializer or initializers.constant_initializer(0),
                         regularizer=alpha_regularizer, trainable=trainable)
    alpha = emit("reshape", [alpha], {"shape": (1,) + tuple(alpha_shape)}, api=api)
    return indexing.where(x > 0.0, x, x * alpha, name=name)


def _convolution_layer(x: Blob, name: str, shape: tuple, filters: int, data_format: str, use_bias: bool,
                       activation, convolve: Callable[[Blob], Blob], kernel_initializer, bias_initializer,
                       kernel_regularizer, bias_regularizer, trainable: bool, weight_name, bias_name) -> Blob:
    """What the convolution layers share: the weight `<name>-weight` (Xavier-uniform by default, as in
    OneFlow), the convolution, the bias `<name>-bias` (zeros) along the channel axis, the activation."""
    from flow import nn
    weight = get_variable(weight_name or f"{name}-weight", shape=shape, dtype=x.dtype,
                          initializer=kernel_initializer or initializers.xavier_uniform_initializer(
                              data_format=data_format),
                          regularizer=kernel_regularizer, trainable=trainable)
    out = convolve(weight)
    if use_bias:
        bias = get_variable(bias_name or f"{name}-bias", shape=(filters,), dtype=x.dtype,
                            initializer=bias_initializer or initializers.constant_initializer(0),
                            regularizer=bias_regularizer, trainable=trainable)
        out = nn.bias_add(out, bias, data_format)
    return activation(out) if activation is not None else out
