"""The kernel cache's file locks: waits that say whom they wait for and give up, and entry pins.

Two flock files per key live under ``<root>/locks/`` (compiler/cache.py):

* ``<key>.lock`` is held exclusively by a process that builds, repairs or clears the entry.  The
  holder writes ``<pid> <host>`` into it, so a process that waits can say whom it waits for.
* ``<key>.use`` is held shared by every process that was handed the entry (a "pin"), from the
  lookup until the process exits.  `flowc cache clear` removes an entry only when it can take this
  lock exclusively, so it never deletes a library that a running process is about to load.

flock, not lock-by-creating-a-file: the kernel drops the lock when a process dies, so a crashed
compile never wedges the cache.  A live process that hangs while holding a lock is what the
timeout is for: after `PROGRESS_AFTER_SECONDS` a waiter prints whom it waits for, and after
``$FLOWC_LOCK_TIMEOUT`` seconds it raises `LockTimeout` naming the holder's pid.  Waits poll with
LOCK_NB (a blocking flock cannot be given a timeout from a thread).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Iterator

from flowc.compiler import settings

__all__ = ["LockTimeout", "PROGRESS_AFTER_SECONDS", "Pins", "exclusive", "holder", "try_exclusive"]

# A wait longer than this prints one line naming the holder (a compile takes about a second).
PROGRESS_AFTER_SECONDS = 5.0
# A process keeps at most this many pins: an entry it took long ago was loaded long ago.
MAX_PINS = 64


class LockTimeout(TimeoutError):
    """Waited ``$FLOWC_LOCK_TIMEOUT`` seconds for a cache lock; the message names the holder."""


def _holder_text() -> str:
    return f"{os.getpid()} {socket.gethostname()}\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:        # alive, another user's
        return True
    return True


def holder(path: Path) -> str:
    """Who holds the lock file `path`, in words: ``"process 1234 (running)"``, or an unknown process."""
    try:
        fields = path.read_text().split()
    except OSError:
        fields = []
    if not fields or not fields[0].isdigit():
        return "another process (it did not record its pid)"
    pid, host = int(fields[0]), fields[1] if len(fields) > 1 else ""
    if host and host != socket.gethostname():
        return f"process {pid} on host {host}"
    state = "running" if _alive(pid) else "no longer running"
    return f"process {pid} ({state}{', this process' if pid == os.getpid() else ''})"


def _wait(f: IO, operation: int, path: Path, what: str) -> None:
    """Take flock `operation` on `f`, polling; print progress, then raise LockTimeout, naming the holder."""
    timeout = settings.lock_timeout()
    start = time.monotonic()
    delay, told = 0.005, False
    while True:
        try:
            fcntl.flock(f.fileno(), operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            raise LockTimeout(
                f"gave up after {waited:.0f} s waiting for {what}: {holder(path)} holds its lock {path}. "
                f"If that process is stuck, end it; set FLOWC_LOCK_TIMEOUT to wait longer (0 waits forever).")
        if not told and waited >= PROGRESS_AFTER_SECONDS:
            limit = f"gives up after {timeout:.0f} s" if timeout is not None else "waits without a limit"
            print(f"[flowc] waiting for {what}: {holder(path)} holds its lock {path} "
                  f"(flowc {limit}; FLOWC_LOCK_TIMEOUT sets that)", file=sys.stderr, flush=True)
            told = True
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


@contextlib.contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold the lock file `path` exclusively, waiting as `_wait` says; `what` names the entry in messages."""
    with open(path, "a+") as f:
        _wait(f, fcntl.LOCK_EX, path, what)
        try:
            _record_holder(f)
            yield
        finally:
            with contextlib.suppress(OSError):
                f.truncate(0)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def try_exclusive(path: Path) -> Iterator[bool]:
    """Hold `path` exclusively if no one else holds it now; yields whether it did (never waits)."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            _record_holder(f)
            yield True
        finally:
            with contextlib.suppress(OSError):
                f.truncate(0)
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _record_holder(f: IO) -> None:
    f.seek(0)
    f.truncate(0)
    f.write(_holder_text())
    f.flush()


class Pins:
    """The entries this process was handed, each held by a shared flock on its ``.use`` file (see above).

    One per process (compiler/cache.py's), not per cache object: a cache object may be dropped
    long before the library it handed out is loaded.
    """

    def __init__(self) -> None:
        self._files: OrderedDict[str, IO] = OrderedDict()
        self._lock = threading.Lock()

    def pin(self, path: Path, what: str) -> None:
        """Hold the ``.use`` file `path` shared (once; the oldest pin goes beyond `MAX_PINS`)."""
        key = str(path)
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
                return
        f = open(path, "a")
        try:
            _wait(f, fcntl.LOCK_SH, path, what)
        except BaseException:
            f.close()
            raise
        with self._lock:
            if key in self._files:       # another thread pinned it meanwhile
                f.close()
                return
            self._files[key] = f
            while len(self._files) > MAX_PINS:
                self._files.popitem(last=False)[1].close()

    def release(self, path: Path) -> None:
        """Drop the pin on `path`, if held."""
        with self._lock:
            f = self._files.pop(str(path), None)
        if f is not None:
            f.close()

    def release_all(self) -> None:
        """Drop every pin (closing the file drops its flock)."""
        with self._lock:
            files, self._files = list(self._files.values()), OrderedDict()
        for f in files:
            f.close()

    def __del__(self) -> None:
        self.release_all()
