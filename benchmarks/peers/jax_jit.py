"""JAX: the seed models as pure functions, each step one `jax.jit` program (XLA CPU).

Same models as the seeds (see torch_models for the list).  The train step returns the updated
parameters and donates the old ones, so XLA may update them in place, as flowc does.  Dropout
draws its mask from a key folded with the step number, as flowc's does from its step counter.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.peers import NotApplicable, Step
from benchmarks.workloads import (CLASSES, DROPOUT_RATE, INIT_STDDEV, LEARNING_RATE, LENET_FLAT, LENET_KERNEL,
                                  MLP_HIDDEN, MLP_IN, Workload)

Params = dict[str, jax.Array]


def _weight(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Truncated normal (within 2 standard deviations), drawn with NumPy: initialising with
    jax.random would compile a few programs per shape, which is set-up, not the model."""
    w = rng.standard_normal(shape, dtype=np.float32)
    outside = np.abs(w) > 2.0
    while outside.any():
        w[outside] = rng.standard_normal(int(outside.sum()), dtype=np.float32)
        outside = np.abs(w) > 2.0
    return INIT_STDDEV * w


def init_params(model: str) -> Params:
    shapes: dict[str, tuple[int, ...]]
    if model == "mlp":
        shapes = {"hidden": (MLP_IN, MLP_HIDDEN), "output": (MLP_HIDDEN, CLASSES)}
    else:
        k = LENET_KERNEL
        shapes = {"conv1": (32, 1, k, k), "conv2": (64, 32, k, k), "dense1": (LENET_FLAT, 512),
                  "dense2": (512, CLASSES)}
    rng = np.random.default_rng(0)
    params: Params = {}
    for name, shape in shapes.items():
        params[name + "_w"] = jnp.asarray(_weight(rng, shape))
        params[name + "_b"] = jnp.zeros(shape[0] if name.startswith("conv") else shape[1], jnp.float32)
    return params


def _conv_relu_pool(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = jax.nn.relu(y + b[None, :, None, None])
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "SAME")


def logits_of(params: Params, x: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
    """Forward pass; `dropout_key` only for LeNet in training (the seeds' dropout after dense1)."""
    if "hidden_w" in params:
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["hidden_w"] + params["hidden_b"])
        return h @ params["output_w"] + params["output_b"]
    x = _conv_relu_pool(x, params["conv1_w"], params["conv1_b"])
    x = _conv_relu_pool(x, params["conv2_w"], params["conv2_b"])
    h = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["dense1_w"] + params["dense1_b"])
    if dropout_key is not None:
        keep = jax.random.bernoulli(dropout_key, 1.0 - DROPOUT_RATE, h.shape)
        h = jnp.where(keep, h / (1.0 - DROPOUT_RATE), 0.0)
    return h @ params["dense2_w"] + params["dense2_b"]


def mean_xent(params: Params, x: jax.Array, y: jax.Array, dropout_key: jax.Array | None) -> jax.Array:
    log_p = jax.nn.log_softmax(logits_of(params, x, dropout_key))
    return -jnp.mean(jnp.take_along_axis(log_p, y[:, None], axis=1))


@partial(jax.jit, static_argnames="dropout", donate_argnums=0)
def train_step(params: Params, x: jax.Array, y: jax.Array, step: jax.Array, dropout: bool) -> tuple[Params, jax.Array]:
    key = jax.random.fold_in(jax.random.key(0), step) if dropout else None
    loss, grads = jax.value_and_grad(mean_xent)(params, x, y, key)
    return jax.tree.map(lambda w, g: w - LEARNING_RATE * g, params, grads), loss


@jax.jit
def predict_step(params: Params, x: jax.Array) -> jax.Array:
    return logits_of(params, x, None)


def configure(threads: int) -> None:
    # XLA's CPU client sizes its thread pool from the CPUs this process may use (benchmarks.threads.pin).
    pass


def reset() -> None:
    pass


def _trainer(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, dict[str, Any]]:
    """A step that dispatches one train step and returns its loss without waiting for it."""
    state: dict[str, Any] = {"params": init_params(workload.model), "step": 0, "loss": None}
    dropout = workload.model == "lenet"

    def dispatch() -> jax.Array:
        state["params"], state["loss"] = train_step(state["params"], images, labels, state["step"], dropout=dropout)
        state["step"] += 1
        return state["loss"]
    return dispatch, state


def build(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    if workload.model not in ("mlp", "lenet"):
        raise NotApplicable(f"the JAX peer has the seed models only, not {workload.title}")
    if workload.mode == "train":
        dispatch, _ = _trainer(workload, images, labels)
        return lambda: np.asarray(dispatch())          # np.asarray waits for the step: a synchronous call
    params = init_params(workload.model)
    return lambda: np.asarray(predict_step(params, images))


def build_sgemm(n: int) -> Step:
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.random((n, n), dtype=np.float32))
    b = jnp.asarray(rng.random((n, n), dtype=np.float32))
    product = jax.jit(jnp.matmul)
    return lambda: product(a, b).block_until_ready()


def build_async(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Step]:
    if workload.mode != "train":
        raise NotApplicable("asynchronous steps are measured on train steps")
    dispatch, state = _trainer(workload, images, labels)
    return dispatch, lambda: state["loss"].block_until_ready()


def build_profiled(workload: Workload, images: np.ndarray, labels: np.ndarray) -> tuple[Step, Callable[[], float]]:
    raise NotApplicable("XLA has no per-step kernel timers comparable to flowc's")


def cache_env(directory: str) -> dict[str, str] | None:
    # The persistent cache is off unless a directory is set; by default it skips programs that
    # compile in under a second, which would leave the small MLP uncached.
    return {"JAX_COMPILATION_CACHE_DIR": directory,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def compilations() -> int | None:
    return None
