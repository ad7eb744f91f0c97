"""PyTorch eager: the seed models op by op, each op a call into ATen (oneDNN / MKL kernels)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from benchmarks.peers import NotApplicable, Step, torch_models
from benchmarks.workloads import Workload

configure = torch_models.configure
build_sgemm = torch_models.build_sgemm


def reset() -> None:
    pass


def build(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    return torch_models.build(workload, images, labels, compiled=False)


def build_async(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
    raise NotApplicable("PyTorch on the CPU finishes each op before the call returns: no asynchronous steps")


def build_profiled(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
    raise NotApplicable("PyTorch eager has no per-step kernel timers comparable to flowc's")


def cache_env(directory: str) -> dict[str, str] | None:
    return None


def compilations() -> int | None:
    return None
