"""Matrix multiplication, OneFlow's `flow.matmul(a, b, transpose_a, transpose_b)`.

Rank 2 is a GEMM; higher ranks are batched over equal leading dims.  The lowering
is the blocked GEMM in codegen_templates/cpu/flowc_gemm.h; pointwise consumers of
the product (bias, activation, even the optimizer update of a weight gradient)
fuse into its epilogue.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def matmul_dims(a: tuple, b: tuple, ta: bool, tb: bool) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of op(a) @ op(b); raises ShapeError naming the mismatch."""
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul: operands need rank >= 2, got {list(a)} and {list(b)}")
    if len(a) != len(b) or a[:-2] != b[:-2]:
        raise ShapeError(f"matmul: batch dimensions differ: {list(a)} vs {list(b)}")
    m, ka = (a[-1], a[-2]) if ta else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    if ka != kb:
        raise ShapeError(f"matmul: inner dimensions differ: {'transposed ' if ta else ''}a is "
                         f"{list(a)}, {'transposed ' if tb else ''}b is {list(b)} ({ka} vs {kb})")
    return m, n, ka, int(np.prod(a[:-2], dtype=np.int64)) if len(a) > 2 else 1


def _infer(inputs: list, attrs: dict) -> TensorType:
    a, b = inputs
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"matmul: needs two float16, float32 or float64 operands, got {a.dtype} and {b.dtype}")
    m, n, _, _ = matmul_dims(a.shape, b.shape, attrs["transpose_a"], attrs["transpose_b"])
    return TensorType(tuple(a.shape[:-2]) + (m, n), a.dtype)


def _reference(a, b, transpose_a, transpose_b):
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    return np.matmul(a, b)


def _grad(e, node, dy):
    a, b = node.inputs
    ta, tb = node.attr("transpose_a"), node.attr("transpose_b")

    def mm(x, y, tx, ty):
        return e.op("matmul", x, y, transpose_a=tx, transpose_b=ty)
    # C = op(A) op(B); each case writes dA, dB without materialising a transpose.
    if not ta and not tb:
        return [mm(dy, b, False, True), mm(a, dy, True, False)]
    if not ta and tb:
        return [mm(dy, b, False, False), mm(dy, a, True, False)]
    if ta and not tb:
        return [mm(b, dy, False, True), mm(a, dy, False, False)]
    return [mm(b, dy, True, True), mm(dy, a, True, True)]


register(OpRule("matmul", "matmul", _infer, _reference, _grad))
