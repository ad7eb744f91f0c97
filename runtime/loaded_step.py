"""The one interface the runtime calls on a compiled step, whatever backend built it.

Each backend's record (compiler/backends.py) names its `LoadedStep` subclass: `CpuLoadedStep`
(runtime/executor.py, a cffi-loaded library) and `CudaLoadedStep` (runtime/cuda_executor.py, a
cubin run through PyCUDA).  The pipeline, the job functions and the tools use only this:

    step = load_step(compiled, session, depth)     # runtime/devices.py picks the class
    step.feed(step.slots[0], arrays, scalars)      # caller thread: inputs into a register slot
    outputs = step.compute(step.slots[0])          # compute actor: one step, outputs copied out
    outputs = step.run(arrays, scalars)            # both, synchronously (tests and tools)
"""
from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np

from flowc.compiler.errors import StepError


class LoadedStep(abc.ABC):
    """A compiled step bound to its buffers, with `depth` register slots so calls can be fed ahead.

    Subclasses set `compiled`, `graph`, `session` and `slots` and implement the four methods below;
    a slot is whatever object the subclass keeps one call's inputs in.
    """
    compiled: Any
    graph: Any
    session: Any
    slots: list[Any]

    @abc.abstractmethod
    def feed(self, slot: Any, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> None:
        """Copy the caller's arrays (converting dtype) and this step's scalars into `slot`."""

    @abc.abstractmethod
    def compute(self, slot: Any) -> list[np.ndarray]:
        """Run the step on `slot` and return copies of its outputs."""

    @abc.abstractmethod
    def compute_borrowed(self, slot: Any, arrays: Sequence[np.ndarray],
                         scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """Feed and compute for a synchronous call on the caller's thread, which may read the
        caller's arrays in place (the caller cannot touch them before the call returns)."""

    @abc.abstractmethod
    def profile(self) -> list[tuple[str, float]]:
        """(kernel, seconds summed over the steps so far), for a step compiled with FLOWC_PROFILE=1."""

    def run(self, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """Feed, compute, fetch on the first slot, synchronously (tests and tools)."""
        self.feed(self.slots[0], arrays, scalars)
        return self.compute(self.slots[0])

    def raise_step_error(self, code: int) -> None:
        """Raise the StepError for status `code`, naming the user's line of the op that reported it."""
        node_id = self.compiled.generated.error_nodes.get(code)
        node = self.graph.node(node_id) if node_id is not None else None
        if node is not None and node.op.startswith("sparse_softmax_cross_entropy"):
            classes = self.graph.node(node.inputs[0]).type.shape[-1]
            raise StepError(f"{node.loc}: sparse_softmax_cross_entropy_with_logits: a label is out of range "
                            f"[0, {classes}) in job {self.graph.name!r}")
        raise StepError(f"job {self.graph.name!r}: step failed with code {code}")

    @staticmethod
    def profile_not_built(graph) -> RuntimeError:
        return RuntimeError(f"job {graph.name!r} was compiled without per-kernel timers; "
                            "set FLOWC_PROFILE=1 before its first call")
