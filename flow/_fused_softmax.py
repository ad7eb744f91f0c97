"""The scaled masked softmax rule: `softmax(scores * scale + mask)` traced as one op.

BERT's attention writes `flow.nn.softmax(flow.matmul(q, k, transpose_b=True) * c + bias)` with a
(B, 1, S, S) additive mask `bias` for (B, heads, S, S) scores.  Traced op by op that is a batched
matmul, a pointwise loop over the scores (scale and mask), a softmax kernel, and backward a
reduction and more loops.  When `flow.nn.softmax` finds that pattern right behind it, it emits
`fused_scale_mask_softmax` (compiler/ops/normalization.py) instead: one pass per row forward and
one backward.  The multiply and add it matched are left in the graph; dead code elimination drops
them when nothing else reads them.
"""
from __future__ import annotations

from flowc.compiler.ir import FLOAT_DTYPES, Node
from flowc.compiler.ops.normalization import mask_broadcasts
from flowc.compiler.trace import Blob, emit


def _scalar_constant(node: Node) -> float | None:
    if node.op == "constant" and node.type.size == 1:
        return float(node.attr("value"))
    return None


def _scaled(nodes: list[Node], node: Node, shape: tuple) -> tuple[int, float] | None:
    """(scores, scale) when `node` is scores * constant (either order) with `shape`."""
    if node.op != "multiply" or node.type.shape != shape:
        return None
    a, b = (nodes[i] for i in node.inputs)
    for scores, factor in ((a, b), (b, a)):
        value = _scalar_constant(factor)
        if value is not None and scores.type.shape == shape and scores.type.dtype == node.type.dtype:
            return scores.id, value
    return None


def scale_mask_softmax(x: Blob, name: str, api: str) -> Blob | None:
    """The fused op for `softmax(x)` when x is `scores * scale + mask` (either order of either
    operation), the mask broadcasting to x by whole rows; None when x is anything else.

    Example:
        probs = scale_mask_softmax(scores * 0.125 + bias, "", "flow.nn.softmax")
    """
    nodes = x.ctx.builder.nodes
    n = nodes[x.id]
    if n.op != "add" or n.type.dtype not in FLOAT_DTYPES:
        return None
    a, b = (nodes[i] for i in n.inputs)
    for scaled, mask in ((a, b), (b, a)):
        found = _scaled(nodes, scaled, n.type.shape)
        if found is not None and mask.type.dtype == n.type.dtype and mask_broadcasts(mask.type.shape, n.type.shape):
            scores, scale = found
            return emit("fused_scale_mask_softmax", [Blob(x.ctx, scores), Blob(x.ctx, mask.id)],
                        {"scale": scale}, name=name, api=api)
    return None
