"""The IR after the graph passes: kernels, the memory plan, and the program that carries them.

`compiler/ir.py` holds the graph (typed nodes); this module holds what the kernel passes make of
it.  Passes produce these types and the code generators consume them, so both import them from
here and never from each other:

    program = Program(graph)                          # after the graph passes
    program.kernels                                   # [Kernel(name, kind, anchor, loops)]
    program.memory.storage[node_id]                   # Buffer(kind, key, nbytes, first, last)
    print(program.format())                           # the graph, its kernels and the memory plan
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from flowc.compiler.ir import Graph
from flowc.compiler.ops import OPS

# How a kernel is laid out (compiler/passes/fusion.py makes them; each backend lowers every kind).
KernelKind = Literal["pointwise", "reduction", "matmul", "row", "window", "xent_fused", "collective"]
KERNEL_KINDS: tuple[KernelKind, ...] = get_args(KernelKind)
# Where a materialized value lives.
BufferKind = Literal["arena", "input", "variable", "scalar"]


@dataclass
class Kernel:
    """One function of the generated step.

    kind: pointwise | matmul | reduction | row | window | xent_fused | collective.
    `anchor` is the matmul / reduction / row node; `loops` are pointwise member
    groups: the body of a pointwise kernel (several independent loops after
    `group_optimizer_updates`), or the epilogue (loops[0]) of an anchored kernel.
    """
    name: str
    kind: KernelKind
    anchor: int | None = None
    loops: list[list[int]] = field(default_factory=lambda: [[]])
    second: int | None = None          # xent_fused: the gradient node
    notes: list[str] = field(default_factory=list)

    @property
    def members(self) -> list[int]:
        return [m for loop in self.loops for m in loop]

    @property
    def anchor_id(self) -> int:
        """`anchor` of an anchored kernel (every kind but pointwise), for code that has checked the kind."""
        assert self.anchor is not None, f"{self.kind} kernel {self.name} has no anchor"
        return self.anchor

    @property
    def second_id(self) -> int:
        """`second` of an xent_fused kernel: its gradient node."""
        assert self.second is not None, f"{self.kind} kernel {self.name} has no second node"
        return self.second

    def nodes(self) -> list[int]:
        anchors = [a for a in (self.anchor, self.second) if a is not None]
        return anchors + self.members


@dataclass
class FusionLog:
    fused: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Buffer:
    kind: BufferKind       # arena | input | variable | scalar
    key: object            # arena offset, placeholder index, variable or scalar name
    nbytes: int
    first: int = -1        # kernel index that writes it (arena only)
    last: int = -1         # last kernel index that reads it; len(kernels) = the end of the step


@dataclass
class MemoryPlan:
    storage: dict[int, Buffer]                 # node id -> buffer (views share their root's)
    copy_back: list[tuple[int, str]]           # (node, variable) updated after the last kernel
    inplace: dict[int, str]                    # node -> variable it is written into directly
    arena_bytes: int
    naive_bytes: int                           # what one buffer per value would take
    notes: list[str] = field(default_factory=list)

    def format(self, graph: Graph, kernels: list[Kernel]) -> str:
        lines = [f"memory plan for {graph.name}: arena peak {self.arena_bytes} bytes "
                 f"(one buffer per value would take {self.naive_bytes})"]
        for node_id, buf in sorted(self.storage.items(), key=lambda kv: (kv[1].kind, str(kv[1].key))):
            n = graph.node(node_id)
            if buf.kind == "arena":
                span = f"kernels {buf.first}..{buf.last}"
                where = f"arena+{buf.key}"
            else:
                span, where = "step", f"{buf.kind} {buf.key}"
            lines.append(f"  %{node_id:<4} {str(n.type):<24} {where:<28} {buf.nbytes:>10} B  {span}  ({n.op})")
        for node_id, var in self.copy_back:
            lines.append(f"  copy %{node_id} -> variable {var} after the last kernel")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


@dataclass
class Program:
    """What the passes hand each other: the graph, then its kernels, then its memory plan."""
    graph: Graph
    kernels: list[Kernel] | None = None
    memory: MemoryPlan | None = None
    log: FusionLog = field(default_factory=FusionLog)

    def require_kernels(self) -> list[Kernel]:
        """`kernels`, for the passes and stages after `fuse_elementwise` (which makes them)."""
        assert self.kernels is not None, f"{self.graph.name}: no kernels yet (before fuse_elementwise)"
        return self.kernels

    def require_memory(self) -> MemoryPlan:
        """`memory`, for what comes after `plan_memory` (which makes it)."""
        assert self.memory is not None, f"{self.graph.name}: no memory plan yet (before plan_memory)"
        return self.memory

    def format(self) -> str:
        if self.kernels is None:
            return self.graph.format()
        lines = [f"kernels of {self.graph.name} ({len(self.kernels)}):"]
        for i, k in enumerate(self.kernels):
            ops = ", ".join(f"%{n} {self.graph.node(n).op}" for n in k.nodes())
            lines.append(f"  [{i}] {k.name} ({k.kind}): {ops}")
        if self.memory is not None:
            lines.append(self.memory.format(self.graph, self.kernels))
        return self.graph.format() + "\n" + "\n".join(lines)


def view_roots(graph: Graph) -> dict[int, int]:
    """reshape node -> the node whose buffer it shares (views share their root's buffer)."""
    roots: dict[int, int] = {}
    for n in graph.nodes:
        if OPS[n.op].kind == "view":
            roots[n.id] = roots.get(n.inputs[0], n.inputs[0])
    return roots
