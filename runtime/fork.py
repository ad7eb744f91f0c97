"""What a forked child (multiprocessing's default start method on Linux) must not inherit.

`os.fork()` copies the process but only the thread that called it.  The child gets the
parent's sessions, jobs and loaded steps, but none of their threads: the pipeline's actors,
the register's waiting callers, and libgomp's OpenMP team of the forking thread.  Without
the hooks below, the child's first asynchronous call waits forever for an actor that does not
exist, and its first synchronous step on the forking thread waits forever for OpenMP workers
that do not exist (libgomp, unlike LLVM's libomp, does not rebuild its team after fork).

* Before the fork, the forking thread takes every session's step lock (waiting for the step in
  progress), so the child's copy of the variables is between two whole steps, and no lock a
  parent thread held is copied held.
* In the child: the parent's calls in flight fail (their futures raise, naming the parent),
  every pipeline, register and job lock is new, and the next call starts new actors.
* OpenMP: new threads build a new team, so the child's steps run on them at full width: a
  synchronous call made by the forking thread runs on the compute actor instead of on the
  caller (`openmp_unsafe_here`).  Anything else that runs a step on the forking thread (a
  tool calling `LoadedStep.run`) runs with one OpenMP thread there (`flowc_set_num_threads`,
  exported by the core library), slower but never hung.

A CUDA context does not survive fork either; a child that runs GPU jobs should use the
'spawn' start method, as CUDA's own documentation says.
"""
from __future__ import annotations

import os
import threading

_unsafe_thread: int | None = None    # in a forked child: the thread that forked (its OpenMP team is gone)
_held: list = []                    # the step locks taken before the fork, released after it


def openmp_unsafe_here() -> bool:
    """Whether this thread forked this (child) process after OpenMP may have run on it."""
    return _unsafe_thread is not None and threading.get_ident() == _unsafe_thread


def _before_fork() -> None:
    from flowc.runtime.job import build_lock
    from flowc.runtime.pipeline import _pipelines
    build_lock().acquire()          # no trace or step load half done in the child
    _held.append(build_lock())
    for pipeline in list(_pipelines):
        if pipeline._abandoned:     # after Ctrl-C at exit its lock stays held: nothing runs anyway
            continue
        lock = pipeline._compute_lock
        lock.acquire()
        _held.append(lock)


def _release_held() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_parent() -> None:
    _release_held()


def _after_fork_in_child() -> None:
    global _unsafe_thread
    _release_held()                 # the forking thread took them, and it is this child's thread
    _unsafe_thread = threading.get_ident()
    _one_openmp_thread_here()
    from flowc.runtime.job import reset_jobs_after_fork
    from flowc.runtime.pipeline import forget_callback_after_fork
    from flowc.runtime.session import sessions_after_fork
    forget_callback_after_fork()
    for session in sessions_after_fork():
        session.reset_after_fork()
    reset_jobs_after_fork()


def _one_openmp_thread_here() -> None:
    """Limit this thread's OpenMP team to itself: libgomp's workers of the parent are gone."""
    from flowc.compiler import core_library
    # The core library links libgomp; it is loaded (and OpenMP can have run) only once a CPU
    # step was loaded.  _loaded is read, not changed.
    for library in list(core_library._loaded.values()):
        library.flowc_set_num_threads(1)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
