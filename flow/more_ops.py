"""OneFlow 0.3 names composed of other ops: `flow.sort`, `flow.argsort`, `flow.range`,
`flow.smooth_l1_loss`, `flow.dtypes`, and the deprecated scope names (`flow.name_scope`,
`flow.device_prior_placement`, `flow.scope.consistent_view_enabled`, ...).

Example:
    ascending = flow.sort(x)                            # along the last axis
    order = flow.argsort(x, direction="DESCENDING")
"""
from __future__ import annotations

import warnings
from typing import Any

from flowc.compiler import dtypes as _dtypes
from flowc.compiler.errors import TraceError
from flowc.compiler.ir import dtype_name
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import along_last_axis, check_blob, iota


def _direction(direction: str, api: str) -> bool:
    if direction not in ("ASCENDING", "DESCENDING"):
        raise TraceError(f"{user_location()}: {api}: direction must be \"ASCENDING\" or \"DESCENDING\", "
                         f"got {direction!r}")
    return direction == "DESCENDING"


def _order_last(x: Blob, descending: bool, api: str) -> Blob:
    """int32 indices sorting x's last axis; equal values keep their order (top_k puts the lower
    index first among ties)."""
    keys = x if descending else emit("negative", [x], api=api)
    return emit("top_k", [keys], {"k": x.shape[-1]}, api=api)


def argsort(input, axis: int = -1, direction: str = "ASCENDING", name: str | None = None) -> Blob:  # noqa: A002
    """`flow.argsort(input, axis=-1, direction="ASCENDING")`: int32 indices that sort `input` along
    `axis`; stable (equal values keep their order).  NaN counts as the largest when DESCENDING and,
    unlike np.argsort, as the smallest when ASCENDING (the sort is a top-k of -input).

    Example:
        order = flow.argsort(scores, direction="DESCENDING")
    """
    api = "flow.argsort"
    x = check_blob(input, api, "input")
    descending = _direction(direction, api)
    if not x.shape:
        raise TraceError(f"{user_location()}: {api}: input must have at least one axis")
    return along_last_axis(x, axis, api, lambda v: _order_last(v, descending, api))


def sort(input, axis: int = -1, direction: str = "ASCENDING", name: str | None = None) -> Blob:  # noqa: A002
    """`flow.sort(input, axis=-1, direction="ASCENDING")`: `input` sorted along `axis` (a gather by
    `flow.argsort`, so the gradient flows back to the elements' places).

    Example:
        ranked = flow.sort(scores, direction="DESCENDING")
    """
    api = "flow.sort"
    x = check_blob(input, api, "input")
    descending = _direction(direction, api)
    if not x.shape:
        raise TraceError(f"{user_location()}: {api}: input must have at least one axis")

    def sorted_last(v: Blob) -> Blob:
        order = _order_last(v, descending, api)
        rank = len(v.shape)
        return emit("gather", [v, order], {"axis": rank - 1, "batch_dims": rank - 1}, name=name or "", api=api)
    return along_last_axis(x, axis, api, sorted_last)


def range(start, limit=None, delta=1, dtype=None, name: str = "range") -> Blob:  # noqa: A001 - OneFlow's name
    """`flow.range(start, limit=None, delta=1, dtype=None)`: the constant [start, start + delta, ...)
    up to `limit` (exclusive), as np.arange; `flow.range(n)` is [0, n).  The dtype is int64 unless
    told (OneFlow's default).

    Example:
        positions = flow.range(0, 16, dtype=flow.int32)
    """
    import math
    api = "flow.range"
    if limit is None:
        start, limit = 0, start
    try:
        start, limit, delta = (float(v) if isinstance(v, float) else int(v) for v in (start, limit, delta))
    except (TypeError, ValueError):
        raise TraceError(f"{user_location()}: {api}: start, limit and delta must be numbers") from None
    if delta == 0:
        raise TraceError(f"{user_location()}: {api}: delta must not be 0")
    out_dtype = "int64" if dtype is None else dtype_name(dtype)
    n = max(int(math.ceil((limit - start) / delta)), 0)
    if n == 0:
        raise TraceError(f"{user_location()}: {api}: range({start}, {limit}, {delta}) is empty")
    index = iota(n, out_dtype if out_dtype in ("float32", "float64", "int64") else "int64", api)
    values = index * delta + start if (delta != 1 or start != 0) else index
    if values.type.dtype != out_dtype:
        values = emit("cast", [values], {"dtype": out_dtype}, api=api)
    return emit("reshape", [values], {"shape": (n,)}, name=name or "", api=api)


def smooth_l1_loss(prediction, label, beta: float = 1.0, name: str | None = None) -> Blob:
    """`flow.smooth_l1_loss(prediction, label, beta=1.0)`: elementwise, with d = |prediction - label|,
    0.5 * d^2 / beta where d < beta, else d - 0.5 * beta (beta = 0: d).  No reduction, as in OneFlow.

    Example:
        loss = flow.smooth_l1_loss(boxes, target_boxes)      # OneFlow's example: [0.02, 0.125, 1.7, 0.005, 0.18]
    """
    from flow import indexing, math
    api = "flow.smooth_l1_loss"
    p, t = check_blob(prediction, api, "prediction"), check_blob(label, api, "label")
    if p.shape != t.shape:
        raise TraceError(f"{user_location()}: {api}: prediction {list(p.shape)} and label {list(t.shape)} "
                         f"must have one shape")
    beta = float(beta)
    if beta < 0:
        raise TraceError(f"{user_location()}: {api}: beta must be >= 0, got {beta}")
    d = math.abs(p - t)
    if beta == 0:
        return math.multiply(d, 1.0, name=name)
    return indexing.where(d < beta, math.square(d) * (0.5 / beta), d - 0.5 * beta, name=name)


def count_not_finite(x, name: str | None = None) -> Blob:
    """`flow.count_not_finite(x)`: how many elements of x are NaN or infinite, an int64 Blob of shape (1,).

    Example:
        bad = flow.count_not_finite(grad)
    """
    from flow import math
    api = "flow.count_not_finite"
    x = check_blob(x, api, "x")
    # x - x is 0 for a finite x and NaN for NaN and the infinities (flowc never folds it: IEEE-exact)
    flags = emit("cast", [math.not_equal(x - x, 0)], {"dtype": "int64"}, api=api)
    return math.reduce_sum(flags, name=name)


def multi_count_not_finite(x=None, name: str | None = None) -> Blob:
    """`flow.multi_count_not_finite([a, b, ...])`: the NaN and infinite elements of every Blob, counted
    together (int64, shape (1,)).

    Example:
        bad = flow.multi_count_not_finite([grad_w, grad_b])
    """
    from flow import math
    api = "flow.multi_count_not_finite"
    if not isinstance(x, (list, tuple)) or not x:
        raise TraceError(f"{user_location()}: {api}: x must be a non-empty list of Blobs, got {x!r}")
    counts = [count_not_finite(check_blob(b, api, f"x[{i}]")) for i, b in enumerate(x)]
    return counts[0] if len(counts) == 1 and name is None else math.add_n(counts, name=name)


def elem_cnt(inputs, dtype=None, name: str | None = None) -> Blob:
    """`flow.elem_cnt(inputs, dtype=None)`: the number of elements of `inputs`, a Blob of shape (1,)
    (int32 unless `dtype` says otherwise, as OneFlow's shape_elem_cnt op); on several ranks, of the
    logical Blob.

    Example:
        n = flow.elem_cnt(x)       # x (4, 5): [20]
    """
    api = "flow.elem_cnt"
    x = check_blob(inputs, api, "inputs")
    count = 1
    for d in x.shape:
        count *= d
    out_dtype = "int32" if dtype is None else dtype_name(dtype)
    return emit("constant", [], {"value": count, "shape": (1,), "dtype": out_dtype}, name=name or "", api=api)


def dtypes() -> list:
    """`flow.dtypes()`: every data type object flowc knows (`flow.float32`, `flow.int8`, ...).

    Example:
        flow.float16 in flow.dtypes()     # True
    """
    return [_dtypes.char, _dtypes.float16, _dtypes.float32, _dtypes.float64, _dtypes.int8, _dtypes.int32,
            _dtypes.int64, _dtypes.uint8]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"flow.{old} is deprecated; use flow.{new}", DeprecationWarning, stacklevel=3)


def name_scope(*args: Any, **kwargs: Any):
    """Deprecated name of `flow.scope.namespace`.

    Example:
        with flow.name_scope("encoder"):
            w = flow.get_variable("w", shape=(4, 4))      # "encoder-w"
    """
    from flow import scope
    _deprecated("name_scope", "scope.namespace")
    return scope.namespace(*args, **kwargs)


def variable_scope(*args: Any, **kwargs: Any):
    """`flow.deprecated.variable_scope`: deprecated name of `flow.scope.namespace`.

    Example:
        with flow.deprecated.variable_scope("encoder"):
            w = flow.get_variable("w", shape=(4, 4))      # "encoder-w"
    """
    from flow import scope
    _deprecated("deprecated.variable_scope", "scope.namespace")
    return scope.namespace(*args, **kwargs)


def device_prior_placement(device_tag, machine_device_ids):
    """Deprecated name of `flow.scope.placement`.

    Example:
        with flow.device_prior_placement("cpu", "0:0"):
            y = x * 2
    """
    from flow import scope
    _deprecated("device_prior_placement", "scope.placement")
    return scope.placement(device_tag, machine_device_ids)


__all__ = ["argsort", "sort", "range", "smooth_l1_loss", "dtypes", "name_scope", "variable_scope",
           "device_prior_placement"]


def _logical_view() -> str:
    """The innermost `with flow.scope.*_view():` block's view, else the traced job's, else consistent."""
    from flow.scope import _view_stack
    from flowc.compiler.trace import _current
    if _view_stack:
        return _view_stack[-1]
    return _current[-1].logical_view if _current else "consistent"


def consistent_view_enabled() -> bool:
    """`flow.scope.consistent_view_enabled()`: True unless the job being traced has
    `function_config().default_logical_view(flow.scope.mirrored_view())` (outside a job: True),
    or a `with flow.scope.mirrored_view():` block is open (the innermost block wins).

    Example:
        if flow.scope.consistent_view_enabled():
            x = flow.identity(x)
    """
    return _logical_view() == "consistent"


def mirrored_view_enabled() -> bool:
    """`flow.scope.mirrored_view_enabled()`: True where the job being traced has the mirrored logical
    view (`function_config().default_logical_view(flow.scope.mirrored_view())`) or inside a
    `with flow.scope.mirrored_view():` block (the innermost block wins).

    Example:
        if flow.scope.mirrored_view_enabled():
            ...
    """
    return _logical_view() == "mirrored"


def parallel_cast(input, name: str | None = None, distribute=None, gradient_distribute=None) -> Blob:  # noqa: A002
    """`flow.parallel_cast(input, distribute=None, gradient_distribute=None)`: the same logical values,
    laid out over the devices as `distribute` says (and its gradient as `gradient_distribute`).  In
    the consistent view a layout never changes a value, and flowc's passes choose the layouts, so
    both hints are checked and the result is `input`'s values.

    Example:
        ids = flow.parallel_cast(ids, distribute=flow.distribute.broadcast())
    """
    from flowc.compiler.distribute import check_distribute
    from flow.indexing import identity
    api = "flow.parallel_cast"
    x = check_blob(input, api, "input")
    for hint in (distribute, gradient_distribute):
        if hint is not None:
            check_distribute(hint, x, api)
    return identity(x, name=name)


class FunctionDesc:
    """What `flow.current_global_function_desc()` returns: the job being traced, as OneFlow's
    FunctionDesc shows it: `IsTrainable()`, `HasAttr(option)`, and the FunctionConfig options the
    job set, read as attributes."""

    def __init__(self, job_name: str, job_type: str, config: Any) -> None:
        self._job_name, self._job_type = job_name, job_type
        self._values: dict[str, Any] = dict(getattr(config, "values", None) or {})

    def IsTrainable(self) -> bool:  # noqa: N802 - OneFlow's name
        """True in a `type="train"` job."""
        return self._job_type == "train"

    def HasAttr(self, attr_name: str) -> bool:  # noqa: N802 - OneFlow's name
        """Did the job's function config set option `attr_name`?"""
        return attr_name in self._values

    def __getattr__(self, attr_name: str) -> Any:
        if attr_name.startswith("_"):
            raise AttributeError(attr_name)
        if attr_name in self._values:
            return self._values[attr_name]
        raise AttributeError(f"job {self._job_name!r}: its function config does not set {attr_name!r} "
                             f"(HasAttr({attr_name!r}) is False)")


def current_global_function_desc() -> FunctionDesc:
    """`flow.current_global_function_desc()`: the job function being traced; `IsTrainable()` tells
    a train job from a predict job (layers use it to pick batch statistics or the moving ones).

    Example:
        training = flow.current_global_function_desc().IsTrainable()
    """
    from flowc.compiler.trace import current
    ctx = current("flow.current_global_function_desc()")
    return FunctionDesc(ctx.job_name, ctx.job_type, ctx.function_config)
