"""BERT small (benchmarks/workloads.py: BERT_ZOO) in PyTorch, and its train / predict steps.

The network is examples/models/torch_models.py's `Bert` (the one memory.py measures), layer for layer
examples/models/bert.py's: the same embeddings, encoder layers (layer_norm epsilon 1e-5, tanh-free
erf gelu, the additive (mask - 1) * 10000 bias), tied masked-LM head and next-sentence head, the same
loss; truncated-normal(0.02) weights, zero biases, output bias 1.  Training: AdamW with weight decay
0.01 on everything but the biases and the layer norms (bert.py's `weight_decay_excludes`), epsilon
1e-6, global-norm clipping at 1 (`clip_grad_norm_` before the step), the learning rate set each step
by the example's schedule (a linear warmup from 0 over the first tenth of the steps, then polynomial
decay to 0 counted from step 0).  PyTorch's AdamW decays the weights by `lr * wd * w` before the Adam
step and puts epsilon after the bias-corrected square root, OneFlow's adds `wd * w` to the
bias-corrected Adam step: the same work per step, slightly different numbers.  Dropout is on in
training (PyTorch draws new masks from its generator; flowc hashes the step), off in predict.

    step = build_train(BERT_ZOO["bert_small"], features, targets, compiled=False); loss = step()
"""
from __future__ import annotations

import types
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from benchmarks.peers import Step
from benchmarks.peers.flowc_jobs import load_example
from benchmarks.workloads import (BERT_CLIP_NORM, BERT_EPSILON, BERT_LEARNING_RATE, BERT_STEPS, BERT_WEIGHT_DECAY,
                                  BertShape)

Arrays = tuple[np.ndarray, ...]


def _torch_models() -> types.ModuleType:
    return load_example("models/torch_models")


def make_model(shape: BertShape) -> nn.Module:
    """examples/models/torch_models.py's Bert at `shape`'s sizes (its config object is read by attribute)."""
    from benchmarks.peers.flowc_bert import shape_config       # the example's BertConfig: NumPy and flow only
    torch.manual_seed(0)
    return _torch_models().Bert(shape_config(shape))


def learning_rate(step: int, total_steps: int = BERT_STEPS, base_lr: float = BERT_LEARNING_RATE) -> float:
    """bert.py's schedule: PolynomialScheduler(lr, total, end 0, power 1, warmup=linear(total // 10, 0))."""
    warmup = max(1, total_steps // 10)
    if step < warmup:
        return base_lr * step / warmup
    return base_lr * (1.0 - min(step, total_steps) / total_steps)


def _decays(name: str) -> bool:
    # bert.py excludes "bias", "LayerNorm" and "layer_norm"; the PyTorch module's norms are "*_norm"
    return not ("bias" in name or "norm" in name)


def build_train(shape: BertShape, features: Arrays, targets: Arrays, compiled: bool,
                model: nn.Module | None = None) -> Step:
    """One train step on the batch: forward, loss, backward, clipping, AdamW; returns the loss."""
    model = model or make_model(shape)
    model.train()
    params = list(model.named_parameters())
    optimizer = torch.optim.AdamW([{"params": [p for n, p in params if _decays(n)], "weight_decay": BERT_WEIGHT_DECAY},
                                   {"params": [p for n, p in params if not _decays(n)], "weight_decay": 0.0}],
                                  lr=learning_rate(0), eps=BERT_EPSILON)
    loss_fn: Callable[..., Any] = torch.compile(model) if compiled else model
    state = {"step": 0}

    def step() -> np.ndarray:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(state["step"])
        state["step"] += 1
        batch = [torch.from_numpy(a) for a in (*features, *targets)]      # int32 ids: the model casts them
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(*batch)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), BERT_CLIP_NORM)
        optimizer.step()
        return loss.detach().numpy()
    return step


def build_predict(shape: BertShape, features: Arrays, compiled: bool, model: nn.Module | None = None) -> Step:
    """One predict step: (masked-LM logits (B * P, vocab), next-sentence logits (B, 2)), as bert.py's predict job."""
    model = model or make_model(shape)
    model.eval()
    forward: Callable[..., Any] = torch.compile(model.logits) if compiled else model.logits

    def step() -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            mlm, ns = forward(*[torch.from_numpy(a) for a in features])
            return mlm.numpy(), ns.numpy()
    return step
