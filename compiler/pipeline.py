"""The compiler, top to bottom: graph passes, kernel passes, memory plan, C++, shared library.

Read `lower()` the way one reads Halide's Lower.cpp: each line is one named pass.
With `FLOWC_DEBUG=1` the program after every pass, the generated source and the
memory plan are written to a folder whose path is printed.
"""
from __future__ import annotations

import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from flowc.compiler import settings
from flowc.compiler.backends import HOST_DEVICE, get_backend
from flowc.compiler.codegen.common import GenerateOptions
from flowc.compiler.ir import Graph
from flowc.compiler.passes import canonicalize, constants, float16, fusion, memory, placement, simplify, snapshot
from flowc.compiler.program import Program


@dataclass
class PassRecord:
    name: str
    seconds: float
    summary: str          # what changed, in a few words
    dump: str             # the program after the pass


def _graph_pass(fn: Callable[[Graph], Graph]) -> Callable[[Program], Program]:
    def run(p: Program) -> Program:
        # A graph pass returns a new graph and no kernels: after fusion it would drop them silently.
        if p.kernels is not None:
            raise AssertionError(f"graph pass {fn.__name__} runs after the kernels were formed; "
                                 "move it before fuse_elementwise in PASSES")
        return Program(fn(p.graph), log=p.log)
    return run


def _form_kernels(p: Program) -> Program:
    return Program(p.graph, fusion.fuse_elementwise(p.graph, p.log), log=p.log)


def _fuse_epilogues(p: Program) -> Program:
    return Program(p.graph, fusion.fuse_epilogues(p.graph, p.require_kernels(), p.log), log=p.log)


def _chain_epilogues(p: Program) -> Program:
    return Program(p.graph, fusion.chain_epilogues(p.graph, p.require_kernels(), p.log), log=p.log)


def _fuse_xent(p: Program) -> Program:
    return Program(p.graph, fusion.fuse_softmax_cross_entropy(p.graph, p.require_kernels(), p.log), log=p.log)


def _group_updates(p: Program) -> Program:
    return Program(p.graph, fusion.group_optimizer_updates(p.graph, p.require_kernels(), p.log), log=p.log)


def _plan_memory(p: Program) -> Program:
    formed = p.require_kernels()
    inplace, copy_back, notes = memory.plan_inplace(p.graph, formed)
    try:
        kernels = fusion.order_kernels(p.graph, formed, inplace)
    except fusion.ScheduleCycle as cycle:
        # Some reader of an old value needs a new one: update every variable by copy instead.
        notes.append(f"in-place updates dropped: {cycle}")
        copy_back += [(node, var) for node, var in inplace.items()]
        inplace = {}
        kernels = fusion.order_kernels(p.graph, formed, inplace)
    return Program(p.graph, kernels, memory.plan_memory(p.graph, kernels, inplace, copy_back, notes), log=p.log)


# The pass list, in order.  Names are what `flowc show --after NAME` accepts.
PASSES: list[tuple[str, Callable[[Program], Program]]] = [
    ("simplify", _graph_pass(simplify.simplify)),
    ("place_devices", _graph_pass(placement.insert_device_copies)),   # no-op unless a node is off the host
    # no-op unless the graph has float16 values: they are stored as halves, computed in float32
    ("compute_float16_in_float32", _graph_pass(float16.compute_float16_in_float32)),
    ("split_reductions", _graph_pass(canonicalize.split_reductions)),
    ("fold_transposes", _graph_pass(canonicalize.fold_transposes)),
    ("simplify_again", _graph_pass(simplify.simplify)),
    # no-op unless a result is a variable that the step updates
    ("snapshot_outputs", _graph_pass(snapshot.snapshot_assigned_variables)),
    # after the last common-subexpression pass, which would merge the copies again
    ("clone_constants", _graph_pass(constants.clone_constants)),
    ("fuse_elementwise", _form_kernels),
    ("fuse_epilogues", _fuse_epilogues),
    ("fuse_softmax_cross_entropy", _fuse_xent),
    ("chain_epilogues", _chain_epilogues),
    ("group_optimizer_updates", _group_updates),
    ("plan_memory", _plan_memory),
]


def _summary(before: Program, after: Program, fused_before: int, refused_before: int) -> str:
    """What a pass changed: node counts, ops that appeared or vanished, fusion decisions, kernels."""
    parts = [f"{len(before.graph.nodes)} -> {len(after.graph.nodes)} nodes"]
    counts: dict[str, int] = {}
    for n in before.graph.nodes:
        counts[n.op] = counts.get(n.op, 0) - 1
    for n in after.graph.nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    changed = [f"{d:+d} {op}" for op, d in sorted(counts.items(), key=lambda kv: (kv[1], kv[0])) if d]
    if changed:
        parts.append(" ".join(changed[:6]) + (" ..." if len(changed) > 6 else ""))
    fused, refused = len(after.log.fused) - fused_before, len(after.log.refused) - refused_before
    if fused or refused:
        parts.append(f"{fused} fused, {refused} refused")
    if after.kernels is not None and (before.kernels is None or len(before.kernels) != len(after.kernels)):
        parts.append(f"{len(after.kernels)} kernels")
    if after.memory is not None:
        parts.append(f"arena {after.memory.arena_bytes} B")
    return ", ".join(parts) if len(parts) > 1 else parts[0] + ", no change"


def lower(graph: Graph, records: list[PassRecord] | None = None) -> Program:
    """Run every pass; append a `PassRecord` per pass to `records` when given."""
    program = Program(graph)
    graph.verify()
    for name, run in PASSES:
        fused, refused = len(program.log.fused), len(program.log.refused)
        start = time.perf_counter()
        after = run(program)
        after.graph.verify()
        if records is not None:
            records.append(PassRecord(name, time.perf_counter() - start,
                                      _summary(program, after, fused, refused), after.format()))
        program = after
    return program


def generate(program: Program, device: str = HOST_DEVICE, profile: bool = False, tf32: bool = False,
             arch: str | None = None, check_numerics: bool = False):
    """The generated step of `program` for `device`'s backend (C++, or CUDA for `arch`)."""
    from flowc.compiler.cache import package_version
    options = GenerateOptions(version=package_version(), profile=profile, tf32=tf32, arch=arch,
                              check_numerics=check_numerics)
    return get_backend(device).generator().from_program(program, options).render()


@dataclass
class CompiledStep:
    """A job's step ready to load: the built artifact plus what the runtime needs to call it."""
    program: Program
    generated: Any            # the backend generator's step (GeneratedStep, GeneratedCudaStep)
    library: Path             # the artifact the backend's loaded step loads (.so, .cubin)
    source_path: Path
    compiled: bool            # False when the cache had it
    timings: dict[str, float]
    pass_records: list[PassRecord] | None     # None: from the job cache, made again from `traced` when asked
    device: str = HOST_DEVICE  # the backend it was built for (compiler/backends.py)
    arch: str | None = None   # the device architecture it was built for, where the backend has one
    check_numerics: bool = False   # built with a NaN/Inf check after each kernel
    traced: Graph | None = None    # the graph the passes started from (kept by a job cache hit)

    @property
    def passes(self) -> list[PassRecord]:
        """What each pass did.  A step from the job cache (compiler/job_cache.py) ran no pass: the
        passes run again on its traced graph the first time their records are asked for."""
        if self.pass_records is None:
            assert self.traced is not None, "a step without pass records keeps its traced graph"
            records: list[PassRecord] = []
            lower(self.traced, records)
            self.pass_records = records
        return self.pass_records


def compile_graph(graph: Graph, device: str = HOST_DEVICE, arch: str | None = None) -> CompiledStep:
    """Lower, generate and build `graph`'s step for `device` (through the compile cache).

    A backend with architectures (CUDA) builds for `arch` ("sm_90"; None: the current device's);
    that needs its compiler (nvcc) but no device.
    """
    records: list[PassRecord] = []
    start = time.perf_counter()
    program = lower(graph, records)
    step, _ = build_lowered(program, records, {"passes": time.perf_counter() - start}, device, arch)
    return step


def build_lowered(program: Program, records: list[PassRecord], timings: dict[str, float],
                  device: str = HOST_DEVICE, arch: str | None = None,
                  check_numerics: bool = False) -> tuple[CompiledStep, str | None]:
    """Generate and build a lowered program: the step, and why the cache missed (None on a hit).

    FLOWC_PROFILE=1 builds per-kernel timers in; FLOWC_TF32=1 runs float32 GEMMs and convolutions on
    TF32 tensor cores where the backend has them.  `check_numerics` (the job's function_config) adds a
    NaN/Inf check after each kernel; it changes the source, hence the cache key.
    """
    backend = get_backend(device)
    toolchain = backend.toolchain(arch)
    start = time.perf_counter()
    generated = generate(program, backend.name, profile=settings.profile(), tf32=settings.tf32(),
                         arch=toolchain.arch, check_numerics=check_numerics)
    timings["codegen"] = time.perf_counter() - start
    start = time.perf_counter()
    built = toolchain.build(generated, program.graph.name)
    timings["compile"] = time.perf_counter() - start
    step = CompiledStep(program, generated, built.path, built.source_path, built.compiled, timings, records,
                        device=backend.name, arch=toolchain.arch, check_numerics=check_numerics)
    if settings.debug():
        write_debug_dump(step)
    return step, built.miss_reason


def write_debug_dump(step: CompiledStep) -> None:
    folder = Path(tempfile.mkdtemp(prefix=f"flowc-{debug_folder_label(step.program.graph.name)}-"))
    for i, rec in enumerate(step.passes):
        (folder / f"{i:02d}-{rec.name}.txt").write_text(rec.dump + "\n")
    source_name = get_backend(step.device).source_file
    (folder / source_name).write_text(step.generated.source)
    program = step.program
    (folder / "memory_plan.txt").write_text(program.require_memory().format(program.graph, program.require_kernels()))
    state = "compiled" if step.compiled else "from cache"
    print(f"flowc: job {step.program.graph.name!r} ({state}): IR after each pass, {source_name} and the memory "
          f"plan in {folder}; the library is {step.library} (source {step.source_path})", file=sys.stderr)


def debug_folder_label(job_name: str) -> str:
    """The part of a debug folder's name that recalls the job: letters, digits and `_` only, at most
    40 of them ("job" when none are left), so a job named `a/b`, `..` or with a NUL in it still gets
    a folder inside the temp directory.  The job's own name is in the message that names the folder."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", job_name)[:40].strip("_") or "job"
