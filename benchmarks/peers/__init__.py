"""The frameworks a benchmark run compares, one module each, all with the same small interface.

A module is loaded only in the process that benchmarks it (OpenMP runtimes must not share a
process), so nothing here imports a framework: `unavailable` asks the import system whether the
framework is installed without importing it.

Every step a module builds takes the shared NumPy batch and returns NumPy arrays, as a flowc job
call does, so copies in and out are part of every framework's step.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:      # importing NumPy here would start its BLAS before the thread settings are made
    import numpy as np

    from benchmarks.workloads import Workload

Step = Callable[[], object]

# Report order: flowc first, then its peers.
FRAMEWORKS: dict[str, str] = {
    "flowc": "benchmarks.peers.flowc_jobs",
    "reference": "benchmarks.peers.reference",
    "torch_eager": "benchmarks.peers.torch_eager",
    "torch_compile": "benchmarks.peers.torch_compile",
    "jax_jit": "benchmarks.peers.jax_jit",
}
LABELS: dict[str, str] = {
    "flowc": "flowc",
    "reference": "NumPy reference executor",
    "torch_eager": "PyTorch eager",
    "torch_compile": "torch.compile",
    "jax_jit": "JAX jit",
    "flowc_c": "flowc library from C",
}
# The serving row's exported library (benchmarks/serve.py): timed in flowc's process, labelled apart.
C_FRAMEWORK = "flowc_c"
_REQUIRES: dict[str, str] = {"torch_eager": "torch", "torch_compile": "torch", "jax_jit": "jax"}


class NotApplicable(Exception):
    """The framework has no version of this workload worth timing (the test skips with this reason)."""


class Peer(Protocol):
    """What each module in this package provides (as module-level functions)."""

    def configure(self, threads: int) -> None:
        """Set the framework's own thread count; called once, before anything is built."""

    def reset(self) -> None:
        """Drop state between tests (flowc: a fresh session)."""

    def build(self, workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
        """A step of `workload` on this batch; its first call may trace and compile."""

    def build_profiled(self, workload: Workload, images: np.ndarray,
                       labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
        """(a step built with per-kernel timers, seconds spent inside its kernels so far); raises
        NotApplicable where the framework cannot tell kernel time from call time."""

    def build_sgemm(self, n: int) -> Step:
        """One float32 n x n x n product through the framework's own GEMM."""

    def build_async(self, workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
        """(submit a step without waiting for it, wait for every step submitted)."""

    def cache_env(self, directory: str) -> dict[str, str] | None:
        """Environment that puts the framework's on-disk compile cache in `directory`; None if it has none."""

    def compilations(self) -> int | None:
        """Compilations this process has made, where the framework counts them; else None."""


def unavailable(framework: str) -> str | None:
    """Why `framework` cannot run here (not installed), or None if it can."""
    if framework not in FRAMEWORKS:
        return f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}"
    package = _REQUIRES.get(framework)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install -e '.[bench]')"
    return None


def load(framework: str) -> Peer:
    """Import the module of `framework`; check `unavailable` first."""
    return importlib.import_module(FRAMEWORKS[framework])  # type: ignore[return-value]
