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
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler import settings
from flowc.compiler.codegen.common import describe_binding
from flowc.compiler.codegen.sanitise import CodeText, c_identifier, code, code_format

# The table's fixed head: what every step has, whatever its bindings.
FIXED = {"arena": 0, "scratch": 1, "status": 2}


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
    if kind in FIXED:
        offset = int(binding[1]) if len(binding) > 1 else 0
        base = f"buffers[{FIXED[kind]}]"
        return code(f"{base} + {offset}" if offset else base)
    return code(f"buffers[{table.index(binding)}]")


def host_step(launches: list, copies: list, fetches: list[Fetch], bindings: list[tuple], sync: bool,
              reads: str = "") -> dict:
    """The template context of the host step (see the module docstring); `sync`: wait for the
    stream before returning (the host reads something of the step: `reads` says what)."""
    table = host_buffers(bindings)
    rows = []
    for la in launches:
        rows.append({"kernel": c_identifier(la.kernel), "comment": code_format("{}", la.kernel),
                     "args": code(", ".join(address(b, table) for b in la.args)), "count": len(la.args),
                     "grid": code(", ".join(str(int(g)) for g in la.grid)),
                     "block": code(", ".join(str(int(b)) for b in la.block)),
                     "shared": int(la.shared_bytes), "checks_status": la.checks_status})
    return {"bindings": [describe_binding(b) for b in bindings[1:]], "launches": rows,
            "copies": [{"dst": address(c.dst, table), "src": address(c.src, table), "nbytes": int(c.nbytes)}
                       for c in copies],
            "fetches": [{"output": f.output, "src": address(f.src, table), "nbytes": f.nbytes}
                        for f in fetches if f.nbytes],
            "sync": sync, "reads": code_format("{}", reads)}


def step_mode() -> str:
    """How a GPU job built now runs its steps, in one line (`flowc show --kernels --device gpu`)."""
    if settings.cuda_per_launch():
        return ("GPU step mode: per launch (FLOWC_CUDA_PER_LAUNCH=1): PyCUDA launches each kernel from Python, "
                "then waits for the stream")
    return ("GPU step mode: one foreign call per step: flowc_step, the host step of the step library (nvcc "
            "-shared), launches every kernel on the job's stream and waits only where the host reads "
            "(per launch from Python, with a warning, where that library cannot be built)")
