"""The NumPy reference executor: interprets a graph op by op with each row's `reference`.

It is the oracle of the tests (the compiled step must agree with it), never the
product path.  It reads variables without changing them and returns the values
the step would assign.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from flowc.compiler.ir import Graph, Node, numpy_dtype
from flowc.compiler.ops import OPS


def run_reference(graph: Graph, inputs: Sequence[np.ndarray], variables: Mapping[str, np.ndarray],
                  scalars: Mapping[str, float] | None = None) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Evaluate `graph`; return (outputs, {variable: assigned value}).

    Example:
        outs, updates = run_reference(job.graph, [images, labels], session_values, {"learning_rate": 0.1})
    """
    scalars = scalars or {}
    values: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        values[n.id] = evaluate_node(n, values, inputs, variables, scalars)
    outputs = [values[o] for o in graph.outputs]
    return outputs, {var: values[v] for var, v in graph.assigns.items()}


def evaluate_node(n: Node, values: Mapping[int, np.ndarray], inputs: Sequence[np.ndarray],
                  variables: Mapping[str, np.ndarray], scalars: Mapping[str, float]) -> np.ndarray:
    """The value of node `n`, given the values of the nodes before it (`values`, by node id).

    Example:
        values[n.id] = evaluate_node(n, values, [images], session_values, {})
    """
    dtype = numpy_dtype(n.type.dtype)
    if n.op == "input":
        return np.asarray(inputs[n.attr("index")], dtype=dtype).reshape(n.type.shape)
    if n.op == "variable":
        return np.asarray(variables[n.attr("name")], dtype=dtype)
    if n.op == "scalar":
        return np.asarray(scalars[n.attr("name")], dtype=dtype)
    args = [values[i] for i in n.inputs]
    # float16 is computed in float32 and rounded on store, as the compiled kernels do
    # (compiler/passes/float16.py); np.float16 arithmetic rounds per op the same way.
    args = [a.astype(np.float32) if a.dtype == np.float16 else a for a in args]
    out = np.asarray(OPS[n.op].reference(*args, **n.attr_dict))
    if out.shape != n.type.shape:
        raise AssertionError(f"reference of {n.op} gave shape {out.shape}, IR says {n.type}")
    with np.errstate(over="ignore"):          # float16 rounds past 65504 to infinity
        return out.astype(dtype, copy=False)
