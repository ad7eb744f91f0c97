"""Model parallelism: variables split along axis 0 over the ranks, and the exchanges they need.

A variable declared `distribute=flow.distribute.split(0)` (or a dense layer's
`model_distribute=flow.distribute.split(0)`) is held as slices: rank r keeps rows r·U/N … (r+1)·U/N
of it, its optimizer state likewise, and updates only those.  For a dense layer, whose weight is
(units, inputs), that splits the output units, as in OneFlow's hybrid-parallel examples:

    forward   y = x · Wᵀ + b      x whole (all_gather of the batch's rows), W and b split by unit:
                                  y is split by column (each rank: every row, its units)
    loss      rows again          all_to_all (columns -> rows) before an op that reads whole rows
    backward  dW = dyᵀ · x        dy split by column (all_to_all), x whole (the forward's all_gather):
                                  each rank computes its rows of dW, where summing the batch's partial
                                  products and keeping a slice (reduce_scatter) would move all of dW
              dx = dy · W         dy split by column (all_to_all), W by row: partial sums of dx, each
                                  rank's rows kept (reduce_scatter) where the batch is split again

A weight (inputs, units) split along its inputs and read as x · W is the same dy · W case: x goes
to columns, and each rank keeps its rows of the partial product before the next op.

These rules extend the data-parallel layouts (compiler/passes/data_parallel.py) where a value is
`model_split` or `column_split`; `box` builds each change of layout (OneFlow's boxing) from the
collectives of compiler/ops/collectives.py and local reshapes and transposes, which
`flowc show --ir --ranks N` prints.  What the rules do not know (a convolution's filter split, a
transpose of a split weight) is an error naming the op and its line.

Example::

    >>> hidden = flow.layers.dense(x, 512, name="hidden",                      # doctest: +SKIP
    ...                            model_distribute=flow.distribute.split(0))    # 256 units per rank of 2
"""
from __future__ import annotations

from typing import Any

from flowc.compiler.ir import GraphBuilder, Node
from flowc.compiler.ops import OPS
from flowc.compiler.passes.layouts import BROADCAST, COLS, MODEL, PARTIAL, SPLIT, layout_error

# Element-wise ops that read each operand at the output's own index (after right-aligned
# broadcasting); transpose and broadcast_to move elements between axes.
_MOVES_ELEMENTS = {"transpose", "broadcast_to"}


def _elementwise(op: str) -> bool:
    rule = OPS[op]
    return rule.kind == "pointwise" and op not in _MOVES_ELEMENTS and rule.input_strides is None


def decide(rules: Any, n: Node) -> str | None:
    """`n`'s layout when it reads a model-parallel value, after marking the exchanges its operands
    need in `rules.converted` (or `rules.reduced`); None: the data-parallel rules decide, on the
    operands as converted here."""
    seen = {i: rules.seen(n, i) for i in n.inputs}
    present = set(seen.values())
    if n.id in rules.model_nodes:
        return _as_model(rules, n)
    if n.id in rules.column_products:
        return _column_product(rules, n)
    if not present & {MODEL, COLS}:
        _scatter_batch_partials(rules, n, seen)
        return None
    if n.op == "matmul" and len(n.type.shape) == 2:
        return _matmul(rules, n)
    if n.op == "reduce_sum" and _keeps_layout(rules, n, seen):
        return _reduce_sum(rules, n, seen[n.inputs[0]])
    if _elementwise(n.op) and _keeps_layout(rules, n, seen):
        return COLS if COLS in present else MODEL
    if n.op == "reshape":
        reshaped = _reshape(rules, n, seen[n.inputs[0]])
        if reshaped is not None:
            return reshaped
    if MODEL in present:
        raise layout_error(n, "it reads a variable split over the ranks (model parallelism), which flowc supports in "
                              "dense layers (matmul), element-wise ops and sums only")
    for i, layout in seen.items():       # a value split by column goes back to rows for anything else
        if layout == COLS:
            _convert(rules, n, i, SPLIT)
    _scatter_batch_partials(rules, n, {i: rules.seen(n, i) for i in n.inputs})
    return None


def _reshape(rules: Any, n: Node, layout: str) -> str | None:
    """A bias (units,) as a row (1, units) to add to columns split by unit, and back (its gradient)."""
    x, out = rules.graph.node(n.inputs[0]).type.shape, n.type.shape
    if layout == MODEL and len(x) == 1 and out == (1, x[0]):
        return COLS
    if layout == COLS and x == (1, out[0]) and len(out) == 1:
        return MODEL
    if layout == MODEL:
        if out and out[0] % rules.ranks == 0:
            return MODEL          # a slice along axis 0 is a contiguous range of the flat value
        raise layout_error(n, f"it reshapes a model-split variable to {list(out)}, whose axis 0 does not divide over "
                              f"{rules.ranks} ranks")
    return None


def _convert(rules: Any, n: Node, i: int, target: str) -> None:
    source = rules.seen(n, i)
    if (source, target) not in BOXING:
        raise layout_error(n, f"its operand {rules.graph.node(i).op} is {source}, and flowc cannot make it {target}")
    rules.converted[(n.id, i)] = target
    if (source, target) == (PARTIAL, MODEL):
        _prefer_columns(rules, i)


# Ops a partial operand passes through unchanged in shape on its way from a weight gradient's
# matmul to the update (a learning-rate scale, a weight decay's add).
_PARTIAL_PATH = {"multiply", "divide", "add", "subtract", "negative", "snapshot", "cast"}


def _prefer_columns(rules: Any, i: int) -> None:
    """A batch's partial product about to be scattered to a model-split slice (dW = dyᵀ · x of a
    split weight, both operands split over the batch): when moving dy (by column) and x (whole)
    costs fewer elements than scattering all of dW, mark the matmul to compute its rows of dW
    from those instead (next sweep).  The forward pass already gathered x for the same layer."""
    g = rules.graph
    node = g.node(i)
    while node.op in _PARTIAL_PATH and node.id not in rules.column_products:
        partial = [x for x in node.inputs if rules.layout[x] == PARTIAL and g.node(x).type.shape == node.type.shape]
        if len(partial) != 1:
            return
        node = g.node(partial[0])
    if node.op != "matmul" or len(node.type.shape) != 2 or not node.attr("transpose_a") or node.attr("transpose_b"):
        return
    a, b = node.inputs
    if rules.layout[a] != SPLIT or rules.layout[b] != SPLIT or g.node(a).type.shape[1] % rules.ranks:
        return
    moved = g.node(a).type.size + g.node(b).type.size
    if moved < node.type.size:
        rules.column_products.add(node.id)


def _column_product(rules: Any, n: Node) -> str:
    """aᵀ · b marked by `_prefer_columns`: a split by column, b whole, this rank's rows of the product."""
    a, b = n.inputs
    for i, target in ((a, COLS), (b, BROADCAST)):
        if rules.seen(n, i) != target:
            _convert(rules, n, i, target)
    return MODEL


def _keeps_layout(rules: Any, n: Node, seen: dict[int, str]) -> bool:
    """Can `n` compute its share where it is: an element-wise op whose operands all line up with
    its split axis, or a sum?  Partial operands of a model-split op's shape are scattered first."""
    out = n.type.shape
    layouts = set(seen.values())
    if n.op == "reduce_sum":
        return True
    if COLS in layouts:
        if layouts & {SPLIT, PARTIAL} or len(out) != 2:
            return False
        for i, layout in seen.items():
            shape = rules.graph.node(i).type.shape
            if layout == COLS and shape != out and shape != (1, out[1]):
                return False
            if layout == MODEL and (len(shape) != 1 or shape[0] != out[-1]):
                return False
            if layout == BROADCAST and shape and shape[-1] > 1:
                return False      # a whole value along the split columns (a dropout mask): rows instead
        return True
    for i, layout in seen.items():
        shape = rules.graph.node(i).type.shape
        if layout == SPLIT:
            raise layout_error(n, "it combines a model-split variable with a value split over the batch")
        if layout in (MODEL, PARTIAL) and shape != out:
            raise layout_error(n, f"it broadcasts a {layout} value of shape {list(shape)} to {list(out)}")
        if layout == BROADCAST and _covers_axis_0(shape, out) and not _relabel(rules, i, out):
            raise layout_error(n, f"it combines a whole value of shape {list(shape)} with a model-split one row by row")
    for i, layout in seen.items():
        if layout == PARTIAL:            # a gradient summed over the batch: each rank keeps its slice of the sum
            _convert(rules, n, i, MODEL)
    return True


def _covers_axis_0(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    return len(shape) == len(out) and bool(shape) and shape[0] == out[0] and out[0] > 1


def _relabel(rules: Any, i: int, out: tuple[int, ...]) -> bool:
    """Can whole value `i`, read next to a model-split one, be computed as a slice instead?  Yes
    when it is computed element by element from partial sums (a gradient squared, for Adam's
    second moment), model-split values and values that do not cover axis 0, or broadcast from a
    value without axis 0: its partial operands are then scattered rather than summed whole.  Marks
    it (and such whole operands) for the next sweep of the rules."""
    node = rules.graph.node(i)
    if node.type.shape != out or not node.inputs:
        return False
    if node.op == "broadcast_to":     # of a whole value without axis 0 (a penalty's gradient seed): fill a slice
        source = node.inputs[0]
        if rules.layout[source] != BROADCAST or _covers_axis_0(rules.graph.node(source).type.shape, out):
            return False
        rules.model_nodes.add(i)
        return True
    if not _elementwise(node.op):
        return False
    for x in node.inputs:
        layout, shape = rules.layout[x], rules.graph.node(x).type.shape
        if layout in (PARTIAL, MODEL) and shape == out:
            continue
        if layout == BROADCAST and (not _covers_axis_0(shape, out) or _relabel(rules, x, out)):
            continue
        return False
    rules.model_nodes.add(i)
    return True


def _as_model(rules: Any, n: Node) -> str:
    """A node `_relabel` marked: computed as this rank's slice, its partial operands scattered."""
    for i in n.inputs:
        if rules.layout[i] == PARTIAL:
            rules.reduced.discard((n.id, i))
            rules.converted[(n.id, i)] = MODEL
    return MODEL


def _reduce_sum(rules: Any, n: Node, layout: str) -> str:
    x = rules.graph.node(n.inputs[0]).type.shape
    axes = {a % len(x) for a in n.attr("axes")}
    split_axis = 0 if layout == MODEL else len(x) - 1
    if layout not in (MODEL, COLS):
        raise layout_error(n, f"it sums a {layout} value next to a model-split one")
    if split_axis in axes:
        return PARTIAL
    if layout == COLS and 0 in axes and not n.attr("keepdims"):
        return MODEL              # a bias gradient: the columns' sums, one slice per rank
    return layout


def _matmul(rules: Any, n: Node) -> str | None:
    a, b = n.inputs
    la, lb = rules.seen(n, a), rules.seen(n, b)
    ta, tb = n.attr("transpose_a"), n.attr("transpose_b")
    if lb == MODEL and not ta:
        if tb:            # x · Wᵀ, W split by row (output unit): x whole, y split by column
            if la == PARTIAL:
                rules.reduced.add((n.id, a))
            elif la != BROADCAST:
                _convert(rules, n, a, BROADCAST)
            return COLS
        if la != COLS:    # dy · W, W split by row (the contraction): dy split by column, partial sums
            _convert(rules, n, a, COLS)
        rules.row_partials.add(n.id)      # partial sums of whole rows: each rank may keep its rows
        return PARTIAL
    if la == MODEL and not ta and lb == BROADCAST:
        return MODEL      # W · x: rows of W
    if la == COLS and ta and not tb and lb == BROADCAST:
        return MODEL      # dyᵀ · x, dy split by column: rows of dW
    if MODEL in (la, lb):
        raise layout_error(n, f"its operands are {la} and {lb} (transpose_a={ta}, transpose_b={tb}); flowc splits "
                              "a matmul over a model-split weight as x · Wᵀ or dy · W")
    for i in (a, b):
        if rules.seen(n, i) == COLS:
            _convert(rules, n, i, SPLIT)
    return None


def _scatter_batch_partials(rules: Any, n: Node, seen: dict[int, str]) -> None:
    """A partial value of whole rows (dx of a model-split layer, x · W of a weight split along its
    inputs) read next to one split over the batch, or by an op it cannot pass through: each rank
    keeps its rows of the sum (reduce_scatter) rather than the whole sum, which the data-parallel
    rules could not combine with the batch's split rows."""
    if PARTIAL not in seen.values():
        return
    g = rules.graph
    extents = {g.node(i).type.shape[0] for i, layout in seen.items() if layout == SPLIT and g.node(i).type.shape}
    rows = [i for i, layout in seen.items() if layout == PARTIAL and i in rules.row_partials]
    if rows and rules.passes_partials(n):
        if n.type.shape and n.type.shape[0] == g.node(rows[0]).type.shape[0]:
            rules.row_partials.add(n.id)      # still whole rows (a reshape, a scaling)
        return
    for i, layout in seen.items():
        shape = g.node(i).type.shape
        if layout != PARTIAL or not shape or not rules.split.divides(shape[0]):
            continue
        if shape[0] in extents or i in rules.row_partials:
            rules.converted[(n.id, i)] = SPLIT


def box(builder: GraphBuilder, x: int, source: str, target: str, ranks: int, shape: tuple[int, ...],
        **where: Any) -> int:
    """Node id of local value `x` (logical `shape`, laid out as `source`) laid out as `target`."""
    return BOXING[source, target](lambda op, inputs, attrs: builder.add(op, inputs, attrs, **where), x, ranks, shape)


def _gather_rows(add, x, ranks, shape):
    return add("all_gather", [x], {"ranks": ranks})


def _scatter_sum(add, x, ranks, shape):
    return add("reduce_scatter", [x], {"ranks": ranks})


def _gather_columns(add, x, ranks, shape):
    # [N, u] -> [u, N]: the columns are rows, gathered in rank order, and turned back
    gathered = add("all_gather", [add("transpose", [x], {"perm": (1, 0)})], {"ranks": ranks})
    return add("transpose", [gathered], {"perm": (1, 0)})


def _columns_to_rows(add, x, ranks, shape):
    rows, cols = shape
    # [N, u] as [ranks, n, u]: block r, the rows rank r keeps, goes to rank r; block s of the result
    # holds rank s's columns of this rank's rows
    blocks = add("all_to_all", [add("reshape", [x], {"shape": (ranks, rows // ranks, cols // ranks)})],
                 {"ranks": ranks})
    mine = add("transpose", [blocks], {"perm": (1, 0, 2)})
    return add("reshape", [mine], {"shape": (rows // ranks, cols)})


def _rows_to_columns(add, x, ranks, shape):
    rows, cols = shape
    # [n, U] as [n, ranks, u] -> [ranks, n, u]: block s holds rank s's columns of this rank's rows
    blocks = add("transpose", [add("reshape", [x], {"shape": (rows // ranks, ranks, cols // ranks)})],
                 {"perm": (1, 0, 2)})
    return add("reshape", [add("all_to_all", [blocks], {"ranks": ranks})], {"shape": (rows, cols // ranks)})


# (from, to) -> how (OneFlow's boxing); partial -> broadcast is data_parallel's bucketed all_reduce.
BOXING = {
    (SPLIT, BROADCAST): _gather_rows,
    (MODEL, BROADCAST): _gather_rows,
    (PARTIAL, SPLIT): _scatter_sum,
    (PARTIAL, MODEL): _scatter_sum,
    (COLS, BROADCAST): _gather_columns,
    (COLS, SPLIT): _columns_to_rows,
    (SPLIT, COLS): _rows_to_columns,
}
