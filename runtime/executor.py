"""Running a compiled step: buffers bound once, then one foreign call per step.

`LoadedStep` owns everything a step touches besides the session's variables: the
arena from the memory plan, one input buffer per placeholder (feeding copies the
caller's arrays into them, so the caller may reuse its arrays at once), and one
buffer per runtime scalar.  Their addresses never change, so the pointer table
the generated `flowc_step` reads is built once.  cffi releases the GIL for the call.
"""
from __future__ import annotations

from typing import Sequence

import cffi
import numpy as np

from compiler.errors import StepError
from compiler.ir import numpy_dtype
from compiler.pipeline import CompiledStep

_ffi = cffi.FFI()
_ffi.cdef("int flowc_step(void* const* ptrs);")
ALIGN = 64


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 buffer of `nbytes` starting on a 64-byte boundary (AVX loads, cache lines)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


class LoadedStep:
    def __init__(self, compiled: CompiledStep, session) -> None:
        self.compiled = compiled
        graph = compiled.program.graph
        plan = compiled.program.memory
        self.graph = graph
        self.lib = _ffi.dlopen(str(compiled.library))
        self.arena = aligned_empty(max(plan.arena_bytes, ALIGN))
        self.inputs: list[np.ndarray] = []
        for p in graph.placeholders:
            t = graph.node(p).type
            self.inputs.append(np.frombuffer(aligned_empty(max(t.nbytes, 1)), dtype=numpy_dtype(t.dtype),
                                             count=t.size).reshape(t.shape))
        self.scalars = {name: np.zeros((), dtype=numpy_dtype(dtype)) for name, dtype in graph.scalars.items()}
        self.session = session
        self.table = _ffi.new("void*[]", len(compiled.generated.bindings))
        self._keep: list[np.ndarray] = []
        for slot, binding in enumerate(compiled.generated.bindings):
            self.table[slot] = _ffi.cast("void*", self._buffer(binding).ctypes.data)
        self.outputs = [self._view(o) for o in graph.outputs]

    def _buffer(self, binding: tuple) -> np.ndarray:
        kind = binding[0]
        if kind == "arena":
            return self.arena
        if kind == "input":       # placeholders are kept in index order by every pass
            return self.inputs[binding[1]]
        if kind == "variable":
            value = self.session.value(binding[1])
            self._keep.append(value)
            return value
        return self.scalars[binding[1]]

    def _view(self, node_id: int) -> np.ndarray:
        """A NumPy view of where the step leaves `node_id`'s value."""
        t = self.graph.node(node_id).type
        buf = self.compiled.program.memory.storage[node_id]
        dtype = numpy_dtype(t.dtype)
        if buf.kind == "arena":
            return np.frombuffer(self.arena, dtype=dtype, count=t.size, offset=buf.key).reshape(t.shape)
        return self._buffer((buf.kind, buf.key)).reshape(t.shape)

    def run(self, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """Feed, compute, fetch: copy inputs in, call the step, copy outputs out."""
        for buf, a in zip(self.inputs, arrays):
            np.copyto(buf, a, casting="same_kind")
        if scalars:
            for name, value in scalars.items():
                if name in self.scalars:
                    self.scalars[name][...] = value
        code = self.lib.flowc_step(self.table)
        if code:
            self._raise(code)
        return [v.copy() for v in self.outputs]

    def _raise(self, code: int) -> None:
        node = self.graph.node(self.compiled.generated.error_nodes.get(code, -1)) \
            if code in self.compiled.generated.error_nodes else None
        if node is not None and node.op.startswith("sparse_softmax_cross_entropy"):
            classes = self.graph.node(node.inputs[0]).type.shape[-1]
            raise StepError(f"{node.loc}: sparse_softmax_cross_entropy_with_logits: a label is out of range "
                            f"[0, {classes}) in job {self.graph.name!r}")
        raise StepError(f"job {self.graph.name!r}: step failed with code {code}")
