"""The compiler's stages as objects, staged the way JAX stages `jit`.

    lowered = train_job.lower()          # traced, every pass run: text, no code yet
    print(lowered.as_text())             # the program after the last pass
    compiled = lowered.compile()         # C++ rendered and built (through the cache)
    print(compiled.source())             # the generated translation unit
    print(compiled.memory_plan().peak_bytes)

`flowc show` prints these same objects, so the command and the library never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flowc.compiler.memory_report import MemorySummary, summarize, with_summary
from flowc.compiler.passes.memory import MemoryPlan
from flowc.compiler.pipeline import PASSES, CompiledStep, PassRecord, Program


class UnknownPassError(ValueError):
    """A pass name that is not in the pipeline's pass list."""


def pass_names() -> list[str]:
    """The passes in the order they run: what `--after` and `Lowered.as_text(after=...)` accept."""
    return [name for name, _ in PASSES]


@dataclass
class MemoryPlanView:
    """The memory plan of a compiled job, with its peak and its printout (the summary as its second line)."""
    plan: MemoryPlan
    text: str
    summary: MemorySummary | None = None

    @property
    def peak_bytes(self) -> int:
        """The arena's size: the most bytes of intermediate values the step holds at once (with the gaps
        the planner's offsets leave)."""
        return self.plan.arena_bytes

    @classmethod
    def of(cls, program: Program) -> MemoryPlanView:
        memory, kernels = program.require_memory(), program.require_kernels()
        summary = summarize(memory, kernels)
        return cls(memory, with_summary(memory.format(program.graph, kernels), summary), summary)

    def __str__(self) -> str:
        return self.text


@dataclass
class Lowered:
    """A job after every pass, before any code is generated.  From `job.lower()`."""
    program: Program
    passes: list[PassRecord]
    timings: dict[str, float] = field(default_factory=dict)          # trace, passes (seconds)
    device: str = "cpu"
    on_compiled: Callable[[CompiledStep], None] | None = None
    check_numerics: bool = False        # function_config().check_numerics: a NaN/Inf check after each kernel

    @property
    def name(self) -> str:
        return self.program.graph.name

    def record(self, after: str) -> PassRecord:
        for rec in self.passes:
            if rec.name == after:
                return rec
        raise UnknownPassError(f"unknown pass {after!r}; the passes are: {', '.join(pass_names())}")

    def as_text(self, after: str | None = None) -> str:
        """The program (IR, then kernels and memory plan once formed) after pass `after`, or after all.

        Example:
            print(train_job.lower().as_text(after="fuse_epilogues"))
        """
        return self.record(after).dump if after else self.program.format()

    def passes_text(self) -> str:
        """One line per pass: its time and what it changed."""
        lines = [f"passes of {self.name} ({len(self.passes)}, {sum(r.seconds for r in self.passes) * 1e3:.1f} ms):"]
        for i, rec in enumerate(self.passes):
            lines.append(f"  {i:2d} {rec.name:<28} {rec.seconds * 1e3:7.2f} ms  {rec.summary}")
        return "\n".join(lines)

    def kernels_text(self) -> str:
        """The kernels in run order with the nodes each fuses, then every fusion decision and refusal."""
        graph, kernels, log = self.program.graph, self.program.kernels or [], self.program.log
        lines = [f"kernels of {self.name} ({len(kernels)}, in run order):"]
        from flowc.compiler.backends import get_backend
        if get_backend(self.device).templates == "cuda":      # how a CUDA step runs: one call or per launch
            from flowc.compiler.codegen.cuda_host import step_mode
            lines.insert(0, step_mode())
        for i, k in enumerate(kernels):
            ops = [graph.node(n) for n in k.nodes()]
            lines.append(f"  [{i}] {k.name}  ({k.kind}, {len(ops)} ops)")
            for n in ops:
                lines.append(f"        %{n.id:<4} {n.op:<32} {n.role:<8} {n.loc}")
        from flowc.compiler.codegen.collectives import describe, plan_buckets
        buckets = plan_buckets(graph, kernels)
        if buckets:     # a data-parallel job: where each bucket of gradients is summed over the ranks
            lines.append(f"all-reduce buckets ({len(buckets)}):")
            lines.extend(f"  {line}" for line in describe(buckets, kernels))
        lines.append(f"fused ({len(log.fused)}):")
        lines.extend(f"  {line}" for line in log.fused)
        lines.append(f"not fused ({len(log.refused)}):")
        lines.extend(f"  {line}" for line in log.refused)
        return "\n".join(lines)

    def as_dot(self) -> str:
        """The job graph as Graphviz DOT: roles coloured, fused kernels as clusters."""
        from flowc.compiler.graph_dot import to_dot
        return to_dot(self.program)

    def memory_plan(self) -> MemoryPlanView:
        return MemoryPlanView.of(self.program)

    def compile(self, arch: str | None = None) -> Compiled:
        """Render the source and build it (a cache hit builds nothing).

        Example:
            compiled = train_job.lower().compile()
            compiled.from_cache     # True when an earlier run or `flowc compile` built it
        """
        from flowc.compiler.pipeline import build_lowered
        step, miss_reason = build_lowered(self.program, self.passes, dict(self.timings), self.device, arch,
                                          check_numerics=self.check_numerics)
        if self.on_compiled is not None:
            self.on_compiled(step)
        return Compiled(step, miss_reason)


@dataclass
class Compiled:
    """A job's built step.  From `Lowered.compile()` or `job.compile()`."""
    step: CompiledStep
    miss_reason: str | None = None        # why the cache had to build it (None: a cache hit)

    @property
    def name(self) -> str:
        return self.step.program.graph.name

    @property
    def device(self) -> str:
        return self.step.device

    @property
    def from_cache(self) -> bool:
        return not self.step.compiled

    @property
    def library(self) -> Path:
        return self.step.library

    @property
    def source_path(self) -> Path:
        return self.step.source_path

    @property
    def timings(self) -> dict[str, float]:
        return self.step.timings

    def source(self) -> str:
        """The generated source (C++ for the CPU, CUDA for the GPU)."""
        return self.step.generated.source

    def memory_plan(self) -> MemoryPlanView:
        return MemoryPlanView.of(self.step.program)

    def lowered(self) -> Lowered:
        return Lowered(self.step.program, self.step.passes, dict(self.step.timings),
                       check_numerics=self.step.check_numerics)

