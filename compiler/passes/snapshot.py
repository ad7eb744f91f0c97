"""Results read before this step's update: a copy where a result would be a variable's buffer.

A job's result (a returned Blob, or a watched one) may be a variable itself, or a view of it, or an
expression that `simplify` reduces to it (`w * 1.0`, a cast to the same dtype, a reshape to the same
shape).  Its value lives in the variable's buffer, which the runtime reads after the step: in a job
that also assigns the variable (a train job's optimizer update, a layer's moving average) that is
the value after this step's update.  OneFlow returns the value the forward pass read, so this pass
gives each such result a `snapshot` node: a copy made in a kernel of its own that reads the
variable before the update writes it (`fusion.order_kernels` runs every reader of a variable's old
value before an in-place update; an update by copy happens after the last kernel anyway).

Nothing changes for a job with no such result (predict jobs, variables not assigned, results that
are computed values): the pass hands back the very same graph, so its generated code is unchanged.

    graph = snapshot_assigned_variables(graph)
"""
from __future__ import annotations

from flowc.compiler.ir import Graph, GraphBuilder
from flowc.compiler.program import view_roots


def read_from_assigned_variable(graph: Graph) -> list[int]:
    """Result ids (in `graph.outputs`) whose value would be an assigned variable's buffer."""
    if not graph.assigns:
        return []
    roots = view_roots(graph)
    found = []
    for out in dict.fromkeys(graph.outputs):
        src = graph.node(roots.get(out, out))
        if src.op == "variable" and src.attr("name") in graph.assigns:
            found.append(out)
    return found


def snapshot_assigned_variables(graph: Graph) -> Graph:
    """`graph` with each result read from an assigned variable's buffer replaced by a copy of it."""
    targets = read_from_assigned_variable(graph)
    if not targets:
        return graph
    builder = GraphBuilder()
    new_id: dict[int, int] = {}
    for n in graph.nodes:
        new_id[n.id] = builder.copy_node(n, tuple(new_id[i] for i in n.inputs))
    copies = {}
    for out in targets:
        n = graph.node(out)
        copies[out] = builder.add("snapshot", [new_id[out]], {}, loc=n.loc, name=n.name, role=n.role,
                                  device=n.type.device)
    return Graph(graph.name, builder.nodes, [copies.get(o, new_id[o]) for o in graph.outputs],
                 {v: new_id[i] for v, i in graph.assigns.items()}, dict(graph.variables),
                 dict(graph.scalars), [new_id[p] for p in graph.placeholders])
