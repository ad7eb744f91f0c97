"""The op rule table: one `OpRule` row per op.

A row holds everything the compiler needs to know about an op, so adding an op
means adding a row, not editing switches across files:

* `infer`     input types + attrs -> output type (raises `ShapeError` on misuse)
* `reference` NumPy implementation, used by the reference executor (the test oracle)
* `gradient`  the vector-Jacobian product, written in other ops through a `GradEmitter`
* `kind`      how the op lowers: source | view | pointwise | reduction | matmul | row | window |
              collective (views -- reshape, device_copy -- share their input's buffer; collectives
              -- all_reduce -- are calls into the communication engine, not loops)
* `c_expr`    pointwise ops: a C++ expression over `{0}`, `{1}`, ..., `{T}`, the attributes by
              name and `i` (the element's linear index);
              reductions: how the accumulator `{0}` combines with an element `{1}`
* `c_init`    reductions: the identity element
* `input_strides` for pointwise ops that read their input at a remapped index (transpose)

A row holds the op's semantics only.  How each backend lowers it (which kernel template, which
layout) lives with that backend: `LOWERINGS` in compiler/codegen/cpu.py and cuda.py.

Rows are registered by the modules imported at the bottom of this file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args

# How an op lowers (see `kind` above); a rule's kind is one of these.
OpKind = Literal["source", "view", "pointwise", "reduction", "matmul", "row", "window", "collective"]
KINDS: tuple[OpKind, ...] = get_args(OpKind)


class ShapeError(ValueError):
    """An op was applied to inputs of the wrong shape, rank or dtype."""


@dataclass(frozen=True)
class OpRule:
    name: str
    kind: OpKind
    infer: Callable[[list, dict], Any]
    reference: Callable[..., Any]
    gradient: Callable | None = None         # (GradEmitter, node, dy) -> list of input grads (id or None)
    c_expr: str | None = None                # pointwise: the value; reduction: combine {0} (acc) with {1}
    c_init: str | None = None                # reduction only: the identity, a C++ expression over {T}
    differentiable: bool = True              # False: no gradient flows through (argmax, masks)
    # pointwise ops that read their input at another index than their own (transpose):
    # (attrs, input shape, output shape) -> element strides of the input per output dim
    input_strides: Callable[[dict, tuple, tuple], list] | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        assert (self.kind in ("pointwise", "reduction")) == (self.c_expr is not None), self.name
        assert (self.kind == "reduction") == (self.c_init is not None), self.name


OPS: dict[str, OpRule] = {}


def register(rule: OpRule) -> OpRule:
    if rule.name in OPS:
        raise ValueError(f"op {rule.name!r} registered twice")
    OPS[rule.name] = rule
    return rule


# Importing the modules fills the table.
from flowc.compiler.ops import sources, pointwise, reductions, linalg, nn, conv, arrays, devices, indexing  # noqa: E402,F401
from flowc.compiler.ops import math_rows  # noqa: E402,F401
from flowc.compiler.ops import training  # noqa: E402,F401
from flowc.compiler.ops import indexed_slices  # noqa: E402,F401
from flowc.compiler.ops import normalization  # noqa: E402,F401
from flowc.compiler.ops import batch_norm  # noqa: E402,F401
from flowc.compiler.ops import collectives  # noqa: E402,F401
from flowc.compiler.ops import random_shards  # noqa: E402,F401
