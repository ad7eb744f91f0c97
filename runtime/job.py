"""Job functions: `@flow.global_function` turns a Python function into a compiled step.

The function is traced once, at its first call, for the signature its placeholders
declare; every call then validates its arguments, feeds them to the compiled step
and returns the results in the shape the return annotation promises.
"""
from __future__ import annotations

import functools
import sys
import time
import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from flowc.compiler.backends import HOST_DEVICE, DeviceName, device_names
from flowc.compiler.errors import JobCallError, StepError
from flowc.compiler.ir import dtype_name, numpy_dtype
from flowc.compiler.trace import refuse_job_call_while_tracing
from flowc.runtime.futures import Call, CallbackRegistrar, JobFuture, LocalBlob
from flowc.runtime.register import Register
from flowc.runtime.session import default_session
from flowc.runtime.signature import placeholders_of, rebuild_result, result_spec_of

if TYPE_CHECKING:
    from flowc.compiler.build import TracedJob
    from flowc.compiler.pipeline import CompiledStep
    from flowc.runtime.loaded_step import LoadedStep
    from flowc.runtime.session import Session

_warned_gpu = False
# Three stages overlap: the caller feeds step k+2 while step k+1 computes and step k's callback runs.
DEFAULT_PIPELINE_DEPTH = 3


class TrainConfig:
    """`config.train.*` of the old training style (with `flow.losses.add_loss`)."""

    def __init__(self) -> None:
        self.primary_lr_value: float | None = None
        self.update_conf: dict | None = None

    def primary_lr(self, lr: float) -> None:
        self.primary_lr_value = float(lr)

    def model_update_conf(self, conf: dict) -> None:
        self.update_conf = conf


class FunctionConfig:
    """What `flow.function_config()` returns.

    Example:
        config = flow.function_config()
        config.default_data_type(flow.float)
        @flow.global_function(type="train", function_config=config)
        def train_job(...): ...
    """

    def __init__(self) -> None:
        self.default_dtype = "float32"
        self.train = TrainConfig()
        self.depth = DEFAULT_PIPELINE_DEPTH

    def concurrency_width(self, n: int) -> None:
        """How many calls of the job may be in flight at once (the pipeline depth); a call blocks beyond."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"function_config.concurrency_width: expected an int >= 1, got {n!r}")
        self.depth = n

    def default_data_type(self, dtype) -> None:
        self.default_dtype = dtype_name(dtype)

    def default_logical_view(self, view=None) -> None:
        """Accepted for compatibility: on one device the consistent and mirrored views agree."""

    def __getattr__(self, name: str):
        raise AttributeError(f"function_config has no option {name!r}; flowc supports default_data_type, "
                             "default_logical_view, concurrency_width and train.primary_lr / "
                             "train.model_update_conf")


class JobFunction:
    """A traced-on-first-call job; call it like the Python function it wraps."""

    def __init__(self, fn: Callable, job_type: str, config: FunctionConfig) -> None:
        if job_type not in ("train", "predict"):
            raise ValueError(f"global_function: type must be 'train' or 'predict', got {job_type!r}")
        self.fn = fn
        self.name = fn.__name__
        self.job_type = job_type
        self.config = config
        self.placeholders = placeholders_of(fn)
        self.result_spec, self.asynchronous = result_spec_of(fn)
        self.old_api = self.result_spec.kind == "auto"
        self._session: Session | None = None
        self._traced: TracedJob | None = None        # once traced (in self._session)
        self._trace_seconds = 0.0
        self._compiled: CompiledStep | None = None   # once built
        self._device: str = HOST_DEVICE  # where the traced job runs: a device name of compiler/backends.py
        self.loaded: LoadedStep | None = None        # once traced and compiled
        self.register: Register | None = None        # its slots in flight
        functools.update_wrapper(self, fn)

    # -- building -------------------------------------------------------------------------
    def _ensure_ready(self) -> LoadedStep:
        session = default_session()
        if self.loaded is not None and self._session is session:
            return self.loaded
        if self._compiled is None or self._session is not session:
            self.compile()
        from flowc.runtime.devices import load_step
        self.loaded = load_step(self._compiled, session, self.config.depth)
        self.register = Register(self.loaded.slots)
        if self not in session.jobs:
            session.jobs.append(self)
        return self.loaded

    def _trace(self) -> TracedJob:
        """The traced job in the default session (traced again when the session changed)."""
        session = default_session()
        if self._traced is None or self._session is not session:
            from flowc.compiler.build import build_job_graph
            self.release()
            start = time.perf_counter()
            self._traced = build_job_graph(self.name, self.job_type, self.fn, self.placeholders,
                                           self.result_spec, session, self.config)
            self._trace_seconds = time.perf_counter() - start
            self._session = session
            self._device = _choose_device(self._traced.graph)
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
        from flowc.compiler.pipeline import lower
        from flowc.compiler.stages import Lowered
        if device is not None and device not in device_names():
            raise ValueError(f"job {self.name!r}: device must be {' or '.join(map(repr, device_names()))}, "
                             f"got {device!r}")
        traced = self._trace()
        records: list = []
        start = time.perf_counter()
        program = lower(traced.graph, records)
        timings = {"trace": self._trace_seconds, "passes": time.perf_counter() - start}
        return Lowered(program, records, timings, device=device or self._device, on_compiled=self._adopt)

    def compile(self):
        """Lower and build the job now, so its first call compiles nothing: a `compiler.stages.Compiled`.

        Example:
            compiled = train_job.compile()
            print(compiled.source())                    # the generated C++
            print(compiled.memory_plan().peak_bytes)
        """
        return self.lower().compile()

    def _adopt(self, step) -> None:
        """Take a step built by `Lowered.compile()`: the next call loads it instead of compiling.
        A step built for another device (e.g. a GPU build on a machine without one, ahead
        of time) is only an artifact in the cache: the job keeps compiling for where it runs."""
        if step.device != self._device:
            return
        if self.loaded is not None and self.loaded.compiled is not step:
            self.loaded = None          # a loaded step keeps running until the job is compiled anew
            self.register = None
        self._compiled = step

    def release(self) -> None:
        self.loaded = None
        self.register = None
        self._traced = None
        self._compiled = None
        self._session = None

    @property
    def graph(self):
        """The traced graph (forward, backward, update); traces the job if needed."""
        return self._trace().graph

    def profile(self) -> str:
        """A table of time per kernel over the steps run so far (needs FLOWC_PROFILE=1 at compile time).

        Example:
            FLOWC_PROFILE=1 python train.py    # then: print(train_job.profile())
        """
        rows = self._ensure_ready().profile()
        total = sum(s for _, s in rows) or 1.0
        lines = [f"{'kernel':<48} {'seconds':>10} {'share':>7}"]
        for name, seconds in sorted(rows, key=lambda r: -r[1]):
            lines.append(f"{name:<48} {seconds:>10.4f} {seconds / total:>6.1%}")
        return "\n".join(lines)

    @property
    def compiled(self):
        """The compiled step: `.program` (kernels, memory plan), `.generated.source`, `.library`."""
        return self._ensure_ready().compiled

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Validate, feed a free slot, and run the step: wait for it (annotated results), or return
        a callback registrar (`-> tp.Callback[T]`) or a future (no annotation, the old API)."""
        refuse_job_call_while_tracing(self.name)
        arrays = self._bind(args, kwargs)
        loaded = self._ensure_ready()
        session = self._session
        assert session is not None and self._traced is not None and self.register is not None   # ready
        pipeline = session.pipeline
        synchronous = not self.asynchronous and not self.old_api
        if synchronous:
            pipeline.raise_pending_error()
        done = session.train_steps.get(self.name, 0)     # each train job counts its own steps, as in OneFlow
        scalars = _runtime_scalars(self._traced, done)
        slot = self.register.acquire()
        layout = self._traced.layout
        self._count_step(session, done + 1)
        if synchronous:
            try:
                outputs = pipeline.run_now(self, slot, arrays, scalars)   # None: calls in flight
            except StepError:
                self._uncount_failed_step(session, done)
                raise
            if outputs is not None:
                return rebuild_result(layout, outputs)
        try:
            loaded.feed(slot, arrays, scalars)   # inputs are copied now: the caller may reuse its arrays
        except BaseException:
            self.register.release(slot)
            self._count_step(session, done)         # no step was made
            raise
        if self.old_api:
            call = Call(self, slot, lambda outs: rebuild_result(layout, outs, LocalBlob))
        else:
            call = Call(self, slot, lambda outs: rebuild_result(layout, outs))
        call.wants_callback = not synchronous
        call.delivered = synchronous
        pipeline.submit(call)
        if self.asynchronous:
            return CallbackRegistrar(call)
        if self.old_api:
            return JobFuture(call, pipeline)
        try:
            return call.value()
        except StepError:
            self._uncount_failed_step(session, done)
            raise

    def _count_step(self, session, steps: int) -> None:
        if self.job_type == "train":
            session.train_steps[self.name] = steps

    def _uncount_failed_step(self, session, done: int) -> None:
        """A step that failed (a label out of range) changed no variable, so it is no step: the count,
        which drives the learning-rate schedule and Adam's bias correction, goes back -- unless later
        steps were counted meanwhile (asynchronous calls), whose numbers are already fed."""
        if session.train_steps.get(self.name) == done + 1:
            self._count_step(session, done)

    def _bind(self, args: tuple, kwargs: dict) -> list[np.ndarray]:
        names = [p.name for p in self.placeholders]
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
        arrays = []
        for p in self.placeholders:
            value = bound[p.name]
            if p.as_list:      # ListNumpy.Placeholder: one array per device, and flowc has one device
                if not isinstance(value, (list, tuple)) or len(value) != 1:
                    raise JobCallError(f"job {self.name!r}: argument {p.name!r} is a ListNumpy placeholder: "
                                       f"pass a list with one numpy.ndarray, got {type(value).__name__}"
                                       + (f" of {len(value)}" if isinstance(value, (list, tuple)) else ""))
                value = value[0]
            if not isinstance(value, np.ndarray):
                raise JobCallError(f"job {self.name!r}: argument {p.name!r} must be a numpy.ndarray of shape "
                                   f"{p.shape} and dtype {p.dtype}, got {type(value).__name__}")
            if value.shape != p.shape:
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
            arrays.append(value)
        return arrays


def _runtime_scalars(traced, step: int) -> dict[str, float]:
    """This step's runtime scalars under the graph's names (learning rates: one per variable dtype)."""
    if not traced.graph.scalars:
        return {}
    values = {"train_step": step}
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
        train = type.train.primary_lr_value is not None or type.train.update_conf is not None
        function_config = type
        type = "train" if train else "predict"
    config = function_config if function_config is not None else FunctionConfig()
    if not isinstance(config, FunctionConfig):
        raise TypeError(f"global_function: function_config must come from flow.function_config(), "
                        f"got {config!r}")
    if type not in ("train", "predict"):
        raise ValueError(f"global_function: type must be 'train' or 'predict', got {type!r}")

    def decorate(fn: Callable) -> JobFunction:
        return JobFunction(fn, type, config)
    return decorate
