"""Test helpers: compile a small graph (values and gradients) and run it next to the reference.

`compile_case(fn, inputs)` traces `fn` on placeholders shaped like `inputs`, adds
d(sum(fn(x) * cotangent))/dx for every floating input, compiles the whole thing
to C++, runs it, and returns both the compiled and the reference results.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from flowc.compiler.autodiff import differentiate
from flowc.compiler.ir import Graph, dtype_name
from flowc.compiler.pipeline import compile_graph
from flowc.compiler.reference import run_reference
from flowc.compiler.trace import TraceContext, emit, tracing
from flowc.runtime.executor import CpuLoadedStep
from flowc.runtime.session import Session


@dataclass
class Case:
    graph: Graph
    compiled: list[np.ndarray]
    reference: list[np.ndarray]
    n_values: int                  # outputs [0, n_values) are fn's values, the rest gradients
    grad_inputs: list[int]         # which inputs the gradients are for


def trace_case(fn: Callable, inputs: Sequence[np.ndarray], grads: bool = True) -> tuple[Graph, int, list[int]]:
    ctx = TraceContext("case", "predict", Session())
    with tracing(ctx):
        blobs = [emit("input", [], {"index": i, "shape": a.shape, "dtype": dtype_name(a.dtype)})
                 for i, a in enumerate(inputs)]
        result = fn(*blobs)
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        outputs = [v.id for v in values]
        grad_inputs: list[int] = []
        if grads:
            float_values = [v for v in values if v.type.dtype in ("float32", "float64")]
            terms = []
            for k, v in enumerate(float_values):
                cot = emit("input", [], {"index": len(blobs) + k, "shape": v.shape, "dtype": v.type.dtype})
                ctx.placeholders.append(cot.id)
                terms.append(emit("reduce_sum", [v * cot], {"axes": tuple(range(len(v.shape))), "keepdims": False})
                             if v.shape else v * cot)
            if terms:
                loss = terms[0]
                for t in terms[1:]:
                    loss = loss + t
                wrt = [b.id for b in blobs if b.type.dtype in ("float32", "float64")]
                g = differentiate(ctx.builder, loss.id, wrt)
                grad_inputs = [i for i, b in enumerate(blobs) if b.id in g]
                outputs += [g[blobs[i].id] for i in grad_inputs]
    placeholders = [b.id for b in blobs] + ctx.placeholders
    graph = Graph("case", list(ctx.builder.nodes), outputs, {}, {}, {}, placeholders)
    graph.verify()
    return graph, len(values), grad_inputs


def ops_of_cases(cases: Iterable[tuple[Callable, Sequence[np.ndarray]]]) -> set[str]:
    """Every op the (fn, inputs) cases trace to, gradients included: a test module's
    `covered_ops()` (tests/test_ops.py checks that each op has a case)."""
    seen: set[str] = set()
    for fn, inputs in cases:
        graph, _, _ = trace_case(fn, inputs)
        seen.update(n.op for n in graph.nodes)
    return seen


def cotangents(graph: Graph, n_inputs: int, rng: np.random.Generator) -> list[np.ndarray]:
    extra = []
    for p in graph.placeholders[n_inputs:]:
        t = graph.node(p).type
        extra.append(rng.standard_normal(t.shape).astype(t.dtype))
    return extra


def compile_case(fn: Callable, inputs: Sequence[np.ndarray], grads: bool = True, seed: int = 0) -> Case:
    graph, n_values, grad_inputs = trace_case(fn, inputs, grads)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(seed))
    step = CpuLoadedStep(compile_graph(graph), Session())
    compiled = step.run(feeds)
    reference, _ = run_reference(graph, feeds, {})
    return Case(graph, compiled, reference, n_values, grad_inputs)


def finite_difference_check(fn: Callable, inputs: Sequence[np.ndarray], eps: float = 1e-6,
                            rtol: float = 1e-5, atol: float = 1e-7, seed: int = 0, samples: int = 48) -> None:
    """The graph's gradients (reference executor, float64) against central differences,
    at every element of small inputs and at `samples` random elements of large ones."""
    inputs = [np.asarray(a, np.float64) if a.dtype.kind == "f" else a for a in inputs]
    graph, n_values, grad_inputs = trace_case(fn, inputs, True)
    cot = cotangents(graph, len(inputs), np.random.default_rng(seed))

    def objective(xs) -> float:
        values, _ = run_reference(graph, list(xs) + cot, {})
        return float(sum(np.sum(v * c) for v, c in zip(
            [v for v in values[:n_values] if v.dtype.kind == "f"], cot)))

    outs, _ = run_reference(graph, list(inputs) + cot, {})
    for k, i in enumerate(grad_inputs):
        analytic = outs[n_values + k]
        flat = inputs[i].reshape(-1)
        picks = np.arange(flat.size) if flat.size <= samples else \
            np.random.default_rng(seed + i).choice(flat.size, samples, replace=False)
        numeric = np.zeros(len(picks))
        for slot, j in enumerate(picks):
            saved = flat[j]
            flat[j] = saved + eps
            up = objective(inputs)
            flat[j] = saved - eps
            down = objective(inputs)
            flat[j] = saved
            numeric[slot] = (up - down) / (2 * eps)
        np.testing.assert_allclose(analytic.reshape(-1)[picks], numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} disagrees with finite differences")
