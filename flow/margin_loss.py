"""`flow.combined_margin_loss`: the additive and multiplicative angular margins of face recognition
(SphereFace's m1, ArcFace's m2, CosFace's m3), as OneFlow 0.3's op computes them.

Example:
    cosines = flow.matmul(flow.math.l2_normalize(embedding, axis=1),
                          flow.math.l2_normalize(weight, axis=0))
    logits = flow.combined_margin_loss(cosines, labels, m1=1.0, m2=0.5, m3=0.0) * 64.0
"""
from __future__ import annotations

from flowc.compiler import dtypes
from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, user_location
from flow._ops import check_blob


def combined_margin_loss(x, label, m1: float = 1, m2: float = 0, m3: float = 0, name: str | None = None) -> Blob:
    """`flow.combined_margin_loss(x, label, m1=1, m2=0, m3=0)`: x (N, classes) holds cosines; in
    row i the label's column becomes cos(m1 * acos(x[i, label[i]]) + m2) - m3 and every other
    column stays as it is.  A label outside [0, classes) leaves its row unchanged, as OneFlow's
    kernel does.  The gradient is the derivative of that formula, OneFlow's
    dy * m1 * sin(m1 * theta + m2) / sin(theta), infinite where a label's cosine is exactly 1 or -1
    there too.

    Example:
        logits = flow.combined_margin_loss(cosines, labels, m2=0.5) * 64.0     # ArcFace
    """
    from flow import math
    from flow.indexing import one_hot, where, zeros_like
    api = "flow.combined_margin_loss"
    x, label = check_blob(x, api, "x"), check_blob(label, api, "label")
    if len(x.shape) != 2 or x.type.dtype not in ("float16", "float32", "float64"):
        raise TraceError(f"{user_location()}: {api}: x must be float cosines of shape (N, classes), got "
                         f"{x.type.dtype} {list(x.shape)}")
    if label.shape != x.shape[:1] or label.type.dtype not in ("int8", "uint8", "int32", "int64"):
        raise TraceError(f"{user_location()}: {api}: label must be integer class ids of shape {list(x.shape[:1])}, "
                         f"got {label.type.dtype} {list(label.shape)}")
    m1, m2, m3 = (_number(value, api, arg) for value, arg in ((m1, "m1"), (m2, "m2"), (m3, "m3")))
    is_label = one_hot(label, x.shape[1], dtype=dtypes.int32)           # all zero for a label out of range
    # the label's cosine of each row, by a select: a NaN elsewhere in the row must not reach it
    cosine = math.reduce_sum(where(is_label, x, zeros_like(x)), axis=1, keepdims=True)
    with_margin = math.cos(math.acos(cosine) * m1 + m2) - m3
    return where(is_label, with_margin, x, name=name)


def _number(value, api: str, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{user_location()}: {api}: {arg} must be a number, got {value!r}")
    return float(value)
