"""Elementwise ops: one output element from the same-index elements of the inputs.

Binary ops broadcast like NumPy.  Every row's `c_expr` is the whole C++ lowering:
fusion inlines these expressions into one loop, so no op needs a kernel of its own.
Gradients are written in other ops; `GradEmitter.sum_to` undoes broadcasting.

NaN, infinities, signed zeros and denormals follow the NumPy reference, and every row's C
expression agrees with it on them (tests/test_special_values.py): `maximum`, `minimum` and `relu`
propagate NaN as np.maximum does (flowc::maximum in codegen_templates/*/flowc_runtime.h and
flowc_cuda.h); the gradients of relu and leaky_relu at a NaN input are NaN; `eq_mask` counts NaN as
equal to NaN, so the gradient of a maximum that is NaN goes to the NaN it came from.  Where NumPy
itself has no portable answer, flowc defines one and the reference implements it: a float cast to
an integer saturates and NaN becomes 0 (what GPUs do), and an integer divided by 0 is 0.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType, numpy_dtype
from flowc.compiler.ops import OpRule, ShapeError, register


def broadcast_shape(a: tuple, b: tuple, op: str) -> tuple:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ShapeError(f"{op}: shapes {list(a)} and {list(b)} cannot be broadcast together") from None


def _same_dtype(op: str, types: list) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"{op}: operands have different dtypes {sorted(dtypes)}; use flow.cast first")
    return types[0].dtype


def _unary_float(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        (x,) = inputs
        if x.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: needs a floating-point input, got {x.dtype}")
        return TensorType(x.shape, x.dtype)
    return infer


def _unary_any(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    return TensorType(x.shape, x.dtype)


def _binary(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        a, b = inputs
        return TensorType(broadcast_shape(a.shape, b.shape, op), _same_dtype(op, inputs))
    return infer


def _same_shape(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        if len({t.shape for t in inputs}) != 1:
            raise ShapeError(f"{op}: operands must have the same shape, got {[list(t.shape) for t in inputs]}")
        return TensorType(inputs[0].shape, _same_dtype(op, inputs))
    return infer


def broadcast_strides(in_shape: tuple, out_shape: tuple) -> list[int]:
    """Element strides of a C-contiguous `in_shape` array read at `out_shape` indices."""
    strides = [0] * len(out_shape)
    step = 1
    for k in range(1, len(in_shape) + 1):
        dim = in_shape[-k]
        if dim != 1:
            strides[-k] = step
        step *= dim
    return strides


# --- gradients -----------------------------------------------------------------

def _add_grad(e, node, dy):
    a, b = node.inputs
    return [e.sum_to(dy, a), e.sum_to(dy, b)]


def _sub_grad(e, node, dy):
    a, b = node.inputs
    return [e.sum_to(dy, a), e.sum_to(e.op("negative", dy), b)]


def _mul_grad(e, node, dy):
    a, b = node.inputs
    return [e.sum_to(e.op("multiply", dy, b), a), e.sum_to(e.op("multiply", dy, a), b)]


def _div_grad(e, node, dy):
    a, b = node.inputs
    da = e.op("divide", dy, b)
    db = e.op("negative", e.op("divide", e.op("multiply", dy, node.id), b))
    return [e.sum_to(da, a), e.sum_to(db, b)]


def _extremum_grad(e, node, dy):
    # The gradient goes to whichever operand was chosen (the first one on ties).
    a, b = node.inputs
    picked_a = e.op("eq_mask", node.id, a)
    da = e.op("multiply", dy, picked_a)
    db = e.op("multiply", dy, e.op("subtract", e.const(1.0, node.id), picked_a))
    return [e.sum_to(da, a), e.sum_to(db, b)]


def _gelu_grad(e, node, dy):
    return [e.op("gelu_grad", node.inputs[0], dy)]


def _leaky_relu_grad(e, node, dy):
    return [e.op("leaky_relu_grad", node.inputs[0], dy, alpha=node.attr("alpha"))]


def _neg_grad(e, node, dy):
    return [e.op("negative", dy)]


def _relu_grad(e, node, dy):
    return [e.op("relu_grad", node.id, dy)]


def _sigmoid_grad(e, node, dy):
    y = node.id
    return [e.op("multiply", dy, e.op("multiply", y, e.op("subtract", e.const(1.0, y), y)))]


def _tanh_grad(e, node, dy):
    y = node.id
    return [e.op("multiply", dy, e.op("subtract", e.const(1.0, y), e.op("multiply", y, y)))]


def _exp_grad(e, node, dy):
    return [e.op("multiply", dy, node.id)]


def _log_grad(e, node, dy):
    return [e.op("divide", dy, node.inputs[0])]


def _square_grad(e, node, dy):
    x = node.inputs[0]
    return [e.op("multiply", dy, e.op("multiply", x, e.const(2.0, x)))]


def _sqrt_grad(e, node, dy):
    y = node.id
    return [e.op("divide", e.op("multiply", dy, e.const(0.5, y)), y)]


def _cast_grad(e, node, dy):
    src = e.type(node.inputs[0]).dtype
    return [e.op("cast", dy, dtype=src) if src in FLOAT_DTYPES else None]


def _broadcast_to_grad(e, node, dy):
    return [e.sum_to(dy, node.inputs[0])]


def _transpose_grad(e, node, dy):
    perm = node.attr("perm")
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [e.op("transpose", dy, perm=tuple(inverse))]


def _divide_reference(a, b):
    if a.dtype.kind == "f":
        return a / b
    # C++ integer division truncates toward zero; flowc::divide makes x / 0 == 0 and min / -1 == min.
    safe = np.where(b == 0, np.ones_like(b), b)
    with np.errstate(over="ignore"):
        floor = np.floor_divide(a, safe)
        rounded_down = (np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0))
        return np.where(b == 0, np.zeros_like(floor), floor + rounded_down.astype(a.dtype)).astype(a.dtype)


# --- rows ------------------------------------------------------------------------

def _binary_row(name, expr, ref, grad):
    register(OpRule(name, "pointwise", _binary(name), ref, grad, c_expr=expr))


_binary_row("add", "({0} + {1})", np.add, _add_grad)
_binary_row("subtract", "({0} - {1})", np.subtract, _sub_grad)
_binary_row("multiply", "({0} * {1})", np.multiply, _mul_grad)
_binary_row("divide", "flowc::divide({0}, {1})", _divide_reference, _div_grad)
_binary_row("maximum", "flowc::maximum({0}, {1})", np.maximum, _extremum_grad)
_binary_row("minimum", "flowc::minimum({0}, {1})", np.minimum, _extremum_grad)

register(OpRule("negative", "pointwise", _unary_any, np.negative, _neg_grad, c_expr="(-{0})"))
register(OpRule("relu", "pointwise", _unary_any, lambda x: np.maximum(x, x.dtype.type(0)), _relu_grad,
                c_expr="flowc::maximum({0}, ({T})0)"))
register(OpRule("sigmoid", "pointwise", _unary_float("sigmoid"),
                lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype), _sigmoid_grad,
                c_expr="(({T})1 / (({T})1 + std::exp(-{0})))"))
register(OpRule("tanh", "pointwise", _unary_float("tanh"), np.tanh, _tanh_grad, c_expr="std::tanh({0})"))
register(OpRule("exp", "pointwise", _unary_float("exp"), np.exp, _exp_grad, c_expr="std::exp({0})"))
register(OpRule("log", "pointwise", _unary_float("log"), np.log, _log_grad, c_expr="std::log({0})"))
register(OpRule("square", "pointwise", _unary_any, np.square, _square_grad, c_expr="({0} * {0})"))
register(OpRule("sqrt", "pointwise", _unary_float("sqrt"), np.sqrt, _sqrt_grad, c_expr="std::sqrt({0})"))

def _gelu_reference(x):
    from math import erf, sqrt
    return (0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2.0)))).astype(x.dtype)


def _gelu_grad_reference(x, dy):
    from math import erf, pi, sqrt
    cdf = 0.5 * (1 + np.vectorize(erf)(x / sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / sqrt(2 * pi)
    return (dy * (cdf + x * pdf)).astype(x.dtype)


# gelu(x) = x * Phi(x), the exact (erf) form OneFlow uses; flowc::gelu / gelu_grad are in both
# backends' headers (the CPU's with an erf GCC vectorises).
register(OpRule("gelu", "pointwise", _unary_float("gelu"), _gelu_reference, _gelu_grad,
                c_expr="flowc::gelu<{T}>({0})"))
register(OpRule("gelu_grad", "pointwise", _same_shape("gelu_grad"), _gelu_grad_reference, None,
                c_expr="flowc::gelu_grad<{T}>({0}, {1})", differentiable=False))
register(OpRule("leaky_relu", "pointwise", _unary_float("leaky_relu"),
                lambda x, alpha: np.where(x > 0, x, x * x.dtype.type(alpha)), _leaky_relu_grad,
                c_expr="({0} > ({T})0 ? {0} : {0} * ({T}){alpha})"))
# At a NaN input the slope is NaN (not 0 or alpha): a NaN stays visible in the gradients.
register(OpRule("leaky_relu_grad", "pointwise", _same_shape("leaky_relu_grad"),
                lambda x, dy, alpha: np.where(x > 0, dy, np.where(x <= 0, dy * dy.dtype.type(alpha), x)), None,
                c_expr="({0} > ({T})0 ? {1} : {0} <= ({T})0 ? {1} * ({T}){alpha} : {0})", differentiable=False))

# relu_grad(y, dy): dy where the relu output is positive, NaN where it is NaN.  Written as one op
# (not multiply by a mask) because it is the hottest backward op and one select is cheap.
register(OpRule("relu_grad", "pointwise", _same_shape("relu_grad"),
                lambda y, dy: np.where(y > 0, dy, np.where(y <= 0, dy.dtype.type(0), y)), None,
                c_expr="({0} > ({T})0 ? {1} : {0} <= ({T})0 ? ({T})0 : {0})", differentiable=False))


def _eq_mask_reference(a, b):
    same = a == b
    if a.dtype.kind == "f":
        same |= np.isnan(a) & np.isnan(b)
    return same.astype(a.dtype)


# eq_mask(a, b): 1 where equal (NaN equal to NaN) else 0, in the operands' dtype (the gradients of
# maximum, minimum, reduce_max and reduce_min: which operand the extremum came from).
register(OpRule("eq_mask", "pointwise", _binary("eq_mask"), _eq_mask_reference, None,
                c_expr="(({0} == {1} || ({0} != {0} && {1} != {1})) ? ({T})1 : ({T})0)", differentiable=False))


def _infer_constant(inputs: list, attrs: dict) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


register(OpRule("constant", "pointwise", _infer_constant,
                lambda value, shape, dtype: np.full(shape, value, numpy_dtype(dtype)),
                None, c_expr="({T})({value})", differentiable=False))


def _infer_dropout_mask(inputs: list, attrs: dict) -> TensorType:
    (step,) = inputs
    if step.shape != () or step.dtype != "int64":
        raise ShapeError(f"dropout_mask: its input is the int64 train step scalar, got {step}")
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def dropout_keep(seed: int, step: int, size: int, threshold: int, offset: int = 0) -> np.ndarray:
    """The same bits as flowc::dropout_keep in flowc_runtime.h, for every index at once (from `offset`:
    one rank's share of a larger draw)."""
    with np.errstate(over="ignore"):
        i = np.arange(offset, offset + size, dtype=np.uint64)
        z = np.uint64(seed) ^ (np.uint64(step) * np.uint64(0x9E3779B97F4A7C15)) ^ (i * np.uint64(0xBF58476D1CE4E5B9))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(32)) >= np.uint64(threshold)


def _dropout_mask_reference(step, shape, dtype, seed, threshold, scale, rate):
    size = int(np.prod(shape, dtype=np.int64))
    keep = dropout_keep(seed, int(step), size, threshold).reshape(shape)
    return np.where(keep, scale, 0.0).astype(numpy_dtype(dtype))


# dropout_mask(step): 1/(1-rate) where an element is kept, else 0.  Uses `i`, the linear index
# of the element, which every generated pointwise loop defines.
register(OpRule("dropout_mask", "pointwise", _infer_dropout_mask, _dropout_mask_reference, None,
                c_expr="(flowc::dropout_keep({seed}ULL, (uint64_t){0}, (uint64_t)i, {threshold}u) "
                       "? ({T}){scale} : ({T})0)", differentiable=False))


def _infer_random_uniform(inputs: list, attrs: dict) -> TensorType:
    (step,) = inputs
    if step.shape != () or step.dtype != "int64":
        raise ShapeError(f"random_uniform: its input is the int64 step counter scalar, got {step}")
    if attrs["dtype"] not in ("float32", "float64"):
        raise ShapeError(f"random_uniform: dtype must be float32 or float64, got {attrs['dtype']}")
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


def random_units(seed: int, step: int, size: int, offset: int = 0) -> np.ndarray:
    """The same values as flowc::random_unit in flowc_runtime.h, for every index at once (from
    `offset`): the top 24 bits of splitmix64's finalizer over (seed, step, index), times 2^-24, so in
    [0, 1) and exact in float32."""
    with np.errstate(over="ignore"):
        i = np.arange(offset, offset + size, dtype=np.uint64)
        z = np.uint64(seed) ^ (np.uint64(step) * np.uint64(0x9E3779B97F4A7C15)) ^ (i * np.uint64(0xBF58476D1CE4E5B9))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float64) * 2.0 ** -24


def _random_uniform_reference(step, shape, dtype, seed):
    size = int(np.prod(shape, dtype=np.int64))
    return random_units(seed, int(step), size).reshape(shape).astype(numpy_dtype(dtype))


# random_uniform(step): a uniform value in [0, 1) per element, a counter-based hash of (seed, step,
# element index) like dropout_mask's: no state, the same in every run with the same seed, new every
# step.  flow.random.* (bernoulli, shuffle, coin_flip) are built on it.
register(OpRule("random_uniform", "pointwise", _infer_random_uniform, _random_uniform_reference, None,
                c_expr="(({T})flowc::random_unit({seed}ULL, (uint64_t){0}, (uint64_t)i))", differentiable=False))


def _infer_cast(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    return TensorType(x.shape, attrs["dtype"])


def _cast_reference(x, dtype):
    to = numpy_dtype(dtype)
    if x.dtype.kind != "f" or to.kind not in "iu":
        with np.errstate(over="ignore"):
            return x.astype(to)
    # Saturating, NaN to 0, as flowc::cast (NumPy's own answer depends on the CPU).
    info = np.iinfo(to)
    past_max = x.dtype.type(2.0 * (info.max // 2 + 1))
    low = x.dtype.type(info.min)
    inside = (x < past_max) & (x >= low)
    out = np.where(inside, x, 0).astype(to)
    out[x >= past_max] = info.max
    out[x < low] = info.min
    return out


register(OpRule("cast", "pointwise", _infer_cast, _cast_reference, _cast_grad, c_expr="flowc::cast<{T}>({0})"))


def _infer_broadcast_to(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    shape = tuple(attrs["shape"])
    if broadcast_shape(x.shape, shape, "broadcast_to") != shape:
        raise ShapeError(f"broadcast_to: {list(x.shape)} does not broadcast to {list(shape)}")
    return TensorType(shape, x.dtype)


register(OpRule("broadcast_to", "pointwise", _infer_broadcast_to,
                lambda x, shape: np.ascontiguousarray(np.broadcast_to(x, shape)), _broadcast_to_grad,
                c_expr="{0}"))


def _infer_transpose(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"transpose: perm {list(perm)} is not a permutation of the {len(x.shape)} axes of {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _transpose_strides(attrs: dict, in_shape: tuple, out_shape: tuple) -> list[int]:
    contiguous = broadcast_strides(in_shape, in_shape)
    return [contiguous[p] if in_shape[p] != 1 else 0 for p in attrs["perm"]]


register(OpRule("transpose", "pointwise", _infer_transpose,
                lambda x, perm: np.ascontiguousarray(np.transpose(x, perm)), _transpose_grad,
                c_expr="{0}", input_strides=_transpose_strides))


def _snapshot_grad(e, node, dy):
    return [dy]


# A copy of a value taken where it is computed: the `snapshot_outputs` pass (compiler/passes/
# snapshot.py) inserts it for a train step's result that would otherwise be read from a variable's
# buffer after this step's update.  Never traced, so simplify never sees (or folds) it.
register(OpRule("snapshot", "pointwise", _unary_any, lambda x: np.array(x, copy=True), _snapshot_grad,
                c_expr="{0}"))
