"""`flow.get_variable`: a named variable, shared by every job of the session."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import TensorType, dtype_name
from flowc.compiler.trace import Blob, current, emit, user_location
from flowc.runtime import initializers
from flowc.runtime.checkpoint import shorten_name, variable_name_problem


def get_variable(name: str, shape=None, dtype=None, initializer=None, regularizer=None, trainable: bool = True,
                 model_name=None, random_seed=None, distribute=None, reuse: bool = True) -> Blob:
    """Create or reuse the variable `name`; every job of the session reading `name` sees one storage.

    Without an initializer the values come from glorot_uniform (reproducible: seeded from the name).
    With `reuse=False`, getting a variable this job already got is an error, as in OneFlow 0.3.4.

    Example:
        w = flow.get_variable("w", shape=(10, 784), initializer=flow.truncated_normal(0.1))
    """
    api = "flow.get_variable"
    ctx = current(api)
    loc = user_location()
    if not isinstance(name, str) or not name:
        raise TraceError(f"{loc}: {api}: name must be a non-empty string, got {name!r}")
    if ctx.namespaces:     # flow.scope.namespace("a"): "a-<name>", as OneFlow names it
        name = "-".join(ctx.namespaces + [name])
    if not reuse and name in ctx.variable_nodes:
        raise TraceError(f"{loc}: {api}: variable {name!r} already exists in job {ctx.job_name!r}; getting "
                         f"the same variable again is not allowed with reuse=False")
    problem = variable_name_problem(name)     # decided here, not at the first checkpoint save
    if problem is not None:
        raise TraceError(f"{loc}: {api}: name {shorten_name(name)} {problem}")
    if shape is None:
        raise TraceError(f"{loc}: {api}: variable {name!r} needs a shape")
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TraceError(f"{loc}: {api}: shape of {name!r} must be a sequence of ints, got {shape!r}") from None
    if any(d <= 0 for d in shape):
        raise TraceError(f"{loc}: {api}: shape of {name!r} must be positive, got {list(shape)}")
    try:
        dtype = dtype_name(dtype) if dtype is not None else ctx.default_dtype
    except TypeError as err:
        raise TraceError(f"{loc}: {api}: dtype of {name!r}: {err}") from None
    if initializer is None:
        initializer = initializers.glorot_uniform_initializer()
    if not hasattr(initializer, "sample"):
        raise TraceError(f"{loc}: {api}: initializer of {name!r} must be a flow initializer such as "
                         f"flow.truncated_normal(0.1), got {initializer!r}")
    if distribute is not None:
        from flowc.compiler.distribute import Split, check_distribute
        check_distribute(distribute, None, f"{api}: distribute of {name!r}")
        if isinstance(distribute, Split):
            ctx.split_variables.setdefault(name, (loc, distribute.axis))
    ctx.session.declare_variable(name, TensorType(shape, dtype), initializer, bool(trainable), loc)
    if regularizer is not None:
        _set_regularizer(ctx, name, regularizer, loc)
    if name in ctx.variable_nodes:
        return Blob(ctx, ctx.variable_nodes[name])
    if trainable:          # this job trains it; another job may declare it trainable=False and only read it
        ctx.trainable_variables.add(name)
    blob = emit("variable", [], {"name": name, "shape": shape, "dtype": dtype}, name=name, api=api)
    ctx.variable_nodes[name] = blob.id
    return blob


def _set_regularizer(ctx, name: str, regularizer, loc: str) -> None:
    """Record the variable's L1/L2 penalty for this job's backward pass (OneFlow keeps it in the
    variable's op, so each job that declares the variable says whether it is regularized there)."""
    l1, l2 = getattr(regularizer, "l1", None), getattr(regularizer, "l2", None)
    if not isinstance(l1, (int, float)) or not isinstance(l2, (int, float)):
        raise TraceError(f"{loc}: flow.get_variable: regularizer of {name!r} must be flow.regularizers.l1(...), "
                         f"l2(...) or l1_l2(...), got {regularizer!r}")
    ctx.regularizers[name] = (float(l1), float(l2))
