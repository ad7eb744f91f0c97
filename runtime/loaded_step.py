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

from flowc.compiler.codegen.collectives import COMM_FAILED, COMM_TIMEOUT
from flowc.compiler.errors import DistributedError, StepError

# What the communication engine's codes mean (codegen_templates/cpu/flowc_comm.h).
COMM_ERRORS = {
    COMM_FAILED: "the communication engine (MPI or NCCL) reported an error in a collective",
    COMM_TIMEOUT: ("a gradient all-reduce did not complete within FLOWC_COMM_TIMEOUT seconds: another rank "
                   "stopped taking part (lost, or failed before its step)"),
}


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

    def release(self) -> None:
        """Free what the step holds outside Python's heap (device memory, streams) now, on this
        thread; the step is not used again.  Nothing to do for a step on the host."""
        return None

    def run(self, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """Feed, compute, fetch on the first slot, synchronously (tests and tools)."""
        self.feed(self.slots[0], arrays, scalars)
        return self.compute(self.slots[0])

    def failed_value(self, node_id: int, slot: Any) -> np.ndarray:
        """A copy of `node_id`'s value as the step that just failed on `slot` left it."""
        raise NotImplementedError

    def raise_step_error(self, code: int, slot: Any = None) -> None:
        """Raise the StepError for status `code`, naming the user's line of the op that reported it.
        A check_numerics code also says what the value holds, read from `slot`'s step when given."""
        if code in COMM_ERRORS:
            raise DistributedError(f"job {self.graph.name!r}: {COMM_ERRORS[code]}")
        generated = self.compiled.generated
        node_id = generated.error_nodes.get(code)
        node = self.graph.node(node_id) if node_id is not None else None
        if node is not None and code in generated.numerics_nodes:
            value = self.failed_value(node.id, slot) if slot is not None else None
            raise StepError(non_finite_message(self.compiled.program, node, value))
        if node is not None and node.op.startswith("sparse_softmax_cross_entropy"):
            classes = self.graph.node(node.inputs[0]).type.shape[-1]
            raise StepError(f"{node.loc}: sparse_softmax_cross_entropy_with_logits: a label is out of range "
                            f"[0, {classes}) in job {self.graph.name!r}")
        if node is not None and node.op == "gather":
            size = self.graph.node(node.inputs[0]).type.shape[node.attr("axis")]
            raise StepError(f"{node.loc}: flow.gather: an index is out of range [0, {size}) in job {self.graph.name!r}")
        raise StepError(f"job {self.graph.name!r}: step failed with code {code}")

    @staticmethod
    def profile_not_built(graph) -> RuntimeError:
        return RuntimeError(f"job {graph.name!r} was compiled without per-kernel timers; "
                            "set FLOWC_PROFILE=1 before its first call")


_PASSES = {"backward": " in the backward pass", "update": " in the optimizer update"}


def non_finite_message(program, node, value: np.ndarray | None) -> str:
    """`file:line: op produced NaN ... (check_numerics)` for a node whose value check_numerics refused;
    `value` (the value the step stopped on, when it could be read) says how many and where.  Ops fused
    into one kernel keep only the kernel's results, so the message also names the ops (and lines)
    the kernel computed that value from: the NaN may have arisen in any of them."""
    graph = program.graph
    what = "NaN or infinity"
    if value is not None:
        kinds = [(name, mask) for name, mask in (("NaN", np.isnan(value)), ("+Inf", np.isposinf(value)),
                                                 ("-Inf", np.isneginf(value))) if mask.any()]
        if kinds:
            bad = np.logical_or.reduce([mask for _, mask in kinds])
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), value.shape))
            what = (f"{' and '.join(name for name, _ in kinds)} ({int(bad.sum())} of {value.size} values, "
                    f"the first at index {first})")
    fused = ""
    kernel = next((k for k in program.require_kernels() if node.id in k.nodes()), None)
    if kernel is not None:
        sources = _fused_sources(graph, kernel, node.id)
        if sources:
            fused = "; computed in one kernel from " + ", ".join(f"{n.op} @{n.loc}" for n in sources)
    return (f"{node.loc}: {node.op}{_PASSES.get(node.role, '')} produced {what} in job {graph.name!r} "
            f"(check_numerics: the step stopped after this op){fused}")


def _fused_sources(graph, kernel, node_id: int) -> list:
    """The nodes of `kernel` that `node_id`'s value is computed from inside it (itself excluded;
    constants too), in the kernel's order."""
    inside = set(kernel.nodes())
    needed, stack = set(), [node_id]
    while stack:
        for x in graph.node(stack.pop()).inputs:
            if x in inside and x not in needed:
                needed.add(x)
                stack.append(x)
    return [graph.node(n) for n in kernel.nodes() if n in needed and graph.node(n).op != "constant"]
