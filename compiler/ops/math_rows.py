"""`flow.math`'s elementwise functions beyond the basic arithmetic of pointwise.py (issue 14).

Every row is pointwise: its `c_expr` is the whole lowering on the CPU and the GPU (fusion inlines
it).  Special values follow NumPy (tests/test_math_ops.py plants NaN, infinities and signed zeros):
the C++ calls the <cmath> function NumPy's ufunc wraps, or a helper of flowc_runtime.h /
flowc_cuda.h that spells out NumPy's rule (abs, sign, floordiv, mod, softplus).  Where NumPy has
no such function (lgamma, erf, xlogy, ...) the reference computes the C library's answer in
float64, and TensorFlow's definition (which OneFlow follows) fixes the rest: xlogy(0, y) and
xdivy(0, y) are 0 for every y, reciprocal_no_nan(0) is 0.

Comparisons and logical_and return int8 0/1, as OneFlow 0.3 does.  Rounding functions (ceil,
floor, rint, round, sign, floordiv) pass no gradient, like OneFlow's zero gradient.
"""
from __future__ import annotations

import math

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register
from flowc.compiler.ops.pointwise import _binary, _unary_any, _unary_float, broadcast_shape, _same_dtype


def _float_binary(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        t = _binary(op)(inputs, attrs)
        if t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: needs floating-point inputs, got {t.dtype}")
        return t
    return infer


def _compare(op: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        a, b = inputs
        _same_dtype(op, inputs)
        return TensorType(broadcast_shape(a.shape, b.shape, op), "int8")
    return infer


def _f64(fn):
    """A float64 evaluation of a scalar C-library function, cast back to the input's dtype."""
    vec = np.vectorize(fn, otypes=[np.float64])

    def reference(x):
        if x.size == 0:
            return x.copy()
        with np.errstate(all="ignore"):
            return vec(x.astype(np.float64)).astype(x.dtype)
    return reference


def _lgamma(v: float) -> float:
    if math.isnan(v):
        return v
    try:
        return math.lgamma(v)
    except (ValueError, OverflowError):
        return math.inf          # the poles 0, -1, -2, ... (C's lgamma: +inf)


def _digamma(v: float) -> float:
    """The algorithm of flowc::digamma (flowc_runtime.h), in float64."""
    if math.isnan(v) or v == -math.inf:
        return math.nan
    if v == math.inf:
        return v
    result = 0.0
    if v <= 0.0:
        if v == math.floor(v):
            return math.nan
        result = -math.pi / math.tan(math.pi * v)
        v = 1.0 - v
    while v < 6.0:
        result -= 1.0 / v
        v += 1.0
    r = 1.0 / (v * v)
    return result + math.log(v) - 0.5 / v - r * (1 / 12 - r * (1 / 120 - r * (1 / 252 - r * (1 / 240 - r / 132))))


def _ignore(fn):
    def reference(*args):
        with np.errstate(all="ignore"):
            out = fn(*args)
        return np.asarray(out, dtype=args[0].dtype)
    return reference


# --- gradients (written in other ops) ---------------------------------------------------------------

def _chain(factor):
    """dy * factor(e, x, y) for a unary op."""
    def grad(e, node, dy):
        return [e.op("multiply", dy, factor(e, node.inputs[0], node.id))]
    return grad


def _one_minus_x2(e, x):
    return e.op("subtract", e.const(1.0, x), e.op("square", x))


_GRADS = {
    "abs": _chain(lambda e, x, y: e.op("sign", x)),
    "acos": _chain(lambda e, x, y: e.op("negative", e.op("rsqrt", _one_minus_x2(e, x)))),
    "asin": _chain(lambda e, x, y: e.op("rsqrt", _one_minus_x2(e, x))),
    "acosh": _chain(lambda e, x, y: e.op("rsqrt", e.op("subtract", e.op("square", x), e.const(1.0, x)))),
    "asinh": _chain(lambda e, x, y: e.op("rsqrt", e.op("add", e.op("square", x), e.const(1.0, x)))),
    "atan": _chain(lambda e, x, y: e.op("reciprocal", e.op("add", e.const(1.0, x), e.op("square", x)))),
    "atanh": _chain(lambda e, x, y: e.op("reciprocal", _one_minus_x2(e, x))),
    "cos": _chain(lambda e, x, y: e.op("negative", e.op("sin", x))),
    "sin": _chain(lambda e, x, y: e.op("cos", x)),
    "cosh": _chain(lambda e, x, y: e.op("sinh", x)),
    "sinh": _chain(lambda e, x, y: e.op("cosh", x)),
    "tan": _chain(lambda e, x, y: e.op("add", e.const(1.0, y), e.op("square", y))),
    # d erf / dx = 2 / sqrt(pi) * exp(-x^2)
    "erf": _chain(lambda e, x, y: e.op("multiply", e.const(1.1283791670955126, x),
                                        e.op("exp", e.op("negative", e.op("square", x))))),
    "erfc": _chain(lambda e, x, y: e.op("multiply", e.const(-1.1283791670955126, x),
                                         e.op("exp", e.op("negative", e.op("square", x))))),
    "expm1": _chain(lambda e, x, y: e.op("exp", x)),
    "log1p": _chain(lambda e, x, y: e.op("reciprocal", e.op("add", e.const(1.0, x), x))),
    "lgamma": _chain(lambda e, x, y: e.op("digamma", x)),
    "log_sigmoid": _chain(lambda e, x, y: e.op("sigmoid", e.op("negative", x))),
    "softplus": _chain(lambda e, x, y: e.op("sigmoid", x)),
    "reciprocal": _chain(lambda e, x, y: e.op("negative", e.op("square", y))),
    # 0 where x == 0 (y is 0 there), -y^2 elsewhere
    "reciprocal_no_nan": _chain(lambda e, x, y: e.op("negative", e.op("square", y))),
    # d x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
    "rsqrt": _chain(lambda e, x, y: e.op("multiply", e.const(-0.5, y), e.op("multiply", y, e.op("square", y)))),
}


def _atan2_grad(e, node, dy):
    a, b = node.inputs
    scale = e.op("divide", dy, e.op("add", e.op("square", a), e.op("square", b)))
    return [e.sum_to(e.op("multiply", scale, b), a), e.sum_to(e.op("negative", e.op("multiply", scale, a)), b)]


def _pow_grad(e, node, dy):
    # d x^y / dx = y x^(y-1);  d x^y / dy = x^y log x, taken as 0 where x^y is 0 (x == 0, y > 0)
    x, y = node.inputs
    dx = e.op("multiply", dy, e.op("multiply", y, e.op("pow", x, e.op("subtract", y, e.const(1.0, y)))))
    dyy = e.op("xlogy", e.op("multiply", dy, node.id), x)
    return [e.sum_to(dx, x), e.sum_to(dyy, y)]


def _mod_grad(e, node, dy):
    # x mod y = x - floor(x / y) * y
    x, y = node.inputs
    return [e.sum_to(dy, x), e.sum_to(e.op("negative", e.op("multiply", dy, e.op("floordiv", x, y))), y)]


def _xdivy_grad(e, node, dy):
    # 0 where x == 0, else dy / y and -dy x / y^2 = -dy z / y
    x, y = node.inputs
    dx = e.op("unless_zero", x, e.op("divide", dy, y))
    dyy = e.op("unless_zero", x, e.op("negative", e.op("divide", e.op("multiply", dy, node.id), y)))
    return [e.sum_to(dx, x), e.sum_to(dyy, y)]


def _xlogy_grad(e, node, dy):
    # 0 where x == 0, else dy log y and dy x / y
    x, y = node.inputs
    dx = e.op("unless_zero", x, e.op("multiply", dy, e.op("log", y)))
    dyy = e.op("unless_zero", x, e.op("divide", e.op("multiply", dy, x), y))
    return [e.sum_to(dx, x), e.sum_to(dyy, y)]


# --- rows ---------------------------------------------------------------------------------------------

def _unary(name: str, expr: str, ref, *, any_dtype: bool = False, differentiable: bool = True) -> None:
    infer = _unary_any if any_dtype else _unary_float(name)
    register(OpRule(name, "pointwise", infer, ref, _GRADS.get(name) if differentiable else None, c_expr=expr,
                    differentiable=differentiable))


def _np_abs(x):
    with np.errstate(over="ignore"):
        return np.abs(x)


_unary("abs", "flowc::abs({0})", _np_abs, any_dtype=True)
_unary("sign", "flowc::sign({0})", np.sign, any_dtype=True, differentiable=False)
for _name, _fn in (("acos", np.arccos), ("acosh", np.arccosh), ("asin", np.arcsin), ("asinh", np.arcsinh),
                   ("atan", np.arctan), ("atanh", np.arctanh), ("cos", np.cos), ("cosh", np.cosh),
                   ("sin", np.sin), ("sinh", np.sinh), ("tan", np.tan), ("expm1", np.expm1), ("log1p", np.log1p)):
    _unary(_name, f"std::{_name}({{0}})", _ignore(_fn))
_unary("erf", "std::erf({0})", _f64(math.erf))
_unary("erfc", "std::erfc({0})", _f64(math.erfc))
_unary("lgamma", "std::lgamma({0})", _f64(_lgamma))
_unary("digamma", "flowc::digamma({0})", _f64(_digamma), differentiable=False)   # lgamma's gradient
for _name, _rounding in (("ceil", np.ceil), ("floor", np.floor), ("rint", np.rint)):
    _unary(_name, f"std::{_name}({{0}})", _rounding, differentiable=False)
# round half to even, like np.round and OneFlow's round (std::nearbyint in the default rounding mode)
_unary("round", "std::nearbyint({0})", np.round, differentiable=False)
_unary("reciprocal", "(({T})1 / {0})", _ignore(lambda x: np.reciprocal(x)))
_unary("reciprocal_no_nan", "({0} == ({T})0 ? ({T})0 : ({T})1 / {0})",
       _ignore(lambda x: np.where(x == 0, x.dtype.type(0), np.reciprocal(np.where(x == 0, 1, x)))))
_unary("rsqrt", "(({T})1 / std::sqrt({0}))", _ignore(lambda x: 1 / np.sqrt(x)))
_unary("softplus", "flowc::softplus({0})", _ignore(lambda x: np.logaddexp(x.dtype.type(0), x)))
_unary("log_sigmoid", "(-flowc::softplus(-{0}))", _ignore(lambda x: -np.logaddexp(x.dtype.type(0), -x)))


# finite_or_zero(x): x where finite, else 0.  The shift of reduce_logsumexp: a constant to autodiff
# (the shift cancels out of the value's gradient), and 0 for rows whose maximum is infinite.
register(OpRule("finite_or_zero", "pointwise", _unary_float("finite_or_zero"),
                lambda x: np.where(np.isfinite(x), x, x.dtype.type(0)), None,
                c_expr="(({0} - {0}) == ({T})0 ? {0} : ({T})0)", differentiable=False))


def _binary_row(name: str, expr: str, ref, grad, *, floats_only: bool = True, differentiable: bool = True) -> None:
    infer = _float_binary(name) if floats_only else _binary(name)
    register(OpRule(name, "pointwise", infer, ref, grad, c_expr=expr, differentiable=differentiable))


def _int_safe(fn):
    """NumPy's integer floor_divide/mod, but 0 where the divisor is 0 (the C++ helpers' answer)."""
    def reference(a, b):
        with np.errstate(all="ignore"):
            if a.dtype.kind == "f":
                return np.asarray(fn(a, b), a.dtype)
            safe = np.where(b == 0, np.ones_like(b), b)
            return np.where(b == 0, np.zeros((), a.dtype), fn(a, safe)).astype(a.dtype)
    return reference


def _xlogy_reference(x, y):
    with np.errstate(all="ignore"):
        return np.where(x == 0, x.dtype.type(0), x * np.log(y)).astype(x.dtype)


def _xdivy_reference(x, y):
    with np.errstate(all="ignore"):
        return np.where(x == 0, x.dtype.type(0), x / y).astype(x.dtype)


_binary_row("pow", "std::pow({0}, {1})", _ignore(np.power), _pow_grad)
_binary_row("atan2", "std::atan2({0}, {1})", _ignore(np.arctan2), _atan2_grad)
_binary_row("floordiv", "flowc::floordiv({0}, {1})", _int_safe(np.floor_divide), None, floats_only=False,
            differentiable=False)
_binary_row("mod", "flowc::mod({0}, {1})", _int_safe(np.mod), _mod_grad, floats_only=False)
_binary_row("xdivy", "({0} == ({T})0 ? ({T})0 : {0} / {1})", _xdivy_reference, _xdivy_grad)
_binary_row("xlogy", "({0} == ({T})0 ? ({T})0 : {0} * std::log({1}))", _xlogy_reference, _xlogy_grad)
# unless_zero(a, b): 0 where a == 0, else b (the gradients of xdivy and xlogy).
_binary_row("unless_zero", "({0} == ({T})0 ? ({T})0 : {1})",
            lambda a, b: np.where(a == 0, np.zeros((), b.dtype), b).astype(b.dtype), None, floats_only=False,
            differentiable=False)


def _compare_row(name: str, cxx: str, ref) -> None:
    register(OpRule(name, "pointwise", _compare(name), lambda a, b: ref(a, b).astype(np.int8), None,
                    c_expr=f"(({{0}} {cxx} {{1}}) ? ({{T}})1 : ({{T}})0)", differentiable=False))


for _name, _cxx, _test in (("equal", "==", np.equal), ("not_equal", "!=", np.not_equal), ("less", "<", np.less),
                         ("less_equal", "<=", np.less_equal), ("greater", ">", np.greater),
                         ("greater_equal", ">=", np.greater_equal)):
    _compare_row(_name, _cxx, _test)
register(OpRule("logical_and", "pointwise", _compare("logical_and"),
                lambda a, b: np.logical_and(a, b).astype(np.int8), None,
                c_expr="(({0} != 0 && {1} != 0) ? ({T})1 : ({T})0)", differentiable=False))
