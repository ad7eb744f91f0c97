"""The peak-memory summary of a memory plan: what `flowc show --memory` prints above the buffer list.

The arena is one block of `arena_bytes` allocated for the step; the values live in it at once are at
most `live_peak_bytes` (the rest of the arena is what the planner's offsets leave unused).  Variables
and placeholders are held outside the arena for the whole step.  Kernel scratch (GEMM packing and
convolution padding buffers, per thread) is outside the plan, so it is named but not counted.

    summary = summarize(plan, kernels)
    print(summary.text())   # arena 4.60 MiB (live values at most 4.10 MiB, at kernel 17 matmul_17), ...
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler.program import Kernel, MemoryPlan

MIB = float(1 << 20)


@dataclass(frozen=True)
class MemorySummary:
    """The planned bytes of one job's step."""
    arena_bytes: int
    live_peak_bytes: int          # the most bytes of arena values alive during one kernel
    peak_kernel: int              # the kernel at which they are (-1 without arena values)
    peak_kernel_name: str
    variable_bytes: int
    input_bytes: int

    @property
    def total_bytes(self) -> int:
        """Arena, variables and placeholders: what the step holds, kernel scratch aside."""
        return self.arena_bytes + self.variable_bytes + self.input_bytes

    def text(self) -> str:
        where = f", at kernel {self.peak_kernel} {self.peak_kernel_name}" if self.peak_kernel >= 0 else ""
        return (f"peak: arena {self.arena_bytes / MIB:.2f} MiB (live values at most "
                f"{self.live_peak_bytes / MIB:.2f} MiB{where}); variables {self.variable_bytes / MIB:.2f} MiB; "
                f"inputs {self.input_bytes / MIB:.2f} MiB; total {self.total_bytes / MIB:.2f} MiB "
                f"(kernel scratch for GEMM packing and convolution padding is outside the plan)")


def summarize(plan: MemoryPlan, kernels: list[Kernel]) -> MemorySummary:
    """The peak figures of `plan` (a job's memory plan over `kernels`).

    Example:
        summarize(lowered.program.memory, lowered.program.kernels).live_peak_bytes
    """
    arena = {b for b in plan.storage.values() if b.kind == "arena"}     # views share their root's buffer
    # A buffer is alive from the kernel that writes it to the last that reads it, both included.
    delta = [0] * (len(kernels) + 2)
    for b in arena:
        first = max(b.first, 0)
        last = min(max(b.last, first), len(kernels))
        delta[first] += b.nbytes
        delta[last + 1] -= b.nbytes
    live, peak, at = 0, 0, -1
    for k, d in enumerate(delta[:-1]):
        live += d
        if live > peak:
            peak, at = live, k
    held = {(b.kind, b.key): b.nbytes for b in plan.storage.values() if b.kind in ("variable", "input")}
    name = kernels[at].name if 0 <= at < len(kernels) else ("the end of the step" if at >= 0 else "")
    return MemorySummary(plan.arena_bytes, peak, at, name,
                         sum(n for (kind, _), n in held.items() if kind == "variable"),
                         sum(n for (kind, _), n in held.items() if kind == "input"))


def with_summary(text: str, summary: MemorySummary) -> str:
    """`text` (a plan's printout) with the summary as its second line."""
    head, _, rest = text.partition("\n")
    return f"{head}\n  {summary.text()}" + (f"\n{rest}" if rest else "")
