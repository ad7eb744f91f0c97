"""The host step of a CUDA job: `flowc_step`, the C++ function that launches a step's kernels.

`CudaGenerator.render` (cuda.py) lays out a step as a launch list; this module turns that list
into the context of the host-step section of codegen_templates/cuda/step.cu.j2, so that a step
is one foreign call (runtime/cuda_executor.py) instead of one PyCUDA call per launch:

    host = host_step(launches, copies, fetches, bindings, sync=True)
    host["launches"][0]["args"]      # 'buffers[0] + 1024, buffers[3]'

The call passes one table of device addresses per register slot (`buffers`): the arena, the
scratch buffer and the status int first, then every other binding of the step in the order of
`GeneratedCudaStep.bindings` (its first entry is the arena); a launch argument is an entry of
that table plus its byte offset.

A data-parallel or model-parallel job also calls its communication engine between launches
(`CommCall`: codegen_templates/cuda/flowc_cuda_comm.h, NCCL behind it): the table's ("comm",)
entry is the engine's function table, a ("bucket", b, offset) argument is where bucket b holds a
sum, and the step ends with the engine's `settle` (a wait that watches the peers) instead of a
plain synchronize.
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler import settings
from flowc.compiler.codegen.collectives import COMM_TYPES
from flowc.compiler.codegen.common import describe_binding
from flowc.compiler.codegen.sanitise import CodeText, c_identifier, code, code_format

# The table's fixed head: what every step has, whatever its bindings.
FIXED = {"arena": 0, "scratch": 1, "status": 2}
# Arguments that are not entries of the table: resolved by the engine at run time.
ENGINE_KINDS = ("bucket",)


@dataclass(frozen=True)
class CommCall:
    """A call of the communication engine, queued before launch `at` of the step (len(launches):
    after the last one).  `op` "start": sum bucket `bucket`, whose gradients are `args` (their
    bindings) of `sizes` values of type `dtype`; "wait": the stream waits for bucket `bucket`'s
    sums; "exchange": `args` = (in, out), `sizes` = (kind, count) (flowc_cuda_comm.h's
    FLOWC_COMM_ALL_GATHER ...), of values of type `dtype`."""
    at: int
    op: str
    bucket: int = -1
    args: tuple[tuple, ...] = ()
    sizes: tuple[int, ...] = ()
    dtype: str = "float32"


@dataclass(frozen=True)
class Fetch:
    """An output the host step downloads into the slot's page-locked buffer `output`."""
    output: int
    src: tuple
    nbytes: int


def host_buffers(bindings: list[tuple]) -> list[tuple]:
    """The `buffers` table's entries, in order: the three fixed ones, then `bindings` past the arena."""
    assert bindings and bindings[0] == ("arena",), bindings
    return [("arena",), ("scratch",), ("status",), *bindings[1:]]


def address(binding: tuple, table: list[tuple]) -> CodeText:
    """The C++ expression of `binding`'s device address in the host step."""
    kind = binding[0]
    if kind == "bucket":           # a sum where the engine holds it: ("bucket", b, byte offset)
        sums, offset = f"static_cast<char*>(comm->data(comm->ctx, {int(binding[1])}))", int(binding[2])
        return code(f"{sums} + {offset}" if offset else sums)
    if kind in FIXED:
        offset = int(binding[1]) if len(binding) > 1 else 0
        base = f"buffers[{FIXED[kind]}]"
        return code(f"{base} + {offset}" if offset else base)
    return code(f"buffers[{table.index(binding)}]")


def comm_text(call: CommCall, table: list[tuple]) -> CodeText:
    """The C++ statement of one engine call (`err` and the stream `s` are the host step's)."""
    if call.op == "start":
        grads = ", ".join(f"static_cast<const void*>({address(b, table)})" for b in call.args)
        sizes = ", ".join(str(int(n)) for n in call.sizes)
        start = f"comm->start(comm->ctx, {int(call.bucket)}, {len(call.args)}, g, n, {COMM_TYPES[call.dtype]}, s)"
        return code(f"{{ const void* g[] = {{{grads}}}; static const int64_t n[] = {{{sizes}}};"
                    f" if ((err = {start})) return err; }}")
    if call.op == "wait":
        return code(f"if ((err = comm->wait(comm->ctx, {int(call.bucket)}, s))) return err;")
    assert call.op == "exchange", call
    (src, dst), (kind, count) = call.args, call.sizes
    src_text = f"static_cast<const void*>({address(src, table)})"
    dst_text = f"static_cast<void*>({address(dst, table)})"
    dtype = COMM_TYPES[call.dtype]
    exchange = f"comm->exchange(comm->ctx, {int(kind)}, {src_text}, {dst_text}, {int(count)}, {dtype}, s)"
    return code(f"if ((err = {exchange})) return err;")


def host_step(launches: list, copies: list, fetches: list[Fetch], bindings: list[tuple], sync: bool,
              reads: str = "", comm_calls: list[CommCall] | None = None) -> dict:
    """The template context of the host step (see the module docstring); `sync`: wait for the
    stream before returning (the host reads something of the step: `reads` says what);
    `comm_calls`: the engine's calls, each before its launch."""
    table = host_buffers(bindings)
    calls = comm_calls or []
    rows = []
    for index, la in enumerate(launches):
        rows.append({"calls": [comm_text(c, table) for c in calls if c.at == index],
                     "kernel": c_identifier(la.kernel), "comment": code_format("{}", la.kernel),
                     "args": code(", ".join(address(b, table) for b in la.args)), "count": len(la.args),
                     "grid": code(", ".join(str(int(g)) for g in la.grid)),
                     "block": code(", ".join(str(int(b)) for b in la.block)),
                     "shared": int(la.shared_bytes), "checks_status": la.checks_status})
    return {"bindings": [describe_binding(b) for b in bindings[1:]], "launches": rows,
            "copies": [{"dst": address(c.dst, table), "src": address(c.src, table), "nbytes": int(c.nbytes)}
                       for c in copies],
            "fetches": [{"output": f.output, "src": address(f.src, table), "nbytes": f.nbytes}
                        for f in fetches if f.nbytes],
            "sync": sync, "reads": code_format("{}", reads),
            "comm": code(f"buffers[{table.index(('comm',))}]") if ("comm",) in table else None,
            "calls_after": [comm_text(c, table) for c in calls if c.at >= len(launches)]}


def step_mode() -> str:
    """How a GPU job built now runs its steps, in one line (`flowc show --kernels --device gpu`)."""
    if settings.cuda_per_launch():
        return ("GPU step mode: per launch (FLOWC_CUDA_PER_LAUNCH=1): PyCUDA launches each kernel from Python, "
                "then waits for the stream")
    return ("GPU step mode: one foreign call per step: flowc_step, the host step of the step library (nvcc "
            "-shared), launches every kernel on the job's stream and waits only where the host reads "
            "(per launch from Python, with a warning, where that library cannot be built)")
