"""Fusion: grouping IR nodes into kernels.

Each fusion decision asks two separate questions: is it legal (the result is the
same and the schedule has no cycle) and does it pay.  Every refusal is logged with
its reason, so `flowc show --kernels` can say why two nodes were not fused.

* `fuse_elementwise`: pointwise chains become one loop.  A node joins its consumers'
  group when all its consumers are in one group and read it at their own index.
* `fuse_epilogues`: a pointwise group that is the only reader of a matmul, a
  reduction, a convolution or a batch normalisation runs inside that kernel's
  write-back (bias, activation, and the optimizer update of a gradient).
* `fuse_softmax_cross_entropy`: the loss and its gradient on the same logits are one
  pass over each row.
* `group_optimizer_updates`: the update loops left standalone share one kernel.
* `order_kernels`: a topological order of kernels in which an in-place variable
  update runs after every reader of the old value.
"""
from __future__ import annotations


from flowc.compiler.ir import Graph
from flowc.compiler.ops import OPS
from flowc.compiler.program import FusionLog, Kernel, view_roots


# Row and window ops whose kernels run an epilogue (besides matmuls and reductions): conv2d indexes it
# by (image, filter, pixel); batch_norm linearly, as a reduction (operands of its shape or scalars).
EPILOGUE_OPS = frozenset({"conv2d", "batch_norm"})


class ScheduleCycle(AssertionError):
    """No kernel order satisfies the data dependencies plus the in-place update constraints."""


def _reads_at_own_index(graph: Graph, producer: int, consumer: int) -> str | None:
    """None if `consumer` reads `producer` element-for-element, else why not."""
    c = graph.node(consumer)
    if graph.node(producer).op == "constant":
        return None                 # uniform: any index reads the same literal (see passes/constants.py)
    if OPS[c.op].input_strides is not None:
        return f"{c.op} %{consumer} reads it at a permuted index"
    if c.type.shape != graph.node(producer).type.shape:
        return f"%{consumer} ({c.op}) broadcasts it to {list(c.type.shape)}"
    return None


def fuse_elementwise(graph: Graph, log: FusionLog) -> list[Kernel]:
    users = graph.consumers()
    group_of: dict[int, int] = {}
    groups: dict[int, list[int]] = {}
    for n in reversed(graph.nodes):
        if OPS[n.op].kind != "pointwise":
            continue
        consumers = users[n.id]
        target, reason = None, None
        if not consumers:
            reason = "it is only a result of the step"
        elif any(OPS[graph.node(c).op].kind != "pointwise" for c in consumers):
            kinds = sorted({graph.node(c).op for c in consumers if OPS[graph.node(c).op].kind != "pointwise"})
            reason = f"it feeds {', '.join(kinds)}"
        elif len({group_of[c] for c in consumers}) > 1:
            reason = f"its {len(consumers)} consumers are in different kernels"
        else:
            reason = next((r for c in consumers if (r := _reads_at_own_index(graph, n.id, c))), None)
            if reason is None:
                target = group_of[consumers[0]]
        if target is None:
            target = n.id
            groups[target] = []
            if consumers and reason:
                log.refused.append(f"%{n.id} {n.op} [{n.loc}] not fused into its consumers: {reason}")
        else:
            log.fused.append(f"%{n.id} {n.op} fused into the loop of %{target}")
        group_of[n.id] = target
        groups[target].insert(0, n.id)

    kernels = []
    for n in graph.nodes:
        kind = OPS[n.op].kind
        if kind in ("matmul", "reduction", "row", "window", "collective"):
            kernels.append(Kernel(f"{n.op}_{n.id}", kind, anchor=n.id))
        elif kind == "pointwise" and n.id in groups:
            kernels.append(Kernel(f"loop_{n.id}", "pointwise", loops=[groups[n.id]]))
    return kernels


def fuse_epilogues(graph: Graph, kernels: list[Kernel], log: FusionLog) -> list[Kernel]:
    users = graph.consumers()
    owner = {m: k for k in kernels for m in k.members}
    absorbed: set[int] = set()
    for k in kernels:
        if k.kind == "pointwise" or (k.kind not in ("matmul", "reduction")
                                     and graph.node(k.anchor_id).op not in EPILOGUE_OPS):
            continue
        a = graph.node(k.anchor_id)
        consumers = users[a.id]
        if not consumers:
            continue
        groups = {id(owner.get(c)) for c in consumers}
        group = owner.get(consumers[0])
        if group is not None and id(group) in absorbed:
            log.refused.append(f"%{a.id} {a.op} [{a.loc}]: its consumer loop already runs in another epilogue")
            continue
        if group is None or len(groups) != 1:
            log.refused.append(f"%{a.id} {a.op} [{a.loc}] keeps a plain write-back: its result is read by "
                               f"{'a non-pointwise op' if group is None else 'several kernels'}")
            continue
        if len(group.loops) != 1 or graph.node(group.loops[0][-1]).type.shape != a.type.shape:
            log.refused.append(f"%{a.id} {a.op} [{a.loc}]: consumer loop has another shape")
            continue
        reason = next((r for c in consumers if (r := _reads_at_own_index(graph, a.id, c))), None)
        reason = reason or _epilogue_refusal(graph, k, group.loops[0])
        if reason:
            log.refused.append(f"%{a.id} {a.op} [{a.loc}] epilogue refused: {reason}")
            continue
        k.loops = [list(group.loops[0])]
        k.name = f"{k.name}_" + "_".join(dict.fromkeys(graph.node(m).op for m in group.members
                                                       if graph.node(m).op != "constant"))
        absorbed.add(id(group))
        log.fused.append(f"%{a.id} {a.op}: epilogue {', '.join(graph.node(m).op for m in group.members)}")
    return [k for k in kernels if id(k) not in absorbed]


def chain_epilogues(graph: Graph, kernels: list[Kernel], log: FusionLog) -> list[Kernel]:
    """A loop that reads a 2-D GEMM's epilogue values at their own index joins that epilogue.

    BERT's feed-forward layer is `gelu(x W + b)`: the bias add is the GEMM's epilogue, but its value
    is also read by the gelu's gradient, so the gelu was refused by `fuse_elementwise` (its input's
    readers are in different kernels) and ran as its own loop over the (tokens, 4 * hidden) result.
    Here such a loop runs in the GEMM's write-back instead; values read elsewhere are still stored.
    Legal when every value it reads from the GEMM kernel is read at its own index, it has the GEMM's
    shape, it updates no variable, and no kernel that produces one of its other inputs depends on the
    GEMM kernel (the merged kernel runs where the GEMM runs).
    """
    users = graph.consumers()
    roots = view_roots(graph)
    owner = {n: k for k in kernels for n in k.nodes()}
    merged: set[int] = set()
    for k in kernels:
        if k.kind != "matmul" or not k.members or len(graph.node(k.anchor_id).type.shape) != 2:
            continue
        shape = graph.node(k.anchor_id).type.shape
        grown = True
        while grown:
            grown = False
            inside = set(k.nodes())
            readers = {id(owner[c]): owner[c] for m in k.members for c in users[m]
                       if c in owner and owner[c] is not k and id(owner[c]) not in merged}
            for loop in readers.values():
                if _chain_refusal(graph, roots, owner, k, loop, inside, shape) is None:
                    k.loops = [k.loops[0] + loop.loops[0]]
                    k.name += "_" + "_".join(dict.fromkeys(graph.node(m).op for m in loop.members
                                                           if graph.node(m).op != "constant"))
                    merged.add(id(loop))
                    owner.update({m: k for m in loop.members})
                    log.fused.append(f"%{k.anchor} {graph.node(k.anchor_id).op}: epilogue chained with "
                                     f"{', '.join(graph.node(m).op for m in loop.members)}")
                    grown = True
                    break
    return [k for k in kernels if id(k) not in merged]


def _chain_refusal(graph: Graph, roots: dict[int, int], owner: dict, k: Kernel, loop: Kernel, inside: set[int],
                   shape: tuple) -> str | None:
    if loop.kind != "pointwise" or len(loop.loops) != 1 or graph.node(loop.loops[0][-1]).type.shape != shape:
        return "not one loop of the GEMM's shape"
    members = set(loop.members)
    if any(graph.node(m).role == "update" for m in members):
        return "it updates a variable"
    for m in loop.members:
        for x in graph.node(m).inputs:
            if x in inside:
                if graph.node(x).type.shape != shape or _reads_at_own_index(graph, x, m):
                    return f"%{m} reads %{x} at another index"
                continue
            src = roots.get(x, x)         # a view (reshape, device copy) reads its root's kernel
            if src not in members and src in owner and _kernel_reaches(graph, roots, owner, owner[src], k):
                return f"%{x} comes from a kernel that runs after the GEMM"
    return None


def _kernel_reaches(graph: Graph, roots: dict[int, int], owner: dict, start: Kernel, target: Kernel) -> bool:
    """Does kernel `start` depend, through kernels, on kernel `target`?"""
    stack, seen = [start], {id(start)}
    while stack:
        k = stack.pop()
        if k is target:
            return True
        for n in k.nodes():
            for x in graph.node(n).inputs:
                p = owner.get(roots.get(x, x))
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    stack.append(p)
    return False


def _epilogue_refusal(graph: Graph, k: Kernel, members: list[int]) -> str | None:
    """Why the anchored kernel cannot run `members` in its write-back (None: it can)."""
    a = graph.node(k.anchor_id)
    if k.kind == "matmul":
        return "batched matmul has a plain write-back" if len(a.type.shape) > 2 else None
    if k.kind == "window":      # conv2d: the epilogue indexes (image, filter, pixel) with any strides
        return None
    # A reduction's epilogue indexes its output linearly: other operands must match it or be scalars.
    inside = set(members) | {a.id}
    for m in members:
        for x in graph.node(m).inputs:
            t = graph.node(x).type
            if x not in inside and t.shape != a.type.shape and t.size != 1:
                return f"%{m} reads %{x} of shape {list(t.shape)}, broadcast in the reduction epilogue"
    return None


def _reaches(graph: Graph, start: int, target: int) -> bool:
    users = graph.consumers()
    stack, seen = [start], set()
    while stack:
        n = stack.pop()
        if n == target:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(users[n])
    return False


def fuse_softmax_cross_entropy(graph: Graph, kernels: list[Kernel], log: FusionLog) -> list[Kernel]:
    by_anchor = {k.anchor: k for k in kernels if k.kind == "row"}
    removed: set[int] = set()
    for k in list(by_anchor.values()):
        g = graph.node(k.anchor_id)
        if g.op != "sparse_softmax_cross_entropy_grad":
            continue
        logits, labels, dy = g.inputs
        fwd = next((by_anchor[n.id] for n in graph.nodes if n.op == "sparse_softmax_cross_entropy"
                    and n.inputs == (logits, labels) and n.id in by_anchor), None)
        if fwd is None:
            continue
        if _reaches(graph, fwd.anchor_id, dy):
            log.refused.append(f"%{g.id}: cross-entropy gradient not fused with %{fwd.anchor}: dy depends on the loss")
            continue
        fwd.kind, fwd.second, fwd.name = "xent_fused", g.id, f"softmax_xent_fwd_bwd_{fwd.anchor}"
        removed.add(id(k))
        log.fused.append(f"%{fwd.anchor} sparse_softmax_cross_entropy + %{g.id} its gradient: one pass per row")
    return [k for k in kernels if id(k) not in removed]


def group_optimizer_updates(graph: Graph, kernels: list[Kernel], log: FusionLog) -> list[Kernel]:
    """Merge standalone update loops (nothing reads them but the assigns) into one kernel."""
    assigned = set(graph.assigns.values())
    users = graph.consumers()
    members_of = {id(k): set(k.members) for k in kernels}

    def standalone_update(k: Kernel) -> bool:
        return (k.kind == "pointwise" and all(graph.node(m).role == "update" for m in k.members)
                and all(c in members_of[id(k)] for m in k.members for c in users[m])
                and any(m in assigned for m in k.members))
    updates = [k for k in kernels if standalone_update(k)]
    if len(updates) < 2:
        return kernels
    merged = Kernel("optimizer_update", "pointwise", loops=[loop for k in updates for loop in k.loops])
    log.fused.append(f"{len(updates)} update loops in one kernel")
    # by identity: Kernel is a dataclass, and comparing thousands of them field by field was quadratic
    chosen = {id(k) for k in updates}
    first = next(i for i, k in enumerate(kernels) if k is updates[0])
    rest = [k for k in kernels if id(k) not in chosen]
    return rest[:first] + [merged] + rest[first:]


def order_kernels(graph: Graph, kernels: list[Kernel], inplace_writes: dict[int, str]) -> list[Kernel]:
    """Topological order of kernels; a kernel writing variable V in place runs after V's readers.

    `inplace_writes` maps assigned node id -> variable name for in-place updates.
    """
    producer = {n: i for i, k in enumerate(kernels) for n in k.nodes()}
    view_root = view_roots(graph)
    deps: list[set[int]] = [set() for _ in kernels]
    readers_of_var: dict[str, set[int]] = {}
    for i, k in enumerate(kernels):
        for n in k.nodes():
            for inp in graph.node(n).inputs:
                src = view_root.get(inp, inp)
                if src in producer and producer[src] != i:
                    deps[i].add(producer[src])
                src_node = graph.node(src)
                if src_node.op == "variable":
                    readers_of_var.setdefault(src_node.attr("name"), set()).add(i)
    for node_id, var in inplace_writes.items():
        writer = producer[node_id]
        deps[writer] |= readers_of_var.get(var, set()) - {writer}
    order: list[Kernel] = []
    done: set[int] = set()
    position: dict[int, float] = {i: max(k.nodes()) for i, k in enumerate(kernels)}
    # A collective (all_reduce) waits for the other ranks: it goes as late as its first reader allows,
    # so the rest of the backward pass runs while the sums are in flight (compiler/codegen/collectives.py).
    for i, k in enumerate(kernels):
        if k.kind == "collective":
            readers = [j for j, d in enumerate(deps) if i in d]
            if readers:
                position[i] = min(position[j] for j in readers) - 0.5
    pending = sorted(range(len(kernels)), key=position.__getitem__)
    while pending:
        ready = next((i for i in pending if deps[i] <= done), None)
        if ready is None:
            raise ScheduleCycle("kernel schedule has a cycle: " + ", ".join(kernels[i].name for i in pending))
        order.append(kernels[ready])
        done.add(ready)
        pending.remove(ready)
    return order


