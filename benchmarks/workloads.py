"""What every framework runs: the seed models' steps, their FLOP counts, and the one batch they all use.

FLOPs count 2 per multiply-add of the GEMMs and convolutions only (the elementwise work, the loss
and the optimizer update are a few percent at most); that is the work a GEMM ceiling bounds, so
GFLOP/s against the measured sgemm ceiling is a fair roofline.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

BATCH = 100
CLASSES = 10
LEARNING_RATE = 0.1         # both seeds: SGD, momentum 0, PiecewiseConstantScheduler([], [0.1])
DROPOUT_RATE = 0.5          # the LeNet train seed's dropout after dense1
INIT_STDDEV = 0.1           # flow.truncated_normal(0.1) in both seeds; biases start at 0
SGEMM_SIZE = 2048           # n of the n x n x n product that measures the machine's sgemm ceiling

# The seed LeNet: conv 5x5 SAME (1->32), pool 2, conv 5x5 SAME (32->64), pool 2, dense 3136->512, dense 512->10.
LENET_CONV = ((1, 32, 28), (32, 64, 14))    # (in channels, out channels, output height = width)
LENET_KERNEL = 5
LENET_FLAT = 64 * 7 * 7
MLP_IN, MLP_HIDDEN = 28 * 28, 512


@dataclass(frozen=True)
class Workload:
    name: str      # e.g. "mlp_train"; the key every framework module and the report use
    model: str     # "mlp" or "lenet"
    mode: str      # "train" (forward, backward, SGD update, loss to host) or "predict" (logits to host)
    gflop: float   # per step

    @property
    def title(self) -> str:
        return f"{'MLP' if self.model == 'mlp' else 'LeNet'} {self.mode}"


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def dense_flops(batch: int, n_in: int, n_out: int, mode: str, needs_input_grad: bool) -> int:
    """Forward product; in training also the weight gradient and (unless the input is data) the input gradient."""
    one = gemm_flops(batch, n_out, n_in)
    if mode == "predict":
        return one
    return one * (3 if needs_input_grad else 2)


def conv_flops(batch: int, c_in: int, c_out: int, out_hw: int, kernel: int, mode: str, needs_input_grad: bool) -> int:
    one = 2 * batch * c_out * out_hw * out_hw * c_in * kernel * kernel
    if mode == "predict":
        return one
    return one * (3 if needs_input_grad else 2)


def mlp_flops(mode: str, batch: int = BATCH) -> int:
    return (dense_flops(batch, MLP_IN, MLP_HIDDEN, mode, needs_input_grad=False)
            + dense_flops(batch, MLP_HIDDEN, CLASSES, mode, needs_input_grad=True))


def lenet_flops(mode: str, batch: int = BATCH) -> int:
    total = 0
    for i, (c_in, c_out, hw) in enumerate(LENET_CONV):
        total += conv_flops(batch, c_in, c_out, hw, LENET_KERNEL, mode, needs_input_grad=i > 0)
    total += dense_flops(batch, LENET_FLAT, 512, mode, needs_input_grad=True)
    total += dense_flops(batch, 512, CLASSES, mode, needs_input_grad=True)
    return total


def _workload(model: str, mode: str) -> Workload:
    flops = mlp_flops(mode) if model == "mlp" else lenet_flops(mode)
    return Workload(f"{model}_{mode}", model, mode, flops / 1e9)


STEP_WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    _workload("mlp", "train"), _workload("mlp", "predict"),
    _workload("lenet", "train"), _workload("lenet", "predict"))}

# First-call latency is measured on the train jobs: they are the largest programs to compile.
LATENCY_WORKLOADS = ("mlp_train", "lenet_train")
# Async vs sync with host work: the MLP train step is short enough for the overlap to matter.
ASYNC_WORKLOADS = ("mlp_train",)


def sgemm_gflop(n: int = SGEMM_SIZE) -> float:
    return gemm_flops(n, n, n) / 1e9


@lru_cache(maxsize=1)
def batch() -> tuple[np.ndarray, np.ndarray]:
    """The first batch of the embedded MNIST sample: images float32 (100, 1, 28, 28) in [0, 1], labels int32.

    Every framework gets the same arrays; each step takes them as NumPy arrays and hands its
    results back as NumPy arrays, as a flowc job call does.
    """
    from flowc.runtime.datasets import load_mnist_sample     # NumPy only: safe in every framework's process
    (images, labels), _ = load_mnist_sample(BATCH)
    first_images = np.ascontiguousarray(images[0], dtype=np.float32)
    first_labels = np.ascontiguousarray(labels[0], dtype=np.int32)
    return first_images, first_labels
