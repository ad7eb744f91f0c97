"""The one session object: variables shared by name across every job, and the jobs.

A train job and a predict job that call `flow.get_variable("w", ...)` read the same
storage.  Values are NumPy arrays owned by the session; compiled steps read and
update them in place, so their addresses stay fixed for the life of the session.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import TensorType, numpy_dtype


@dataclass
class VariableSlot:
    name: str
    type: TensorType
    initializer: Any
    trainable: bool
    defined_at: str
    value: np.ndarray | None = None


@dataclass
class Session:
    """Holds variables and jobs.  Use `default_session()`; `clear_default_session()` starts afresh."""
    seed: int = 0
    variables: dict[str, VariableSlot] = field(default_factory=dict)
    jobs: list[Any] = field(default_factory=list)
    train_steps: dict[str, int] = field(default_factory=dict)    # job name -> steps done
    # Checkpoint values loaded before a job declared their variable (runtime/checkpoint.py):
    # name -> PendingValue; declare_variable checks it and uses it as the initial value.
    pending_values: dict[str, Any] = field(default_factory=dict)

    def declare_variable(self, name: str, type_: TensorType, initializer: Any, trainable: bool,
                         loc: str) -> VariableSlot:
        """Register a variable, or return the existing one after checking it agrees."""
        slot = self.variables.get(name)
        if slot is None:
            slot = VariableSlot(name, type_, initializer, trainable, loc)
            if name in self.pending_values:    # loaded from a checkpoint before this declaration
                from flowc.runtime.checkpoint import take_pending
                slot.value = take_pending(self, name, type_, loc)
            self.variables[name] = slot
            return slot
        if (slot.type.shape, slot.type.dtype) != (type_.shape, type_.dtype):
            raise TraceError(f"{loc}: variable {name!r} is {type_} here but was defined as {slot.type} "
                             f"at {slot.defined_at}")
        if slot.trainable != trainable:
            raise TraceError(f"{loc}: variable {name!r} is trainable={trainable} here but was defined with "
                             f"trainable={slot.trainable} at {slot.defined_at}")
        return slot

    def declare_state_variable(self, name: str, type_: TensorType, loc: str) -> VariableSlot:
        """Register an optimizer's state variable (momentum, Adam's moments): zeros, not trainable."""
        from flowc.runtime.initializers import zeros_initializer
        return self.declare_variable(name, type_, zeros_initializer(), False, loc)

    def value(self, name: str) -> np.ndarray:
        """The variable's storage, initialized on first use."""
        slot = self.variables[name]
        if slot.value is None:
            self._initialize(slot)
        assert slot.value is not None      # _initialize set it
        return slot.value

    def initialize_all(self, force: bool = False) -> None:
        for slot in self.variables.values():
            if force or slot.value is None:
                self._initialize(slot)

    def _initialize(self, slot: VariableSlot) -> None:
        from flowc.runtime.initializers import seed_for
        data = slot.initializer.sample(slot.type.shape, numpy_dtype(slot.type.dtype),
                                       default_seed=seed_for(slot.name, self.seed))
        if slot.value is None:
            slot.value = np.ascontiguousarray(data, dtype=numpy_dtype(slot.type.dtype))
        else:  # keep the address: compiled steps hold pointers into it
            np.copyto(slot.value, data)

    _pipeline: Any = None

    @property
    def pipeline(self):
        """The actors that run this session's steps and callbacks (started at the first call)."""
        if self._pipeline is None:
            from flowc.runtime.pipeline import Pipeline
            self._pipeline = Pipeline()
        return self._pipeline

    def sync(self) -> None:
        """Wait for every call in flight; then the host arrays hold the variables' current values
        (GPU jobs keep theirs on the device: they are copied back here)."""
        if self._pipeline is not None:
            self._pipeline.sync()
        from flowc.runtime.devices import sync_to_host
        sync_to_host(self)

    def close(self) -> None:
        """Drain the pipeline, stop its threads, forget the jobs."""
        errors = self._pipeline.close() if self._pipeline is not None else []
        self._pipeline = None
        for job in self.jobs:
            job.release()
        self.jobs.clear()
        for err in errors:
            warnings.warn(f"flowc: an asynchronous call failed before the session was cleared: {err!r}",
                          RuntimeWarning, stacklevel=3)


_default: Session | None = None


def default_session() -> Session:
    global _default
    if _default is None:
        _default = Session()
    return _default


def clear_default_session() -> None:
    """Forget every job and variable; the next job call traces and initializes afresh."""
    global _default
    if _default is not None:
        _default.close()
    _default = None
