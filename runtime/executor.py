"""Running a compiled step: buffers bound once, then one foreign call per step.

`CpuLoadedStep` owns everything a step touches besides the session's variables: the
arena from the memory plan and `depth` register slots, each with one input buffer
per placeholder (feeding copies the caller's arrays into them, so the caller may
reuse its arrays at once), one buffer per runtime scalar, and the pointer table the
generated `flowc_step` reads, built once.  Steps of one job run one at a time (the
compute actor), so the arena is shared by the slots.  cffi releases the GIL for the
call, which lets the caller prepare the next step meanwhile.
"""
from __future__ import annotations

from typing import Any, Sequence

import cffi
import numpy as np

from flowc.compiler.backends import HOST_DEVICE
from flowc.compiler.core_library import load_core
from flowc.compiler.ir import numpy_dtype
from flowc.compiler.pipeline import CompiledStep
from flowc.runtime.devices import DEVICE_VARIABLES_ATTR, acquire_variables
from flowc.runtime.loaded_step import LoadedStep

_ffi = cffi.FFI()
_ffi.cdef("int flowc_step(void* const* ptrs); const double* flowc_profile(void);")
ALIGN = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer of `nbytes` starting on a 64-byte boundary (AVX loads, cache lines)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


class Slot:
    """One register slot: the inputs and scalars of one step in flight, and its pointer table."""

    def __init__(self, step: CpuLoadedStep) -> None:
        graph = step.graph
        self.inputs: list[np.ndarray] = []
        for p in graph.placeholders:
            t = graph.node(p).type
            self.inputs.append(np.frombuffer(aligned_empty(max(t.nbytes, 1)), dtype=numpy_dtype(t.dtype),
                                             count=t.size).reshape(t.shape))
        self.scalars = {name: np.zeros((), dtype=numpy_dtype(dtype)) for name, dtype in graph.scalars.items()}
        self.table = _ffi.new("void*[]", len(step.compiled.generated.bindings))
        for i, binding in enumerate(step.compiled.generated.bindings):
            self.table[i] = _ffi.cast("void*", step.buffer(binding, self).ctypes.data)
        self.outputs = [step.view(o, self) for o in graph.outputs]


class CpuLoadedStep(LoadedStep):
    """The CPU backend's step: a cffi-loaded library bound to its buffers, with `depth` slots."""

    def __init__(self, compiled: CompiledStep, session, depth: int = 1) -> None:
        self.compiled = compiled
        self.graph = compiled.program.graph
        self.session = session
        load_core()                     # the GEMM kernel every step library links against
        self.lib = _ffi.dlopen(str(compiled.library))
        self.arena = aligned_empty(max(compiled.program.require_memory().arena_bytes, ALIGN))
        self._keep: list[np.ndarray] = []          # variables the tables point into
        self._engine: Any = None                    # a data-parallel step's collectives (runtime/collectives.py)
        self.slots = [Slot(self) for _ in range(depth)]
        bindings = compiled.generated.bindings
        # placeholder index -> its entry in the pointer table, for steps run on borrowed arrays;
        # placeholders whose buffer an output views must be fed by copy (the output reads the slot)
        self._input_entries = {b[1]: i for i, b in enumerate(bindings) if b[0] == "input"}
        storage = compiled.program.require_memory().storage
        self._inputs_read_back = {storage[o].key for o in self.graph.outputs if storage[o].kind == "input"}
        self._reads, self._writes = list(self.graph.variables), list(self.graph.assigns)

    def buffer(self, binding: tuple, slot: Slot) -> np.ndarray:
        kind = binding[0]
        if kind == "arena":
            return self.arena
        if kind == "input":       # placeholders are kept in index order by every pass
            return slot.inputs[binding[1]]
        if kind == "variable":
            value = self.session.value(binding[1])
            local = self.graph.variables.get(binding[1])
            if local is not None and local.shape != value.shape:
                # a variable split over the ranks (model parallelism): this rank's rows of the whole
                from flowc.runtime.distributed import shard_rows
                value = shard_rows(value, self.session.cluster).reshape(local.shape)
            self._keep.append(value)
            return value
        if kind == "comm":        # a data-parallel step: the MPI engine's table (runtime/collectives.py)
            engine = self._engine
            if engine is None:
                engine = self._engine = self.session.cluster.engine(self.compiled.generated.comm_buckets)
            return engine.table
        return slot.scalars[binding[1]]

    def view(self, node_id: int, slot: Slot) -> np.ndarray:
        """A NumPy view of where the step leaves `node_id`'s value."""
        t = self.graph.node(node_id).type
        buf = self.compiled.program.memory.storage[node_id]
        dtype = numpy_dtype(t.dtype)
        if buf.kind == "arena":
            return np.frombuffer(self.arena, dtype=dtype, count=t.size, offset=buf.key).reshape(t.shape)
        return self.buffer((buf.kind, buf.key), slot).reshape(t.shape)

    def failed_value(self, node_id: int, slot: Slot) -> np.ndarray:
        """A copy of `node_id`'s value as the step that just failed on `slot` left it."""
        return self.view(node_id, slot).copy()

    def feed(self, slot: Slot, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> None:
        """Copy the caller's arrays (converting dtype) and this step's scalars into `slot`."""
        for buf, a in zip(slot.inputs, arrays):
            np.copyto(buf, a, casting="same_kind")
        if scalars:
            for name, value in scalars.items():
                if name in slot.scalars:
                    slot.scalars[name][...] = value

    def compute_borrowed(self, slot: Slot, arrays: Sequence[np.ndarray],
                         scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """Feed and compute with the step reading the caller's arrays in place where their dtype and
        layout already fit: a synchronous call returns before its caller can touch them again, so
        the copy `feed` makes for calls in flight is not needed (313 KB per MLP batch)."""
        borrowed = []
        for i, (buf, a) in enumerate(zip(slot.inputs, arrays)):
            entry = self._input_entries.get(i)
            if entry is not None and a.dtype == buf.dtype and a.flags.c_contiguous and \
                    i not in self._inputs_read_back:
                borrowed.append((entry, slot.table[entry]))
                # from_buffer: the array's own memory, without building the ctypes view a.ctypes
                # would (1 us of a 15 us call); a read-only array is only read by the step.
                slot.table[entry] = _ffi.from_buffer(a)
            else:
                np.copyto(buf, a, casting="same_kind")
        self.feed(slot, [], scalars)
        try:
            return self.compute(slot)
        finally:
            for entry, pointer in borrowed:
                slot.table[entry] = pointer

    def compute(self, slot: Slot) -> list[np.ndarray]:
        """Run the step on `slot` (one foreign call, GIL released) and copy its outputs out."""
        if hasattr(self.session, DEVICE_VARIABLES_ATTR):    # a GPU job of the session may own some
            acquire_variables(self.session, HOST_DEVICE, self._reads, self._writes)
        code = self.lib.flowc_step(slot.table)
        if code:
            self.raise_step_error(code, slot)
        return [v.copy() for v in slot.outputs]

    def profile(self) -> list[tuple[str, float]]:
        """(kernel, seconds summed over the steps so far), for a step built with FLOWC_PROFILE=1."""
        names = self.compiled.generated.profiled_kernels
        if not names:
            raise self.profile_not_built(self.graph)
        seconds = self.lib.flowc_profile()
        return [(name, seconds[i]) for i, name in enumerate(names)]
