"""Graph clean-up: dead code elimination, common subexpressions, constant folding.

All three rebuild the graph with `rebuild`, which re-adds each kept node through a
`GraphBuilder` (so inference re-checks every type) and remaps ids.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from flowc.compiler.ir import Graph, GraphBuilder, Node
from flowc.compiler.ops import OPS

# A rewrite sees the node with its inputs already remapped and returns either the
# id of an existing node to use instead, or None to keep (copy) the node.
Rewrite = Callable[[GraphBuilder, Node, tuple[int, ...]], "int | None"]


def rebuild(graph: Graph, rewrite: Rewrite | None = None, keep: set[int] | None = None) -> Graph:
    builder = GraphBuilder()
    new_id: dict[int, int] = {}
    for n in graph.nodes:
        if keep is not None and n.id not in keep:
            continue
        inputs = tuple(new_id[i] for i in n.inputs)
        replaced = rewrite(builder, n, inputs) if rewrite else None
        new_id[n.id] = replaced if replaced is not None else builder.copy_node(n, inputs)
    return Graph(graph.name, builder.nodes, [new_id[o] for o in graph.outputs],
                 {v: new_id[i] for v, i in graph.assigns.items()}, dict(graph.variables),
                 dict(graph.scalars), [new_id[p] for p in graph.placeholders if p in new_id])


def eliminate_dead_code(graph: Graph) -> Graph:
    """Keep what the outputs and assigns need, and every placeholder (the call signature)."""
    live = set(graph.roots()) | set(graph.placeholders)
    for n in reversed(graph.nodes):
        if n.id in live:
            live.update(n.inputs)
    return rebuild(graph, keep=live)


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    seen: dict[tuple, int] = {}

    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        if n.op in ("input",):
            return None
        key = (n.op, inputs, n.attrs, n.type.device)
        if key in seen:
            return seen[key]
        seen[key] = builder.next_id    # the id copy_node is about to give it
        return None
    return rebuild(graph, rewrite)


def _uniform_value(builder: GraphBuilder, node_id: int):
    """The value of a node that is a constant (every element equal), else None."""
    n = builder.nodes[node_id]     # a fresh builder numbers nodes 0, 1, 2, ...
    return n.attr("value") if n.op == "constant" else None


def _is_additive_identity(value: object, op: str, dtype: str) -> bool:
    """Whether adding (op "add") or subtracting (op "subtract") `value` leaves every x of `dtype` as it is.

    Any zero does for integers; only a zero of the right sign does for floats: -0.0 + +0.0 is +0.0,
    so `x + 0.0` is not `x` when x is -0.0, while `x + (-0.0)` and `x - 0.0` are `x` for every x, NaN and -0.0 included.
    """
    if value is None or value != 0:
        return False
    if not dtype.startswith("float"):
        return True
    negative_zero = math.copysign(1.0, float(value)) < 0
    return negative_zero if op == "add" else not negative_zero


def fold_constants(graph: Graph) -> Graph:
    """Evaluate pointwise ops on uniform constants; drop identities (x*1, x+0, same-shape views)."""
    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        rule = OPS[n.op]
        values = [_uniform_value(builder, i) for i in inputs]
        if rule.kind == "pointwise" and inputs and all(v is not None for v in values):
            # Each operand at its own rank (all dims 1): a reference that checks its input's rank
            # (transpose's perm) sees the rank it was traced with; the value is the same either way.
            args = [np.full((1,) * len(builder.types[i].shape), v, dtype=builder.types[i].dtype)
                    for v, i in zip(values, inputs)]
            folded = np.asarray(rule.reference(*args, **n.attr_dict)).reshape(-1)[0]
            return builder.add("constant", [], {"value": folded.item(), "shape": n.type.shape,
                                                "dtype": n.type.dtype}, loc=n.loc, role=n.role)
        same_shape = [builder.types[i].shape == n.type.shape for i in inputs]
        if n.op in ("reshape", "broadcast_to") and same_shape[0]:
            return inputs[0]
        if n.op == "reshape" and builder.nodes[inputs[0]].op == "reshape":
            return builder.add("reshape", [builder.nodes[inputs[0]].inputs[0]], n.attr_dict, loc=n.loc, role=n.role)
        if n.op == "transpose" and list(n.attr("perm")) == sorted(n.attr("perm")):
            return inputs[0]
        if n.op in ("multiply", "divide") and values[1] == 1 and same_shape[0]:
            return inputs[0]
        if n.op == "multiply" and values[0] == 1 and same_shape[1]:
            return inputs[1]
        if n.op in ("add", "subtract") and _is_additive_identity(values[1], n.op, n.type.dtype) and same_shape[0]:
            return inputs[0]
        if n.op == "add" and _is_additive_identity(values[0], n.op, n.type.dtype) and same_shape[1]:
            return inputs[1]
        return None
    return rebuild(graph, rewrite)


def simplify(graph: Graph) -> Graph:
    """Fold, then CSE, then DCE (folding exposes dead nodes and duplicates)."""
    return eliminate_dead_code(eliminate_common_subexpressions(fold_constants(graph)))
