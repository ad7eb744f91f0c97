"""`flow.math`: elementwise math and reductions, with OneFlow 0.3's names and signatures."""
from __future__ import annotations

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, as_blob, emit, scalar_blob, user_location
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


def _at_least_1d(value: Blob, api: str, name: str | None = None) -> Blob:
    """OneFlow 0.3 has no 0-d blobs: a reduction over every axis gives shape (1,) (its Shape::RemoveOnes
    keeps one axis), so programs index it (`loss[0]`) and concatenate such results.  `name` names the
    view when there is one (see `_names`)."""
    if value.shape:
        return value
    return emit("reshape", [value], {"shape": (1,)}, name=name or "", api=api)


def _names(x: Blob, ax, keepdims: bool, name: str | None) -> tuple[str, str | None]:
    """(the reduction's op name, the (1,) view's): the user's name goes to the op whose Blob is returned,
    the view when the reduction gives one value, as OneFlow's one op carries it."""
    whole = not keepdims and len(ax) == len(x.shape)
    return ("", name) if whole else (name or "", None)


def _reduce(op: str, api: str, argument: str, x, axis, keepdims: bool, name: str | None) -> Blob:
    x, ax = _reduce_args(x, axis, api, argument)
    if not ax:
        return x
    inner, outer = _names(x, ax, keepdims, name)
    return _at_least_1d(emit(op, [x], {"axes": ax, "keepdims": bool(keepdims)}, name=inner, api=api), api, outer)


def _reduction(op: str, api: str):
    def fn(input_tensor, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
        return _reduce(op, api, "input_tensor", input_tensor, axis, keepdims, name)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = (f"`{api}(input_tensor, axis=None, keepdims=False)`: reduce over `axis` (int, list or None "
                  f"for all).\n\nExample:\n    s = {api}(x, axis=[0, 2], keepdims=True)")
    return fn


reduce_sum = _reduction("reduce_sum", "flow.math.reduce_sum")
reduce_max = _reduction("reduce_max", "flow.math.reduce_max")
reduce_min = _reduction("reduce_min", "flow.math.reduce_min")
reduce_prod = _reduction("reduce_prod", "flow.math.reduce_prod")


def _two_stage(op: str, api: str):
    # OneFlow reduces a blob split over devices in two stages, each device's extremum then theirs;
    # the value and the gradient (shared among ties) are those of the one-stage reduction
    def fn(x, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
        return _reduce(op, api, "x", x, axis, keepdims, name)
    fn.__name__ = api.rsplit(".", 1)[-1]
    fn.__doc__ = (f"`{api}(x, axis=None, keepdims=False)`: OneFlow's reduction of a blob split over devices "
                  f"in two stages; the same values and gradient as `{op}`, whose limits it shares on several "
                  f"ranks (docs/distributed.md).\n\nExample:\n    peak = {api}(x, axis=[1])")
    return fn


two_stage_reduce_max = _two_stage("reduce_max", "flow.math.two_stage_reduce_max")
two_stage_reduce_min = _two_stage("reduce_min", "flow.math.two_stage_reduce_min")


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
    if not count:
        return reduce_sum(x, ax, keepdims, name)
    total = reduce_sum(x, ax, keepdims)
    # the result, not the sum inside it, carries the name (`op_name`, watch scopes), as OneFlow's one op does
    return emit("multiply", [total, scalar_blob(1.0 / count, total)], name=name or "", api="flow.math.reduce_mean")


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
    shape = tuple(d for i, d in enumerate(x.shape) if i not in ax) or (1,)     # (1,): as _at_least_1d
    return emit("reshape", [value], {"shape": shape}, name=name or "", api=api)


def _any_all(op: str, api: str):
    def fn(x, axis=None, keepdims: bool = False, name: str | None = None) -> Blob:
        blob, ax = _reduce_args(x, axis, api, "x")
        nonzero = emit("not_equal", [blob, as_blob(0, blob, api)], api=api)
        if not ax:
            return nonzero
        inner, outer = _names(blob, ax, keepdims, name)
        return _at_least_1d(emit(op, [nonzero], {"axes": ax, "keepdims": bool(keepdims)}, name=inner, api=api),
                            api, outer)
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
    inner, outer = _names(x, ax, keepdims, name)
    return _at_least_1d(emit("sqrt", [total], name=inner, api=api), api, outer)


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


# --- issue 14, names: tril, in_top_k, polyval, sigmoid_grad and the segment sums ------------------------

def tril(x, diagonal: int = 0, fill_value=0, name: str | None = None) -> Blob:
    """`flow.math.tril(x, diagonal=0, fill_value=0)`: the lower triangle of the last two axes of x
    (element [i, j] kept where j - i <= diagonal), `fill_value` elsewhere.

    Example:
        causal = flow.math.tril(scores, fill_value=float("-inf"))
    """
    from flow._ops import iota
    api = "flow.math.tril"
    x = check_blob(x, api, "x")
    if len(x.shape) < 2:
        raise TraceError(f"{user_location()}: {api}: x must have at least 2 axes, got shape {list(x.shape)}")
    rows, cols = x.shape[-2], x.shape[-1]
    row = emit("reshape", [iota(rows, "int32", api)], {"shape": (rows, 1)}, api=api)
    col = emit("reshape", [iota(cols, "int32", api)], {"shape": (1, cols)}, api=api)
    keep = emit("less_equal", [emit("subtract", [col, row], api=api), as_blob(int(diagonal), col, api)], api=api)
    return emit("where", [keep, x, as_blob(fill_value, x, api)], name=name or "", api=api)


def fused_scale_tril(x, diagonal: int = 0, fill_value=0, scale=1, name: str | None = None) -> Blob:
    """`flow.math.fused_scale_tril(x, diagonal=0, fill_value=0, scale=1)`: `tril(x * scale, diagonal,
    fill_value)` (the fill is not scaled), OneFlow's fused form of an attention mask.

    Example:
        masked = flow.math.fused_scale_tril(scores, fill_value=float("-inf"), scale=0.125)
    """
    x = check_blob(x, "flow.math.fused_scale_tril", "x")
    return tril(x * scale, diagonal, fill_value, name)


def in_top_k(targets, predictions, k: int, name: str | None = None) -> Blob:
    """`flow.math.in_top_k(targets, predictions, k)`: int8 1 where `predictions[i, targets[i]]` is
    among the k largest of row i, else 0.  Ties count in (fewer than k values are strictly larger),
    as in TensorFlow; a target outside [0, classes) fails the step.

    Example:
        hits = flow.math.in_top_k(labels, logits, k=5)      # (N,) int32, (N, C) -> (N,) int8
    """
    api = "flow.math.in_top_k"
    t, p = check_blob(targets, api, "targets"), check_blob(predictions, api, "predictions")
    if len(p.shape) != 2 or len(t.shape) != 1 or t.shape[0] != p.shape[0]:
        raise TraceError(f"{user_location()}: {api}: predictions must be (N, C) and targets (N,), got "
                         f"{list(p.shape)} and {list(t.shape)}")
    if t.type.dtype not in ("int32", "int64"):
        raise TraceError(f"{user_location()}: {api}: targets must be int32 or int64, got {t.type.dtype}")
    picked = emit("gather", [p, t], {"axis": 1, "batch_dims": 1}, api=api)
    picked = emit("reshape", [picked], {"shape": (p.shape[0], 1)}, api=api)
    larger = emit("cast", [emit("greater", [p, picked], api=api)], {"dtype": "int32"}, api=api)
    count = emit("reduce_sum", [larger], {"axes": (1,), "keepdims": False}, api=api)
    return emit("less", [count, as_blob(int(k), count, api)], name=name or "", api=api)


def polyval(coeffs, x, name: str | None = None) -> Blob:
    """`flow.math.polyval(coeffs, x)`: coeffs[0] * x^(n-1) + ... + coeffs[n-1] (Horner's rule), with
    `coeffs` a list of Python numbers, as np.polyval.  No coefficients: zeros like x.

    Example:
        y = flow.math.polyval([1.0, 0.0, -2.0], x)      # x^2 - 2
    """
    api = "flow.math.polyval"
    x = check_blob(x, api, "x")
    if not isinstance(coeffs, (list, tuple)):
        raise TraceError(f"{user_location()}: {api}: coeffs must be a list or tuple of numbers, got "
                         f"{type(coeffs).__name__}")
    if not coeffs:
        return emit("constant", [], {"value": 0, "shape": x.shape, "dtype": x.type.dtype}, name=name or "", api=api)
    first = float(coeffs[0]) if x.type.dtype.startswith("float") else coeffs[0]
    result = emit("constant", [], {"value": first, "shape": x.shape, "dtype": x.type.dtype}, api=api)
    for k, c in enumerate(coeffs[1:], start=2):
        result = emit("add", [emit("multiply", [result, x], api=api), as_blob(c, x, api)],
                      name=(name or "") if k == len(coeffs) else "", api=api)
    return result


def sigmoid_grad(y, dy, name: str | None = None) -> Blob:
    """`flow.math.sigmoid_grad(y, dy)`: dy * y * (1 - y), the gradient of sigmoid given its output y.

    Example:
        dx = flow.math.sigmoid_grad(flow.math.sigmoid(x), dy)
    """
    api = "flow.math.sigmoid_grad"
    y, dy = check_blob(y, api, "y"), check_blob(dy, api, "dy")
    slope = emit("multiply", [y, emit("subtract", [as_blob(1.0, y, api), y], api=api)], api=api)
    return emit("multiply", [dy, slope], name=name or "", api=api)


def _float_data(data: Blob, api: str) -> None:
    if data.type.dtype not in ("float32", "float64"):
        raise TraceError(f"{user_location()}: {api}: data must be float32 or float64 (the sum is a matrix "
                         f"product), got {data.type.dtype}")


def _segment_ids(data: Blob, segment_ids, axis: int, api: str) -> tuple[Blob, int]:
    _float_data(data, api)
    ids = check_blob(segment_ids, api, "segment_ids")
    if ids.type.dtype not in ("int32", "int64"):
        raise TraceError(f"{user_location()}: {api}: segment_ids must be int32 or int64, got {ids.type.dtype}")
    rank = len(data.shape)
    if not -rank <= axis < rank:
        raise TraceError(f"{user_location()}: {api}: axis {axis} is out of range for data of shape "
                         f"{list(data.shape)}")
    axis %= rank
    if tuple(data.shape[axis:axis + len(ids.shape)]) != tuple(ids.shape):
        raise TraceError(f"{user_location()}: {api}: segment_ids {list(ids.shape)} must match data "
                         f"{list(data.shape)} from axis {axis} on")
    return ids, axis


def unsorted_segment_sum(data, segment_ids, num_segments: int, axis: int = 0, name: str | None = None) -> Blob:
    """`flow.math.unsorted_segment_sum(data, segment_ids, num_segments, axis=0)`: out[..., s, ...] is the
    sum of the slices of `data` whose segment id is s; `segment_ids` covers data's axes from `axis` on
    (its shape is data.shape[axis:axis + ids.rank]), and those axes become one of size `num_segments`.
    An id outside [0, num_segments) is dropped, as in TensorFlow.  Differentiable in `data`, which must
    be float32 or float64.

    Computed as a one-hot matrix product (num_segments x segments of work), which keeps gradients and
    every backend for free.

    Example:
        sums = flow.math.unsorted_segment_sum(values, ids, num_segments=4)    # (6, 3), (6,) -> (4, 3)
    """
    from flow.indexing import one_hot
    api = "flow.math.unsorted_segment_sum"
    x = check_blob(data, api, "data")
    ids, axis = _segment_ids(x, segment_ids, int(axis), api)
    n_seg = int(num_segments)
    if n_seg <= 0:
        raise TraceError(f"{user_location()}: {api}: num_segments must be positive, got {num_segments!r}")
    pre, seg, post = x.shape[:axis], x.shape[axis:axis + len(ids.shape)], x.shape[axis + len(ids.shape):]
    p, n, q = _count(pre), _count(seg), _count(post)
    moved = emit("reshape", [x], {"shape": (p, n, q)}, api=api)
    moved = emit("transpose", [moved], {"perm": (1, 0, 2)}, api=api)
    moved = emit("reshape", [moved], {"shape": (n, p * q)}, api=api)
    flat_ids = emit("reshape", [ids], {"shape": (n,)}, api=api)
    onehot = one_hot(flat_ids, n_seg, dtype=x.type.dtype)                       # (n, segments)
    sums = emit("matmul", [onehot, moved], {"transpose_a": True, "transpose_b": False}, api=api)
    sums = emit("reshape", [sums], {"shape": (n_seg, p, q)}, api=api)
    sums = emit("transpose", [sums], {"perm": (1, 0, 2)}, api=api)
    return emit("reshape", [sums], {"shape": tuple(pre) + (n_seg,) + tuple(post)}, name=name or "", api=api)


def _count(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def unsorted_segment_sum_like(data, segment_ids, like, axis: int = 0, name: str | None = None) -> Blob:
    """`flow.math.unsorted_segment_sum_like(data, segment_ids, like, axis=0)`: `unsorted_segment_sum` with
    num_segments = like.shape[axis] (the result has like's shape).

    Example:
        grads = flow.math.unsorted_segment_sum_like(rows, ids, like=embedding)
    """
    api = "flow.math.unsorted_segment_sum_like"
    lk = check_blob(like, api, "like")
    x = check_blob(data, api, "data")
    ids = check_blob(segment_ids, api, "segment_ids")
    rank = len(x.shape)
    ax = int(axis) % rank if -rank <= int(axis) < rank else int(axis)
    if not 0 <= ax < len(lk.shape):
        raise TraceError(f"{user_location()}: {api}: axis {axis} is out of range for like {list(lk.shape)}")
    out = unsorted_segment_sum(x, ids, lk.shape[ax], ax, name)
    if out.shape != lk.shape:
        raise TraceError(f"{user_location()}: {api}: the result {list(out.shape)} does not have like's shape "
                         f"{list(lk.shape)}")
    return out


def unsorted_batch_segment_sum(data, segment_ids, num_segments: int, name: str | None = None) -> Blob:
    """`flow.math.unsorted_batch_segment_sum(data, segment_ids, num_segments)`: per batch row b,
    out[b, s, ...] sums data[b, i, ...] over the i with segment_ids[b, i] == s; `segment_ids` is
    (batch, n) and data (batch, n, ...).  Ids outside [0, num_segments) are dropped.

    Example:
        sums = flow.math.unsorted_batch_segment_sum(values, ids, num_segments=3)   # (2, 5, 4) -> (2, 3, 4)
    """
    from flow.indexing import one_hot
    api = "flow.math.unsorted_batch_segment_sum"
    x = check_blob(data, api, "data")
    _float_data(x, api)
    ids = check_blob(segment_ids, api, "segment_ids")
    if ids.type.dtype not in ("int32", "int64"):
        raise TraceError(f"{user_location()}: {api}: segment_ids must be int32 or int64, got {ids.type.dtype}")
    if len(ids.shape) != 2 or len(x.shape) < 2 or tuple(x.shape[:2]) != tuple(ids.shape):
        raise TraceError(f"{user_location()}: {api}: segment_ids must be (batch, n) and data (batch, n, ...), "
                         f"got {list(ids.shape)} and {list(x.shape)}")
    n_seg = int(num_segments)
    if n_seg <= 0:
        raise TraceError(f"{user_location()}: {api}: num_segments must be positive, got {num_segments!r}")
    b, n, post = x.shape[0], x.shape[1], x.shape[2:]
    flat = emit("reshape", [x], {"shape": (b, n, _count(post))}, api=api)
    onehot = one_hot(ids, n_seg, dtype=x.type.dtype)                          # (b, n, segments)
    sums = emit("matmul", [onehot, flat], {"transpose_a": True, "transpose_b": False}, api=api)
    return emit("reshape", [sums], {"shape": (b, n_seg) + tuple(post)}, name=name or "", api=api)


def _ordered(input, strict: bool, api: str, name: str | None) -> Blob:
    from flow.indexing import slice_v2
    x = check_blob(input, api, "input")
    if len(x.shape) != 1:
        x = emit("reshape", [x], {"shape": (x.type.size,)}, api=api)
    if x.shape[0] < 2:       # an empty or one-element sequence is ordered
        return emit("constant", [], {"value": 1, "shape": (), "dtype": "int8"}, name=name or "", api=api)
    later, earlier = slice_v2(x, [(1, None, None)]), slice_v2(x, [(None, -1, None)])
    return reduce_all(greater(later, earlier) if strict else greater_equal(later, earlier), name=name)


def is_non_decreasing(input, name: str | None = None) -> Blob:  # noqa: A002 - OneFlow's name
    """`flow.math.is_non_decreasing(input)`: 1 (int8) if every element (in row-major order) is at least the
    one before it, else 0.

    Example:
        ok = flow.math.is_non_decreasing(boundaries)
    """
    return _ordered(input, False, "flow.math.is_non_decreasing", name)


def is_strictly_increasing(input, name: str | None = None) -> Blob:  # noqa: A002 - OneFlow's name
    """`flow.math.is_strictly_increasing(input)`: 1 (int8) if every element (in row-major order) is greater
    than the one before it, else 0.

    Example:
        ok = flow.math.is_strictly_increasing(boundaries)
    """
    return _ordered(input, True, "flow.math.is_strictly_increasing", name)
