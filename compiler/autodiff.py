"""Reverse-mode differentiation on the IR, and the optimizer update nodes.

`differentiate(graph, loss, wrt)` appends the backward pass to a graph: it walks the
nodes that lie between `wrt` and `loss` in reverse order and asks each op's rule
for its vector-Jacobian product, written in other ops through `GradEmitter`.
A non-scalar loss is differentiated as the sum of its elements (OneFlow's rule).
"""
from __future__ import annotations

from typing import Iterable

from flowc.compiler.ir import FLOAT_DTYPES, GraphBuilder, TensorType
from flowc.compiler.ops import OPS


class GradientError(TypeError):
    """The loss cannot be differentiated (no gradient rule on the path, integer loss)."""


class GradEmitter:
    """What a gradient rule may use: add ops, make constants, undo broadcasting.

    Nodes it creates carry the forward node's source location and role `backward`.
    """

    def __init__(self, builder: GraphBuilder) -> None:
        self.builder = builder
        self.loc = "<autodiff>"
        self.role = "backward"

    def type(self, node_id: int) -> TensorType:
        return self.builder.types[node_id]

    def op(self, op_name: str, /, *inputs: int, **attrs) -> int:
        return self.builder.add(op_name, inputs, attrs, loc=self.loc, role=self.role)

    def const(self, value: float, like: int) -> int:
        """A scalar constant in the dtype of node `like` (broadcasts in binary ops)."""
        return self.op("constant", value=float(value), shape=(), dtype=self.type(like).dtype)

    def sum_to(self, grad: int, target: int) -> int:
        """Sum `grad` over the axes along which `target` was broadcast to it."""
        g_shape, t_shape = self.type(grad).shape, self.type(target).shape
        if g_shape == t_shape:
            return grad
        lead = len(g_shape) - len(t_shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(t_shape) if d == 1 and g_shape[lead + i] != 1)
        summed = self.op("reduce_sum", grad, axes=axes, keepdims=False) if axes else grad
        return self.op("reshape", summed, shape=t_shape) if self.type(summed).shape != t_shape else summed


def _accumulate(e: GradEmitter, grads: dict[int, int], node_id: int, g: int) -> None:
    if node_id in grads:
        grads[node_id] = e.op("add", grads[node_id], g)
    else:
        grads[node_id] = g


def differentiate(builder: GraphBuilder, loss: int, wrt: Iterable[int], scale: float = 1.0,
                  also: Iterable[int] = ()) -> dict[int, int]:
    """Append scale * d(sum(loss))/d(w) for every w in `wrt` to `builder`; return {w: grad id}.

    A `w` that the loss does not depend on is left out of the result.  `also` names more nodes
    whose gradient the caller wants if the backward pass makes one anyway (a node between `wrt`
    and the loss: `flow.watch_diff`); they widen nothing, so the backward pass is the same.
    """
    wrt = list(wrt)
    also = list(also)
    loss_type = builder.types[loss]
    if loss_type.dtype not in FLOAT_DTYPES:
        raise GradientError(f"the loss must be floating point, got {loss_type}")
    # Nodes on a path wrt -> loss: reachable from wrt (forward) and reaching loss (backward).
    order = [n for n in builder.nodes if n.id <= loss]
    from_wrt = set(wrt)
    for n in order:
        if any(i in from_wrt for i in n.inputs) and OPS[n.op].differentiable:
            from_wrt.add(n.id)
    to_loss = {loss}
    for n in reversed(order):
        if n.id in to_loss:
            to_loss.update(n.inputs)
    active = from_wrt & to_loss

    e = GradEmitter(builder)
    e.loc = next(n.loc for n in order if n.id == loss)
    seed = e.op("constant", value=float(scale), shape=loss_type.shape, dtype=loss_type.dtype)
    grads: dict[int, int] = {loss: seed}
    for n in reversed(order):
        if n.id not in active or n.id not in grads or n.op in ("variable", "input", "scalar"):
            continue
        rule = OPS[n.op]
        if rule.gradient is None:
            raise GradientError(f"{n.loc}: op {n.op!r} has no gradient, but the loss depends on it "
                                "through a trainable variable")
        e.loc = n.loc
        input_grads = rule.gradient(e, n, grads[n.id])
        for inp, g in zip(n.inputs, input_grads):
            if g is not None and inp in active:
                _accumulate(e, grads, inp, g)
    return {w: grads[w] for w in wrt + also if w in grads}
