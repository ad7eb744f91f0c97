"""flowc: the seed programs' own job functions, called as a user calls them.

The jobs come from the example files unchanged (the LeNet seeds keep their "gpu" placement, which
runs on the CPU with a warning that is silenced here), so the benchmark times exactly what the
seeds compile.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import types
import warnings
from functools import cache
from typing import Any, Callable

import numpy as np

import flow
import flow.typing as tp
from benchmarks.peers import NotApplicable, Step
from benchmarks.workloads import BERT_ZOO, Workload

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

# workload -> (example file under examples/, job function name)
JOBS: dict[str, tuple[str, str]] = {
    "mlp_train": ("mlp_train_demo", "train_job"),
    "mlp_predict": ("mlp_train_demo", "eval_job"),
    "lenet_train": ("seeds/synchronize_single_job", "train_job"),
    "lenet_predict": ("seeds/synchronize_batch_job", "eval_job"),
}
# The same MLP train job returning tp.Callback[tp.Numpy]: calls return at once.
ASYNC_JOBS: dict[str, tuple[str, str]] = {"mlp_train": ("seeds/async_single_job", "train_job")}


@cache
def load_example(name: str) -> types.ModuleType:
    """Import examples/<name>.py without running its __main__ part (its folder goes on sys.path: the
    model zoo's scripts import their neighbour progress.py)."""
    path = EXAMPLES / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("bench_" + name.replace("/", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def job(workload_name: str, table: dict[str, tuple[str, str]] = JOBS) -> Any:
    """The job function (not yet traced) that runs `workload_name`."""
    if table is JOBS and workload_name == "wide_and_deep_train":
        from benchmarks.peers.flowc_wide_and_deep import train_job    # the model zoo's example, at the bench's size
        return train_job()
    if table is JOBS and workload_name in ("resnet18_train", "resnet50_predict"):
        from benchmarks.peers.flowc_resnet_models import zoo_jobs    # the model zoo's example, at the bench's size
        train_job, predict_job = zoo_jobs(workload_name.split("_")[0])
        return train_job if workload_name.endswith("_train") else predict_job
    if table is JOBS and workload_name in ("bert_small_train", "bert_small_predict"):
        from benchmarks.peers.flowc_bert import bert_jobs    # the model zoo's example, at the bench's size
        train_job, predict_job = bert_jobs(workload_name.rsplit("_", 1)[0])
        return train_job if workload_name.endswith("_train") else predict_job
    if table is JOBS and workload_name.startswith("resnet_block_"):
        from benchmarks.peers.flowc_resnet import block_jobs     # written for the benchmark: no seed has it
        train_job, predict_job = block_jobs()
        return train_job if workload_name.endswith("_train") else predict_job
    if workload_name not in table:
        raise NotApplicable(f"flowc has no job for {workload_name}")
    example, function = table[workload_name]
    return getattr(load_example(example), function)


def configure(threads: int) -> None:
    # The compiled steps use OpenMP, which reads OMP_NUM_THREADS (set by benchmarks.threads.pin).
    warnings.filterwarnings("ignore", message=".*no CUDA backend.*")


def reset() -> None:
    flow.clear_default_session()


def build(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    train_or_eval = job(workload.name)
    inputs = arguments(workload, images, labels)
    return lambda: train_or_eval(*inputs)


def arguments(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the job of `workload` takes: the seeds' and the zoo ResNets' jobs take both, the ResNet
    block's predict job images only, Wide & Deep (labels, dense, wide ids, deep ids) (its "images" are
    the three feature arrays), BERT its four input arrays then its three target arrays (both of its
    jobs take all seven)."""
    if workload.model == "resnet_block" and workload.mode == "predict":
        return (images,)
    if workload.model == "wide_and_deep":
        return (labels, *images)
    if workload.model in BERT_ZOO:
        return (*images, *labels)
    return images, labels


def build_profiled(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
    """The job of `workload` compiled with FLOWC_PROFILE=1 (a timer around every kernel), and the
    seconds its kernels have run so far, summed from `job.profile()`.

    The timers cost two clock reads per kernel (well under a microsecond per MLP predict step).
    """
    train_or_eval = job(workload.name)
    inputs = arguments(workload, images, labels)
    previous = os.environ.get("FLOWC_PROFILE")
    os.environ["FLOWC_PROFILE"] = "1"          # read when the job compiles, at its first call
    try:
        train_or_eval(*inputs)
    finally:
        if previous is None:
            del os.environ["FLOWC_PROFILE"]
        else:
            os.environ["FLOWC_PROFILE"] = previous

    def kernel_seconds() -> float:
        # job.profile(): a header, then "<kernel> <seconds> <share>" per kernel
        return sum(float(line.rsplit(maxsplit=2)[1]) for line in train_or_eval.profile().splitlines()[1:])
    return (lambda: train_or_eval(*inputs)), kernel_seconds


def build_sgemm(n: int) -> Step:
    """A predict job of one n x n x n product of two variables.

    Reducing the product to a scalar keeps the copy-out off the timing (one extra pass over C,
    about 1/n of the GEMM's work).
    """
    @flow.global_function(type="predict")
    def sgemm_job(scale: tp.Numpy.Placeholder((1,), dtype=flow.float)) -> tp.Numpy:
        init = flow.random_uniform_initializer()
        a = flow.get_variable("bench_sgemm_a", shape=(n, n), dtype=flow.float, initializer=init, trainable=False)
        b = flow.get_variable("bench_sgemm_b", shape=(n, n), dtype=flow.float, initializer=init, trainable=False)
        return flow.math.reduce_sum(flow.matmul(a, b), axis=[0, 1]) * scale

    one = np.ones(1, dtype=np.float32)
    return lambda: sgemm_job(one)


def _ignore(_: object) -> None:
    pass


def build_async(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
    async_job = job(workload.name, ASYNC_JOBS)
    return (lambda: async_job(images, labels)(_ignore)), flow.sync_default_session


def cache_env(directory: str) -> dict[str, str] | None:
    return {"FLOWC_CACHE_DIR": directory}


def compilations() -> int | None:
    return flow.compile_cache_stats()["compilations"]
