"""How a value of a distributed job lies across its ranks (OneFlow's SBP), and the pass's errors.

* `split`: each rank holds a contiguous slice along axis 0 of the batch (placeholders and what is
  computed from them row by row);
* `broadcast`: each rank holds the whole value (variables, constants, runtime scalars);
* `partial_sum`: each rank holds a part and the logical value is their sum;
* `model_split`: each rank holds a contiguous slice along axis 0 of a variable declared
  `distribute=flow.distribute.split(0)` (a dense layer's output units), and of what is computed from
  it element by element (its update, its optimizer state);
* `column_split`: a 2-D activation whose last axis (the units of a model-split layer) is split: each
  rank holds every row's slice of the columns.

The first three are data parallelism, the last two model parallelism (compiler/passes/model_parallel.py).
"""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import Node

SPLIT, BROADCAST, PARTIAL = "split", "broadcast", "partial_sum"
MODEL, COLS = "model_split", "column_split"


def layout_error(node: Node, why: str) -> TraceError:
    return TraceError(f"{node.loc}: {node.op} in a data-parallel job: {why}; flowc cannot split it over the ranks "
                      "(run this job in one process, or compute it outside the job)")
