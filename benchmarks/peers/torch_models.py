"""The seed MLP and LeNet and the ResNet-18-style block in PyTorch, layer for layer, and their
train / predict steps.

Same as the seeds: layer sizes, ReLU, 2x2 max pooling, LeNet's dropout(0.5) in training,
truncated-normal(0.1) weights and zero biases, mean sparse softmax cross entropy, plain SGD
(lr 0.1, momentum 0).  torch_eager and torch_compile differ only in whether the forward pass and
loss go through torch.compile (its backward is then compiled too, by AOTAutograd); the optimizer
step stays eager, as in PyTorch's own training recipes.

The ResNet block is benchmarks/peers/flowc_resnet.py's network: convolutions without bias (padding
1 for the 3x3s, which at stride 2 is OneFlow's "SAME"), BatchNorm2d with the same epsilon and
momentum (PyTorch counts momentum the other way round), SGD with momentum 0.9.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.peers import Step
from benchmarks.workloads import (BERT_ZOO, BN_EPSILON, BN_MOMENTUM, CLASSES, DROPOUT_RATE, INIT_STDDEV, LEARNING_RATE,
                                  LENET_FLAT, LENET_KERNEL, MLP_HIDDEN, MLP_IN, RESNET_CONVS, RESNET_FEATURES,
                                  RESNET_LEARNING_RATE, RESNET_MOMENTUM, RESNET_ZOO, Workload)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(MLP_IN, MLP_HIDDEN)
        self.output = nn.Linear(MLP_HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(F.relu(self.hidden(x.flatten(1))))


class LeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        same = LENET_KERNEL // 2       # "SAME" padding for a 5x5 kernel at stride 1
        self.conv1 = nn.Conv2d(1, 32, LENET_KERNEL, padding=same)
        self.conv2 = nn.Conv2d(32, 64, LENET_KERNEL, padding=same)
        self.dense1 = nn.Linear(LENET_FLAT, 512)
        self.dense2 = nn.Linear(512, CLASSES)
        self.dropout = nn.Dropout(DROPOUT_RATE)     # active in train() mode only, as in the seeds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.dense1(x.flatten(1)))
        return self.dense2(self.dropout(x))


class ConvBN(nn.Sequential):
    """conv (no bias) -> batch norm, named as flowc names them ("<name>" and "<name>_bn")."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out, eps=BN_EPSILON, momentum=1 - BN_MOMENTUM))


class ResNetBlock(nn.Module):
    """Stem, one downsampling basic block with a 1x1 strided shortcut, global average pooling, dense."""

    def __init__(self) -> None:
        super().__init__()
        for name, c_in, c_out, kernel, stride, _, _ in RESNET_CONVS:
            self.add_module(name, ConvBN(c_in, c_out, kernel, stride))
        self.fc = nn.Linear(RESNET_FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        residual = self.conv2(F.relu(self.conv1(x)))
        y = F.relu(residual + self.shortcut(x))
        return self.fc(y.mean((2, 3)))


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": MLP, "lenet": LeNet, "resnet_block": ResNetBlock}


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = MODELS[name]()
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(module.weight, std=INIT_STDDEV, a=-2 * INIT_STDDEV, b=2 * INIT_STDDEV)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return model


def build(workload: Workload, images: np.ndarray, labels: np.ndarray, compiled: bool) -> Step:
    if workload.model == "wide_and_deep":       # its own module: sparse embeddings, two optimizers
        from benchmarks.peers.torch_wide_and_deep import build_train
        return build_train(images, labels, compiled)
    if workload.model in BERT_ZOO:             # the model zoo's BERT: its own module
        from benchmarks.peers import torch_bert
        shape = BERT_ZOO[workload.model]
        if workload.mode == "train":
            return torch_bert.build_train(shape, images, labels, compiled)
        return torch_bert.build_predict(shape, images, compiled)
    if workload.model in RESNET_ZOO:           # the model zoo's ResNet-18 / ResNet-50: their own module
        from benchmarks.peers import torch_resnet
        shape = RESNET_ZOO[workload.model]
        if workload.mode == "train":
            return torch_resnet.build_train(shape, images, labels, compiled)
        return torch_resnet.build_predict(shape, images, compiled)
    model = make_model(workload.model)
    if workload.mode == "train":
        return _train_step(model, images, labels, compiled)
    return _predict_step(model, images, compiled)


def _train_step(model: nn.Module, images: np.ndarray, labels: np.ndarray, compiled: bool) -> Step:
    model.train()

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)          # mean over the batch

    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.compile(loss_of) if compiled else loss_of
    if isinstance(model, ResNetBlock):
        optimizer = torch.optim.SGD(model.parameters(), lr=RESNET_LEARNING_RATE, momentum=RESNET_MOMENTUM)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0)

    def step() -> np.ndarray:
        x = torch.from_numpy(images)
        y = torch.from_numpy(labels).long()           # cross_entropy wants int64 class indices
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        return loss.detach().numpy()
    return step


def _predict_step(model: nn.Module, images: np.ndarray, compiled: bool) -> Step:
    model.eval()
    forward = torch.compile(model) if compiled else model

    def step() -> np.ndarray:
        with torch.inference_mode():
            return forward(torch.from_numpy(images)).numpy()
    return step


def build_sgemm(n: int) -> Step:
    generator = torch.Generator().manual_seed(0)
    a = torch.rand((n, n), generator=generator)
    b = torch.rand((n, n), generator=generator)
    c = torch.empty((n, n))
    return lambda: torch.mm(a, b, out=c)


def configure(threads: int) -> None:
    torch.set_num_threads(threads)
