"""The model zoo's ResNet-18 / ResNet-50 v1.5 (benchmarks/workloads.py: RESNET_ZOO) in PyTorch, layer
for layer as examples/models/resnet.py builds them, and their train / predict steps.

NCHW, float32; convolutions without bias and padding kernel // 2 (at stride 2 that is OneFlow's
"SAME", whose odd padding row sits on top; the last padded row PyTorch adds is never read); the
stem's max pool 3x3 stride 2 padding 1 (likewise); BatchNorm2d with epsilon 1e-5 and momentum 0.1
(OneFlow's 0.9 counted the other way round); He-normal (fan-in) weights, zero fc bias, the last BN
of each residual branch starting with gamma 0.  Training: cross-entropy with label smoothing 0.1
(PyTorch's smoothing is OneFlow-Benchmark's: 1 - eta + eta/K on the label, eta/K elsewhere), SGD
with momentum and weight decay on every parameter (OneFlow's L2 regularizer adds `l2 * w` to the
gradient, as `weight_decay` does), the learning rate set each step by the example's schedule (linear
warmup from 0 over the first tenth of the steps, then cosine decay counted from step 0; PyTorch's
momentum buffer sums gradients where OneFlow's sums rate-scaled steps, so the two updates agree only
while the rate is constant: the same work per step either way).  The modules
carry the example's variable names (`convs["res2_0_branch2a"]`, `convs["conv1"]`, `fc1001`).

    step = build_train(RESNET_ZOO["resnet18"], images, labels, compiled=False); loss = step()
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.peers import Step
from benchmarks.workloads import RESNET_ZOO_IN, RESNET_ZOO_STEPS, ResNetShape

BN_EPSILON, BN_MOMENTUM = 1e-5, 0.1


class ConvBN(nn.Sequential):
    """conv (no bias) -> BatchNorm2d: the example's `<name>` weight and `<name>_bn` statistics."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, last: bool = False) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out, eps=BN_EPSILON, momentum=BN_MOMENTUM))
        nn.init.kaiming_normal_(self[0].weight, mode="fan_in", nonlinearity="relu")     # std sqrt(2 / fan_in)
        if last:                # every residual block starts as the identity
            nn.init.zeros_(self[1].weight)


class ResNet(nn.Module):
    """(B, 3, H, W) -> (B, num_classes) logits of `shape`'s network."""

    def __init__(self, shape: ResNetShape) -> None:
        super().__init__()
        self.convs = nn.ModuleDict({"conv1": ConvBN(RESNET_ZOO_IN, shape.stem_filters, 7, 2)})
        self.blocks: list[tuple[list[str], str | None]] = []      # (branch conv names, shortcut name or None)
        c = shape.stem_filters
        for i, (count, filters, inner) in enumerate(zip(shape.block_counts, shape.block_filters,
                                                        shape.block_filters_inner)):
            for j in range(count):
                block, stride = f"res{i + 2}_{j}", 2 if i > 0 and j == 0 else 1
                if shape.block == "bottleneck":              # v1.5: the stride on the 3x3
                    branch = [("2a", c, inner, 1, 1), ("2b", inner, inner, 3, stride), ("2c", inner, filters, 1, 1)]
                else:
                    branch = [("2a", c, filters, 3, stride), ("2b", filters, filters, 3, 1)]
                names = []
                for k, (suffix, c_in, c_out, kernel, s) in enumerate(branch):
                    names.append(f"{block}_branch{suffix}")
                    self.convs[names[-1]] = ConvBN(c_in, c_out, kernel, s, last=k == len(branch) - 1)
                shortcut = None
                if stride != 1 or c != filters:
                    shortcut = f"{block}_branch1"
                    self.convs[shortcut] = ConvBN(c, filters, 1, stride)
                self.blocks.append((names, shortcut))
                c = filters
        self.fc1001 = nn.Linear(c, shape.num_classes)
        nn.init.kaiming_normal_(self.fc1001.weight, mode="fan_in", nonlinearity="relu")
        nn.init.zeros_(self.fc1001.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.convs["conv1"](x)), 3, 2, padding=1)
        for names, shortcut in self.blocks:
            y = x
            for k, name in enumerate(names):
                y = self.convs[name](y)
                if k < len(names) - 1:
                    y = F.relu(y)
            x = F.relu(y + (self.convs[shortcut](x) if shortcut else x))
        return self.fc1001(x.mean((2, 3)))


def make_model(shape: ResNetShape) -> ResNet:
    torch.manual_seed(0)
    return ResNet(shape)


def learning_rate(shape: ResNetShape, step: int, total_steps: int = RESNET_ZOO_STEPS) -> float:
    """The example's schedule: CosineScheduler(lr, total - warmup, warmup=linear(warmup, 0)), warmup a tenth."""
    warmup = max(1, total_steps // 10)
    if step < warmup:
        return shape.learning_rate * step / warmup
    decay = max(total_steps - warmup, 1)
    return shape.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(step, decay) / decay))


def build_train(shape: ResNetShape, images: np.ndarray, labels: np.ndarray, compiled: bool,
                model: ResNet | None = None) -> Step:
    """One train step of `shape` on the batch: forward, loss, backward, SGD update; returns the loss."""
    model = model or make_model(shape)
    model.train()

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y, label_smoothing=shape.label_smoothing)      # mean over the batch

    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.compile(loss_of) if compiled else loss_of
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate(shape, 0), momentum=shape.momentum,
                                weight_decay=shape.weight_decay)
    state = {"step": 0}

    def step() -> np.ndarray:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(shape, state["step"])
        state["step"] += 1
        x = torch.from_numpy(images)
        y = torch.from_numpy(labels).long()           # cross_entropy wants int64 class indices
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        return loss.detach().numpy()
    return step


def build_predict(shape: ResNetShape, images: np.ndarray, compiled: bool, model: ResNet | None = None) -> Step:
    """One predict step of `shape`: the softmax probabilities (B, num_classes), as the example's predict job."""
    model = model or make_model(shape)
    model.eval()

    def probabilities(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(model(x), dim=1)
    forward: Callable[[torch.Tensor], torch.Tensor] = torch.compile(probabilities) if compiled else probabilities

    def step() -> np.ndarray:
        with torch.inference_mode():
            return forward(torch.from_numpy(images)).numpy()
    return step
