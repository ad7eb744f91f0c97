"""`flow.math`: elementwise math and reductions, with OneFlow 0.3's names and signatures."""
from __future__ import annotations

from flowc.compiler.trace import Blob, as_blob, emit
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
