"""Rewrites that put ops in the forms codegen handles best.

* `split_reductions`: a reduction over axes that are not one contiguous run (after
  dropping size-1 dims) becomes a chain of reductions that each are, so the kernel
  is always the (outer, reduced, inner) loop.
* `fold_transposes`: `matmul(transpose(x))` reads x with the GEMM's transpose flag
  instead of materialising the transpose.
"""
from __future__ import annotations

from flowc.compiler.ir import Graph, GraphBuilder, Node
from flowc.compiler.ops.reductions import reduced_shape
from flowc.compiler.passes.simplify import rebuild


def contiguous_runs(shape: tuple, axes: tuple) -> list[list[int]]:
    """Reduced axes grouped into runs that are adjacent once size-1 dims are ignored."""
    runs: list[list[int]] = []
    last = None
    for a in axes:
        between = range(last + 1, a) if last is not None else range(0)
        if runs and all(shape[b] == 1 for b in between):
            runs[-1].append(a)
        else:
            runs.append([a])
        last = a
    return runs


def split_reductions(graph: Graph) -> Graph:
    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        if n.op not in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
            return None
        shape = builder.types[inputs[0]].shape
        runs = contiguous_runs(shape, n.attr("axes"))
        if len(runs) <= 1:
            return None
        # Reduce the runs last-to-first with keepdims, so earlier axes keep their numbers.
        value = inputs[0]
        for run in reversed(runs):
            value = builder.add(n.op, [value], {"axes": tuple(run), "keepdims": True},
                                loc=n.loc, name=n.name, role=n.role, device=n.type.device)
        final = reduced_shape(shape, n.attr("axes"), n.attr("keepdims"))
        if builder.types[value].shape != final:
            value = builder.add("reshape", [value], {"shape": final}, loc=n.loc, role=n.role,
                                device=n.type.device)
        return value
    return rebuild(graph, rewrite)


def fold_transposes(graph: Graph) -> Graph:
    def rewrite(builder: GraphBuilder, n: Node, inputs: tuple[int, ...]) -> int | None:
        if n.op != "matmul":
            return None
        new_inputs, attrs, changed = list(inputs), n.attr_dict, False
        for k, flag in ((0, "transpose_a"), (1, "transpose_b")):
            src = builder.nodes[inputs[k]]
            rank = len(src.type.shape)
            swap_last = tuple(range(rank - 2)) + (rank - 1, rank - 2)
            if src.op == "transpose" and tuple(src.attr("perm")) == swap_last:
                new_inputs[k] = src.inputs[0]
                attrs[flag] = not attrs[flag]
                changed = True
        if not changed:
            return None
        return builder.add("matmul", new_inputs, attrs, loc=n.loc, name=n.name, role=n.role,
                           device=n.type.device)
    return rebuild(graph, rewrite)
