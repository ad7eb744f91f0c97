"""OneFlow 0.3's `flow.nn.InstanceNorm1d/2d/3d` and `flow.nn.GroupNorm`, composed of reductions.

As OneFlow computes them: each (sample, channel) row (or, for GroupNorm, each (sample, group)) is
normalized by its own mean and biased variance, `(x - mean) / sqrt(variance + eps)`; with `affine`
it is then scaled and shifted by `<name>_gamma` (ones) and `<name>_beta` (zeros) of shape (1, C, 1).
GroupNorm's gamma and beta are per group, (1, num_groups, 1), as OneFlow's are (PyTorch's are per
channel).  Every one is a function of its input, so train and predict jobs compute the same.

Example:
    y = flow.nn.InstanceNorm2d(images, eps=1e-5, affine=True, name="in1")
    y = flow.nn.GroupNorm(features, num_groups=4, name="gn1")
"""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, current, user_location
from flow._ops import check_blob


def InstanceNorm1d(x, eps: float = 1e-05, affine: bool = True, name: str | None = None) -> Blob:  # noqa: N802
    """`flow.nn.InstanceNorm1d(x, eps=1e-5, affine=True)`: x (N, C, L) normalized over L, per sample and channel.

    Example:
        y = flow.nn.InstanceNorm1d(x, name="in1")
    """
    from flow import math
    from flow.variables import get_variable
    from flowc.runtime import initializers
    api = "flow.nn.InstanceNorm1d"
    x = _checked(x, 3, api)
    name = name or current(api).unique_name("InstanceNorm1D")
    mean = math.reduce_mean(x, axis=[2], keepdims=True)
    variance = math.reduce_variance(x, axis=[2], keepdims=True)
    normalized = (x - mean) / math.sqrt(variance + float(eps))
    if not affine:
        return normalized
    shape = (1, x.shape[1], 1)
    gamma = get_variable(f"{name}_gamma", shape=shape, dtype=x.dtype, initializer=initializers.ones_initializer())
    beta = get_variable(f"{name}_beta", shape=shape, dtype=x.dtype, initializer=initializers.zeros_initializer())
    return gamma * normalized + beta


def InstanceNorm2d(x, eps: float = 1e-05, affine: bool = True, name: str | None = None) -> Blob:  # noqa: N802
    """`flow.nn.InstanceNorm2d(x, eps=1e-5, affine=True)`: x (N, C, H, W) normalized over H and W.

    Example:
        y = flow.nn.InstanceNorm2d(images, name="in1")
    """
    api = "flow.nn.InstanceNorm2d"
    x = _checked(x, 4, api)
    return _as_rows(x, x.shape[1], eps, affine, name or current(api).unique_name("InstanceNorm2D"), api)


def InstanceNorm3d(x, eps: float = 1e-05, affine: bool = True, name: str | None = None) -> Blob:  # noqa: N802
    """`flow.nn.InstanceNorm3d(x, eps=1e-5, affine=True)`: x (N, C, D, H, W) normalized over D, H and W.

    Example:
        y = flow.nn.InstanceNorm3d(volumes, name="in1")
    """
    api = "flow.nn.InstanceNorm3d"
    x = _checked(x, 5, api)
    return _as_rows(x, x.shape[1], eps, affine, name or current(api).unique_name("InstanceNorm3D"), api)


def GroupNorm(x, num_groups: int = 32, eps: float = 1e-05, affine: bool = True,  # noqa: N802
              name: str | None = None) -> Blob:
    """`flow.nn.GroupNorm(x, num_groups=32, eps=1e-5, affine=True)`: x (N, C, ...) normalized over each
    group of C / num_groups channels and all the other axes; gamma and beta are per group, as in OneFlow.

    Example:
        y = flow.nn.GroupNorm(features, num_groups=4, name="gn1")
    """
    api = "flow.nn.GroupNorm"
    x = check_blob(x, api, "x")
    if len(x.shape) < 3:
        raise TraceError(f"{user_location()}: {api}: x must have 3 or more axes (N, C, ...), got {list(x.shape)}")
    if not isinstance(num_groups, int) or num_groups < 1 or x.shape[1] % num_groups:
        raise TraceError(f"{user_location()}: {api}: the {x.shape[1]} channels must divide into num_groups="
                         f"{num_groups!r}")
    return _as_rows(x, num_groups, eps, affine, name or current(api).unique_name("GroupNorm"), api)


def _checked(x, rank: int, api: str) -> Blob:
    x = check_blob(x, api, "x")
    if len(x.shape) != rank:
        raise TraceError(f"{user_location()}: {api}: x must have {rank} axes (N, C, ...), got {list(x.shape)}")
    return x


def _as_rows(x: Blob, rows: int, eps: float, affine: bool, name: str, api: str) -> Blob:
    """OneFlow's composition: x as (N, rows, -1), InstanceNorm1d under `name`, back to x's shape."""
    from flow.array_ops import reshape
    flat = reshape(x, [x.shape[0], rows, -1])
    return reshape(InstanceNorm1d(flat, eps=eps, affine=affine, name=name), list(x.shape))
