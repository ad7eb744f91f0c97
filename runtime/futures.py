"""What a job call hands back while its step is in flight.

* `Call`: one call's record, filled by the compute actor (outputs or exception).
* `CallbackRegistrar`: what a `-> tp.Callback[T]` job returns: `job(x)(cb)` registers `cb`.
* `JobFuture`: what a job without return annotation returns (the old API): `.get()` or
  `.async_get(cb)`, one of the two.
* `LocalBlob`: the old API's result value: `.numpy()`, and ndarray-like use (`.mean()`).
"""
from __future__ import annotations

import inspect
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable

import numpy as np

from flowc.runtime.signature import PerRank, whole


class Call:
    """One job call on its way through the actors.

    `ready` is the job's build this call runs (a `job.ReadyStep`: session, loaded step, register),
    fixed when the call starts, so a job compiled anew or a session cleared meanwhile cannot mix
    another build's buffers into it; `hold` is its claim on the register (slot and room).
    """

    def __init__(self, job, ready, hold, convert: Callable[[list], Any]) -> None:
        self.job = job
        self.ready = ready
        self.hold = hold
        self.ticket = 0                     # its place in the pipeline (Pipeline.submit)
        self.convert = convert              # output arrays -> the user's value
        self.outputs: list | None = None
        self.error: BaseException | None = None
        self.computed = threading.Event()
        self.callback: Callable | None = None
        self.wants_callback = False         # the callback actor must run something for it
        self.decided = threading.Event()    # the callback (or none) is known
        self._deciding = threading.Lock()   # decide and park: one of them wins
        # A sync point passed over this call while nobody had decided yet (a held JobFuture): its
        # result stays for .get(); a callback registered later runs on its own (Pipeline.run_late).
        self.parked = False
        self.orphaned = False               # in a forked child: the parent runs this call (fail_after_fork)
        self.delivered = False              # .get() or a sync call took the result (or its error)
        # flow.watch / flow.watch_diff handlers: (WatchSpec, index in the outputs), run after the step
        traced = getattr(ready, "traced", None)
        self.watches: list = list(getattr(traced, "watches", None) or [])
        # The callback thread has run the watch handlers, or passed this call (or will not see it):
        # the callbacks of earlier calls have run, so .get() raises their errors before its result.
        self.watched = threading.Event()
        self.watch_errors: list[BaseException] = []
        self.caller_takes_watch_errors = False   # a sync call raises its handlers' errors itself

    def decide(self, callback: Callable | None) -> bool:
        """Fix what runs when the step is done; False when a sync point has parked the call already
        (then the caller runs `callback` through `Pipeline.run_late`)."""
        with self._deciding:
            if self.parked:
                return False
            self.callback = callback
            self.decided.set()
        self.ready.register.changed()       # a caller waiting for room may now count this call out
        return True

    def park(self) -> None:
        """A sync point or a session's close waits for this computed call, whose result nobody has
        asked for yet: stop waiting for a decision (`.get()` still returns the result)."""
        with self._deciding:
            if not self.decided.is_set():
                self.parked = True
                self.decided.set()

    def fail_after_fork(self) -> None:
        """In a forked child: this call was in flight in the parent, whose threads run it; here it
        fails (with new events: a parent thread may have held the old ones' locks at the fork)."""
        self.error = RuntimeError(f"job {self.job.name!r}: this call was in flight when the process "
                                  f"forked; its step and callback run in the parent (pid {os.getppid()}), "
                                  f"not in this child")
        self.orphaned = True
        self.computed = threading.Event()
        self.computed.set()
        self.decided = threading.Event()
        self.decided.set()
        self._deciding = threading.Lock()
        self.watched = threading.Event()    # its watch handlers never run here
        self.watched.set()

    def wait_computed(self) -> None:
        while not self.computed.wait(timeout=0.1):   # a timeout keeps Ctrl-C working
            pass

    def value(self) -> Any:
        self.wait_computed()
        if self.error is not None:
            raise self.error
        return self.converted()

    def run_watches(self) -> None:
        """Call each watch handler, in the order the job registered them, with this step's value
        converted as its annotation asks; keep their exceptions in `watch_errors`.  A handler that
        raises does not stop the others (nor the job's callback)."""
        try:
            if self.error is None and self.outputs is not None:
                for spec, index in self.watches:
                    try:
                        spec.handler(watched_value(spec.convert, self.outputs[index]))
                    except Exception as err:  # noqa: BLE001 - kept and raised like a callback's error
                        self.watch_errors.append(err)
        finally:
            self.watched.set()

    def converted(self) -> Any:
        """The user's value of a call computed without an error."""
        assert self.outputs is not None, "the call has no outputs"
        return self.convert(self.outputs)


def watched_value(convert: str, array: np.ndarray | PerRank) -> Any:
    """A watched value as its handler's annotation asks (`flow.watch`): "numpy" an ndarray,
    "list_numpy" a list with one per device, "blob" a LocalBlob (no annotation).  `array` is a
    `PerRank` list in a mirrored-view job on several ranks."""
    if convert == "numpy":
        return whole(array)
    if convert == "list_numpy":
        return list(array) if isinstance(array, PerRank) else [array]
    return LocalBlob(array)


def check_callback(cb: Any, what: str) -> Callable:
    """A callable taking exactly one argument, else a TypeError now (not on the callback thread)."""
    if not callable(cb):
        raise TypeError(f"{what}: expected a function taking the job's result, got {type(cb).__name__}")
    try:
        sig = inspect.signature(cb)
    except (TypeError, ValueError):
        return cb            # builtins without a signature: trust them
    try:
        sig.bind(object())
    except TypeError:
        params = ", ".join(sig.parameters)
        raise TypeError(f"{what}: the callback must take exactly one argument (the job's result); "
                        f"{getattr(cb, '__name__', cb)!r} takes ({params})") from None
    return cb


class CallbackRegistrar:
    """Returned by a `-> tp.Callback[T]` job: call it with the function that receives the result.

    Example:
        train_job(images, labels)(cb_print_loss)
    """

    def __init__(self, call: Call) -> None:
        self._call = call
        self._used = False
        # Dropped without registering: the callback actor must not wait for it.  Detached once a
        # callback is registered, so the usual call runs no finalizer: a Ctrl-C that lands inside
        # one is swallowed ("Exception ignored"), and the program would not stop.
        self._finalizer = weakref.finalize(self, _decide_if_pending, call)

    def __call__(self, callback: Callable) -> None:
        if self._used:
            raise RuntimeError(f"job {self._call.job.name!r}: a callback is already registered for this call")
        check_callback(callback, f"job {self._call.job.name!r}")
        if self._call.orphaned:
            assert self._call.error is not None
            raise self._call.error
        self._used = True
        self._finalizer.detach()
        if not self._call.decide(callback):
            self._call.ready.session.pipeline.run_late(self._call, callback)


def _decide_if_pending(call: Call) -> None:
    # At exit after Ctrl-C the pipeline abandons its backlog anyway, and the interrupt may have left
    # this call's event lock held (it can land inside Event.set): deciding now could block forever.
    if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
        return
    if not call.decided.is_set():
        call.decide(None)


class LocalBlob:
    """A result of the old API: an ndarray with `.numpy()` (and the deprecated `.ndarray()`).

    A mirrored-view job on several ranks gives one array per device, as OneFlow's LocalMirroredTensor:
    `.numpy_list()` is the list, `.numpy(i)` device i's array, and `.numpy()` (and ndarray-like use)
    their join along axis 0.

    Example:
        blob = eval_job(images).get()
        print(blob.numpy().mean(), blob.parallel_num())
    """

    def __init__(self, array: np.ndarray | PerRank) -> None:
        self._devices: list[np.ndarray] = list(array) if isinstance(array, PerRank) else [array]
        self._whole: np.ndarray | PerRank = array

    @property
    def _array(self) -> np.ndarray:
        # joined when first asked, once (ndarray-like use asks often); a scalar per rank is an error only then
        if isinstance(self._whole, PerRank):
            self._whole = self._whole.joined()
        return self._whole

    def numpy(self, parallel_id: int | None = None) -> np.ndarray:
        """The array (None), or device `parallel_id`'s array."""
        if parallel_id is None:
            return self._array
        if not isinstance(parallel_id, int) or not 0 <= parallel_id < len(self._devices):
            raise IndexError(f"LocalBlob.numpy: parallel_id {parallel_id!r} is out of range: the result has "
                             f"{len(self._devices)} device(s), parallel_id 0 to {len(self._devices) - 1}")
        return self._devices[parallel_id]

    def numpy_list(self) -> list[np.ndarray]:
        """The array of each device: `[blob.numpy()]` on one device.

        Example:
            losses = train_job(images, labels).get().numpy_list()
        """
        return list(self._devices)

    def parallel_num(self) -> int:
        """How many devices' arrays the result holds (1 unless a mirrored-view job ran on several ranks)."""
        return len(self._devices)

    def ndarray_list(self) -> list[np.ndarray]:
        warnings.warn("LocalBlob.ndarray_list() is deprecated; use .numpy_list()", DeprecationWarning, stacklevel=2)
        return self.numpy_list()

    def ndarray(self) -> np.ndarray:
        warnings.warn("LocalBlob.ndarray() is deprecated; use .numpy()", DeprecationWarning, stacklevel=2)
        return self._array

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)

    def __getattr__(self, name: str):
        if name.startswith("_"):           # never found on the array: also keeps copy and pickle from recursing
            raise AttributeError(name)
        return getattr(self._array, name)     # .mean(), .shape, .tolist(), ...

    def __getitem__(self, index):
        return self._array[index]

    def __len__(self) -> int:
        return len(self._array)

    def __repr__(self) -> str:
        if len(self._devices) > 1:
            return f"LocalBlob(per device: {self._devices!r})"
        return f"LocalBlob({self._array!r})"


class JobFuture:
    """Returned by a job without a return annotation (the old API): `.get()` or `.async_get(cb)`.

    Example:
        loss = train_job(images, labels).get().mean()
        eval_job(images, labels).async_get(lambda result: print(result.numpy()))
    """

    def __init__(self, call: Call, pipeline) -> None:
        self._call = call
        self._pipeline = pipeline
        self._used: str | None = None
        weakref.finalize(self, _decide_if_pending, call)

    def _claim(self, how: str) -> None:
        if self._used is not None:
            raise RuntimeError(f"job {self._call.job.name!r}: .{self._used}() was already called on this "
                               f"result; use either .get() or .async_get(), once")
        self._used = how

    def get(self) -> Any:
        """Wait for the step; return its result as LocalBlob(s); raise an earlier async error first
        (and then a later `.get()` returns this call's result).  Inside a callback, its watch
        handlers run after that callback returns."""
        self._pipeline.raise_pending_error()
        self._claim("get")
        self._call.delivered = True
        self._call.decide(None)
        value = self._call.value()
        from flowc.runtime.pipeline import running_callback_of
        if running_callback_of() is None:    # inside a callback, this very thread runs them later
            self._pipeline.wait_watched(self._call)      # the watch handlers of this call have run
            try:
                self._pipeline.raise_pending_error()
            except BaseException:
                self._used = None            # the result is not lost: the next .get() returns it
                raise
        return value

    def async_get(self, callback: Callable) -> None:
        """Run `callback(result)` on the callback thread when the step is done."""
        check_callback(callback, f"job {self._call.job.name!r}: async_get")
        if self._call.orphaned:
            assert self._call.error is not None
            raise self._call.error
        self._claim("async_get")
        if not self._call.decide(callback):
            self._pipeline.run_late(self._call, callback)
