"""The ResNet-18-style block workload: its FLOP count, flowc's job trains it, and PyTorch's and
JAX's models compute the same function (each skipped where its framework is not installed).

The jobs run on small shapes (batch 4, 8x8 images): the network is the benchmark's, only the batch
and the image size differ.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import flow
from benchmarks.peers.flowc_resnet import block_jobs
from flowc.runtime.session import default_session
from benchmarks.workloads import (CLASSES, RESNET_BATCH, RESNET_CONVS, RESNET_IN, STEP_WORKLOADS, batch_for,
                                  resnet_block_flops)

BATCH, HW = 4, 8


@pytest.fixture(scope="module")
def jobs():
    return block_jobs(BATCH, HW)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    images = rng.standard_normal((BATCH, RESNET_IN, HW, HW), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    return images, labels


def test_flops_count_the_four_convolutions_and_the_dense_layer():
    b = RESNET_BATCH
    forward = [2 * b * 64 * 32 * 32 * 3 * 9,       # stem 3x3, 3 -> 64 at 32x32
               2 * b * 128 * 16 * 16 * 64 * 9,     # conv1 3x3 stride 2, 64 -> 128, out 16x16
               2 * b * 128 * 16 * 16 * 128 * 9,    # conv2 3x3, 128 -> 128 at 16x16
               2 * b * 128 * 16 * 16 * 64,         # shortcut 1x1 stride 2, 64 -> 128
               2 * b * 10 * 128]                   # dense 128 -> 10
    assert resnet_block_flops("predict") == sum(forward)
    # training: forward, weight gradient, and the input gradient for all but the stem (its input is data)
    assert resnet_block_flops("train") == 2 * forward[0] + 3 * sum(forward[1:])
    assert STEP_WORKLOADS["resnet_block_train"].batch == RESNET_BATCH
    assert round(STEP_WORKLOADS["resnet_block_train"].gflop, 2) == 11.50
    images, labels = batch_for("resnet_block_train")
    assert images.shape == (RESNET_BATCH, RESNET_IN, 32, 32) and images.dtype == np.float32
    assert labels.shape == (RESNET_BATCH,) and labels.dtype == np.int32 and labels.max() < CLASSES
    assert [c[0] for c in RESNET_CONVS] == ["stem", "conv1", "conv2", "shortcut"]


def test_flowc_block_trains_and_predicts(jobs, data):
    flow.clear_default_session()
    train_job, predict_job = jobs
    images, labels = data
    losses = [train_job(images, labels).item() for _ in range(12)]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses          # momentum SGD memorises one small batch
    logits = predict_job(images)
    assert logits.shape == (BATCH, CLASSES) and np.isfinite(logits).all()
    names = set(train_job.graph.variables)
    assert {"stem-weight", "conv1_bn-moving_mean", "shortcut-weight", "conv2_bn-gamma-momentum", "fc-weight"} <= names
    assert "conv1-bias" not in names                      # no bias before batch norm
    moving = default_session().value("conv1_bn-moving_mean")
    assert np.abs(moving).max() > 0                       # training updated the running statistics
    flow.clear_default_session()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_pytorch_model_computes_the_same_function(jobs, data):
    import torch

    from benchmarks.peers.torch_models import make_model
    flow.clear_default_session()
    train_job, predict_job = jobs
    images, labels = data
    logits = predict_job(images)                          # moving mean 0, variance 1: both models
    values = {name: default_session().value(name).copy() for name in predict_job.graph.variables}
    model = make_model("resnet_block")
    with torch.no_grad():
        for name, _, _, _, _, _, _ in RESNET_CONVS:
            getattr(model, name)[0].weight.copy_(torch.from_numpy(values[f"{name}-weight"]))
        model.fc.weight.copy_(torch.from_numpy(values["fc-weight"]))     # (out, in) in both
        model.fc.bias.copy_(torch.from_numpy(values["fc-bias"]))
    model.eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    model.train()                                         # batch statistics, as the train job uses
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(images)), torch.from_numpy(labels).long())
    np.testing.assert_allclose(train_job(images, labels).item(), float(loss), rtol=1e-4)
    flow.clear_default_session()


@pytest.mark.slow          # JAX's op-by-op dispatch compiles each op: ~10 s on 2 cores
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_jax_model_computes_the_same_function(jobs, data):
    import jax.numpy as jnp

    from benchmarks.peers import jax_jit
    flow.clear_default_session()
    train_job, predict_job = jobs
    images, labels = data
    logits = predict_job(images)
    value = default_session().value
    params, stats = jax_jit.init_resnet()
    for name, _, _, _, _, _, _ in RESNET_CONVS:
        params[name + "_w"] = jnp.asarray(value(f"{name}-weight"))
        params[name + "_gamma"] = jnp.asarray(value(f"{name}_bn-gamma"))
        params[name + "_beta"] = jnp.asarray(value(f"{name}_bn-beta"))
    params["fc_w"] = jnp.asarray(value("fc-weight").T)      # x @ W in JAX: (in, out)
    params["fc_b"] = jnp.asarray(value("fc-bias"))
    np.testing.assert_allclose(logits, np.asarray(jax_jit.resnet_predict_step(params, stats, images)),
                               rtol=1e-4, atol=1e-4)
    expected, new_stats = jax_jit.resnet_logits(params, stats, images, train=True)
    log_p = np.log(np.exp(expected - expected.max(1, keepdims=True)).sum(1)) + np.asarray(expected.max(1))
    loss = float(np.mean(log_p - np.asarray(expected)[np.arange(BATCH), labels]))
    np.testing.assert_allclose(train_job(images, labels).item(), loss, rtol=1e-4)
    np.testing.assert_allclose(value("conv1_bn-moving_mean"), np.asarray(new_stats["conv1_mean"]), rtol=1e-3,
                               atol=1e-5)
    flow.clear_default_session()
