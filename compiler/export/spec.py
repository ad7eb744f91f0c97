"""What an exported library exposes, read off a compiled CPU step: its inputs, outputs and variables.

`interface_of` also refuses a step the library cannot run (one that reads runtime scalars or talks
to other ranks), naming the job.

Example:
    >>> spec = interface_of(job, compiled_step, prefix="lenet")          # doctest: +SKIP
    >>> [(t.name, t.shape) for t in spec.inputs]                        # doctest: +SKIP
    [('images', (1, 1, 28, 28))]
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from flowc.compiler.export.weights import ALIGN, DTYPE_CODES

# An exported prefix starts every symbol of the library: a C identifier that no C or C++ rule
# reserves (no leading underscore, no double underscore), short enough for every linker.
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class ExportError(ValueError):
    """A job that cannot be exported, or an export that failed; the message names the job."""


@dataclass(frozen=True)
class Tensor:
    """One input, output or variable of the exported step."""
    name: str                  # user text: only ever an escaped string literal in generated C
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    slot: int | None = None    # its entry in the step's pointer table (None: the step does not read it)
    offset: int = 0            # a variable: where it lies in an instance's weights buffer
    # an output: where the step leaves it, ("arena", byte offset) | ("input", index) | ("variable", index)
    source: tuple = ()


@dataclass(frozen=True)
class ExportSpec:
    job: str
    prefix: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    variables: list[Tensor]
    table_size: int            # entries of the step's pointer table
    arena_bytes: int
    weights_bytes: int         # an instance's weights buffer
    step_errors: dict[int, str]    # a code flowc_step returns -> what it means, naming the user's line
    shares_scratch: bool       # the step's kernels keep process-wide scratch: calls are serialized


def check_prefix(prefix: str, origin: str) -> str:
    """`prefix` if it can start C symbols (see _PREFIX), else an ExportError saying what to pass."""
    if not _PREFIX.fullmatch(prefix) or "__" in prefix:
        raise ExportError(f"{origin} {prefix!r} cannot start C symbol names: give --prefix NAME (a letter, then "
                          f"at most 63 letters, digits or single underscores)")
    return prefix


# A function-level `static` that is neither const nor per thread: a kernel's scratch (a conv's packed
# weights), one per process, which two instances on two threads would write at once.
_SHARED_STATIC = re.compile(r"^\s*static\s+(?!const\b|constexpr\b|thread_local\b|__attribute__)", re.M)


def shares_scratch(source: str) -> bool:
    """Whether the generated step keeps mutable process-wide state (see _SHARED_STATIC)."""
    return bool(_SHARED_STATIC.search(source))


def interface_of(job, step, prefix: str) -> ExportSpec:
    """The ExportSpec of `job`'s compiled CPU `step` (a compiler.pipeline.CompiledStep); the refusals that need
    no compile are exporter.check_exportable's."""
    name = job.name
    graph, program = step.program.graph, step.program
    generated = step.generated
    if graph.scalars:
        raise ExportError(f"job {name!r} reads runtime scalars ({', '.join(graph.scalars)}), which only train "
                          f"jobs have; it cannot be exported")
    if any(b[0] == "comm" for b in generated.bindings):
        raise ExportError(f"job {name!r} is a data-parallel step (it all-reduces across ranks); export a "
                          f"one-process build of it")
    for dtype in {graph.node(n).type.dtype for n in [*graph.placeholders, *graph.outputs]} | \
            {t.dtype for t in graph.variables.values()}:
        if dtype not in DTYPE_CODES:
            raise ExportError(f"job {name!r}: dtype {dtype} has no code in the exported API")
    slots = {b: i for i, b in enumerate(generated.bindings)}
    inputs = []
    for index, (node_id, p) in enumerate(zip(graph.placeholders, job.placeholders)):
        t = graph.node(node_id).type
        inputs.append(Tensor(p.name, t.dtype, tuple(t.shape), t.nbytes, slots.get(("input", index))))
    variables, offset = [], 0
    for var_name, t in graph.variables.items():
        variables.append(Tensor(var_name, t.dtype, tuple(t.shape), t.nbytes, slots.get(("variable", var_name)),
                                offset))
        offset += -(-max(t.nbytes, 1) // ALIGN) * ALIGN
    var_index = {v.name: i for i, v in enumerate(variables)}
    memory = program.require_memory()
    outputs = []
    for index, node_id in enumerate(graph.outputs):
        t = graph.node(node_id).type
        buf = memory.storage[node_id]
        source: tuple
        if buf.kind == "arena":
            source = ("arena", buf.key)
        elif buf.kind == "input":
            source = ("input", buf.key)
        elif buf.kind == "variable":
            source = ("variable", var_index[buf.key])
        else:
            raise ExportError(f"job {name!r}: output {index} is kept in a {buf.kind!r} buffer, which the "
                              f"exported library cannot read")
        outputs.append(Tensor(f"output{index}", t.dtype, tuple(t.shape), t.nbytes, None, 0, source))
    errors = {}
    for code, node_id in generated.error_nodes.items():
        node = graph.node(node_id)
        errors[code] = f"{node.loc}: {node.op} found bad data in its input (error {code}) in job {name!r}"
    return ExportSpec(name, prefix, inputs, outputs, variables, len(generated.bindings), memory.arena_bytes,
                      offset, errors, shares_scratch(generated.source))
