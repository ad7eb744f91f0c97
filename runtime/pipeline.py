"""A session's step pipeline: feed (caller thread) -> compute actor -> callback actor.

The caller validates and copies its inputs into a register slot, then posts the call.
The compute actor runs steps one after another in call order, copies the outputs
out and frees the slot; calls whose results go to a callback continue to the
callback actor, which runs callbacks in call order.  A call keeps its room in the
job's register (`concurrency_width`) until its callback has returned, so a slow
callback holds the caller back instead of letting results pile up.

Every step runs under the step lock, taken by the compute actor (or by a caller running
a synchronous step at once) for the step only: whatever else holds it (`holding_steps`)
sees the variables between two whole steps.  Each train job's step counter is advanced
under it too, so counters, learning rates and Adam's bias correction follow the order
in which steps really run, whichever threads call.

An exception in a step or a callback is never lost: it is kept, with its traceback,
and raised by the session's next synchronous call, `.get()` or
`flow.sync_default_session()`.  At interpreter exit the pipelines drain (an exit handler
registered when flowc is imported, so it runs after the script's own handlers), so the
callbacks of calls still in flight run before the process ends, and so do the calls those
callbacks make.  A callback may call jobs, but not wait for the pipeline
(`sync_default_session`, `clear_default_session`): that would wait for its own call, which
ends when it returns.

Callbacks run in call order, so the callback thread waits for a result nobody has decided on
yet (an old-API future held without `.get()` or `.async_get()`, a registrar not yet called).
Whoever waits for that thread meanwhile (a sync point, a session's close, `.get()` or a
synchronous call waiting for its watch handlers) parks such an earlier result instead of
waiting for it forever: `.get()` still returns it, and a callback registered later runs on its
own (`run_late`).
"""
from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import traceback
import weakref
from collections import deque
from typing import Callable, Iterator

from flowc.runtime.actors import Actor
from flowc.runtime.fork import openmp_unsafe_here
from flowc.runtime.futures import Call

_thread_state = threading.local()        # .callback_of: the Call whose callback this thread runs now
_pipelines: weakref.WeakSet[Pipeline] = weakref.WeakSet()     # the live ones, for fork and exit
CLEARED = "its session was cleared; call the job again to run it in the new default session"
EXITING = ("the interpreter is exiting and flowc has run the calls in flight: a job called after that (from a "
           "daemon thread, or an exit handler registered before `import flow`) does not run")


def running_callback_of() -> Call | LateCallback | None:
    """The call whose callback the current thread is running, if it is running one."""
    return getattr(_thread_state, "callback_of", None)


def forget_callback_after_fork() -> None:
    """In a forked child: the thread that forked may have been running a callback; the child's
    thread runs none (its sync points are its own)."""
    _thread_state.callback_of = None


def refuse_inside_callback(what: str) -> None:
    """Raise a clear error instead of the deadlock `what` (which waits for every call in flight)
    would be inside a callback: the callback's own call is in flight until the callback returns."""
    call = running_callback_of()
    if call is not None:
        raise RuntimeError(f"{what} was called inside the callback of job {call.job.name!r}: it waits for "
                           f"every call in flight, and that callback's own call is in flight until the "
                           f"callback returns, so it would wait forever.  Call it from the thread that "
                           f"calls the jobs (after the calls), not from a callback")


class Pipeline:
    def __init__(self, name: str = "flowc") -> None:
        self.compute = Actor(f"{name}-compute", self._compute)
        self.callbacks = Actor(f"{name}-callbacks", self._run_callback)
        self._cond = threading.Condition()
        self._issued = 0                                  # tickets handed out, one per call
        self._unfinished: dict[int, Call | None] = {}     # ticket -> its call (None: run at once)
        self._origins: dict[int, int] = {}                # ticket -> the ticket of the call it came from
        # Steps run one at a time, on the compute actor or, for a synchronous call made while
        # nothing is in flight, on the caller's thread (see run_now).
        self._compute_lock = threading.Lock()
        self._errors: deque[BaseException] = deque()
        self._abandoned = False        # after Ctrl-C at exit: skip queued steps and callbacks
        self._closed: str | None = None    # why no call enters any more (CLEARED, EXITING)
        self._awaiting: Call | None = None   # the call whose .get()/callback the callback actor waits for
        _pipelines.add(self)

    # -- submitting ---------------------------------------------------------------------
    def _begin(self, call: Call | None) -> int:
        """A ticket for a call entering the pipeline (under self._cond).  A call made inside a callback
        takes its origin from the callback's call, so a sync point that waits for that call waits
        for what its callback started too."""
        parent = running_callback_of()
        parent_origin = self._origins.get(parent.ticket) if parent is not None else None
        if self._closed and parent_origin is None:   # a callback's calls are part of the drain
            raise RuntimeError(f"flowc: this session's pipeline is closed: {self._closed}")
        self._issued += 1
        origin = self._issued if parent_origin is None else parent_origin
        self._unfinished[self._issued] = call
        self._origins[self._issued] = origin
        if call is not None:
            call.ticket = self._issued
        return self._issued

    def _finished(self, ticket: int) -> None:
        with self._cond:
            del self._unfinished[ticket]
            del self._origins[ticket]
            self._cond.notify_all()

    def submit(self, call: Call) -> None:
        try:
            with self._cond:
                self._begin(call)
        except BaseException:
            call.ready.register.free_slot(call.hold)     # refused: its slot and room are free again
            call.ready.register.finish(call.hold)
            raise
        self.compute.post(call)

    def run_now(self, ready, hold, arrays) -> list | None:
        """Run a synchronous call's step on the caller's thread if nothing is in flight, and return
        its outputs; None when busy (feed the slot and submit it instead).  The actor would have run
        it next anyway, so order is unchanged; the caller saves two thread hand-offs (0.1 ms of a
        0.7 ms MLP step on the 2-vCPU VM) and the copy of its inputs.  A call that other threads post
        meanwhile waits for the compute lock."""
        if openmp_unsafe_here():       # a forked child's forking thread: its OpenMP pool is gone
            return None
        with self._cond:
            if self._unfinished:
                return None
            try:
                ticket = self._begin(None)
            except BaseException:
                ready.register.finish(hold)
                raise
        try:
            if self._abandoned:
                raise KeyboardInterrupt("abandoned at interpreter exit")
            ready.session.wait_until_usable()
            with self._compute_lock:
                return ready.compute_borrowed(hold.slot, arrays)
        finally:
            ready.register.finish(hold)
            self._finished(ticket)

    @contextlib.contextmanager
    def holding_steps(self) -> Iterator[None]:
        """No step runs inside: the variables and step counters stay as whole steps left them."""
        with self._compute_lock:
            yield

    # -- the actors' work -----------------------------------------------------------------
    def _compute(self, call: Call) -> None:
        register = call.ready.register
        try:
            if self._abandoned:
                raise KeyboardInterrupt("abandoned at interpreter exit")
            call.ready.session.wait_until_usable()
            with self._compute_lock:
                call.outputs = call.ready.compute(call.hold.slot)
        except BaseException as err:      # kept for the caller or the next sync point
            call.error = err
        finally:
            call.computed.set()
            register.free_slot(call.hold)
        if call.wants_callback:
            self.callbacks.post(call)
        else:
            call.watched.set()
            register.finish(call.hold)
            self._finished(call.ticket)

    def _run_watches(self, call: Call) -> None:
        """The call's watch handlers (flow.watch), before its callback and before waiting for a
        decision: they do not depend on how the result is taken.  Their errors go to the caller of
        a synchronous call, else to the next sync point, as a callback's do."""
        if not call.watches or self._abandoned:
            call.watched.set()
            return
        _thread_state.callback_of = call
        try:
            call.run_watches()
        finally:
            _thread_state.callback_of = None
        if not call.caller_takes_watch_errors:
            self._errors.extend(call.watch_errors)

    def _run_callback(self, call: Call | LateCallback) -> None:
        if isinstance(call, LateCallback):
            self._run_late(call)
            return
        try:
            self._run_watches(call)
            if not call.decided.is_set():
                self._awaiting = call
                call.ready.register.changed()
            while not call.decided.wait(timeout=0.1) and not self._abandoned:
                pass
            self._awaiting = None
            if self._abandoned:
                return
            if call.error is not None:
                if not call.delivered:
                    self._errors.append(call.error)
            elif call.callback is not None:
                self._call_back(call, call, call.callback)
        except BaseException as err:
            self._errors.append(err)
        finally:
            call.watched.set()
            call.ready.register.finish(call.hold)
            self._finished(call.ticket)

    @staticmethod
    def _call_back(call: Call, running: Call | LateCallback, callback) -> None:
        # `running`: whose callback this is, for the calls the callback makes (they share its origin)
        _thread_state.callback_of = running
        try:
            callback(call.converted())
        finally:
            _thread_state.callback_of = None

    def run_late(self, call: Call, callback) -> None:
        """Run `callback` with a parked call's result (`Call.park`): a callback registered after a
        sync point passed over the call.  It runs on the callback actor, after the callbacks queued
        so far, and the next sync point waits for it.  A call that failed has had its error raised
        by that sync point already: its callback does not run.  After the pipeline closed (the
        session was cleared), the callback runs at once, on this thread."""
        late = LateCallback(call, callback)
        with self._cond:
            closed = self._closed is not None
            if not closed:
                late.ticket = self._begin(None)
        if closed:
            if call.error is None:
                callback(call.converted())
            return
        self.callbacks.post(late)

    def _run_late(self, late: LateCallback) -> None:
        try:
            if late.call.error is None and not self._abandoned:
                self._call_back(late.call, late, late.callback)
        except BaseException as err:
            self._errors.append(err)
        finally:
            self._finished(late.ticket)

    def callbacks_wait_for_caller(self) -> bool:
        """Whether the callback actor waits for a caller to decide a result (`.get()` or a callback)."""
        return self._awaiting is not None

    def _park_awaited(self, up_to_origin: float) -> None:
        """A sync point must not wait for a result nobody has asked for yet (a JobFuture held without
        .get()): park the call the callback actor waits for, if the sync point waits for it."""
        call = self._awaiting
        if call is not None and self._origins.get(call.ticket, up_to_origin + 1) <= up_to_origin:
            call.park()

    def wait_watched(self, call: Call) -> None:
        """Wait until the callback thread has reached `call` and run its watch handlers (the earlier
        calls' callbacks have run then), parking an earlier result that thread waits for."""
        while not call.watched.wait(timeout=0.1):    # a timeout keeps Ctrl-C working
            if self._abandoned:                       # (the callback thread runs no more)
                return
            awaited = self._awaiting
            if awaited is not None and awaited.ticket < call.ticket:
                awaited.park()

    # -- sync points --------------------------------------------------------------------------
    def raise_pending_error(self) -> None:
        """Raise the oldest error of an earlier asynchronous call or callback, if any."""
        if self._errors:
            raise self._errors.popleft()

    def wait_for_calls_made(self) -> None:
        """Block until every call submitted so far is computed and its callback has run, and so are
        the calls those callbacks made.  Calls that other threads make meanwhile are not waited for,
        so a thread that keeps calling cannot hold a sync point back forever."""
        with self._cond:
            last = self._issued
            while any(origin <= last for origin in self._origins.values()):
                self._park_awaited(last)
                self._cond.wait(timeout=0.1)    # a timeout keeps Ctrl-C working

    def wait_idle(self) -> None:
        """Block until no call is in flight."""
        with self._cond:
            self._wait_idle_locked()

    def _wait_idle_locked(self) -> None:
        while self._unfinished:
            self._park_awaited(float("inf"))
            self._cond.wait(timeout=0.1)

    def sync(self, what: str = "flow.sync_default_session()") -> None:
        refuse_inside_callback(what)
        self.wait_for_calls_made()
        self.raise_pending_error()

    @property
    def in_flight(self) -> int:
        return len(self._unfinished)

    def close(self, why: str = CLEARED) -> list[BaseException]:
        """Run the calls made so far, stop both threads; return the errors nobody collected.  No call
        enters after (`why` says why), except the calls that the callbacks make while it drains: at
        exit, a callback may call a job.  Calls other threads keep making meanwhile (a daemon thread
        at exit) do not hold it back."""
        self.wait_for_calls_made()
        with self._cond:
            self._closed = why
            self._wait_idle_locked()
        self.compute.stop()
        self.callbacks.stop()
        _pipelines.discard(self)
        errors, self._errors = list(self._errors), deque()
        return errors

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's threads run this pipeline's calls, and none of them exists
        here.  Fail the calls in flight (their futures raise instead of waiting forever), close the
        pipeline without waiting, and drop its exit drain; the session starts a new one."""
        for call in self._unfinished.values():
            if call is not None:
                call.fail_after_fork()
        self._unfinished = {}
        self._origins = {}
        self._closed = "the process forked: this child's calls run in the new default session's pipeline"
        self._cond = threading.Condition()
        self._compute_lock = threading.Lock()
        _pipelines.discard(self)

    def drain_at_exit(self) -> None:
        # After Ctrl-C ended the program, do not drain the backlog (it may take long): skip the
        # queued steps and callbacks, but let the step in progress finish, so that no thread is
        # inside compiled code while the process tears down.
        interrupted = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(interrupted, KeyboardInterrupt):
            pending = len(self._unfinished)
            self._abandoned = True
            # Wait for the step in progress through the compute lock rather than for the in-flight
            # count: Ctrl-C may have landed between two updates of that count, which then never
            # reaches zero.  The lock stays held, so no step starts while the interpreter tears down.
            try:
                while not self._compute_lock.acquire(timeout=0.1):
                    pass
            except KeyboardInterrupt:
                return
            if pending:
                print(f"flowc: interrupted; {pending} job call(s) in flight were abandoned", file=sys.stderr)
            return
        try:
            errors = self.close(EXITING)
        except KeyboardInterrupt:
            return
        for err in errors:
            print("flowc: an asynchronous job call failed and no later sync point collected the error:",
                  file=sys.stderr)
            traceback.print_exception(err, file=sys.stderr)


class LateCallback:
    """A callback registered on a parked call (`Pipeline.run_late`), queued for the callback actor."""

    def __init__(self, call: Call, callback) -> None:
        self.call = call
        self.job = call.job
        self.callback = callback
        self.ticket = 0


_after_exit_drain: list[Callable[[], None]] = []


def call_after_exit_drain(action: Callable[[], None]) -> None:
    """Run `action` at interpreter exit once every pipeline has drained (the master of several ranks
    tells its workers to exit there: the callbacks drained before may still call jobs)."""
    _after_exit_drain.append(action)


def _drain_all_at_exit() -> None:
    try:
        for pipeline in list(_pipelines):
            pipeline.drain_at_exit()
    finally:
        while _after_exit_drain:
            _after_exit_drain.pop(0)()


# Registered when flowc is imported (flow imports the session, which imports this module), so the
# script's own exit handlers, registered later, run first and may still call jobs (atexit runs
# its handlers last registered first).
atexit.register(_drain_all_at_exit)
