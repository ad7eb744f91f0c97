"""Where a data-parallel step starts and awaits each bucket of its gradient all-reduces.

The data-parallel pass (compiler/passes/data_parallel.py) gives every `all_reduce` node a
`bucket`: gradients in the order the backward pass produces them, cut into buckets of at most
`flow.config.collective_boxing.nccl_fusion_threshold_mb`.  Given the kernel schedule, a bucket
starts right after the kernel that writes the last of its gradients, the step pokes the engine
after each later kernel while buckets are in flight (a non-blocking collective moves only when
the engine is called), and the bucket is awaited at its first all_reduce kernel, after the rest of
the backward pass; each all_reduce kernel then copies its reduced gradient out.  Both backends
use this plan, and `flowc show --kernels` prints it.

Example::

    >>> for bucket in plan_buckets(graph, kernels):          # doctest: +SKIP
    ...     print(bucket.index, bucket.start_after, bucket.wait_at)
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler.ir import Graph
from flowc.compiler.ops import OPS
from flowc.compiler.program import Kernel

# Error codes of the engine (codegen_templates/cpu/flowc_comm.h): a step returns them as they are.
COMM_FAILED = 900001
COMM_TIMEOUT = 900002


@dataclass(frozen=True)
class Bucket:
    index: int
    members: tuple[int, ...]     # all_reduce node ids, in the order their gradients lie in the bucket
    sizes: tuple[int, ...]       # elements of each
    start_after: int             # the kernel after which it starts (-1: before the first kernel)
    wait_at: int                 # the kernel before which it is awaited: its first all_reduce kernel

    def offset(self, member: int) -> int:
        """Where `member`'s sums start in the bucket, in elements."""
        i = self.members.index(member)
        return sum(self.sizes[:i])


def plan_buckets(graph: Graph, kernels: list[Kernel]) -> list[Bucket]:
    """The buckets of `graph`'s all_reduce nodes under the schedule `kernels` (empty: none)."""
    position = {n: i for i, k in enumerate(kernels) for n in k.nodes()}
    roots: dict[int, int] = {}        # a view (reshape) -> the node whose buffer it shares
    for n in graph.nodes:
        if OPS[n.op].kind == "view":
            roots[n.id] = roots.get(n.inputs[0], n.inputs[0])
    members: dict[int, list[int]] = {}
    for n in graph.nodes:
        if OPS[n.op].kind == "collective":
            members.setdefault(n.attr("bucket"), []).append(n.id)
    plan = []
    for index, (bucket, ids) in enumerate(sorted(members.items())):
        if bucket != index:
            raise AssertionError(f"all_reduce buckets are numbered 0..{len(members) - 1}, found {bucket}")

        def written_at(node_id: int) -> int:
            source = graph.node(node_id).inputs[0]
            return position.get(roots.get(source, source), -1)
        start_after = max(written_at(m) for m in ids)
        wait_at = min(position[m] for m in ids)
        if wait_at <= start_after:
            raise AssertionError(f"bucket {index} would be awaited (kernel {wait_at}) before it starts "
                                 f"(after kernel {start_after})")
        sizes = tuple(graph.node(m).type.size for m in ids)
        plan.append(Bucket(index, tuple(ids), sizes, start_after, wait_at))
    return plan


def describe(plan: list[Bucket], kernels: list[Kernel]) -> list[str]:
    """One line per bucket: its gradients, bytes, and the kernels it starts after and is awaited at."""
    lines = []
    for b in plan:
        after = kernels[b.start_after].name if b.start_after >= 0 else "the step's start"
        lines.append(f"bucket {b.index}: {len(b.members)} gradients, {4 * sum(b.sizes)} B; starts after "
                     f"#{b.start_after} {after}, awaited before #{b.wait_at} {kernels[b.wait_at].name}")
    return lines
