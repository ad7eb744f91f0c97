"""torch.compile (default mode: TorchDynamo + Inductor's C++/OpenMP code generation) of the seed models."""
from __future__ import annotations

from typing import Callable

import numpy as np

from benchmarks.peers import NotApplicable, Step, torch_models
from benchmarks.workloads import Workload

configure = torch_models.configure


def reset() -> None:
    # Each test builds new models; forgetting the old guards keeps recompilation limits out of the way.
    import torch
    torch._dynamo.reset()


def build(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    return torch_models.build(workload, images, labels, compiled=True)


def build_sgemm(n: int) -> Step:
    raise NotApplicable("torch.compile calls the same MKL sgemm as PyTorch eager (measured there)")


def build_async(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
    raise NotApplicable("compiled PyTorch steps on the CPU return when they are done: no asynchronous steps")


def build_profiled(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
    raise NotApplicable("torch.compile has no per-step kernel timers comparable to flowc's")


def cache_env(directory: str) -> dict[str, str] | None:
    # Inductor's FX-graph and AOTAutograd caches (on by default) and its built kernels live here.
    return {"TORCHINDUCTOR_CACHE_DIR": directory}


def compilations() -> int | None:
    """Inductor graphs compiled from scratch in this process (FX-graph cache misses)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["fxgraph_cache_miss"])
