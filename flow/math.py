"""`flow.math`: elementwise math and reductions, with OneFlow 0.3's names and signatures."""
from __future__ import annotations

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, as_blob, emit, user_location
from flow._ops import along_last_axis, axes, check_blob


def _binary(op: str, api: str):
    def fn(x, y, name: str | None = None) -> Blob:
        if not isinstance(x, Blob):
            y = check_blob(y, api, "y")
            x = as_blob(x, y, api)
        x = check_blob(x, api, "x")
        return emit(op, [x, as_blob(y, x, api)], name=name or "", api=api)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = f"`{api}(x, y)`: elementwise, broadcasting like NumPy.\n\nExample:\n    z = {api}(a, b)"
    return fn


def _unary(op: str, api: str):
    def fn(x, name: str | None = None) -> Blob:
        return emit(op, [check_blob(x, api, "x")], name=name or "", api=api)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = f"`{api}(x)`: elementwise.\n\nExample:\n    y = {api}(x)"
    return fn


add = _binary("add", "flow.math.add")
subtract = _binary("subtract", "flow.math.subtract")
multiply = _binary("multiply", "flow.math.multiply")
divide = _binary("divide", "flow.math.divide")
maximum = _binary("maximum", "flow.math.maximum")
minimum = _binary("minimum", "flow.math.minimum")
sigmoid = _unary("sigmoid", "flow.math.sigmoid")
tanh = _unary("tanh", "flow.math.tanh")
exp = _unary("exp", "flow.math.exp")
log = _unary("log", "flow.math.log")
square = _unary("square", "flow.math.square")
sqrt = _unary("sqrt", "flow.math.sqrt")
negative = _unary("negative", "flow.math.negative")
relu = _unary("relu", "flow.math.relu")


def _reduction(op: str, api: str):
    def fn(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
        x = check_blob(input_tensor, api, "input_tensor")
        ax = axes(x, axis, api)
        if not ax:
            return x
        return emit(op, [x], {"axes": ax, "keepdims": bool(keepdims)}, name=name or "", api=api)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = (f"`{api}(input_tensor, axis=None, keepdims=False)`: reduce over `axis` (int, list or None "
                  f"for all).\n\nExample:\n    s = {api}(x, axis=[0, 2], keepdims=True)")
    return fn


reduce_sum = _reduction("reduce_sum", "flow.math.reduce_sum")
reduce_max = _reduction("reduce_max", "flow.math.reduce_max")
reduce_min = _reduction("reduce_min", "flow.math.reduce_min")
reduce_prod = _reduction("reduce_prod", "flow.math.reduce_prod")


def reduce_mean(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
    """`flow.math.reduce_mean(x, axis=None, keepdims=False)`: the sum times 1/count.

    Example:
        m = flow.math.reduce_mean(loss)
    """
    x = check_blob(input_tensor, "flow.math.reduce_mean", "input_tensor")
    ax = axes(x, axis, "flow.math.reduce_mean")
    count = 1
    for a in ax:
        count *= x.shape[a]
    total = reduce_sum(x, ax, keepdims, name)
    return total * (1.0 / count) if count else total


def gelu(x, name: str | None = None) -> Blob:
    """`flow.math.gelu(x)`, the same as `flow.nn.gelu`."""
    from flow.nn import gelu as nn_gelu
    return nn_gelu(x, name)


def argmax(input, axis: int = -1, name: str | None = None) -> Blob:
    """`flow.math.argmax(input, axis=-1)`: int32 index of the largest element along `axis`.

    Example:
        predictions = flow.math.argmax(logits)
    """
    x = check_blob(input, "flow.math.argmax", "input")
    return along_last_axis(x, axis, "flow.math.argmax",
                           lambda v: emit("argmax", [v], name=name or "", api="flow.math.argmax"))


def top_k(input, k: int = 1, sorted: bool = True, name: str | None = None) -> Blob:  # noqa: A002
    """`flow.math.top_k(input, k=1, sorted=True)`: int32 indices of the k largest along the last axis.

    Example:
        best5 = flow.math.top_k(logits, k=5)
    """
    from flow.indexing import top_k as _top_k
    return _top_k(input, k, sorted, name)
# --- issue 14: the rest of OneFlow 0.3's flow.math (rows in compiler/ops/math_rows.py) ---------------

abs = _unary("abs", "flow.math.abs")   # noqa: A001 - OneFlow's name
acos = _unary("acos", "flow.math.acos")
acosh = _unary("acosh", "flow.math.acosh")
asin = _unary("asin", "flow.math.asin")
asinh = _unary("asinh", "flow.math.asinh")
atan = _unary("atan", "flow.math.atan")
atanh = _unary("atanh", "flow.math.atanh")
ceil = _unary("ceil", "flow.math.ceil")
cos = _unary("cos", "flow.math.cos")
cosh = _unary("cosh", "flow.math.cosh")
erf = _unary("erf", "flow.math.erf")
erfc = _unary("erfc", "flow.math.erfc")
expm1 = _unary("expm1", "flow.math.expm1")
floor = _unary("floor", "flow.math.floor")
lgamma = _unary("lgamma", "flow.math.lgamma")
log1p = _unary("log1p", "flow.math.log1p")
log_sigmoid = _unary("log_sigmoid", "flow.math.log_sigmoid")
reciprocal = _unary("reciprocal", "flow.math.reciprocal")
reciprocal_no_nan = _unary("reciprocal_no_nan", "flow.math.reciprocal_no_nan")
rint = _unary("rint", "flow.math.rint")
round = _unary("round", "flow.math.round")   # noqa: A001 - OneFlow's name; half to even, like np.round
rsqrt = _unary("rsqrt", "flow.math.rsqrt")
sign = _unary("sign", "flow.math.sign")
sin = _unary("sin", "flow.math.sin")
sinh = _unary("sinh", "flow.math.sinh")
softplus = _unary("softplus", "flow.math.softplus")
tan = _unary("tan", "flow.math.tan")
sigmoid_v2 = _unary("sigmoid", "flow.math.sigmoid_v2")
tanh_v2 = _unary("tanh", "flow.math.tanh_v2")

pow = _binary("pow", "flow.math.pow")   # noqa: A001 - OneFlow's name
atan2 = _binary("atan2", "flow.math.atan2")
floordiv = _binary("floordiv", "flow.math.floordiv")
mod = _binary("mod", "flow.math.mod")
xdivy = _binary("xdivy", "flow.math.xdivy")
xlogy = _binary("xlogy", "flow.math.xlogy")
# Comparisons and logical_and: int8 0/1, as in OneFlow 0.3.
equal = _binary("equal", "flow.math.equal")
not_equal = _binary("not_equal", "flow.math.not_equal")
less = _binary("less", "flow.math.less")
less_equal = _binary("less_equal", "flow.math.less_equal")
greater = _binary("greater", "flow.math.greater")
greater_equal = _binary("greater_equal", "flow.math.greater_equal")
logical_and = _binary("logical_and", "flow.math.logical_and")


def squared_difference(x, y, name: str | None = None) -> Blob:
    """`flow.math.squared_difference(x, y)`: (x - y)^2, broadcasting like NumPy.

    Example:
        err = flow.math.squared_difference(prediction, target)
    """
    api = "flow.math.squared_difference"
    if not isinstance(x, Blob):
        y = check_blob(y, api, "y")
        x = as_blob(x, y, api)
    x = check_blob(x, api, "x")
    diff = emit("subtract", [x, as_blob(y, x, api)], api=api)
    return emit("square", [diff], name=name or "", api=api)


def add_n(inputs, name: str | None = None) -> Blob:
    """`flow.math.add_n(inputs)`: the elementwise sum of a list of blobs of one shape and dtype.

    Example:
        total = flow.math.add_n([a, b, c])
    """
    api = "flow.math.add_n"
    items = list(inputs)
    if not items:
        raise TraceError(f"{user_location()}: {api}: argument 'inputs' must hold at least one Blob")
    blobs = [check_blob(b, api, f"inputs[{k}]") for k, b in enumerate(items)]
    for k, b in enumerate(blobs[1:], start=1):
        if b.shape != blobs[0].shape:
            raise TraceError(f"{user_location()}: {api}: inputs[{k}] has shape {list(b.shape)}, inputs[0] has "
                             f"{list(blobs[0].shape)}; add_n needs one shape")
    if len(blobs) == 1:
        return blobs[0]
    total = blobs[0]
    for k, b in enumerate(blobs[1:], start=1):
        total = emit("add", [total, b], name=(name or "") if k == len(blobs) - 1 else "", api=api)
    return total


def clip_by_value(values, min_value=None, max_value=None, name: str | None = None) -> Blob:
    """`flow.math.clip_by_value(values, min_value=None, max_value=None)`: values limited to
    [min_value, max_value] (either bound may be None).  NaN stays NaN (as np.clip); the gradient
    flows where min_value <= values <= max_value.

    Example:
        y = flow.math.clip_by_value(x, min_value=-1.0, max_value=1.0)
    """
    api = "flow.math.clip_by_value"
    x = check_blob(values, api, "values")
    if min_value is None and max_value is None:
        raise TraceError(f"{user_location()}: {api}: give min_value, max_value or both")
    if min_value is not None:
        x = emit("maximum", [x, as_blob(min_value, x, api)], name=(name or "") if max_value is None else "", api=api)
    if max_value is not None:
        x = emit("minimum", [x, as_blob(max_value, x, api)], name=name or "", api=api)
    return x


def _reduce_args(input_tensor, axis, api: str, arg: str = "input_tensor") -> tuple[Blob, tuple[int, ...]]:
    x = check_blob(input_tensor, api, arg)
    return x, axes(x, axis, api)


def _keep_or_drop(value: Blob, x: Blob, ax: tuple[int, ...], keepdims: bool, name: str | None, api: str) -> Blob:
    """A keepdims=True reduction result, reshaped to drop the reduced axes unless keepdims."""
    if keepdims:
        return value
    shape = tuple(d for i, d in enumerate(x.shape) if i not in ax)
    return emit("reshape", [value], {"shape": shape}, name=name or "", api=api)


def _any_all(op: str, api: str):
    def fn(x, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
        blob, ax = _reduce_args(x, axis, api, "x")
        nonzero = emit("not_equal", [blob, as_blob(0, blob, api)], api=api)
        if not ax:
            return nonzero
        return emit(op, [nonzero], {"axes": ax, "keepdims": bool(keepdims)}, name=name or "", api=api)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = (f"`{api}(x, axis=None, keepdims=False)`: int8 1 where {'any' if op == 'reduce_max' else 'every'} "
                  f"element along `axis` is non-zero (NaN counts as non-zero, as in NumPy), else 0.\n\n"
                  f"Example:\n    flags = {api}(mask, axis=1)")
    return fn


reduce_any = _any_all("reduce_max", "flow.math.reduce_any")
reduce_all = _any_all("reduce_min", "flow.math.reduce_all")


def reduce_euclidean_norm(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
    """`flow.math.reduce_euclidean_norm(x, axis=None, keepdims=False)`: sqrt(sum(x^2)) over `axis`.

    Example:
        norms = flow.math.reduce_euclidean_norm(w, axis=1)
    """
    api = "flow.math.reduce_euclidean_norm"
    x, ax = _reduce_args(input_tensor, axis, api)
    squares = emit("square", [x], api=api)
    total = emit("reduce_sum", [squares], {"axes": ax, "keepdims": bool(keepdims)}, api=api) if ax else squares
    return emit("sqrt", [total], name=name or "", api=api)


def reduce_logsumexp(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
    """`flow.math.reduce_logsumexp(x, axis=None, keepdims=False)`: log(sum(exp(x))) over `axis`.

    Computed as m + log(sum(exp(x - m))) with m the (finite) maximum, so it neither overflows nor
    underflows where OneFlow's direct formula would; the value is the same elsewhere.

    Example:
        lse = flow.math.reduce_logsumexp(logits, axis=-1)
    """
    api = "flow.math.reduce_logsumexp"
    x, ax = _reduce_args(input_tensor, axis, api)
    if not ax:
        return x
    peak = emit("reduce_max", [x], {"axes": ax, "keepdims": True}, api=api)
    shift = emit("finite_or_zero", [peak], api=api)
    exps = emit("exp", [emit("subtract", [x, shift], api=api)], api=api)
    total = emit("reduce_sum", [exps], {"axes": ax, "keepdims": True}, api=api)
    value = emit("add", [emit("log", [total], api=api), shift], api=api)
    return _keep_or_drop(value, x, ax, keepdims, name, api)


def reduce_variance(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
    """`flow.math.reduce_variance(x, axis=None, keepdims=False)`: the population variance over `axis`.

    Computed as mean((x - mean(x))^2), as np.var does (OneFlow's mean(x^2) - mean(x)^2 loses every
    digit when the mean is large against the spread, and can even be negative).  No axes: zeros.

    Example:
        var = flow.math.reduce_variance(x, axis=0)
    """
    api = "flow.math.reduce_variance"
    x, ax = _reduce_args(input_tensor, axis, api)
    if not ax:
        return emit("constant", [], {"value": 0.0, "shape": x.shape, "dtype": x.dtype.ir_name}, name=name or "",
                    api=api)
    mean = reduce_mean(x, ax, keepdims=True)
    deviation = emit("subtract", [x, mean], api=api)
    return reduce_mean(emit("square", [deviation], api=api), ax, keepdims, name)


def reduce_std(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
    """`flow.math.reduce_std(x, axis=None, keepdims=False)`: sqrt of `reduce_variance`.

    Example:
        std = flow.math.reduce_std(x, axis=0)
    """
    api = "flow.math.reduce_std"
    variance = reduce_variance(input_tensor, axis, keepdims)
    return emit("sqrt", [variance], name=name or "", api=api)


def l2_normalize(input, axis: int | None = None, epsilon: float = 1e-12, name: str | None = None) -> Blob:
    """`flow.math.l2_normalize(input, axis, epsilon=1e-12)`: x / sqrt(max(sum(x^2 along axis), epsilon)).

    OneFlow needs `axis` (one int, negatives allowed); so does flowc.

    Example:
        unit = flow.math.l2_normalize(embeddings, axis=1)
    """
    api = "flow.math.l2_normalize"
    x = check_blob(input, api, "input")
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TraceError(f"{user_location()}: {api}: argument 'axis' must be an int, got {axis!r}")
    ax = axes(x, axis, api)
    total = emit("reduce_sum", [emit("square", [x], api=api)], {"axes": ax, "keepdims": True}, api=api)
    floor = emit("maximum", [total, as_blob(float(epsilon), total, api)], api=api)
    return emit("multiply", [x, emit("rsqrt", [floor], api=api)], name=name or "", api=api)


def gelu_grad(x, dy, name: str | None = None) -> Blob:
    """`flow.math.gelu_grad(x, dy)`: dy times the derivative of gelu at x.

    Example:
        dx = flow.math.gelu_grad(x, dy)
    """
    api = "flow.math.gelu_grad"
    return emit("gelu_grad", [check_blob(x, api, "x"), check_blob(dy, api, "dy")], name=name or "", api=api)


def tanh_grad(y, dy, name: str | None = None) -> Blob:
    """`flow.math.tanh_grad(y, dy)`: dy * (1 - y^2), the gradient of tanh given its output y.

    Example:
        dx = flow.math.tanh_grad(flow.math.tanh(x), dy)
    """
    api = "flow.math.tanh_grad"
    y = check_blob(y, api, "y")
    slope = emit("subtract", [as_blob(1.0, y, api), emit("square", [y], api=api)], api=api)
    return emit("multiply", [check_blob(dy, api, "dy"), slope], name=name or "", api=api)


def broadcast_to_compatible_with(x, compatible, name: str | None = None) -> Blob:
    """`flow.math.broadcast_to_compatible_with(x, compatible)`: x broadcast (NumPy's rules) to the
    shape it has together with every blob of `compatible`.

    Example:
        y = flow.math.broadcast_to_compatible_with(bias, [activations])
    """
    api = "flow.math.broadcast_to_compatible_with"
    x = check_blob(x, api, "x")
    shape = tuple(x.shape)
    for k, other in enumerate(compatible):
        other = check_blob(other, api, f"compatible[{k}]")
        try:
            shape = tuple(np.broadcast_shapes(shape, tuple(other.shape)))
        except ValueError:
            raise TraceError(f"{user_location()}: {api}: compatible[{k}] of shape {list(other.shape)} does not "
                             f"broadcast with {list(shape)}") from None
    if shape == tuple(x.shape):
        return x
    return emit("broadcast_to", [x], {"shape": shape}, name=name or "", api=api)
