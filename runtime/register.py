"""A register: N slots of a job's step buffers.  N is the pipeline depth and the back-pressure at once.

A call takes a free slot (waiting while all N are in flight), feeds it, and the
compute actor gives it back once the step's outputs are copied out.  The register
counts what is in flight, and remembers the most it ever saw, so tests can check
the bound.
"""
from __future__ import annotations

import threading
from collections import deque


class Register:
    def __init__(self, slots: list) -> None:
        self._free = deque(slots)
        self._cond = threading.Condition()
        self.capacity = len(slots)
        self.in_flight = 0
        self.max_in_flight = 0

    def acquire(self):
        """A free slot; blocks (interruptibly, e.g. by Ctrl-C) while the pipeline is full."""
        try:
            with self._cond:
                while not self._free:
                    self._cond.wait(timeout=0.1)
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                return self._free.popleft()
        except KeyboardInterrupt:
            # Ctrl-C can land inside the `with`'s exit, after wait() took the lock back and before it
            # is released; the compute actor would then block on it forever and the exit drain with
            # it (seen about once in 25 interrupted runs).  The condition's RLock knows its owner.
            while self._cond._is_owned():    # type: ignore[attr-defined]  # private, but no public way
                self._cond.release()
            raise

    def release(self, slot) -> None:
        with self._cond:
            self.in_flight -= 1
            self._free.append(slot)
            self._cond.notify()
