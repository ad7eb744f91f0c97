"""The ranks of a distributed job run in lock-step in one process, with the NumPy reference ops.

A test oracle for the data- and model-parallel passes without MPI: every rank evaluates the same
local graph node by node (compiler/reference.py), each on its own share, and a collective takes
its value from every rank at once, as the MPI engine would (sums in rank order).  What the ranks
compute is then put together as the runtime does (runtime/distributed.py) and compared with the
logical job's reference run.

Example::

    outputs, assigns = run_ranks(local, distribution, ranks=2, inputs=[x, y], variables=values,
                                 scalars={"learning_rate:float32": 0.1})
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from flowc.compiler.ir import Graph, Node, numpy_dtype
from flowc.compiler.ops import OPS
from flowc.compiler.ops.random_shards import RANK_SCALAR
from flowc.compiler.passes.batch_split import BatchSplit
from flowc.compiler.passes.data_parallel import Distribution
from flowc.compiler.reference import evaluate_node


def _collective(n: Node, xs: list[np.ndarray]) -> list[np.ndarray]:
    ranks = len(xs)
    total = xs[0].copy()
    if n.op in ("all_reduce", "reduce_scatter"):
        for x in xs[1:]:
            total += x
    if n.op == "all_reduce":
        if total.dtype.kind != "f":            # an integer sum is never scaled (compiler/ops/collectives.py)
            assert n.attr("scale") == 1.0
            return [total for _ in xs]
        return [total * total.dtype.type(n.attr("scale")) for _ in xs]
    if n.op == "reduce_scatter":
        return list(np.split(total, ranks, axis=0))
    if n.op == "all_gather":
        return [np.concatenate(xs, axis=0) for _ in xs]
    if n.op == "all_to_all":
        return [np.stack([xs[s][r] for s in range(ranks)]) for r in range(ranks)]
    raise AssertionError(f"no simulation of {n.op}")


def _shares(x: np.ndarray, split: BatchSplit) -> list[np.ndarray]:
    """Each rank's rows of input `x`, as the runtime feeds them (the balanced split when uneven)."""
    x = np.asarray(x)
    first = [split.first_row(len(x), r) for r in range(split.ranks)]
    return [x[f:f + split.rows(len(x), r)] for r, f in enumerate(first)]


def run_ranks(local: Graph | Sequence[Graph], distribution: Distribution, ranks: int, inputs: Sequence[np.ndarray],
              variables: Mapping[str, np.ndarray], scalars: Mapping[str, float]) -> tuple[list, dict]:
    """The logical outputs and assigned variables of `local` run on `ranks` simulated ranks, given
    the logical (global) `inputs` and `variables`.  `local`: the ranks' one graph, or each rank's own
    (a batch that does not divide over the ranks: the same ops, with shapes of their own)."""
    graphs = list(local) if isinstance(local, (list, tuple)) else [local] * ranks
    assert len(graphs) == ranks and all(len(g.nodes) == len(graphs[0].nodes) for g in graphs)
    split = distribution.split or BatchSplit(ranks)
    shares = [_shares(x, split) for x in inputs]
    sharded = set(distribution.sharded)
    per_rank_vars = [{name: (np.split(v, ranks, axis=0)[r] if name in sharded else v)
                      for name, v in variables.items()} for r in range(ranks)]
    values: list[dict[int, np.ndarray]] = [{} for _ in range(ranks)]
    for index, n in enumerate(graphs[0].nodes):
        assert all(g.nodes[index].op == n.op for g in graphs), f"the ranks' graphs differ at op {index}"
        if OPS[n.op].kind == "collective":
            for r, value in enumerate(_collective(n, [values[r][n.inputs[0]] for r in range(ranks)])):
                values[r][n.id] = value.astype(numpy_dtype(n.type.dtype))
            continue
        for r in range(ranks):
            values[r][n.id] = evaluate_node(graphs[r].nodes[index], values[r], [s[r] for s in shares],
                                            per_rank_vars[r], {**scalars, RANK_SCALAR: r})
    local = graphs[0]
    outputs = []
    for o, layout in zip(local.outputs, distribution.outputs):
        parts = [values[r][o] for r in range(ranks)]
        if layout in ("split", "model_split"):
            outputs.append(np.concatenate(parts, axis=0))
        elif layout == "column_split":
            outputs.append(np.concatenate(parts, axis=-1))
        elif layout == "partial_sum":
            outputs.append(sum(parts[1:], parts[0].copy()))
        else:
            outputs.append(parts[0])
    assigns = {}
    for var, v in local.assigns.items():
        parts = [values[r][v] for r in range(ranks)]
        if var in sharded:
            assigns[var] = np.concatenate(parts, axis=0)
        else:
            for r in range(1, ranks):        # a whole variable: every rank computed the same new value
                np.testing.assert_array_equal(parts[r], parts[0], err_msg=f"ranks disagree on {var!r}")
            assigns[var] = parts[0]
    return outputs, assigns
