"""The per-model table the scaling cost model (benchmarks/scaling_model.py) runs on, read from
flowc's own traced graph of a train job.

A train job's graph (`job.graph`: traced, not compiled) has nodes in the order the step runs
them, each with a role: forward, backward (autodiff, emitted last layer first) or update (the
optimizer).  For each trainable variable the table holds its gradient, which is the backward node that
the variable's update chain reads (see `_gradient_owners`), in the order the backward pass produces them,
and the backward FLOPs spent since the previous gradient (the work the all-reduce of that gradient
can overlap with).  FLOPs count 2 per multiply-add of the products and convolutions only, as
benchmarks/workloads.py does; the elementwise work is folded into the achieved throughput the model
assumes.

    table = model_table_of_job(train_job, samples=32, name="my model")

Extraction traces the job (about 0.1 s for ResNet-50 or BERT-base), so nothing is cached on disk.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "models")


@dataclass(frozen=True)
class Gradient:
    """One trainable variable's gradient: its bytes, and the backward FLOPs done since the previous
    gradient was produced (so the cumulative sum up to this row is when it is ready)."""
    name: str
    nbytes: int
    backward_flops: int


@dataclass(frozen=True)
class ModelTable:
    """What the cost model needs of one model's train step on one device (one replica's batch)."""
    name: str
    samples: int                      # per-device batch: images or sequences per step
    forward_flops: int
    gradients: tuple[Gradient, ...]   # in production order (the last layer's first)
    tail_backward_flops: int          # backward work after the last gradient (input gradients)
    update_bytes: int                 # bytes the update reads and writes (variables, state, gradients)

    @property
    def backward_flops(self) -> int:
        return sum(g.backward_flops for g in self.gradients) + self.tail_backward_flops

    @property
    def gradient_bytes(self) -> int:
        return sum(g.nbytes for g in self.gradients)


# ------------------------------------------------------------------------------------------ FLOPs

def _prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def _matmul_flops(graph: Any, node: Any) -> int:
    a = graph.node(node.inputs[0]).type.shape
    k = a[-2] if node.attr("transpose_a") else a[-1]
    return 2 * _prod(node.type.shape) * k


def _conv_flops(out_shape: tuple[int, ...], weight_shape: tuple[int, ...]) -> int:
    # per output element, one multiply-add per weight of its output channel (in/groups x kh x kw),
    # whatever the layout: the output channel is the weight's first axis in NCHW and NHWC alike
    return 2 * _prod(out_shape) * (_prod(weight_shape) // weight_shape[0])


# op -> FLOPs of one node; conv2d_grad_input(dy, w) and conv2d_grad_filter(x, dy) do the forward's work
FLOP_RULES: dict[str, Callable[[Any, Any], int]] = {
    "matmul": _matmul_flops,
    "conv2d": lambda g, n: _conv_flops(n.type.shape, g.node(n.inputs[1]).type.shape),
    "conv2d_grad_input": lambda g, n: _conv_flops(g.node(n.inputs[0]).type.shape, g.node(n.inputs[1]).type.shape),
    "conv2d_grad_filter": lambda g, n: _conv_flops(g.node(n.inputs[1]).type.shape, n.type.shape),
}


def node_flops(graph: Any, node: Any) -> int:
    """The FLOPs of one node: its rule in FLOP_RULES, 0 for the elementwise and data-movement ops."""
    rule = FLOP_RULES.get(node.op)
    return rule(graph, node) if rule else 0


# ------------------------------------------------------------------------------------------ gradients

def _gradients_reached(graph: Any, var: str, value: int) -> set[int]:
    """The backward nodes `var`'s new value reads through update nodes of the variable's shape only
    (so not through the global norm of gradient clipping or the scalar learning rate)."""
    shape = graph.variables[var].shape
    found: set[int] = set()
    stack, seen = [value], set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = graph.node(nid)
        if node.role == "backward" and node.type.shape == shape:
            found.add(nid)
        elif node.role == "update" and node.type.shape == shape:
            stack.extend(node.inputs)
    return found


def _gradient_owners(graph: Any) -> dict[int, str]:
    """{gradient node: its variable}.  A variable's update and its optimizer state's (`<var>-momentum`,
    `<var>-m`, `<var>-v`: named after it, so longer) read the same gradient: the shortest name owns it."""
    owners: dict[int, str] = {}
    assigned = set(graph.assigns)
    for var, value in graph.assigns.items():
        if graph.node(value).role != "update":
            continue                      # batch norm's moving statistics are assigned in the forward pass
        found = _gradients_reached(graph, var, value)
        is_state = any(var.startswith(v + "-") for v in assigned if v != var)
        if len(found) > 1 or (not found and not is_state):
            raise ValueError(f"{graph.name}: variable {var!r}: expected one backward node feeding its update, "
                             f"found {sorted(found)}")
        for g in found:
            if g not in owners or len(var) < len(owners[g]):
                owners[g] = var
    return owners


def _live(graph: Any) -> set[int]:
    """The nodes the step's outputs and assigns depend on: what the compiled step runs (autodiff also
    emits gradients nobody reads, e.g. of the images through the stem's convolution; the compiler's
    dead-code elimination drops them)."""
    live: set[int] = set()
    stack = list(graph.roots())
    while stack:
        nid = stack.pop()
        if nid not in live:
            live.add(nid)
            stack.extend(graph.node(nid).inputs)
    return live


def table_of_graph(graph: Any, name: str, samples: int) -> ModelTable:
    """The ModelTable of a traced train graph (`job.graph`); `samples` is its batch size."""
    gradient_var = _gradient_owners(graph)
    if not gradient_var:
        raise ValueError(f"{graph.name}: no trainable variable has a gradient: is it a train job?")
    live = _live(graph)
    forward = sum(node_flops(graph, n) for n in graph.nodes if n.role == "forward" and n.id in live)
    rows, since = [], 0
    for n in graph.nodes:
        if n.role != "backward" or n.id not in live:
            continue
        since += node_flops(graph, n)
        if n.id in gradient_var:
            var = gradient_var[n.id]
            rows.append(Gradient(var, graph.variables[var].nbytes, since))
            since = 0
    update = sum(2 * graph.variables[v].nbytes for v in graph.assigns) + sum(r.nbytes for r in rows)
    return ModelTable(name, samples, forward, tuple(rows), since, update)


def model_table_of_job(job: Any, samples: int, name: str = "") -> ModelTable:
    """The ModelTable of a flowc train job (a `flow.global_function(type="train")`), traced, not compiled.

    Example:
        train, _ = bert.make_jobs(bert.CONFIGS["tiny"])
        table = model_table_of_job(train, samples=bert.CONFIGS["tiny"].batch_size, name="BERT-tiny")
    """
    return table_of_graph(job.graph, name or job.__name__, samples)


# ------------------------------------------------------------------------------------------ the zoo

def _zoo(module: str) -> Any:
    if MODELS_DIR not in sys.path:
        sys.path.insert(0, MODELS_DIR)
    return __import__(module)


# name -> (examples/models module, config, per-device batch).  ResNet-50 at 32 images per GPU (the
# per-GPU batch of Goyal et al.'s "ImageNet in 1 hour"); BERT-base at sequence length 128 (the zoo's
# and pretraining phase 1's), 32 sequences per GPU.
ZOO = {
    "ResNet-50": ("resnet", "resnet50", 32),
    "BERT-base": ("bert", "base", 32),
    "BERT-large": ("bert", "large", 32),      # only to derive the achieved throughput (scaling_model.py)
    "ResNet-tiny": ("resnet", "tiny", 4),
    "BERT-tiny": ("bert", "tiny", 4),
}
# BERT-large is not one of the zoo's configs: base's vocabulary and sequence, the paper's sizes
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}


def zoo_table(name: str) -> ModelTable:
    """The ModelTable of one ZOO model at its per-device batch, from a fresh trace of its train job.

    Example:
        zoo_table("ResNet-50").gradient_bytes / 1e6      # about 102 (25.6 M float32 parameters)
    """
    import flow
    module_name, config_name, batch = ZOO[name]
    module = _zoo(module_name)
    if config_name == "large":
        config = replace(module.CONFIGS["base"], **BERT_LARGE)
    else:
        config = module.CONFIGS[config_name]
    config = replace(config, batch_size=batch)
    flow.clear_default_session()
    try:
        train, _ = module.make_jobs(config)
        return model_table_of_job(train, batch, name)
    finally:
        flow.clear_default_session()
