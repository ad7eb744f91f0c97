"""flowc's public API: OneFlow's job-function API (v0.3), compiled to C++.

Example:
    import numpy as np
    import flow
    import flow.typing as tp

    @flow.global_function(type="predict")
    def double(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
        return x * 2

    double(np.arange(4, dtype=np.float32))   # array([0., 2., 4., 6.], dtype=float32)
"""
import warnings as _warnings

from flowc.compiler.dtypes import DType as dtype  # noqa: F401 - OneFlow's name of the dtype class
from flowc.compiler.dtypes import (char, convert_oneflow_dtype_to_numpy_dtype, float16, float32, float64, half, int8,
                                   int32, int64, uint8)
from flowc.compiler.errors import FlowError, JobCallError, StepError, TraceError, UnsupportedError
from flowc.compiler.backends import DeviceName as _DeviceName
from flowc.compiler.trace import Blob
from flow import config, layers, losses, math, nn, optimizer, scope, typing
from flow import checkpoint, distribute, env, image, profiler, regularizers, train, unsupported
from flow import nvtx, random
from flow import system
from flow.checkpoint import get_all_variables, load_variables
from flow import data
from flow.array_ops import cast, concat, flatten, matmul, reshape, transpose
from flow.indexing import (assign, broadcast_like, cast_to_current_logical_view, constant, constant_like,
                           constant_scalar, expand_dims, gather, identity, identity_n, masked_fill, one_hot, ones,
                           ones_like, pad, reshape_like, reverse, slice, slice_update, slice_v2, squeeze, stack, where,
                           zeros, zeros_like)
from flow.variables import get_variable
from flow.math import broadcast_to_compatible_with
from flow.math import clip_by_value, clip_by_value as clip, clip_by_value as clamp, clip_by_value as clip_by_scalar
from flow.watch import watch, watch_diff, watch_scope
from flowc.runtime.initializers import (constant_initializer, glorot_normal_initializer, glorot_uniform_initializer,
                                  kaiming_initializer, ones_initializer, random_normal_initializer,
                                  random_uniform_initializer, truncated_normal, truncated_normal_initializer,
                                  variance_scaling_initializer, xavier_normal_initializer,
                                  xavier_uniform_initializer, zeros_initializer)
from flowc.runtime.job import FunctionConfig, global_function
from flowc.runtime.session import clear_default_session
from flow import deprecated, linalg, sbp
from flow.math import in_top_k, unsorted_batch_segment_sum, unsorted_segment_sum, unsorted_segment_sum_like
from flow.margin_loss import combined_margin_loss
from flow.nd_indexing import dim_gather, gather_nd, scatter_nd, tensor_scatter_nd_add, tensor_scatter_nd_update
from flow.pad2d import constant_pad2d, reflection_pad2d, replication_pad2d
from flow.user_ops import consistent_user_op_builder, user_op_builder
from flow.more_ops import (argsort, count_not_finite, current_global_function_desc, device_prior_placement, dtypes,
                           elem_cnt, multi_count_not_finite, name_scope,
                           parallel_cast, range, smooth_l1_loss, sort)

float = float32        # noqa: A001 - OneFlow's name
double = float64

# The public API: what `from flow import *` binds and what linters count as re-exported.
__all__ = [
    # submodules
    "checkpoint", "config", "data", "distribute", "env", "image", "layers", "losses", "math", "nn", "optimizer",
    "nvtx", "profiler", "random", "regularizers", "scope", "system", "train", "typing", "dtype",
    "amp_white_identity", "cast_to_static_shape", "copy", "current_machine_id", "broadcast_to_compatible_with",
    # data types
    "float", "double", "float16", "half", "float32", "float64", "char", "int8", "int32", "int64", "uint8",
    "convert_oneflow_dtype_to_numpy_dtype",
    # errors
    "FlowError", "JobCallError", "StepError", "TraceError", "UnsupportedError",
    # execution modes; features flowc does not support (flow/unsupported.py: calling them raises)
    "eager_execution_enabled", "enable_eager_execution", "user_op_module_builder",
    # OneFlow's built-in ops by their op type (flow/user_ops.py)
    "user_op_builder", "consistent_user_op_builder",
    # blobs and ops
    "Blob", "cast", "concat", "flatten", "matmul", "reshape", "transpose",
    # sources, views and indexing (flow/indexing.py)
    "assign", "broadcast_like", "cast_to_current_logical_view", "constant", "constant_like", "constant_scalar",
    "expand_dims", "gather", "identity", "identity_n", "masked_fill", "one_hot", "ones", "ones_like", "pad",
    "reshape_like", "reverse", "slice", "slice_update", "slice_v2", "squeeze", "stack", "where", "zeros", "zeros_like",
    "gather_nd", "scatter_nd", "tensor_scatter_nd_add", "tensor_scatter_nd_update", "dim_gather",
    "constant_pad2d", "reflection_pad2d", "replication_pad2d",
    "clip_by_value", "clip", "clamp", "clip_by_scalar",     # OneFlow's other names of flow.math.clip_by_value
    # variables, checkpoints and initializers
    "get_variable", "get_all_variables", "load_variables",
    "constant_initializer", "glorot_normal_initializer", "glorot_uniform_initializer", "kaiming_initializer",
    "ones_initializer", "random_normal_initializer", "random_uniform_initializer", "truncated_normal",
    "truncated_normal_initializer", "variance_scaling_initializer", "xavier_normal_initializer",
    "xavier_uniform_initializer", "zeros_initializer",
    # job functions and the session
    "FunctionConfig", "function_config", "global_function", "clear_default_session", "sync_default_session",
    "compile_cache_stats", "fixed_placement", "FixedTensorDef", "MirroredTensorDef", "MirroredTensorListDef",
    # watching values and gradients
    "watch", "watch_diff", "watch_scope",
    # more of OneFlow 0.3's names (flow/more_ops.py, flow/linalg.py, flow/sbp.py, flow/deprecated.py)
    "deprecated", "linalg", "sbp", "in_top_k", "unsorted_batch_segment_sum", "unsorted_segment_sum",
    "unsorted_segment_sum_like", "argsort", "device_prior_placement", "dtypes", "name_scope", "range",
    "smooth_l1_loss", "sort", "parallel_cast", "current_global_function_desc", "combined_margin_loss",
    "count_not_finite", "multi_count_not_finite", "elem_cnt",
]

__version__ = "0.1.0"


def function_config() -> FunctionConfig:
    """A job's configuration; pass it as `global_function(..., function_config=config)`.

    Example:
        config = flow.function_config()
        config.default_data_type(flow.float)
    """
    return FunctionConfig()


def eager_execution_enabled() -> bool:
    """False: flowc runs job functions in OneFlow's lazy (graph) mode only.

    Example:
        flow.eager_execution_enabled()   # False
    """
    return False


def enable_eager_execution(val: bool = True) -> None:
    """Eager execution is not supported: raises UnsupportedError, except `enable_eager_execution(False)`
    (lazy mode, which is what flowc runs).

    Example:
        flow.enable_eager_execution(False)   # fine: lazy mode
        flow.enable_eager_execution()        # UnsupportedError: ... eager execution ...
    """
    if not isinstance(val, bool):
        raise TypeError(f"flow.enable_eager_execution: expected True or False, got {val!r}")
    if val:
        unsupported.stub("enable_eager_execution")()


user_op_module_builder = unsupported.stub("user_op_module_builder")


def _bind_unsupported() -> None:
    """Bind every name of flow/unsupported.py where OneFlow has it, so that calling it raises
    UnsupportedError naming the feature (never an AttributeError); namespaces holding only such
    names become modules of stubs."""
    import sys
    here = sys.modules[__name__]
    for ns in unsupported.UNSUPPORTED_NAMESPACES:
        parent, _, leaf = ns.rpartition(".")
        setattr(getattr(here, parent) if parent else here, leaf, unsupported.namespace_module(ns))
    namespaces = {name.rpartition(".")[0] for name in unsupported.UNSUPPORTED}
    for ns in sorted(namespaces):
        target, path = here, []
        for part in ns.split(".") if ns else []:
            path.append(part)
            if not hasattr(target, part):       # a namespace flowc has no module for: one of stubs
                setattr(target, part, unsupported.namespace_module(".".join(path)))
            target = getattr(target, part)
        for name, stub in unsupported.stubs(ns).items():
            if not hasattr(target, name):
                setattr(target, name, stub)


_bind_unsupported()


def amp_white_identity(x, name: str | None = None) -> Blob:
    """OneFlow's marker that `x` may be float16 under auto mixed precision; the value is `x`.

    Example:
        y = flow.amp_white_identity(x)
    """
    return identity(x, name)


def cast_to_static_shape(x, name: str | None = None) -> Blob:
    """The blob with its static shape; every flowc blob has one, so this is `x`.

    Example:
        y = flow.cast_to_static_shape(x)
    """
    return identity(x, name)


def copy(x, name: str | None = None) -> Blob:
    """`flow.copy(x)`: a copy of `x` (flowc's values are never aliased by the user, so the copy is `x`).

    Example:
        y = flow.copy(x)
    """
    return identity(x, name)


def current_machine_id() -> int:
    """The index of this machine among the session's machines: 0 (flowc runs on one machine).

    Example:
        flow.current_machine_id()   # 0
    """
    return 0


def fixed_placement(device_tag: _DeviceName, machine_device_ids="0:0"):
    """Deprecated name of `flow.scope.placement`."""
    _warnings.warn("flow.fixed_placement is deprecated; use flow.scope.placement", DeprecationWarning, stacklevel=2)
    return scope.placement(device_tag, machine_device_ids)


def compile_cache_stats() -> dict:
    """This process's compile-cache counters: hits, misses and compilations.

    Example:
        flow.compile_cache_stats()   # {'hits': 2, 'misses': 0, 'compilations': 0}
    """
    from flowc.compiler.cache import stats
    return stats()


def sync_default_session() -> None:
    """Wait until every job call in flight has run and its callback has returned; then raise the
    first error of an asynchronous call or callback that no sync point has raised yet.  Calls that
    other threads make meanwhile are not waited for.  Inside a callback it raises a RuntimeError
    (it would wait for the callback's own call).

    Example:
        for images, labels in batches:
            train_job(images, labels)(print_loss)
        flow.sync_default_session()
    """
    from flowc.runtime.session import default_session
    default_session().sync()


def FixedTensorDef(shape, dtype=float32, batch_axis=0, name=None):  # noqa: N802 - OneFlow's name
    """Deprecated placeholder of the old API, used as a parameter's default value.

    Example:
        @flow.global_function()
        def job(x=flow.FixedTensorDef((4,), dtype=flow.float)): ...
    """
    _warnings.warn("flow.FixedTensorDef is deprecated; annotate the parameter with tp.Numpy.Placeholder",
                   DeprecationWarning, stacklevel=2)
    from flowc.runtime.signature import NumpyPlaceholder
    return NumpyPlaceholder(shape, dtype, batch_axis, name)


def MirroredTensorDef(shape, dtype=float32, batch_axis=0, name=None):  # noqa: N802 - OneFlow's name
    """Deprecated mirrored placeholder of the old API: `tp.ListNumpy.Placeholder` as a default value.

    Example:
        @flow.global_function()
        def job(x=flow.MirroredTensorDef((4,), dtype=flow.float)): ...
        job([np.ones(3, np.float32)])         # a list with one array, at most the declared size
    """
    _warnings.warn("flow.MirroredTensorDef is deprecated; annotate the parameter with tp.ListNumpy.Placeholder",
                   DeprecationWarning, stacklevel=2)
    from flowc.runtime.signature import ListNumpyPlaceholder
    return ListNumpyPlaceholder(shape, dtype, batch_axis, name)


def MirroredTensorListDef(shape, dtype=float32, batch_axis=0, name=None):  # noqa: N802 - OneFlow's name
    """Deprecated tensor-list placeholder of the old API: `tp.ListListNumpy.Placeholder` as a default.

    Example:
        @flow.global_function()
        def job(x=flow.MirroredTensorListDef((4,), dtype=flow.float)): ...
    """
    _warnings.warn("flow.MirroredTensorListDef is deprecated; annotate the parameter with "
                   "tp.ListListNumpy.Placeholder", DeprecationWarning, stacklevel=2)
    from flowc.runtime.signature import ListListNumpyPlaceholder
    return ListListNumpyPlaceholder(shape, dtype, batch_axis, name)


# The compiler and the step runtime load with `flow`, as a framework's kernels load with it: a
# job's first call then spends its time tracing and compiling, not importing (about 0.25 s).
import flowc.compiler.pipeline as _pipeline  # noqa: E402,F401
import flowc.runtime.executor as _executor  # noqa: E402,F401
