"""Where a data-parallel step starts and awaits each bucket of its gradient all-reduces.

The data-parallel pass (compiler/passes/data_parallel.py) gives every `all_reduce` node the most
a bucket may hold (`flow.config.collective_boxing.nccl_fusion_threshold_mb`).  Given the kernel
schedule, the sums go into buckets in the order their values are written.  A bucket starts right
after the kernel that writes the last of its values; the step pokes the engine after each later
kernel while buckets are in flight (a non-blocking collective moves only when the engine is
called); the bucket is awaited at its first all_reduce kernel, after the rest of the backward
pass, and each all_reduce kernel then copies its reduced value out.  Both backends use this plan,
and `flowc show --kernels` prints it.

Example::

    >>> for bucket in plan_buckets(graph, kernels):          # doctest: +SKIP
    ...     print(bucket.index, bucket.start_after, bucket.wait_at)
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler.ir import Graph, Node, numpy_dtype
from flowc.compiler.program import Kernel, view_roots

# Error codes of the engine (codegen_templates/cpu/flowc_comm.h): a step returns them as they are.
COMM_FAILED = 900001
COMM_TIMEOUT = 900002
# The type of the values a collective moves or sums: dtype -> the engines' code for it (flowc_comm.h,
# flowc_cuda_comm.h).  A bucket holds values of one type, as MPI and NCCL take one type per call.
COMM_TYPES = {"float32": "FLOWC_COMM_FLOAT32", "float64": "FLOWC_COMM_FLOAT64",
              "int32": "FLOWC_COMM_INT32", "int64": "FLOWC_COMM_INT64"}
# The exchanges of model parallelism: op -> (the engine's `kind`, the elements of one rank's block
# given the op's input and output sizes and the ranks).  Each is one blocking call at its place
# in the schedule (flowc_comm.h `exchange`), not bucketed: its reader comes right after it.
EXCHANGES = {
    "all_gather": ("FLOWC_COMM_ALL_GATHER", 1, lambda size_in, size_out, ranks: size_in),
    "reduce_scatter": ("FLOWC_COMM_REDUCE_SCATTER", 2, lambda size_in, size_out, ranks: size_out),
    "all_to_all": ("FLOWC_COMM_ALL_TO_ALL", 3, lambda size_in, size_out, ranks: size_in // ranks),
}


def exchange_count(node: Node, x: Node) -> int:
    """The `count` of exchange `node` (reading `x`): values of x's type in one rank's block."""
    _, _, block = EXCHANGES[node.op]
    return block(x.type.size, node.type.size, node.attr("ranks"))


@dataclass(frozen=True)
class Bucket:
    index: int
    members: tuple[int, ...]     # all_reduce node ids, in the order their gradients lie in the bucket
    sizes: tuple[int, ...]       # elements of each
    start_after: int             # the kernel after which it starts (-1: before the first kernel)
    wait_at: int                 # the kernel before which it is awaited: its first all_reduce kernel
    dtype: str = "float32"       # of every member (COMM_TYPES)

    def offset(self, member: int) -> int:
        """Where `member`'s sums start in the bucket, in elements."""
        i = self.members.index(member)
        return sum(self.sizes[:i])

    @property
    def itemsize(self) -> int:
        return numpy_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.itemsize * sum(self.sizes)


def plan_buckets(graph: Graph, kernels: list[Kernel]) -> list[Bucket]:
    """The buckets of `graph`'s all_reduce nodes under the schedule `kernels` (empty: none).

    Sums go into buckets in the order their values are written; a bucket closes before a value that
    would take it past its `bucket_bytes`, that is of another dtype, that is written after some member
    must already be awaited (a sum the forward pass reads, or an update the schedule runs early), or
    that must be awaited before the bucket's last value is written."""
    position = {n: i for i, k in enumerate(kernels) for n in k.nodes()}
    roots = view_roots(graph)          # a view (reshape) -> the node whose buffer it shares

    def written_at(node_id: int) -> int:
        source = graph.node(node_id).inputs[0]
        return position.get(roots.get(source, source), -1)
    sums = sorted((n.id for n in graph.nodes if n.op == "all_reduce"),
                  key=lambda m: (written_at(m), position[m]))
    def nbytes(node_id: int) -> int:
        node = graph.node(node_id)
        return node.type.size * numpy_dtype(node.type.dtype).itemsize

    groups: list[list[int]] = []
    for m in sums:
        current = groups[-1] if groups else None
        if current is None or \
                graph.node(m).type.dtype != graph.node(current[0]).type.dtype or \
                sum(nbytes(c) for c in current) + nbytes(m) > graph.node(m).attr("bucket_bytes") or \
                written_at(m) >= min(position[c] for c in current) or \
                position[m] <= max(written_at(c) for c in current):
            groups.append([m])
        else:
            current.append(m)
    plan = []
    for index, members in enumerate(groups):
        start_after = max(written_at(m) for m in members)
        wait_at = min(position[m] for m in members)
        assert wait_at > start_after, (index, members)
        plan.append(Bucket(index, tuple(members), tuple(graph.node(m).type.size for m in members),
                           start_after, wait_at, graph.node(members[0]).type.dtype))
    return plan


def describe(plan: list[Bucket], kernels: list[Kernel]) -> list[str]:
    """One line per bucket: its gradients, bytes, and the kernels it starts after and is awaited at."""
    lines = []
    for b in plan:
        after = kernels[b.start_after].name if b.start_after >= 0 else "the step's start"
        kind = "" if b.dtype == "float32" else f" {b.dtype}"
        noun = "gradients" if b.dtype.startswith("float") else "values"
        lines.append(f"bucket {b.index}: {len(b.members)}{kind} {noun}, {b.nbytes} B; starts after "
                     f"#{b.start_after} {after}, awaited before #{b.wait_at} {kernels[b.wait_at].name}")
    return lines
