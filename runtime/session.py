"""The one session object: variables shared by name across every job, and the jobs.

A train job and a predict job that call `flow.get_variable("w", ...)` read the same
storage.  Values are NumPy arrays owned by the session; compiled steps read and
update them in place, so their addresses stay fixed for the life of the session.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import TensorType, numpy_dtype
from flowc.runtime import pipeline as pipeline_module    # imported with flowc: it registers the exit drain then


@dataclass
class VariableSlot:
    name: str
    type: TensorType
    initializer: Any
    trainable: bool            # some job trains it (which ones: each job's trace decides)
    defined_at: str
    value: np.ndarray | None = None


@dataclass
class Session:
    """Holds variables and jobs.  Use `default_session()`; `clear_default_session()` starts afresh."""
    seed: int = 0
    variables: dict[str, VariableSlot] = field(default_factory=dict)
    jobs: list[Any] = field(default_factory=list)
    train_steps: dict[str, int] = field(default_factory=dict)    # job name -> steps done
    # Predict jobs with random ops (flow.random.*): job name -> calls done, their random step counter.
    random_calls: dict[str, int] = field(default_factory=dict)
    # Checkpoint values loaded before a job declared their variable (runtime/checkpoint.py):
    # name -> PendingValue; declare_variable checks it and uses it as the initial value.
    pending_values: dict[str, Any] = field(default_factory=dict)
    # Loaded steps off the host (GPU): their device memory is freed when the session closes.
    loaded_steps: list[Any] = field(default_factory=list)
    # A session over several MPI ranks (runtime/distributed.py, made by `distributed.join` at the first
    # job call or trace): the ranks a job's batch is split over, the bucket size of its gradient
    # all-reduces, and the cluster; one rank and no cluster in a process launched alone.
    ranks: int = 1
    bucket_bytes: int = 16 << 20
    cluster: Any = None
    joined: bool = False

    @property
    def rank(self) -> int:
        """This process's rank in the cluster (0: the master, or a process launched alone)."""
        return self.cluster.world.rank if self.cluster is not None else 0

    def add_job_function(self, job: Any) -> None:
        """Remember a job function of this session (decorated while it was the default one, or called in
        it): `trace_jobs` traces it."""
        with self._lock:
            if not any(known is job for known in self._job_functions):
                self._job_functions.append(job)

    def job_named(self, name: str, ordinal: int = 0) -> Any:
        """The session's job function called `name` (the `ordinal`-th of that name, in the order they
        were defined: a factory may make several), or None."""
        with self._lock:
            named = [job for job in self._job_functions if job.name == name]
        return named[ordinal] if ordinal < len(named) else None

    def job_ordinal(self, job: Any) -> int:
        """Which of the session's job functions called `job.name` `job` is (0: the first defined):
        with the name, what identifies it to the other ranks, which define the same jobs in the same order."""
        with self._lock:
            named = [known for known in self._job_functions if known.name == job.name]
        return next((i for i, known in enumerate(named) if known is job), 0)

    def trace_jobs(self, why: str) -> None:
        """Trace every job function of the session not traced in it yet, declaring their variables.

        OneFlow initializes its session (builds every global function) at the first job call,
        `get_all_variables()` or checkpoint operation; flowc does the same at those points, so that
        a save before any call saves every job's variables and a load before any call reaches them.
        An error tracing a job propagates, with a note naming `why` the job was traced.

        Example:
            session.trace_jobs("flow.checkpoint.save()")
        """
        from flowc.compiler.trace import tracing_in_this_thread
        if tracing_in_this_thread():     # get_all_variables() inside a job body: that trace is not done
            return
        with self._lock:
            jobs = list(self._job_functions)
        for job in jobs:
            try:
                job.trace_in(self)
            except Exception as err:
                add_note = getattr(err, "add_note", None)       # Python 3.11+
                if add_note is not None:
                    add_note(f"(flowc traced job {job.name!r} for {why}: as OneFlow, flowc builds every job "
                             "function of the session at its first job call, get_all_variables() or "
                             "checkpoint operation)")
                raise

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
        # As in OneFlow, `trainable` belongs to the job that declares it: a variable one job trains and
        # another only reads is one variable (each job's trace records which variables it trains).
        slot.trainable = slot.trainable or trainable
        return slot

    def declare_state_variable(self, name: str, type_: TensorType, loc: str, initial: float = 0.0) -> VariableSlot:
        """Register an optimizer's state variable (momentum, Adam's moments: zeros; LAMB's beta1_t,
        a dynamic loss scale: `initial`), not trainable."""
        from flowc.runtime.initializers import constant_initializer, zeros_initializer
        init = constant_initializer(initial) if initial else zeros_initializer()
        return self.declare_variable(name, type_, init, False, loc)

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
        if force and self.cluster is not None:     # a distributed session: the workers get them before the next step
            self.cluster.variables_sent = False

    def _initialize(self, slot: VariableSlot) -> None:
        from flowc.runtime.initializers import seed_for
        data = slot.initializer.sample(slot.type.shape, numpy_dtype(slot.type.dtype),
                                       default_seed=seed_for(slot.name, self.seed))
        if slot.value is None:
            slot.value = np.ascontiguousarray(data, dtype=numpy_dtype(slot.type.dtype))
        else:  # keep the address: compiled steps hold pointers into it
            np.copyto(slot.value, data)

    _pipeline: Any = None

    def __post_init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())  # guards the pipeline's creation, _calling, _closed
        self._calling = 0          # calls between taking this session and handing their step over
        self._closed = False
        # Set once the session may run steps: a session that replaces a cleared one on several ranks
        # waits until every worker has cleared its own (clear_default_session).
        self._usable = threading.Event()
        self._usable.set()
        # Every job function of the session, in order, kept as OneFlow's session keeps its jobs (until
        # clear_default_session), so that the session's initialization can trace them.
        self._job_functions: list[Any] = []

    @property
    def pipeline(self):
        """The actors that run this session's steps and callbacks (started at the first call)."""
        pipeline = self._pipeline
        if pipeline is not None:
            return pipeline
        with self._lock:
            if self._pipeline is None:
                self._pipeline = pipeline_module.Pipeline()
            return self._pipeline

    # -- calls, and the clear that waits for them ------------------------------------------
    def begin_call(self) -> bool:
        """Enter a job call; False once the session is closed (the caller takes the new default
        session instead).  Every begin_call that returned True is followed by one end_call."""
        with self._lock:
            if self._closed:
                return False
            self._calling += 1
            return True

    def end_call(self) -> None:
        """The call has handed its step to the pipeline (or finished it): `close` may go on."""
        with self._lock:
            self._calling -= 1
            if self._closed:
                self._lock.notify_all()

    def wait_until_usable(self) -> None:
        """Before a step (or a consistent cut of the variables): wait while clear_default_session
        makes this session the workers' too."""
        while not self._usable.wait(timeout=0.1):    # a timeout keeps Ctrl-C working
            pass

    @property
    def usable(self) -> bool:
        return self._usable.is_set()

    @contextlib.contextmanager
    def holding_steps(self) -> Iterator[None]:
        """No step of this session runs inside, so variables and step counters form one consistent
        cut (checkpoint saves).  GPU variables are copied to the host inside, before the caller
        reads them, and so are the other ranks' slices of variables split over them."""
        self.wait_until_usable()
        with self.pipeline.holding_steps():
            from flowc.runtime.devices import sync_to_host
            sync_to_host(self)
            if self.cluster is not None:
                self.cluster.gather_shards(self)
            yield

    def sync(self, what: str = "flow.sync_default_session()") -> None:
        """Wait for every call made so far; then the host arrays hold the variables' current values
        (GPU jobs keep theirs on the device: they are copied back here).  Refused inside a callback,
        where it would wait for the callback's own call."""
        pipeline_module.refuse_inside_callback(what)
        if self._pipeline is not None:
            self._pipeline.sync(what)
        with self.holding_steps():
            pass

    def close(self) -> None:
        """Let no new call in, wait for the calls already made (their steps and callbacks run),
        stop the pipeline's threads, forget the jobs."""
        with self._lock:
            self._closed = True
            while self._calling:
                self._lock.wait(timeout=0.1)
        errors = self._pipeline.close() if self._pipeline is not None else []
        for job in list(self.jobs):
            job.release(self)
        self.jobs.clear()
        from flowc.runtime.devices import release_device_memory
        release_device_memory(self)        # no step runs any more: free on this thread, explicitly
        with self._lock:
            self._job_functions.clear()
        for err in errors:
            warnings.warn(f"flowc: an asynchronous call failed before the session was cleared: {err!r}",
                          RuntimeWarning, stacklevel=3)

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's pipeline threads do not exist here; its locks may have been
        held by them.  The calls the parent had in flight fail; the next call starts new actors."""
        self._lock = threading.Condition(threading.Lock())
        self._calling = 0
        if self._pipeline is not None:
            self._pipeline.forget_after_fork()
            self._pipeline = None


_default: Session | None = None
_default_lock = threading.Lock()


def default_session() -> Session:
    global _default
    session = _default
    if session is None:
        with _default_lock:
            if _default is None:
                _default = Session()
            session = _default
    return session


def warn_if_started(call: str) -> None:
    """Warn that `call` (a `flow.config` or `flow.env` setting the first job call reads: devices,
    machines, buckets) changes nothing in the running session, as OneFlow's "Nothing happened because
    the session is running" does, instead of ignoring it silently."""
    session = _default
    if session is not None and session.joined:
        warnings.warn(f"{call} has no effect: the session is running (its first job call read the "
                      f"settings); make it before the first job call, or after flow.clear_default_session() "
                      f"in a process launched alone", RuntimeWarning, stacklevel=3)


def clear_default_session() -> None:
    """Forget every job and variable; the next job call traces and initializes afresh.

    Calls other threads make from now on go to the new session; the calls already made finish
    first (steps and callbacks), then the old session's threads stop.  Refused inside a callback,
    where it would wait for the callback's own call."""
    global _default
    pipeline_module.refuse_inside_callback("flow.clear_default_session()")
    with _default_lock:
        old, _default = _default, None
        if old is not None and old.cluster is not None:
            # A distributed run keeps its ranks: the new session is on the same cluster, and the
            # workers clear theirs at the same point of the master's script (runtime/distributed.py).
            # Other threads may take it at once, but its steps wait (`wait_until_usable`) until the
            # old session's calls are done and the workers have cleared theirs: before, a step would
            # reach them first and run on their old variables.
            _default = Session(ranks=old.ranks, bucket_bytes=old.bucket_bytes, cluster=old.cluster, joined=True)
            _default._usable.clear()
        new = _default
    if old is not None:
        try:
            old.close()
            if old.cluster is not None:
                old.cluster.session_cleared()
        finally:
            if new is not None:
                new._usable.set()


def sessions_after_fork() -> list[Session]:
    """The sessions a forked child must reset (runtime/fork.py): the default one."""
    global _default_lock
    _default_lock = threading.Lock()
    return [_default] if _default is not None else []
