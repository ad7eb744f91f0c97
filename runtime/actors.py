"""Actors: a thread with an inbox, handling one message at a time in arrival order.

A session has two: the compute actor runs steps (in call order, so jobs that share
variables see each other's updates in that order) and hands each finished call to
the callback actor, which runs the user's callbacks on its own thread, also in call
order.  Keeping callbacks off the compute thread lets the next step run while
Python handles the last one's results.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_STOP = object()


class Actor:
    """A daemon thread that calls `handle(message)` for each posted message, in order."""

    def __init__(self, name: str, handle: Callable[[Any], None]) -> None:
        self.name = name
        self._handle = handle
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def post(self, message: Any) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
        self._inbox.put(message)

    def _loop(self) -> None:
        while True:
            message = self._inbox.get()
            if message is _STOP:
                return
            self._handle(message)

    def stop(self) -> None:
        """Finish what was posted, then end the thread and wait for it."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._inbox.put(_STOP)
            if thread is not threading.current_thread():
                thread.join()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
