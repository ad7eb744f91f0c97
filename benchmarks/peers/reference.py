"""The NumPy reference executor (compiler/reference.py) interpreting the same seed graphs as flowc.

It is flowc's test oracle, not a product path: it shows what compiling buys over running the
same graph op by op in NumPy (whose BLAS does the GEMMs).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

import flow
from benchmarks.peers import NotApplicable, Step, flowc_jobs
from benchmarks.workloads import BERT_ZOO, LEARNING_RATE, RESNET_LEARNING_RATE, RESNET_ZOO, Workload
from flowc.compiler.reference import run_reference
from flowc.runtime.session import default_session


def configure(threads: int) -> None:
    # NumPy's BLAS reads OPENBLAS_NUM_THREADS / MKL_NUM_THREADS (set by benchmarks.threads.pin).
    flowc_jobs.configure(threads)


def reset() -> None:
    flow.clear_default_session()


def _scalars(graph, step: int, rate: float) -> dict[str, float]:
    """The runtime scalars a train graph reads, under its names ("learning_rate:float32", "train_step")."""
    values = {"learning_rate": rate, "train_step": step}
    return {name: values[name.split(":")[0]] for name in graph.scalars}


def build(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    if workload.model == "wide_and_deep":
        raise NotApplicable("the reference executor's scatter_rows returns a new table (a copy of 10^6 rows "
                            "per table and state per step): it times NumPy copies, not the model")
    if workload.model in BERT_ZOO:
        raise NotApplicable("the reference executor's NumPy step of BERT small takes seconds: the model tests "
                            "check flowc against it on the tiny config")
    if workload.model in RESNET_ZOO:
        raise NotApplicable("the reference executor's NumPy convolutions take seconds per zoo ResNet step: "
                            "the model tests check flowc against it on small configs")
    job = flowc_jobs.job(workload.name)
    inputs = list(flowc_jobs.arguments(workload, images, labels))
    rate = RESNET_LEARNING_RATE if workload.model == "resnet_block" else LEARNING_RATE
    state: dict = {}

    def step() -> list[np.ndarray]:
        if not state:        # trace at the first call, as flowc does
            graph = job.graph
            session = default_session()
            state.update(graph=graph, step=0,
                         values={name: session.value(name).copy() for name in graph.variables})
        graph = state["graph"]
        outputs, updates = run_reference(graph, inputs, state["values"], _scalars(graph, state["step"], rate))
        state["values"].update(updates)
        state["step"] += 1
        return outputs
    return step


def build_sgemm(n: int) -> Step:
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    return lambda: np.matmul(a, b, out=c)


def build_async(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
    raise NotApplicable("the reference executor has no asynchronous calls")


def build_profiled(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
    raise NotApplicable("the reference executor runs no compiled kernels")


def cache_env(directory: str) -> dict[str, str] | None:
    return None


def compilations() -> int | None:
    return None
