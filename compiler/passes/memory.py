"""Memory planning: where every materialized value of a step lives.

Placeholders, variables and runtime scalars live in buffers the runtime owns.
Everything else lives in one arena per job, allocated when the job is loaded and
reused by every step (no allocation per step).  Offsets come from a first-fit
allocator over the values' lifetimes in kernel order, so buffers whose lifetimes
do not overlap share memory.  An optimizer update writes its variable in place
when that is safe; otherwise it is copied back at the end of the step.
"""
from __future__ import annotations


from flowc.compiler.ir import Graph
from flowc.compiler.ops import OPS
from flowc.compiler.program import view_roots
from flowc.compiler.program import Buffer, Kernel, MemoryPlan

ALIGN = 64  # bytes: a cache line, and what AVX loads like


def materialized(graph: Graph, kernels: list[Kernel]) -> set[int]:
    """Node ids whose values must be stored: read outside their kernel, or results."""
    users = graph.consumers()
    owner = {n: i for i, k in enumerate(kernels) for n in k.nodes()}
    needed = set(graph.roots())
    for n in graph.nodes:
        if n.id not in owner:
            continue
        if any(owner.get(c) != owner[n.id] for c in users[n.id]):
            needed.add(n.id)
    for k in kernels:
        # batch_norm with an epilogue (relu) keeps y in registers unless another kernel reads it
        if k.kind in ("row", "xent_fused", "window") and not (k.members and graph.node(k.anchor_id).op == "batch_norm"):
            needed.update(a for a in (k.anchor, k.second) if a is not None)
    return needed


def plan_inplace(graph: Graph, kernels: list[Kernel]) -> tuple[dict[int, str], list[tuple[int, str]], list[str]]:
    """Which assigns can write their variable directly, and why the others cannot."""
    owner = {n: k for k in kernels for n in k.nodes()}
    roots = view_roots(graph)
    users = graph.consumers()
    # each variable's nodes, and the views of them (in view_roots' order): one pass over the graph,
    # not one per assign (a model with thousands of variables and optimizer states)
    var_nodes_of: dict[str, list[int]] = {}
    for n in graph.nodes:
        if n.op == "variable":
            var_nodes_of.setdefault(n.attr("name"), []).append(n.id)
    name_of = {node: name for name, nodes in var_nodes_of.items() for node in nodes}
    views_of: dict[str, list[int]] = {}
    for view, root in roots.items():
        if root in name_of:
            views_of.setdefault(name_of[root], []).append(view)
    inplace: dict[int, str] = {}
    copy_back: list[tuple[int, str]] = []
    notes: list[str] = []
    for var, value in graph.assigns.items():
        k = owner.get(value)
        reason = None
        if k is not None and _writes_rows_of(graph, k, value, var):
            pass     # scatter_rows of the variable's own rows: it reads each row only where it writes it
        elif k is None or value not in k.members:
            reason = "its value is not computed by a pointwise loop"
        elif value in inplace:
            reason = f"the value is already written into {inplace[value]}"
        else:
            readers = [c for v in var_nodes_of.get(var, []) for c in users[v]] + \
                      [c for r in views_of.get(var, []) for c in users[r]]
            for c in readers:
                if c in k.members:
                    if OPS[graph.node(c).op].input_strides or graph.node(c).type.shape != graph.variables[var].shape:
                        reason = f"%{c} reads the old value at another index"
                elif c in (k.anchor, k.second):
                    reason = f"the kernel's {graph.node(c).op} reads the old value"
        if reason:
            copy_back.append((value, var))
            notes.append(f"{var} updated by copy: {reason}")
        else:
            inplace[value] = var
    return inplace, copy_back, notes


def _writes_rows_of(graph: Graph, k: Kernel, value: int, var: str) -> bool:
    """Is `value` a scatter_rows kernel's result over variable `var` itself (a sparse update)?  Its
    kernel reads no other element of the table than the rows it writes, so it can write in place;
    every other reader of the old value runs before it (`fusion.order_kernels`)."""
    node = graph.node(value)
    if k.anchor != value or node.op != "scatter_rows" or k.members:
        return False
    table = graph.node(view_roots(graph).get(node.inputs[0], node.inputs[0]))
    return table.op == "variable" and table.attr("name") == var and table.type.shape == node.type.shape


def plan_memory(graph: Graph, kernels: list[Kernel], inplace: dict[int, str],
                copy_back: list[tuple[int, str]], notes: list[str]) -> MemoryPlan:
    end = len(kernels)
    needed = materialized(graph, kernels)
    roots = view_roots(graph)
    storage: dict[int, Buffer] = {}
    for n in graph.nodes:
        nbytes = n.type.nbytes
        if n.op == "input":
            storage[n.id] = Buffer("input", n.attr("index"), nbytes)
        elif n.op == "variable":
            storage[n.id] = Buffer("variable", n.attr("name"), nbytes)
        elif n.op == "scalar":
            storage[n.id] = Buffer("scalar", n.attr("name"), nbytes)
        elif n.id in inplace:
            storage[n.id] = Buffer("variable", inplace[n.id], nbytes)

    # Arena values: the materialized nodes, and the raw result of every matmul and reduction.
    lifetimes: dict[int, list[int]] = {}
    for i, k in enumerate(kernels):
        for node_id in k.nodes():
            if node_id in storage:
                continue
            # matmul and reduction kernels write their raw result before the epilogue
            if node_id in needed or (node_id == k.anchor and k.kind in ("matmul", "reduction", "window")):
                lifetimes[node_id] = [i, i]
    results = set(graph.outputs) | {node for node, _ in copy_back}
    for i, k in enumerate(kernels):
        for node_id in k.nodes():
            for inp in graph.node(node_id).inputs:
                src = roots.get(inp, inp)
                if src in lifetimes:
                    lifetimes[src][1] = max(lifetimes[src][1], i)
    for r in results:
        src = roots.get(r, r)
        if src in lifetimes:
            lifetimes[src][1] = end

    live: list[tuple[int, int, int]] = []     # (offset, size, last)
    peak = naive = 0
    for node_id, (first, last) in sorted(lifetimes.items(), key=lambda kv: (kv[1][0], kv[0])):
        size = _aligned(graph.node(node_id).type.nbytes)
        naive += size
        live = [b for b in live if b[2] >= first]
        offset = 0
        for b_off, b_size, _ in sorted(live):
            if offset + size <= b_off:
                break
            offset = max(offset, b_off + b_size)
        live.append((offset, size, last))
        peak = max(peak, offset + size)
        storage[node_id] = Buffer("arena", offset, graph.node(node_id).type.nbytes, first, last)
    for view, root in roots.items():
        if root in storage:
            storage[view] = storage[root]
    return MemoryPlan(storage, copy_back, inplace, peak, naive, notes)


def _aligned(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
