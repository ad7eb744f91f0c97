"""Job functions: `@flow.global_function` turns a Python function into a compiled step.

The function is traced once, at its first call, for the signature its placeholders
declare; every call then validates its arguments, feeds them to the compiled step
and returns the results in the shape the return annotation promises.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from flowc.compiler.backends import HOST_DEVICE, DeviceName, device_names
from flowc.compiler.errors import JobCallError, StepError
from flowc.compiler.ir import numpy_dtype
from flowc.compiler.ops.random_shards import RANK_SCALAR
from flowc.compiler.trace import refuse_job_call_while_tracing
from flowc.runtime.function_config import FunctionConfig
from flowc.runtime.futures import Call, CallbackRegistrar, JobFuture, LocalBlob
from flowc.runtime.pipeline import running_callback_of
from flowc.runtime.register import Register
from flowc.runtime.session import default_session
from flowc.runtime.signature import PlaceholderSpec, pack_arguments, parameters_of, rebuild_result, result_spec_of

if TYPE_CHECKING:
    from flowc.compiler.build import TracedJob
    from flowc.compiler.pipeline import CompiledStep
    from flowc.runtime.loaded_step import LoadedStep
    from flowc.runtime.session import Session

_warned_gpu = False


@dataclass(frozen=True)
class ReadyStep:
    """One build of a job loaded in one session: everything a call runs, taken together when the
    call starts, so that another thread compiling the job anew or clearing the session meanwhile
    cannot mix its buffers, register or session into the call."""
    name: str
    counts_steps: bool           # a train job: each step advances the job's step counter
    session: Session
    traced: TracedJob
    loaded: LoadedStep
    register: Register

    def _next_scalars(self) -> dict[str, float]:
        """This step's runtime scalars (learning rates, the step number); advances the job's step
        counter.  The pipeline calls it with the session's step lock held, so the counter counts the
        steps in the order they run, whichever threads call."""
        steps = self.session.train_steps
        done = steps.get(self.name, 0)         # each train job counts its own steps, as in OneFlow
        if self.counts_steps:
            steps[self.name] = done + 1
        elif "train_step" in self.traced.graph.scalars:
            # A predict job reads the step counter only for its random ops (flow.random.*): count its
            # calls, so that each call draws anew, as OneFlow's random kernels do.
            calls = self.session.random_calls
            done = calls.get(self.name, 0)
            calls[self.name] = done + 1
        return _runtime_scalars(self.traced, done)

    def _uncount_failed_step(self) -> None:
        """A step that raised StepError (a label out of range) stopped before any kernel wrote a
        variable, so it is no step: the counter, which drives the learning-rate schedule and Adam's
        bias correction, goes back.  Still under the step lock: no other step ran in between."""
        if self.counts_steps:
            self.session.train_steps[self.name] -= 1

    def compute(self, slot) -> list[np.ndarray]:
        """Run the step on a fed slot (the compute actor)."""
        scalars = self._next_scalars()
        try:
            if scalars:
                self.loaded.feed(slot, (), scalars)
            return self.loaded.compute(slot)
        except StepError:
            self._uncount_failed_step()
            raise

    def compute_borrowed(self, slot, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Feed and run the step on the caller's thread (Pipeline.run_now)."""
        scalars = self._next_scalars()
        try:
            return self.loaded.compute_borrowed(slot, arrays, scalars)
        except StepError:
            self._uncount_failed_step()
            raise


# Tracing keeps its context on a module-wide stack (compiler/trace.py) and loading a step
# initializes the session's variables it binds: one thread at a time does either.  Compiling
# (the slow part) runs outside it, under the job's own lock.
_build_lock = threading.RLock()
_jobs: weakref.WeakSet[JobFunction] = weakref.WeakSet()     # every job, for a forked child


def build_lock() -> threading.RLock:
    """The lock that serializes tracing and loading steps (runtime/fork.py holds it over a fork)."""
    return _build_lock


def job_function_named(name: str, ordinal: int = 0) -> JobFunction | None:
    """A job function (not a shape variant) called `name`, the `ordinal`-th of that name, of any
    session: a worker of a distributed run finds the master's jobs by name after the master cleared its session."""
    named = [job for job in list(_jobs) if job.name == name and job._variant_of is None]
    return named[ordinal] if ordinal < len(named) else None


def reset_jobs_after_fork() -> None:
    """In a forked child: new locks (a parent thread may have held one at the fork) and free
    registers (the parent's calls in flight never finish here)."""
    global _build_lock
    _build_lock = threading.RLock()
    for job in list(_jobs):
        job._lock = threading.RLock()
        ready = job._ready
        if ready is not None:
            ready.register.reset_after_fork(ready.loaded.slots)


class JobFunction:
    """A traced-on-first-call job; call it like the Python function it wraps."""

    def __init__(self, fn: Callable, job_type: str, config: FunctionConfig,
                 variant_of: JobFunction | None = None) -> None:
        if job_type not in ("train", "predict"):
            raise ValueError(f"global_function: type must be 'train' or 'predict', got {job_type!r}")
        self.fn = fn
        self.name = fn.__name__
        self.job_type = job_type
        self.config = config
        self.placeholders, self.parameters = parameters_of(fn)
        self._declared_shapes = tuple(p.shape for p in self.placeholders)
        # The common call, one positional ndarray per plain tp.Numpy parameter with exactly the
        # declared shape and dtype, needs none of _bind's work (see _exact_arrays); None when some
        # parameter is a Tuple or a list placeholder.
        self._exact: tuple[tuple[tuple[int, ...], np.dtype], ...] | None = None
        if all(layout == i for i, (_, layout) in enumerate(self.parameters)) and \
                all(p.kind == "numpy" for p in self.placeholders):
            self._exact = tuple((p.shape, numpy_dtype(p.dtype)) for p in self.placeholders)
        # A job with mirrored (dynamic) inputs runs each call on a build for the shapes it was given:
        # one JobFunction per shape, traced, compiled (through the cache) and loaded on first use.
        self._variants: dict[tuple, JobFunction] = {}
        self._variant_of = variant_of
        self.result_spec, self.asynchronous = result_spec_of(fn)
        self.old_api = self.result_spec.kind == "auto"
        # Threads may make their first calls at once: the lock makes one of them trace, compile and
        # load, and the others wait for that build instead of racing it.
        self._lock = threading.RLock()
        self._session: Session | None = None
        self._traced: TracedJob | None = None        # once traced (in self._session)
        self._trace_seconds = 0.0
        self._compiled: CompiledStep | None = None   # once built
        self._device: str = HOST_DEVICE  # where the traced job runs: a device name of compiler/backends.py
        self._ready: ReadyStep | None = None         # once traced, compiled and loaded in self._session
        functools.update_wrapper(self, fn)
        _jobs.add(self)
        if variant_of is None:       # a variant is built when a call needs it, never by trace_jobs
            default_session().add_job_function(self)     # traced when the session initializes (trace_jobs)

    @property
    def loaded(self) -> LoadedStep | None:
        """The loaded step, once the job was called (None after the session was cleared)."""
        ready = self._ready
        return ready.loaded if ready is not None else None

    @property
    def register(self) -> Register | None:
        """The register of its calls in flight, once the job was called."""
        ready = self._ready
        return ready.register if ready is not None else None

    # -- building -------------------------------------------------------------------------
    def _ensure_ready(self) -> ReadyStep:
        session = default_session()
        ready = self._ready
        if ready is not None and ready.session is session:
            return ready
        if self._variant_of is None:
            session.add_job_function(self)
        # OneFlow builds every job of the session at its first call: their variables exist from then on
        # (outside this job's lock: tracing another job takes that job's lock).
        session.trace_jobs(f"the first call of job {self.name!r}")
        with self._lock:
            ready = self._ready
            if ready is not None and ready.session is session:     # another thread built it meanwhile
                return ready
            if self._compiled is None or self._session is not session:
                self._build(session)
            assert self._compiled is not None and self._traced is not None    # adopted by compile()
            from flowc.runtime.devices import load_step
            with _build_lock:
                loaded = load_step(self._compiled, session, self.config.depth)
            cluster = session.cluster
            if cluster is not None and cluster.world.is_master and self._traced.distribution is not None:
                from flowc.runtime.distributed import DistributedStep
                loaded = DistributedStep(loaded, self._traced, cluster, self.name, session.job_ordinal(self))
            ready = ReadyStep(self.name, self.job_type == "train", session, self._traced, loaded,
                              Register(loaded.slots))
            self._ready = ready
            if self not in session.jobs:
                session.jobs.append(self)
            return ready

    def trace_in(self, session: Session) -> None:
        """Trace the job in `session` if it is not traced there yet (Session.trace_jobs)."""
        if self._traced is None or self._session is not session:
            self._trace(session)

    def _trace(self, session: Session) -> TracedJob:
        """The traced job in `session` (traced again when the session changed)."""
        with self._lock:
            if self._traced is None or self._session is not session:
                from flowc.compiler.build import build_job_graph
                from flowc.runtime.distributed import join
                join(session, self.fn.__module__)     # launched as several MPI ranks: the graph is one rank's share
                self.config.check_for_job(self.name)
                self.release()
                start = time.perf_counter()
                with _build_lock:
                    traced = build_job_graph(self.name, self.job_type, self.fn, self.placeholders,
                                             self.result_spec, session, self.config,
                                             lambda flat: pack_arguments(self.parameters, flat))
                self._trace_seconds = time.perf_counter() - start
                self._traced = traced
                self._session = session
                self._device = _choose_device(traced.graph)
            return self._traced

    def lower(self, device: DeviceName | None = None):
        """Trace the job (if not yet) and run every compiler pass: a `compiler.stages.Lowered`.

        `device` (a registered device: "cpu", "gpu") overrides where the job's placement and this
        machine would run it.

        Example:
            lowered = train_job.lower()
            print(lowered.as_text(after="fuse_epilogues"))
            print(lowered.passes_text())
        """
        return self._lower(default_session(), device)

    def _lower(self, session: Session, device: DeviceName | None):
        from flowc.compiler.pipeline import lower
        from flowc.compiler.stages import Lowered
        if device is not None and device not in device_names():
            raise ValueError(f"job {self.name!r}: device must be {' or '.join(map(repr, device_names()))}, "
                             f"got {device!r}")
        traced = self._trace(session)
        records: list = []
        start = time.perf_counter()
        program = lower(traced.graph, records)
        timings = {"trace": self._trace_seconds, "passes": time.perf_counter() - start}
        return Lowered(program, records, timings, device=device or self._device, on_compiled=self._adopt,
                       check_numerics=self.config.numerics_checked)

    def compile(self, device: DeviceName | None = None, arch: str | None = None):
        """Lower and build the job now, so its first call compiles nothing: a `compiler.stages.Compiled`.
        A job the cache holds (compiler/job_cache.py) is neither lowered nor generated again.
        `device` and `arch` build for another device than the job's, as `lower(device)` and
        `Lowered.compile(arch)` do (such a step is only stored in the cache).

        Example:
            compiled = train_job.compile()
            print(compiled.source())                    # the generated C++
            print(compiled.memory_plan().peak_bytes)
        """
        from flowc.compiler.stages import Compiled
        if device is not None and device not in device_names():
            raise ValueError(f"job {self.name!r}: device must be {' or '.join(map(repr, device_names()))}, "
                             f"got {device!r}")
        return Compiled(*self._build(default_session(), device, arch))

    def _build(self, session: Session, device: DeviceName | None = None, arch: str | None = None):
        """The built step and why the kernel cache missed, through the job cache; adopted by this job
        when it was built for the job's own device."""
        from flowc.compiler.job_cache import compile_traced
        traced = self._trace(session)
        step, miss_reason = compile_traced(traced.graph, device or self._device, arch, self.config.numerics_checked,
                                           {"trace": self._trace_seconds})
        self._adopt(step)
        return step, miss_reason

    def _adopt(self, step) -> None:
        """Take a step built by `Lowered.compile()`: the next call loads it instead of compiling.
        A step built for another device (e.g. a GPU build on a machine without one, ahead
        of time) is only an artifact in the cache: the job keeps compiling for where it runs."""
        with self._lock:
            if step.device != self._device:
                return
            ready = self._ready
            if ready is not None and ready.loaded.compiled is not step:
                self._ready = None      # calls already made keep their step; the next one loads this
            self._compiled = step

    def release(self, session: Session | None = None) -> None:
        """Forget the trace, the build and the loaded step; with `session`, only if they belong to it
        (a job another thread already called in a newer session keeps that)."""
        with self._lock:
            if session is not None and self._session is not session:
                return
            self._ready = None
            self._traced = None
            self._compiled = None
            self._session = None

    @property
    def graph(self):
        """The traced graph (forward, backward, update); traces the job if needed."""
        return self._trace(default_session()).graph

    def profile(self) -> str:
        """A table of time per kernel over the steps run so far (needs FLOWC_PROFILE=1 at compile time).

        Example:
            FLOWC_PROFILE=1 python train.py    # then: print(train_job.profile())
        """
        rows = self._ensure_ready().loaded.profile()
        total = sum(s for _, s in rows) or 1.0
        lines = [f"{'kernel':<48} {'seconds':>10} {'share':>7}"]
        for name, seconds in sorted(rows, key=lambda r: -r[1]):
            lines.append(f"{name:<48} {seconds:>10.4f} {seconds / total:>6.1%}")
        return "\n".join(lines)

    @property
    def compiled(self):
        """The compiled step: `.program` (kernels, memory plan), `.generated.source`, `.library`."""
        return self._ensure_ready().loaded.compiled

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Validate, feed a free slot, and run the step: wait for it (annotated results), or return
        a callback registrar (`-> tp.Callback[T]`) or a future (no annotation, the old API)."""
        refuse_job_call_while_tracing(self.name)
        arrays = None if kwargs else self._exact_arrays(args)
        if arrays is None:
            arrays = self._bind(args, kwargs)
            shapes = tuple(a.shape for a in arrays)
            if shapes != self._declared_shapes and self._ranks_of_mirrored_inputs() == 1:
                cluster = default_session().cluster
                if cluster is not None:
                    raise JobCallError(f"job {self.name!r} runs on {cluster.ranks} ranks: its list inputs must have "
                                       f"their placeholders' shapes {list(self._declared_shapes)} there (smaller "
                                       f"ones, here {list(shapes)}, are not supported on several ranks yet)")
                return self._variant(shapes)._call_bound(arrays)
        return self._call_bound(arrays)

    def _exact_arrays(self, args: tuple) -> list[np.ndarray] | None:
        """`args` as the step's inputs when each is an ndarray of exactly its placeholder's shape and
        dtype (what _bind would accept unchanged, at a tenth of its cost: ~1 us of a 15 us call);
        None otherwise, and _bind checks the call and names what is wrong."""
        exact = self._exact
        if exact is None or len(args) != len(exact):
            return None
        for value, (shape, dtype) in zip(args, exact):
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return None
        return list(args)

    def _call_bound(self, arrays: list[np.ndarray]) -> Any:
        session = default_session()
        if session.cluster is not None or not session.joined:
            from flowc.runtime.distributed import join
            cluster = join(session, self.fn.__module__)
            if cluster is not None and not cluster.world.is_master:
                cluster.serve(session)          # a worker: computes the master's steps, then exits
        ready = self._begin_call()
        try:
            pipeline = ready.session.pipeline
            synchronous = not self.asynchronous and not self.old_api
            if synchronous:
                pipeline.raise_pending_error()
            in_callback = running_callback_of() is not None
            if in_callback and synchronous and not ready.session.usable:
                raise RuntimeError(f"job {self.name!r} was called inside a callback while "
                                   f"flow.clear_default_session() clears the session on every rank: its "
                                   f"step waits for that clear, and the clear for this callback.  Call it "
                                   f"asynchronously (-> tp.Callback), or after the clear")
            # Inside a callback, waiting for room would wait for this very callback to return.
            hold = ready.register.acquire(wait_for_room=not in_callback,
                                          callbacks_waiting_for_caller=pipeline.callbacks_wait_for_caller)
            layout = ready.traced.layout
            # flow.watch handlers run on the callback thread: a watched sync call goes through the
            # pipeline (inside a callback, it runs them itself, on this very thread, afterwards).
            watched = bool(ready.traced.watches)
            if synchronous and not watched:
                outputs = pipeline.run_now(ready, hold, arrays)   # None: calls in flight
                if outputs is not None:
                    return rebuild_result(layout, outputs)
            try:
                ready.loaded.feed(hold.slot, arrays)   # inputs are copied now: the caller may reuse its arrays
            except BaseException:
                ready.register.finish(hold)
                raise
            if self.old_api:
                call = Call(self, ready, hold, lambda outs: rebuild_result(layout, outs, LocalBlob))
            else:
                call = Call(self, ready, hold, lambda outs: rebuild_result(layout, outs))
            call.wants_callback = not synchronous or (watched and not in_callback)
            call.delivered = synchronous
            call.caller_takes_watch_errors = synchronous
            if synchronous and call.wants_callback:
                call.decide(None)             # no callback: the actor runs the watch handlers only
            hold.call = call
            pipeline.submit(call)
        finally:
            ready.session.end_call()
        if self.asynchronous:
            return CallbackRegistrar(call)
        if self.old_api:
            return JobFuture(call, pipeline)
        value = call.value()
        if watched:
            _deliver_watches_to_caller(call, pipeline, in_callback)
        return value

    def _begin_call(self) -> ReadyStep:
        """The job ready in the default session, entered (`Session.begin_call`) so that clearing the
        session waits for this call.  A session cleared between the two is left for the new one."""
        while True:
            ready = self._ensure_ready()
            if ready.session.begin_call():
                return ready

    def _variant(self, shapes: tuple) -> JobFunction:
        """The build of this job for mirrored inputs of other shapes than declared.  It shares the
        job's name (and so its variables, step counter and checkpoints) and its configuration."""
        with self._lock:
            variant = self._variants.get(shapes)
            if variant is None:
                variant = JobFunction(self.fn, self.job_type, self.config, variant_of=self)
                variant.placeholders = [dataclasses.replace(p, shape=shape)
                                        for p, shape in zip(self.placeholders, shapes)]
                variant._declared_shapes = shapes
                self._variants[shapes] = variant
                if len(self._variants) == _MANY_VARIANTS:
                    warnings.warn(f"job {self.name!r} was called with mirrored inputs of {_MANY_VARIANTS} "
                                  "different shapes, and each shape compiles once; pad the inputs to a few "
                                  "sizes to compile less", RuntimeWarning, stacklevel=_user_stacklevel())
            return variant

    def _bind(self, args: tuple, kwargs: dict) -> list[np.ndarray]:
        """The call's arrays, one per placeholder (Tuple parameters flattened), checked against their
        declarations: a tp.Numpy input has the declared shape; a mirrored one may be smaller."""
        names = [name for name, _ in self.parameters]
        if len(args) > len(names):
            raise JobCallError(f"job {self.name!r} takes {len(names)} argument(s) ({', '.join(names)}), "
                               f"got {len(args) + len(kwargs)}")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise JobCallError(f"job {self.name!r} has no parameter {key!r}; its parameters are {names}")
            if key in bound:
                raise JobCallError(f"job {self.name!r}: argument {key!r} given twice")
            bound[key] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise JobCallError(f"job {self.name!r} takes {len(names)} argument(s) ({', '.join(names)}), "
                               f"missing {', '.join(missing)}")
        declared = self._variant_of.placeholders if self._variant_of is not None else self.placeholders
        flat: list = [None] * len(declared)

        def unpack(layout, value, where: str) -> None:
            if isinstance(layout, int):
                flat[layout] = value
                return
            if not isinstance(value, (tuple, list)) or len(value) != len(layout):
                raise JobCallError(f"job {self.name!r}: argument {where} is a Tuple of {len(layout)} inputs: "
                                   f"pass a tuple of {len(layout)}, got {_describe_value(value)}")
            for k, (inner, item) in enumerate(zip(layout, value)):
                unpack(inner, item, f"{where}[{k}]")

        for name, layout in self.parameters:
            unpack(layout, bound[name], repr(name))
        return [self._check_argument(p, value) for p, value in zip(declared, flat)]

    def _ranks_of_mirrored_inputs(self) -> int:
        """How many devices a mirrored input has an array for: the ranks of a distributed session (in the
        mirrored view), else 1."""
        if self.config.logical_view != "mirrored" or not any(p.kind == "list" for p in self.placeholders):
            return 1
        from flowc.runtime.distributed import join
        cluster = join(default_session(), self.fn.__module__)
        return cluster.ranks if cluster is not None else 1

    def _check_argument(self, p: PlaceholderSpec, value: Any) -> np.ndarray:
        ranks = self._ranks_of_mirrored_inputs() if p.kind == "list" else 1
        if ranks > 1:             # one array per rank: each checked, then one after the other (the ranks' shares)
            if not isinstance(value, (list, tuple)) or len(value) != ranks:
                raise JobCallError(f"job {self.name!r}: argument {p.name!r} is a ListNumpy placeholder of a job on "
                                   f"{ranks} ranks: pass a list of {ranks} numpy.ndarrays (one per device), got "
                                   f"{_describe_value(value)}")
            shares = [self._check_argument(dataclasses.replace(p, kind="numpy"), a) for a in value]   # exact shapes
            return np.concatenate(shares, axis=0)
        if p.kind == "list":      # one array per device, and here one device (several ranks: above)
            value = self._one_device(p, value, "a list with one numpy.ndarray")
        elif p.kind == "list_list":
            value = self._one_device(p, value, "a list with one list of numpy.ndarrays")
            value = self._join_tensor_list(p, value)
        if not isinstance(value, np.ndarray):
            raise JobCallError(f"job {self.name!r}: argument {p.name!r} must be a numpy.ndarray of shape "
                               f"{p.shape} and dtype {p.dtype}, got {type(value).__name__}")
        if p.is_dynamic:
            if value.ndim != len(p.shape) or value.size > _count(p.shape):
                raise ValueError(f"job {self.name!r}: argument {p.name!r} must have {len(p.shape)} dims and at "
                                 f"most the {_count(p.shape)} elements of its placeholder's shape {p.shape}, "
                                 f"got {value.shape}")
        elif value.shape != p.shape:
            raise ValueError(f"job {self.name!r}: argument {p.name!r} must have shape {p.shape} "
                             f"(its placeholder), got {value.shape}")
        target = numpy_dtype(p.dtype)
        if value.dtype != target and not np.can_cast(value.dtype, target, casting="same_kind"):
            raise JobCallError(f"job {self.name!r}: argument {p.name!r} has dtype {value.dtype}, which cannot "
                               f"be converted to the placeholder's {p.dtype} without changing its kind; "
                               f"convert it explicitly (e.g. .astype(np.{p.dtype}))")
        if target.kind in "iu" and value.dtype.kind in "iu" and value.size and \
                not np.can_cast(value.dtype, target, casting="safe"):
            info = np.iinfo(target)
            low, high = value.min(), value.max()
            if low < info.min or high > info.max:
                raise ValueError(f"job {self.name!r}: argument {p.name!r} holds values in [{low}, {high}], "
                                 f"outside the range of the placeholder's {p.dtype}")
        return value

    def _one_device(self, p: PlaceholderSpec, value: Any, what: str) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != 1:
            kind = "ListNumpy" if p.kind == "list" else "ListListNumpy"
            raise JobCallError(f"job {self.name!r}: argument {p.name!r} is a {kind} placeholder: pass {what} "
                               f"(one device), got {_describe_value(value)}")
        return value[0]

    def _join_tensor_list(self, p: PlaceholderSpec, value: Any) -> np.ndarray:
        if not isinstance(value, (list, tuple)) or not value or \
                not all(isinstance(a, np.ndarray) for a in value):
            raise JobCallError(f"job {self.name!r}: argument {p.name!r} is a ListListNumpy placeholder: its "
                               f"device entry must be a non-empty list of numpy.ndarrays, got {_describe_value(value)}")
        if any(a.ndim != len(p.shape) or a.shape[1:] != value[0].shape[1:] for a in value):
            raise ValueError(f"job {self.name!r}: argument {p.name!r}: the arrays of a tensor list must have "
                             f"{len(p.shape)} dims and agree past axis 0, got {[a.shape for a in value]}")
        return np.concatenate(value, axis=0)


_MANY_VARIANTS = 8      # mirrored-input shapes of one job past which a warning suggests padding


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _describe_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _deliver_watches_to_caller(call: Call, pipeline, in_callback: bool) -> None:
    """A synchronous call returns once its watch handlers have run (on the callback thread; inside
    a callback, on this thread, which is that thread); the first error of one is raised here."""
    if in_callback:
        call.run_watches()
    else:
        pipeline.wait_watched(call)
    if call.watch_errors:
        raise call.watch_errors[0]


def _runtime_scalars(traced, step: int) -> dict[str, float]:
    """This step's runtime scalars under the graph's names (learning rates: one per variable dtype)."""
    if not traced.graph.scalars:
        return {}
    # data_parallel_rank: the master's (rank 0); each worker of a distributed job feeds its own
    values = {"train_step": step, RANK_SCALAR: 0}
    if traced.optimizer is not None:
        values.update(traced.optimizer.scalars(step))
    return {name: values[name.split(":")[0]] for name in traced.graph.scalars}


def _choose_device(graph) -> str:
    """Where the job runs: its placement if this machine can, else the CPU with one warning per process
    (an error under FLOWC_STRICT_DEVICE=1)."""
    global _warned_gpu
    from flowc.runtime.devices import job_device
    device, why = job_device(graph)
    if why and not _warned_gpu:
        warnings.warn(why, RuntimeWarning, stacklevel=_user_stacklevel())
        _warned_gpu = True
    return device


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside flowc's own packages, so a warning names the user's line."""
    from flowc.compiler.trace import is_flowc_frame
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and is_flowc_frame(frame):
        frame, level = frame.f_back, level + 1
    return level


def global_function(type: str | FunctionConfig | Callable = "predict", function_config: FunctionConfig | None = None):
    """Decorate a job function: traced at its first call, then a compiled step.

    Example:
        @flow.global_function(type="predict")
        def double(x: tp.Numpy.Placeholder((4,), dtype=flow.float)) -> tp.Numpy:
            return x * 2
        double(np.ones(4, np.float32))  # array([2., 2., 2., 2.], dtype=float32)
    """
    if callable(type) and not isinstance(type, str) and not isinstance(type, FunctionConfig):
        return JobFunction(type, "predict", FunctionConfig())      # bare @flow.global_function
    if isinstance(type, FunctionConfig):                            # old: global_function(config)
        warnings.warn("global_function(config) is deprecated; use global_function(type=..., "
                      "function_config=config)", DeprecationWarning, stacklevel=2)
        # the old API had no `type`: a config with training settings made a train job
        function_config = type
        type = "train" if type.trains else "predict"
    config = function_config if function_config is not None else FunctionConfig()
    if not isinstance(config, FunctionConfig):
        raise TypeError(f"global_function: function_config must come from flow.function_config(), "
                        f"got {config!r}")
    if type not in ("train", "predict"):
        raise ValueError(f"global_function: type must be 'train' or 'predict', got {type!r}")

    def decorate(fn: Callable) -> JobFunction:
        return JobFunction(fn, type, config)
    return decorate
