"""The model zoo's ResNet benchmark workloads (issue 15): resnet18_train and resnet50_predict.

Their FLOP counts walk the layer shapes (checked against hand counts of small networks and against
the convolutions of flowc's traced ResNet-50 / ResNet-18 graphs and of PyTorch's modules); flowc's
jobs are examples/models/resnet.py's at the stated sizes; PyTorch's network computes the same
function as flowc's (loss and predict on the same weights, small shapes).  PyTorch tests are skipped
where it is not installed.
"""
from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest

import flow
from benchmarks.workloads import (RESNET_ZOO, STEP_WORKLOADS, ResNetShape, batch_for, conv_flops, dense_flops,
                                  resnet_zoo_convs, resnet_zoo_flops)
from flowc.runtime.session import default_session

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")

# Small networks of both block kinds: every layer kind, few channels, small images.
TINY_BASIC = ResNetShape("basic", (1, 1, 1, 1), (8, 16, 16, 32), (8, 16, 16, 32), 8, 16, 2, 10,
                         learning_rate=0.05)
TINY_BOTTLENECK = ResNetShape("bottleneck", (2, 1, 1, 1), (16, 16, 24, 32), (4, 8, 8, 8), 8, 16, 2, 10)


def _data(shape: ResNetShape, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = shape.image_size
    images = rng.standard_normal((shape.batch_size, 3, s, s), dtype=np.float32)
    return images, rng.integers(0, shape.num_classes, shape.batch_size).astype(np.int32)


def test_flops_of_a_small_basic_network_by_hand():
    shape = ResNetShape("basic", (1, 1), (4, 8), (4, 8), 2, 8, 2, 3)
    b = 2
    stem = 2 * b * 2 * 4 * 4 * 3 * 49                # 7x7 stride 2, 3 -> 2, out 4x4; the max pool makes 2x2
    rest = [2 * b * 4 * 2 * 2 * 2 * 9,              # res2_0 branch2a 3x3, 2 -> 4 at 2x2
            2 * b * 4 * 2 * 2 * 4 * 9,              # res2_0 branch2b 3x3, 4 -> 4
            2 * b * 4 * 2 * 2 * 2,                  # res2_0 branch1 1x1, 2 -> 4 (the width changes)
            2 * b * 8 * 1 * 1 * 4 * 9,              # res3_0 branch2a 3x3 stride 2, 4 -> 8, out 1x1
            2 * b * 8 * 1 * 1 * 8 * 9,              # res3_0 branch2b 3x3, 8 -> 8
            2 * b * 8 * 1 * 1 * 4,                  # res3_0 branch1 1x1 stride 2, 4 -> 8
            2 * b * 3 * 8]                          # fc 8 -> 3
    assert resnet_zoo_flops(shape, "predict") == stem + sum(rest)
    assert resnet_zoo_flops(shape, "train") == 2 * stem + 3 * sum(rest)     # the stem's input is data


def test_flops_of_a_small_bottleneck_network_by_hand():
    shape = ResNetShape("bottleneck", (2,), (8,), (2,), 4, 8, 1, 3)
    forward = [2 * 4 * 4 * 4 * 3 * 49,              # stem 3 -> 4, out 4x4 (pooled to 2x2)
               2 * 2 * 4 * 4, 2 * 2 * 4 * 2 * 9, 2 * 8 * 4 * 2,      # res2_0: 1x1 4->2, 3x3 2->2, 1x1 2->8 at 2x2
               2 * 8 * 4 * 4,                                          # res2_0 branch1 1x1 4 -> 8
               2 * 2 * 4 * 8, 2 * 2 * 4 * 2 * 9, 2 * 8 * 4 * 2,      # res2_1: identity shortcut
               2 * 3 * 8]
    assert resnet_zoo_flops(shape, "predict") == sum(forward)


def test_workloads_are_registered_at_the_issues_sizes():
    r18, r50 = STEP_WORKLOADS["resnet18_train"], STEP_WORKLOADS["resnet50_predict"]
    assert (r18.batch, r18.mode, r18.title) == (32, "train", "ResNet-18 train")
    assert (r50.batch, r50.mode, r50.title) == (1, "predict", "ResNet-50 predict")
    assert len(resnet_zoo_convs(RESNET_ZOO["resnet50"])) == 53 and len(resnet_zoo_convs(RESNET_ZOO["resnet18"])) == 20
    assert round(r50.gflop / 2, 2) == 4.09          # ResNet-50's published 4.1 G multiply-adds at 224x224
    assert r18.gflop * 1e9 == resnet_zoo_flops(RESNET_ZOO["resnet18"], "train")
    for name, shape in (("resnet18_train", RESNET_ZOO["resnet18"]), ("resnet50_predict", RESNET_ZOO["resnet50"])):
        images, labels = batch_for(name)
        s = shape.image_size
        assert images.shape == (shape.batch_size, 3, s, s) and images.dtype == np.float32
        assert labels.shape == (shape.batch_size,) and labels.dtype == np.int32
        assert 0 <= labels.min() and labels.max() < shape.num_classes


def test_conv_flops_helpers_are_the_ones_the_walk_uses():
    # one 1x1 layer network isolates the walk from the helpers' formulas
    shape = ResNetShape("basic", (1,), (2,), (2,), 2, 4, 1, 2)
    convs = resnet_zoo_convs(shape)
    assert convs == [(3, 2, 7, 2, 2, False), (2, 2, 3, 1, 1, True), (2, 2, 3, 1, 1, True)]
    expected = (sum(conv_flops(1, ci, co, hw, k, "train", g) for ci, co, k, _, hw, g in convs)
                + dense_flops(1, 2, 2, "train", True))
    assert resnet_zoo_flops(shape, "train") == expected


def _graph_convs(graph) -> Counter:
    """(in, out, kernel, stride, output size) of the forward conv2d nodes of a traced flowc graph."""
    found = Counter()
    for n in graph.nodes:
        if n.op == "conv2d" and n.role == "forward":
            weight = graph.node(n.inputs[1]).type.shape
            found[(weight[1], weight[0], weight[2], dict(n.attrs)["strides"][0], n.type.shape[2])] += 1
    return found


@pytest.mark.parametrize("model", ["resnet50", "resnet18"])
def test_the_flop_walk_sees_flowcs_convolutions(model):
    from benchmarks.peers.flowc_resnet_models import zoo_jobs
    flow.clear_default_session()
    train, predict = zoo_jobs(model)
    graph = (predict if model == "resnet50" else train).graph       # traced, not compiled
    assert _graph_convs(graph) == Counter(c[:5] for c in resnet_zoo_convs(RESNET_ZOO[model]))
    flow.clear_default_session()


def test_flowc_jobs_are_the_examples_configs():
    from benchmarks.peers.flowc_jobs import arguments, job
    from benchmarks.peers.flowc_resnet_models import zoo_config
    assert zoo_config("resnet50").batch_size == 1 and zoo_config("resnet50").image_size == 224
    assert zoo_config("resnet18").batch_size == 32 and zoo_config("resnet18").block == "basic"
    with pytest.raises(AssertionError, match="not the benchmark's"):
        zoo_config("resnet18", RESNET_ZOO["resnet50"])
    images, labels = batch_for("resnet50_predict")
    assert len(arguments(STEP_WORKLOADS["resnet50_predict"], images, labels)) == 2
    assert job("resnet50_predict").__name__ == "resnet_predict" and job("resnet18_train").__name__ == "resnet_train"


@needs_torch
@pytest.mark.parametrize("model", ["resnet18", "resnet50"])
def test_pytorch_network_has_the_walks_convolutions(model):
    import torch

    from benchmarks.peers.torch_resnet import make_model
    shape = RESNET_ZOO[model]
    net = make_model(shape).eval()
    seen: Counter = Counter()

    def hook(module, _inputs, output):
        seen[(module.in_channels, module.out_channels, module.kernel_size[0], module.stride[0], output.shape[2])] += 1
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.zeros(1, 3, shape.image_size, shape.image_size))
    assert seen == Counter(c[:5] for c in resnet_zoo_convs(shape))


def _copy_into(net, values: dict[str, np.ndarray]) -> None:
    """flowc's variables (examples/models/resnet.py's names) into the PyTorch network."""
    import torch
    with torch.no_grad():
        for name, conv_bn in net.convs.items():
            conv, bn = conv_bn
            conv.weight.copy_(torch.from_numpy(values[f"Resnet-{name}-weight"]))
            for ours, theirs in (("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"),
                                 ("running_var", "moving_variance")):
                getattr(bn, ours).copy_(torch.from_numpy(values[f"Resnet-{name}_bn-{theirs}"]))
        net.fc1001.weight.copy_(torch.from_numpy(values["Resnet-fc1001-weight"]))     # (out, in) in both
        net.fc1001.bias.copy_(torch.from_numpy(values["Resnet-fc1001-bias"]))


@needs_torch
@pytest.mark.parametrize("shape", [TINY_BASIC, TINY_BOTTLENECK], ids=["basic", "bottleneck"])
def test_pytorch_computes_flowcs_function_and_steps(shape):
    import torch

    from benchmarks.peers.flowc_resnet_models import jobs_of
    from benchmarks.peers.torch_resnet import build_predict, build_train, make_model
    flow.clear_default_session()
    train, predict = jobs_of(shape)
    images, labels = _data(shape)
    rng = np.random.default_rng(1)
    # random values everywhere (gamma 0 and unit statistics would hide the branches and the moving statistics)
    names = [n for n in train.graph.variables if n.startswith("Resnet-")]
    flow.load_variables({n: (rng.uniform(0.5, 1.5, train.graph.variables[n].shape) if "variance" in n or "gamma" in n
                             else 0.2 * rng.standard_normal(train.graph.variables[n].shape)).astype(np.float32)
                         for n in names})
    values = {n: default_session().value(n).copy() for n in names}
    net = make_model(shape)
    _copy_into(net, values)
    expected = build_predict(shape, images, compiled=False, model=net)()
    np.testing.assert_allclose(predict(images, labels), expected, rtol=1e-4, atol=1e-5)
    net.train()
    with torch.no_grad():          # batch statistics, label smoothing: the train job's loss before its update
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(images)), torch.from_numpy(labels).long(),
                                                 label_smoothing=shape.label_smoothing)
    np.testing.assert_allclose(train(images, labels).item(), float(loss), rtol=1e-4)
    flow.clear_default_session()
    # PyTorch's benchmark steps run and learn (the schedule's warmup starts at 0: the first step keeps the weights)
    step = build_train(shape, images, labels, compiled=False, model=net)
    losses = [float(step()) for _ in range(3)]
    assert all(np.isfinite(losses))
    assert build_predict(shape, images, compiled=False)().shape == (shape.batch_size, shape.num_classes)


@needs_torch
def test_pytorch_schedule_is_the_examples():
    from benchmarks.peers.torch_resnet import learning_rate
    shape = RESNET_ZOO["resnet18"]
    config_lr = flow.optimizer.CosineScheduler(shape.learning_rate, steps=900,
                                               warmup=flow.optimizer.warmup.linear(100, 0.0))
    for step in (0, 1, 50, 99, 100, 101, 500, 999, 1500):
        assert learning_rate(shape, step, total_steps=1000) == pytest.approx(config_lr.learning_rate(step), abs=1e-12)
