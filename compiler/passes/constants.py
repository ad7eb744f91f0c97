"""`clone_constants`: every pointwise reader of a shared constant gets its own copy.

A constant is a pointwise op with no inputs: inside a fused loop it is a literal (`(T)(value)`)
and costs nothing.  But a constant read by several kernels (the optimizer's hyperparameters of
shape (1,), read by the update of every variable; a (S, S) zeros tensor broadcast into a mask)
cannot join any one of them, so it became a kernel of its own that fills a buffer every step, and
each reader loaded it from memory.  After this pass each pointwise reader has a private copy, which
`fuse_elementwise` puts in the reader's loop (a constant may be read at any index: it is uniform).
Non-pointwise readers (a slice_update, a matmul) keep reading the original.  The copies take the
reader's role, so an optimizer update loop stays all-"update" (`group_optimizer_updates`).

    %3 = constant(0.9)  %7 = multiply(%5, %3)  %9 = multiply(%6, %3)
 -> %7 = multiply(%5, constant(0.9))  %9 = multiply(%6, constant(0.9))
"""
from __future__ import annotations

from flowc.compiler.ir import Graph, GraphBuilder, Node
from flowc.compiler.ops import OPS
from flowc.compiler.passes.simplify import eliminate_dead_code, rebuild


def clone_constants(graph: Graph) -> Graph:
    """Copy each constant read by more than one node into every pointwise reader (see the module docstring).

    Example:
        graph = clone_constants(graph)    # no constant kernel left unless a non-pointwise op reads it
    """
    users = graph.consumers()
    shared = {n.id for n in graph.nodes if n.op == "constant" and len(users[n.id]) > 1
              and any(OPS[graph.node(u).op].kind == "pointwise" for u in users[n.id])}
    if not shared:
        return graph

    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        if OPS[n.op].kind != "pointwise" or not shared.intersection(n.inputs):
            return None
        copies: dict[int, int] = {}
        for old in n.inputs:
            if old in shared and old not in copies:
                c = graph.node(old)
                copies[old] = builder.add("constant", [], c.attr_dict, loc=c.loc, name=c.name, role=n.role,
                                          device=c.type.device)
        return builder.copy_node(n, tuple(copies.get(old, new) for old, new in zip(n.inputs, inputs)))
    return eliminate_dead_code(rebuild(graph, rewrite))
