"""`flow.linalg`: OneFlow 0.3's other home of `matmul`.

Example:
    y = flow.linalg.matmul(a, b, transpose_b=True)
"""
from __future__ import annotations

from flowc.compiler.trace import Blob


def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False, name: str | None = None) -> Blob:
    """`flow.linalg.matmul(a, b, transpose_a=False, transpose_b=False)`, the same as `flow.matmul`.

    Example:
        logits = flow.linalg.matmul(hidden, weight, transpose_b=True)
    """
    from flow.array_ops import matmul as _matmul
    return _matmul(a, b, transpose_a, transpose_b, name=name)


__all__ = ["matmul"]
