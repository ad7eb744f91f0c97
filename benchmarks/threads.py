"""Give every framework the same number of threads on the same cores.

Thread-count variables only work if they are set before a runtime starts, so the driver puts them
in each child's environment and `pin` sets them again in-process (for a direct pytest run) before
any framework is imported.  XLA has no thread-count switch for its CPU client but sizes its pool
from the CPUs the process may run on, so the process is also pinned to `threads` CPUs; that
bounds every runtime the same way, whatever its own defaults are.
"""
from __future__ import annotations

import os

DEFAULT_THREADS = 2
_COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_env(threads: int) -> dict[str, str]:
    """The environment variables that set OpenMP, MKL and OpenBLAS to `threads` threads."""
    return {name: str(threads) for name in _COUNT_VARIABLES}


def pinned_cpus(threads: int) -> list[int]:
    """The CPUs `pin` uses: the first `threads` of those this process may run on."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))[:threads]


def pin(threads: int) -> list[int]:
    """Set the thread-count variables and restrict this process to `threads` CPUs; return them."""
    os.environ.update(thread_env(threads))
    cpus = pinned_cpus(threads)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    return cpus
