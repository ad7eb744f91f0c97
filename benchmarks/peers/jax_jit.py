"""JAX: the seed models and the ResNet block as pure functions, each step one `jax.jit` program (XLA CPU).

Same models as the seeds and benchmarks/peers/flowc_resnet.py (see torch_models for the list).
The train step returns the updated parameters and donates the old ones, so XLA may update them in
place, as flowc does.  Dropout draws its mask from a key folded with the step number, as flowc's
does from its step counter.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.peers import NotApplicable, Step
from benchmarks.workloads import (BERT_ZOO, BN_EPSILON, BN_MOMENTUM, CLASSES, DROPOUT_RATE, INIT_STDDEV, LEARNING_RATE,
                                  LENET_FLAT, LENET_KERNEL, MLP_HIDDEN, MLP_IN, RESNET_CONVS, RESNET_FEATURES,
                                  RESNET_LEARNING_RATE, RESNET_MOMENTUM, RESNET_ZOO, Workload)

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


# The ResNet block: trained parameters, and the batch norms' moving statistics (updated, not trained).
_RESNET_GEOMETRY = {name: (stride, kernel // 2) for name, _, _, kernel, stride, _, _ in RESNET_CONVS}


def init_resnet() -> tuple[Params, Params]:
    """(parameters, moving statistics) of the block, drawn as the other models' are."""
    rng = np.random.default_rng(0)
    params: Params = {}
    stats: Params = {}
    for name, c_in, c_out, kernel, _, _, _ in RESNET_CONVS:
        params[name + "_w"] = jnp.asarray(_weight(rng, (c_out, c_in, kernel, kernel)))
        params[name + "_gamma"] = jnp.ones(c_out, jnp.float32)
        params[name + "_beta"] = jnp.zeros(c_out, jnp.float32)
        stats[name + "_mean"] = jnp.zeros(c_out, jnp.float32)
        stats[name + "_var"] = jnp.ones(c_out, jnp.float32)
    params["fc_w"] = jnp.asarray(_weight(rng, (RESNET_FEATURES, CLASSES)))
    params["fc_b"] = jnp.zeros(CLASSES, jnp.float32)
    return params, stats


def _conv_bn(params: Params, stats: Params, new_stats: Params, x: jax.Array, name: str, train: bool) -> jax.Array:
    stride, pad = _RESNET_GEOMETRY[name]
    y = lax.conv_general_dilated(x, params[name + "_w"], (stride, stride), ((pad, pad), (pad, pad)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    if train:                   # batch statistics (biased variance), and the moving ones updated from them
        mean, var = y.mean((0, 2, 3)), y.var((0, 2, 3))
        for key, batch_value in (("_mean", mean), ("_var", var)):
            new_stats[name + key] = (BN_MOMENTUM * stats[name + key]
                                     + (1 - BN_MOMENTUM) * lax.stop_gradient(batch_value))
    else:
        mean, var = stats[name + "_mean"], stats[name + "_var"]
    scale = params[name + "_gamma"] * lax.rsqrt(var + BN_EPSILON)
    return (y - mean[None, :, None, None]) * scale[None, :, None, None] + params[name + "_beta"][None, :, None, None]


def resnet_logits(params: Params, stats: Params, x: jax.Array, train: bool) -> tuple[jax.Array, Params]:
    """Forward pass of the block; (logits, the moving statistics after this step)."""
    new_stats: Params = dict(stats)
    h = jax.nn.relu(_conv_bn(params, stats, new_stats, x, "stem", train))
    residual = jax.nn.relu(_conv_bn(params, stats, new_stats, h, "conv1", train))
    residual = _conv_bn(params, stats, new_stats, residual, "conv2", train)
    y = jax.nn.relu(residual + _conv_bn(params, stats, new_stats, h, "shortcut", train))
    return y.mean((2, 3)) @ params["fc_w"] + params["fc_b"], new_stats


@partial(jax.jit, donate_argnums=(0, 1, 2))
def resnet_train_step(params: Params, velocity: Params, stats: Params, x: jax.Array,
                      y: jax.Array) -> tuple[Params, Params, Params, jax.Array]:
    def loss_of(p: Params) -> tuple[jax.Array, Params]:
        logits, new_stats = resnet_logits(p, stats, x, train=True)
        log_p = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_p, y[:, None], axis=1)), new_stats
    (loss, new_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    velocity = jax.tree.map(lambda v, g: RESNET_MOMENTUM * v + g, velocity, grads)
    params = jax.tree.map(lambda w, v: w - RESNET_LEARNING_RATE * v, params, velocity)
    return params, velocity, new_stats, loss


@jax.jit
def resnet_predict_step(params: Params, stats: Params, x: jax.Array) -> jax.Array:
    return resnet_logits(params, stats, x, train=False)[0]


def _build_resnet(workload: Workload, images: np.ndarray, labels: np.ndarray) -> Step:
    params, stats = init_resnet()
    if workload.mode == "predict":
        return lambda: np.asarray(resnet_predict_step(params, stats, images))
    state = {"params": params, "velocity": jax.tree.map(jnp.zeros_like, params), "stats": stats}

    def step() -> np.ndarray:
        state["params"], state["velocity"], state["stats"], loss = resnet_train_step(
            state["params"], state["velocity"], state["stats"], images, labels)
        return np.asarray(loss)
    return step


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
    if workload.model == "wide_and_deep":
        raise NotApplicable("jax.grad of a gather is a dense (10^6, 16) table: JAX has no sparse embedding "
                            "update to compare with this workload's")
    if workload.model in RESNET_ZOO:
        raise NotApplicable("no JAX model of the zoo's ResNet-18 / ResNet-50 is written: PyTorch is their peer")
    if workload.model in BERT_ZOO:
        raise NotApplicable("no JAX model of the zoo's BERT is written: PyTorch is its peer")
    if workload.model == "resnet_block":
        return _build_resnet(workload, images, labels)
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
