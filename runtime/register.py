"""A register: N slots of a job's step buffers, and the bound on that job's calls in flight.

N is the job's `concurrency_width`.  A call takes a `Hold` (waiting while N calls are in flight),
feeds the hold's slot, and keeps the hold until it is done: the compute actor gives the slot back
once the step's outputs are copied out, and the call leaves the count when its callback has
returned (or at once when it has no callback).  So the bound covers everything a call keeps
alive, results waiting for a slow callback included; the slots cover only the steps being fed
and computed, which is why a call never waits for a slot once it has room.

Two kinds of call do not wait for room, because what they would wait for can only move when they
go on (they still wait for a free slot, which the compute actor always returns):
* a call made inside a callback: the calls it would wait for need this very callback to return;
* a call whose room is taken only by results the caller holds undecided (an old-API future not
  yet `.get()`, a `tp.Callback` registrar with no callback yet) while the callback actor waits
  for such a decision: only the caller can make them go.

The register counts what is in flight and remembers the most it ever saw, so tests can check the
bound.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable


class Hold:
    """One call's claim on a register: a slot while it is fed and computed, a place in the count
    until the call is done."""

    __slots__ = ("slot", "call")

    def __init__(self, slot: Any) -> None:
        self.slot = slot
        self.call: Any = None            # the futures.Call once submitted; None while fed or run at once

    def counts(self) -> bool:
        """Whether the call still takes room: not computed yet, or its result waits for a callback
        (or for the caller to decide whether there is one)."""
        call = self.call
        if call is None or not call.computed.is_set():
            return True
        return not call.decided.is_set() or call.callback is not None

    def can_move_without_caller(self, callbacks_waiting_for_caller: bool) -> bool:
        """Whether the call leaves the count without its caller doing anything more."""
        call = self.call
        if call is None or not call.computed.is_set():
            return True
        return call.decided.is_set() and not callbacks_waiting_for_caller


class Register:
    def __init__(self, slots: list) -> None:
        self._free = deque(slots)
        self._cond = threading.Condition()
        self._holds: set[Hold] = set()
        self.capacity = len(slots)
        self.max_in_flight = 0

    @property
    def in_flight(self) -> int:
        """Calls taking room now (being fed or computed, or whose result waits for its callback)."""
        with self._cond:
            return self._count()

    def _count(self) -> int:
        return sum(1 for h in self._holds if h.counts())

    def _must_wait_for_room(self, callbacks_waiting_for_caller: Callable[[], bool]) -> bool:
        if len(self._holds) < self.capacity:      # the usual case, without looking at each call
            return False
        counted = [h for h in self._holds if h.counts()]
        if len(counted) < self.capacity:
            return False
        stalled = callbacks_waiting_for_caller()
        return any(h.can_move_without_caller(stalled) for h in counted)

    def acquire(self, wait_for_room: bool = True,
                callbacks_waiting_for_caller: Callable[[], bool] = lambda: False) -> Hold:
        """A hold with a free slot; blocks (interruptibly, e.g. by Ctrl-C) while the job's
        `concurrency_width` calls are in flight (unless `wait_for_room` is False: see the module
        docstring) and while no slot is free."""
        try:
            with self._cond:
                while not self._free or (wait_for_room and
                                         self._must_wait_for_room(callbacks_waiting_for_caller)):
                    self._cond.wait(timeout=0.1)
                hold = Hold(self._free.popleft())
                self._holds.add(hold)
                if len(self._holds) > self.max_in_flight:     # else the count cannot exceed it
                    self.max_in_flight = max(self.max_in_flight, self._count())
                return hold
        except KeyboardInterrupt:
            # Ctrl-C can land inside the `with`'s exit, after wait() took the lock back and before it
            # is released; the compute actor would then block on it forever and the exit drain with
            # it (seen about once in 25 interrupted runs).  The condition's RLock knows its owner.
            while self._cond._is_owned():    # type: ignore[attr-defined]  # private, but no public way
                self._cond.release()
            raise

    def free_slot(self, hold: Hold) -> None:
        """The step's outputs are copied out: its slot can take the next call."""
        with self._cond:
            if hold.slot is not None:
                self._free.append(hold.slot)
                hold.slot = None
            self._cond.notify_all()

    def finish(self, hold: Hold) -> None:
        """The call is done (its callback returned, or it has none): it leaves the count."""
        with self._cond:
            if hold.slot is not None:
                self._free.append(hold.slot)
                hold.slot = None
            self._holds.discard(hold)
            self._cond.notify_all()

    def changed(self) -> None:
        """A call in flight changed (its callback was decided): waiting callers look again."""
        with self._cond:
            self._cond.notify_all()

    def reset_after_fork(self, slots: list) -> None:
        """In a forked child: the parent's calls in flight never finish here, so every slot is free
        and the lock is new (a thread of the parent may have held it at the fork)."""
        self._free = deque(slots)
        self._cond = threading.Condition()
        self._holds = set()
