"""`auto_mixed_precision`: the rewrite behind `function_config().enable_auto_mixed_precision(True)`.

OneFlow 0.3.4's AMP (oneflow/core/job_rewriter/auto_mixed_precision_lists.cpp and
auto_mixed_precision.cpp, read at commit e5cbc2a17ccaa8699a214b6674f08d0843a98fb8), in flowc's ops.
The lists, mapped onto flowc's op names (docs/oneflow_compat_semantics.md has the table):

* WHITE: worth computing in float16 (matmul, which is also batch_matmul, and conv2d);
* GRAY: fine in float16 when their neighbours are (add/sub/mul/div with their broadcast and scalar
  forms, which cover OneFlow's add_n, bias_add, scalar_* and broadcast_*; sigmoid, tanh, sqrt,
  gelu, softmax, average pooling, layer_norm; the fused scaled masked softmax is a softmax).
  OneFlow's normalization is gray as a whole op; in flowc it is built from smaller ops, whose gray
  parts (the arithmetic) may go float16 and whose reductions stay float32;
* CLEAR: exact in any precision, they only move or select values (relu, reshape, transpose, slices,
  concat, gather, max pooling, broadcast_to; OneFlow's random_mask_like, the dropout mask, is
  clear too, flowc's dropout_mask is a source and stays float32);
* BLACK: empty in OneFlow 0.3.4 (its source has a TODO about reduce_mean).  Every op on no list
  (reductions, exp, log, pow, cross-entropy, ...) stays float32, but, the black list being empty,
  does not make its gray neighbours float32.

The float16 set is found as OneFlow does:
1. black spreads forward: a gray or clear op reached from a black op through gray and clear ops
   (clear ones leading on to a gray or black op) is black too (nothing, with an empty black list);
2. a gray or clear op that is not black and lies on a path from a white op to a white op (through
   gray and clear ops only) joins the white ops;
3. white spreads through clear ops: downward, a clear op with any white input becomes white; then
   upward, a clear op with any white consumer becomes white (OneFlow's "one father satisfied").
Only ops whose output and float inputs are float32 take part.  The white set computes in float16;
a cast is inserted on every edge that crosses its boundary.  Variables (and every other source)
are never in it: master weights stay float32, read through a cast to float16 in the forward
pass, so their gradients flow back through the cast's gradient to float32 and the optimizer
updates float32 values.  A result of the job keeps the dtype the job function gave it.

The pass runs on the forward graph, before the backward pass is generated (OneFlow runs it before
autograd too), so the gradients of float16 ops are float16 ops.  Loss scaling is the optimizer's:
pair AMP with `loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale()` as OneFlow's
examples do; without a policy the gradients are not scaled (small float16 gradients may flush to
zero).  How a float16 op is computed is `compute_float16_in_float32`'s business (float16.py).
"""
from __future__ import annotations

from typing import Callable, Iterable

from flowc.compiler.ir import GraphBuilder, Node

WHITE = frozenset({"matmul", "conv2d"})
GRAY = frozenset({"add", "subtract", "multiply", "divide", "sigmoid", "tanh", "sqrt", "gelu", "softmax",
                  "avg_pool2d", "layer_norm", "fused_scale_mask_softmax"})
CLEAR = frozenset({"relu", "reshape", "transpose", "strided_slice", "slice_axis", "concat", "gather",
                   "max_pool2d", "broadcast_to"})
BLACK: frozenset[str] = frozenset()       # OneFlow 0.3.4's black list is empty
FULL, HALF = "float32", "float16"


def _eligible(n: Node, types: dict) -> bool:
    """May `n` run in float16?  Its output and every float input are float32."""
    return n.type.dtype == FULL and all(types[i].dtype == FULL for i in n.inputs
                                        if types[i].dtype.startswith("float"))


def half_set(nodes: list[Node]) -> set[int]:
    """The ids of the ops AMP computes in float16 (the module docstring's steps 1-3).

    Example:
        white = half_set(ctx.builder.nodes)     # ids of the matmuls and the gray ops between them
    """
    types = {n.id: n.type for n in nodes}
    consumers: dict[int, list[int]] = {n.id: [] for n in nodes}
    for n in nodes:
        for i in n.inputs:
            consumers[i].append(n.id)
    op = {n.id: n.op for n in nodes}
    ok = {n.id for n in nodes if _eligible(n, types)}

    def upstream(ends: set[int], through: set[int]) -> set[int]:
        """Nodes of `through` from which a node of `ends` is reached through nodes of `through`."""
        found: set[int] = set()
        for n in reversed(nodes):
            if n.id in through and any(c in ends or c in found for c in consumers[n.id]):
                found.add(n.id)
        return found

    def downstream(starts: set[int], within: set[int]) -> set[int]:
        """Nodes of `within` reached from a node of `starts` through nodes of `within`."""
        found: set[int] = set()
        for n in nodes:
            if n.id in within and any(i in starts or i in found for i in n.inputs):
                found.add(n.id)
        return found

    black = {i for i in ok if op[i] in BLACK}
    gray = {i for i in ok if op[i] in GRAY}
    clear = {i for i in ok if op[i] in CLEAR}
    # Step 1: gray ops, and clear ops leading on to a gray or black op, reached from a black op.
    black |= downstream(black, black | gray | upstream(black | gray, clear))
    # Step 2: gray and clear ops on a path between two white ops.
    white = {i for i in ok if op[i] in WHITE}
    white |= downstream(white, upstream(white, (gray | clear) - black))
    # Step 3: white spreads through clear ops, downward (any white input), then upward (any white consumer).
    spreads = clear - black
    for n in nodes:
        if n.id in spreads and any(i in white for i in n.inputs):
            white.add(n.id)
    for n in reversed(nodes):
        if n.id in spreads and any(c in white for c in consumers[n.id]):
            white.add(n.id)
    return white


def auto_mixed_precision(nodes: Iterable[Node]) -> tuple[GraphBuilder, Callable[[int], int]]:
    """Rewrite a forward graph's nodes for AMP: a new builder, and a function from an old node id to
    the new id of the same value in its original dtype (a cast back from float16 is added on first
    use), for everything that refers to the old nodes (results, the loss, variables, watches).

    Example:
        builder, new_id = auto_mixed_precision(ctx.builder.nodes)
        builder.types[new_id(loss)].dtype   # 'float32', computed from float16 matmuls
    """
    nodes = list(nodes)
    white = half_set(nodes)
    builder = GraphBuilder()
    full: dict[int, int] = {}     # old id -> new id of its float32 (or original dtype) value
    half: dict[int, int] = {}     # old id -> new id of its float16 value

    def cast(n: Node, x: int, dtype: str) -> int:
        return builder.add("cast", [x], {"dtype": dtype}, loc=n.loc, role=n.role, device=n.type.device)

    def as_half(n: Node, old: int) -> int:
        if old not in half:
            half[old] = cast(n, full[old], HALF)
        return half[old]

    def as_full(n: Node, old: int) -> int:
        if old not in full:
            full[old] = cast(n, half[old], FULL)
        return full[old]

    def operand(n: Node, old: int) -> int:
        if old in half:
            return half[old]
        return as_half(n, old) if builder.types[full[old]].dtype == FULL else full[old]

    for n in nodes:
        if n.id in white:
            half[n.id] = builder.copy_node(n, tuple(operand(n, i) for i in n.inputs))
        else:
            full[n.id] = builder.copy_node(n, tuple(as_full(n, i) for i in n.inputs))
    by_id = {n.id: n for n in nodes}
    return builder, lambda old: as_full(by_id[old], old)
