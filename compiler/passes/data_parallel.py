"""Data parallelism in OneFlow's consistent view: one logical job, its batch split over the ranks.

The job is traced as the user wrote it, for the logical (global) batch.  This pass decides how
each value lies across the ranks, as OneFlow's SBP signatures do:

* `split`: each rank holds a contiguous slice along axis 0 (placeholders, and what is computed
  from them row by row: activations, per-example losses, their gradients);
* `broadcast`: each rank holds the whole value (variables, constants, runtime scalars);
* `partial_sum`: each rank holds a part and the logical value is their sum (a reduction over the
  batch axis, a weight gradient: dW = dyᵀ·x contracts the batch).

Wherever an op cannot take a partial value as it is (anything not linear in it: the optimizer
update, a sqrt of a mean), an `all_reduce` is inserted before it: that is the gradient all-reduce
of data parallelism, and, inside the forward pass, what makes a statistic over the batch global.
Every all_reduce carries `bucket_bytes`, the most its bucket may hold: the code generator groups
the sums into buckets once the kernels are scheduled (compiler/codegen/collectives.py).  Then
the graph is rebuilt for one rank: each split value's axis 0 becomes its
share (shape attributes of placeholders, reshapes, fills), and the types are inferred again.
Constants in the graph keep their global meaning: a mean over the batch divides by the global
batch, so the partial sums of the ranks add up to the logical value exactly (OneFlow divides the
loss's gradient by the global instance count the same way).

A train job's batch normalisation normalises with the statistics of the whole batch, as the
one-process job does (synchronised batch norm): each rank's `batch_norm_stats` is followed by an
all_gather and the combination in compiler/passes/batch_statistics.py, and `batch_norm_grad` divides
by the logical batch's count, which its `count` attribute holds.

An op this pass cannot place (a max over the batch axis, a sparse embedding update, an op it does
not know to work example by example) is an error naming the op and its line: results never
silently differ from the one-process job.  A random draw split over the ranks (dropout) becomes
its `_shard` op, which draws this rank's share of the one-process draw.  In the mirrored view the
graph is already one rank's job: nothing is reshaped, and only the gradients are summed (and
averaged) before their updates.

Variables declared split along axis 0 (model parallelism) add two layouts, `model_split` and
`column_split`, whose rules and exchanges (all_gather, all_to_all, reduce_scatter: OneFlow's
boxing) are in compiler/passes/model_parallel.py; this pass asks them first for every op of a job
that has such variables.  After the rebuild every value's share must have the shape its layout
makes (an attribute holding a shape this pass did not rewrite is an error, not a silent whole).

Example::

    >>> local, layouts = distribute(graph, ranks=2, bucket_bytes=16 << 20)   # doctest: +SKIP
    >>> layouts.outputs          # how the runtime puts each result together
    ['partial_sum', 'split']
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import FLOAT_DTYPES, Graph, GraphBuilder, Node
from flowc.compiler.ops import OPS, ShapeError
from flowc.compiler.ops.random_shards import RANK_SCALAR
from flowc.compiler.passes import model_parallel
from flowc.compiler.passes.balanced_boxing import BALANCED_BOXING
from flowc.compiler.passes.batch_split import BatchSplit
from flowc.compiler.passes.batch_statistics import synced_statistics
from flowc.compiler.passes.layouts import BROADCAST, COLS, MODEL, PARTIAL, SPLIT, layout_error

# OneFlow's default fusion threshold of its collectives (flow.config.collective_boxing.nccl_fusion_threshold_mb)
DEFAULT_BUCKET_BYTES = 16 << 20
__all__ = ["distribute", "Distribution", "DEFAULT_BUCKET_BYTES", "SPLIT", "BROADCAST", "PARTIAL", "MODEL", "COLS"]

# Ops linear in every operand that is partial, given the others are broadcast (or, for add and
# subtract, partial too): a partial value passes through them without a sum.
LINEAR_IN_ALL = {"add", "subtract", "negative", "snapshot", "reshape", "device_copy", "reduce_sum",
                 "broadcast_to", "transpose"}
LINEAR_IN_FIRST = {"multiply", "divide", "cast"}      # multiply: either operand, the other broadcast
# Ops that work on each example (along axis 0) separately, once the checks in `_split` hold: whole rows
# along the last axis (LAST_AXIS_ROWS, NORM_ROWS from begin_norm_axis), NCHW windows, per-element ops.
LAST_AXIS_ROWS = {"softmax", "argmax", "top_k", "sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad",
                  "fused_scale_mask_softmax", "fused_scale_mask_softmax_grad"}
NORM_ROWS = {"layer_norm", "layer_norm_grad"}
ROWWISE = LAST_AXIS_ROWS | NORM_ROWS | {
    "conv2d", "conv2d_grad_input", "max_pool2d", "avg_pool2d", "max_pool2d_grad", "avg_pool2d_grad",
    "one_hot", "concat", "slice_axis", "strided_slice", "slice_update", "batch_norm", "batch_norm_grad"}
SPARSE_UPDATES = {"unique_indices", "indexed_slices_reduce_sum", "gather_rows", "scatter_rows"}
# The ops that start a sparse update from the batch's indices and gradient rows: they read them whole.
SPARSE_SOURCES = {"unique_indices", "indexed_slices_reduce_sum"}
NOT_SPARSE_MIRRORED = ("it computes a sparse (indexed-slices) update, which flowc does not average over the ranks "
                       "of the mirrored view (use the consistent view, or an optimizer without sparse updates)")
# Ops whose result sums over the batch rows of their split operands: the result is partial.
BATCH_CONTRACTIONS = {"conv2d_grad_filter", "layer_norm_gamma_grad", "batch_norm_grad_sums"}
# Ops that need the whole batch, and what it would take.
NOT_SPLITTABLE = {
    "reduce_max": "a maximum over the batch axis", "reduce_min": "a minimum over the batch axis",
    "reduce_prod": "a product over the batch axis",
    "gather_rows": "a sparse update", "scatter_rows": "a sparse update",
}
# Attributes that hold the shape of a split result (their axis 0 shrinks to one rank's share).
SHAPE_ATTRS = {**{op: ("shape",) for op in ("input", "reshape", "constant", "broadcast_to", "dropout_mask",
                                           "random_uniform", "strided_slice", "slice_update", "variable")},
               "gather_grad": ("params_shape",), "conv2d_grad_input": ("input_shape",),
               "avg_pool2d_grad": ("input_shape",)}
FILL_OPS = {"constant", "broadcast_to", "dropout_mask", "random_uniform"}   # each rank can make its share
RANDOM_DRAWS = {"dropout_mask", "random_uniform"}     # split: each rank draws its share (ops/random_shards.py)
WINDOW_AXIS_OPS = {"concat", "slice_axis"}            # an `axis` attribute: split unless it is 0
STRIDED_OPS = {"strided_slice", "slice_update"}        # start/step/shape per axis


@dataclass
class Distribution:
    """What the pass decided: each original node's layout, and each output's (for the runtime).
    `mirrored`: every rank ran its own batch (OneFlow's mirrored view): results are per rank.
    `sharded`: the variables each rank holds a slice of (model parallelism: rank r binds rows
    r·U/N … (r+1)·U/N of the variable's storage).  `inputs`: each placeholder's layout, split (each
    rank its rows) or broadcast (every rank the whole: batch_axis=None).  `split`: how many rows of
    the batch each rank holds (an uneven batch gives each rank a graph of its own).  `logical`: the
    job before the pass, which every rank must have traced alike (runtime/distributed.py)."""
    layouts: dict[int, str]
    outputs: list[str]
    mirrored: bool = False
    sharded: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    split: BatchSplit | None = None
    logical: Graph | None = None

    def output_shape(self, index: int, rank: int) -> tuple[int, ...]:
        """The shape of rank `rank`'s share of output `index` (its graph's, which may differ from this
        rank's when the batch does not divide over the ranks)."""
        assert self.logical is not None and self.split is not None
        shape = self.logical.node(self.logical.outputs[index]).type.shape
        if self.mirrored:
            return shape
        return _local_shape(shape, self.outputs[index], self.split, rank)


_error = layout_error


class _Layouts:
    """The layout rules, one method per kind of op, over the logical graph."""

    def __init__(self, graph: Graph, ranks: int, mirrored: bool = False, model_vars: Iterable[str] = (),
                 split: BatchSplit | None = None) -> None:
        self.graph, self.ranks, self.mirrored = graph, ranks, mirrored
        self.split = split or BatchSplit(ranks)
        self.model_vars = frozenset(model_vars)          # variables split along axis 0 (model parallelism)
        self.layout: dict[int, str] = {}
        self.reduced: set[tuple[int, int]] = set()     # (consumer, operand): an all_reduce goes between
        # (consumer, operand) -> the layout the operand is changed to first (model_parallel.BOXING)
        self.converted: dict[tuple[int, int], str] = {}
        self.relabelled: set[int] = set()               # fills whose readers need them split (sticky)
        self.model_nodes: set[int] = set()              # whole values model-split readers need sliced (sticky)
        self.column_products: set[int] = set()          # model-split gradients made from columns (sticky)
        self.row_partials: set[int] = set()             # partial sums of whole rows (model_parallel), per sweep
        self.synced: set[int] = set()                   # batch_norm_stats of split values: made global

    def of(self, i: int) -> str:
        return self.layout[i]

    def run(self) -> dict[int, str]:
        """Decide every node in graph order, again until nothing changes: a fill relabelled split by a
        later reader changes what the nodes between them must be (relabels and sums only grow, so
        this ends; the model-parallel exchanges are decided afresh in each sweep)."""
        for _ in range(len(self.graph.nodes) + 1):
            before = (dict(self.layout), set(self.reduced), dict(self.converted), set(self.relabelled),
                      set(self.model_nodes), set(self.column_products))
            refusals: list[TraceError] = []      # kept until the layouts settle: a later relabel may lift them
            # decided afresh, from the layouts as they now are
            self.converted, self.row_partials, self.synced = {}, set(), set()
            for n in self.graph.nodes:
                try:
                    self.layout[n.id] = self._decide(n)
                except TraceError as err:
                    if self.mirrored and n.op not in SPARSE_UPDATES:
                        # Mirrored: every rank computes its own batch whole: a row-mixing op is no error there.
                        self.layout[n.id] = SPLIT
                        continue
                    refusals.append(err)
                    self.layout[n.id] = SPLIT
            if before == (self.layout, self.reduced, self.converted, self.relabelled, self.model_nodes,
                          self.column_products):
                if refusals:
                    raise refusals[0]
                return self.layout
        raise AssertionError("the data-parallel layouts did not settle")

    def _reduce_partials(self, n: Node) -> None:
        for i in n.inputs:
            if self.of(i) == PARTIAL:
                self.reduced.add((n.id, i))

    def passes_partials(self, n: Node) -> bool:
        """Does a partial operand of `n` pass through it (the result is partial, no sum first)?"""
        return self._partial(n) is not None and not self._summed_elsewhere(n)

    def _summed_elsewhere(self, n: Node) -> bool:
        """Is one of `n`'s partial operands summed for some other reader?"""
        summed = {i for _, i in self.reduced}
        return any(i in summed and self.seen(n, i) == PARTIAL for i in n.inputs)

    def seen(self, n: Node, i: int) -> str:
        """How `n` reads operand `i`: its layout, or what model_parallel changes it to first."""
        return self.converted.get((n.id, i), self.layout[i])

    def sums(self, n: Node, i: int) -> bool:
        """Is operand `i` summed over the ranks before `n` reads it?  (A pair recorded in an earlier
        sweep whose operand is no longer partial sums nothing.)"""
        return (n.id, i) in self.reduced and self.layout[i] == PARTIAL

    def _effective(self, n: Node, i: int) -> str:
        return BROADCAST if self.sums(n, i) else self.seen(n, i)

    def _decide(self, n: Node) -> str:
        rule = OPS[n.op]
        if n.id in self.relabelled:     # a fill its readers need split: whatever it reads, summed first
            self._reduce_partials(n)
            return SPLIT
        if n.op == "input":
            # OneFlow's consistent view splits a placeholder along its batch axis and gives one without
            # any (batch_axis=None) whole to every device
            batch_axis = n.attr("batch_axis", 0)
            if batch_axis is None and not self.mirrored:
                return BROADCAST
            if batch_axis not in (0, None) and not self.mirrored:
                raise TraceError(f"{n.loc}: placeholder {n.name or n.attr('index')!r} of shape {list(n.type.shape)} "
                                 f"has batch_axis={batch_axis}: flowc splits a job's inputs over its {self.ranks} "
                                 "ranks along axis 0 only; put the samples on axis 0, or pass batch_axis=None "
                                 "to give every rank the whole input")
            if not n.type.shape or not self.split.divides(n.type.shape[0]):
                raise TraceError(f"{n.loc}: placeholder {n.name or n.attr('index')!r} of shape {list(n.type.shape)}: "
                                 f"its batch axis (axis 0) must split {self.split.describe()}")
            return SPLIT
        if rule.kind == "source" or not n.inputs:
            if n.op == "variable" and n.attr("name") in self.model_vars:
                return self._model_variable(n)
            return BROADCAST
        if self.model_vars:
            decided = model_parallel.decide(self, n)
            if decided is not None:
                return decided
        if n.op in SPARSE_SOURCES:
            return self._gathered(n)
        if n.op in NOT_SPLITTABLE and any(self.seen(n, i) != BROADCAST for i in n.inputs) and not self._by_rows(n):
            what = NOT_SPLITTABLE[n.op]
            if OPS[n.op].kind == "reduction" and 0 not in tuple(n.attr("axes")):
                what = what.replace("over the batch axis", "across a value split over the ranks by columns")
            raise _error(n, f"it computes {what}")
        kinds = {self.seen(n, i) for i in n.inputs}
        if kinds == {BROADCAST}:
            return BROADCAST
        if PARTIAL in kinds:
            passed = self._partial(n)
            # A partial value summed for another reader anyway (Adam's gradient: for g·g, and scaled for
            # the first moment) is read summed here too: one all_reduce per value, not one per use.
            if passed is not None and self.passes_partials(n):
                return passed
            self._reduce_partials(n)
            kinds = {self._effective(n, i) for i in n.inputs}
            if kinds == {BROADCAST}:
                return BROADCAST
        self._split_fills(n)
        return self._split(n)

    def _gathered(self, n: Node) -> str:
        """A sparse update's unique indices and summed rows, of the whole batch on every rank: each
        split operand (the indices, the gather's gradient rows) is all-gathered first, in rank order,
        which is the one-process batch.  Every rank then updates the same rows of its whole table the
        same way, and moves B·(1 + row) values rather than summing a (vocab, row) gradient.  The
        mirrored view averages gradients, which this sum of everyone's rows would not: refused there."""
        if self.mirrored:
            raise _error(n, NOT_SPARSE_MIRRORED)
        for i in n.inputs:
            layout = self.seen(n, i)
            if layout == SPLIT:
                self.converted[(n.id, i)] = BROADCAST
            elif layout == PARTIAL:
                self.reduced.add((n.id, i))
            elif layout != BROADCAST:
                raise _error(n, f"it reads a {layout} value")
        return BROADCAST

    def _by_rows(self, n: Node) -> bool:
        """A reduce_max, reduce_min or reduce_prod over axes other than the batch axis, of values split
        by rows (or whole): each rank reduces its own rows, as reduce_sum does."""
        return OPS[n.op].kind == "reduction" and 0 not in tuple(n.attr("axes")) and \
            all(self.seen(n, i) in (SPLIT, BROADCAST) for i in n.inputs)

    def _model_variable(self, n: Node) -> str:
        shape = n.type.shape
        if not shape or shape[0] % self.ranks:
            raise TraceError(f"{n.loc}: variable {n.attr('name')!r} of shape {list(shape)} is split along axis 0 over "
                             f"{self.ranks} ranks, which must divide {shape[0] if shape else 'a scalar'}")
        return MODEL

    def _split_fills(self, n: Node) -> None:
        """A whole value with the batch's extent read next to split values is a fill (a loss
        gradient's seed, a broadcast_to of a bias gradient to the batch): each rank makes its own
        share of it instead.  Any other such value is left for `_split` to refuse."""
        split = [i for i in n.inputs if self._effective(n, i) == SPLIT]
        extents = {self.graph.node(i).type.shape[0] for i in split if self.graph.node(i).type.shape}
        for i in n.inputs:
            shape = self.graph.node(i).type.shape
            if self._effective(n, i) != BROADCAST or not shape or shape[0] <= 1 or shape[0] not in extents:
                continue
            if OPS[n.op].kind == "pointwise" and len(shape) != len(n.type.shape):
                continue        # right-aligned: its axis 0 is not the batch axis
            if self._fill(i):
                self._relabel(i)

    def _fill(self, i: int) -> bool:
        """Is `i` computed from constants and runtime scalars only, with its batch axis made by a
        fill op (so that each rank can compute its share)?"""
        node = self.graph.node(i)
        if node.op == "broadcast_to":    # of a value without the batch axis, or of a fill with it ((B, 1) to (B, K))
            return self._not_batch_shaped(node.inputs[0], node.type.shape) or self._fill(node.inputs[0])
        if node.op in FILL_OPS:
            return True
        if node.op == "reshape":        # a fill given other axes, its batch axis kept (keepdims: (B,) to (B, 1))
            source = self.graph.node(node.inputs[0]).type.shape
            return bool(source) and source[0] == node.type.shape[0] and self._fill(node.inputs[0])
        if OPS[node.op].kind != "pointwise" or node.op == "transpose":
            return False
        return all(self._not_batch_shaped(x, node.type.shape) or self._fill(x) for x in node.inputs)

    def _not_batch_shaped(self, i: int, out: tuple[int, ...]) -> bool:
        shape = self.graph.node(i).type.shape
        return len(shape) < len(out) or not shape or shape[0] == 1

    def _relabel(self, i: int) -> None:
        node = self.graph.node(i)
        if i in self.relabelled:
            return
        if not self.split.divides(node.type.shape[0]):
            raise _error(node, f"its batch axis {node.type.shape[0]} does not split {self.split.describe()}")
        self.layout[i] = SPLIT
        self.relabelled.add(i)
        if node.op not in FILL_OPS or node.op == "broadcast_to":
            for x in node.inputs:
                if node.op == "reshape" or not self._not_batch_shaped(x, node.type.shape):
                    self._relabel(x)

    def _partial(self, n: Node) -> str | None:
        """The layout of `n` when a partial operand passes through it, else None."""
        layouts = [self.seen(n, i) for i in n.inputs]
        if n.op in LINEAR_IN_ALL:
            if all(x == PARTIAL for x in layouts):
                return PARTIAL
            return None
        if n.op in LINEAR_IN_FIRST:
            if n.op == "cast" and not (n.type.dtype in FLOAT_DTYPES and
                                       self.graph.node(n.inputs[0]).type.dtype in FLOAT_DTYPES):
                return None        # rounding to an integer is not linear: sum first
            if n.op == "multiply" and sorted(layouts) == [BROADCAST, PARTIAL]:
                return PARTIAL
            if layouts[0] == PARTIAL and all(x == BROADCAST for x in layouts[1:]):
                return PARTIAL
        return None

    def _split(self, n: Node) -> str:
        """`n` reads split values (and broadcast ones): split, partial, or an error."""
        g = self.graph
        split = [i for i in n.inputs if self._effective(n, i) == SPLIT]
        out = n.type.shape
        if n.op in BATCH_CONTRACTIONS:
            return PARTIAL
        if n.op == "matmul":
            return self._matmul(n)
        if OPS[n.op].kind == "reduction":      # over the batch axis: reduce_sum only (the others: NOT_SPLITTABLE)
            if 0 in tuple(n.attr("axes")):
                return PARTIAL
            return SPLIT
        if n.op == "transpose" and tuple(n.attr("perm"))[0] != 0:
            raise _error(n, "it moves the batch axis away from axis 0")
        if n.op in WINDOW_AXIS_OPS and n.attr("axis") % max(len(out), 1) == 0:
            raise _error(n, "it concatenates or slices along the batch axis")
        if n.op in STRIDED_OPS:
            x = g.node(n.inputs[0]).type.shape
            if tuple(n.attr("start"))[0] != 0 or tuple(n.attr("step"))[0] != 1 or tuple(n.attr("shape"))[0] != x[0]:
                raise _error(n, "it slices the batch axis")
        if n.op in ("gather", "gather_grad"):
            return self._gather(n)
        if n.op == "batch_norm_stats":
            return self._batch_statistics(n)
        if not out or not self.split.divides(out[0]):
            raise _error(n, f"its result {list(out)} has no batch axis that splits {self.split.describe()}")
        kind = OPS[n.op].kind
        if kind not in ("pointwise", "view") and n.op not in ROWWISE:
            raise _error(n, "flowc does not know how it reads the batch axis")
        if n.op in LAST_AXIS_ROWS and len(self.graph.node(n.inputs[0]).type.shape) < 2:
            raise _error(n, "its rows are the batch axis itself")
        if n.op in NORM_ROWS and n.attr("begin_norm_axis") < 1:
            raise _error(n, "it normalises over the batch axis")
        if n.op == "reshape":
            return SPLIT          # a split is a contiguous range of the flat value: any reshape keeps it
        for i in split:
            shape = g.node(i).type.shape
            if OPS[n.op].kind == "pointwise" and (len(shape) != len(out) or shape[0] != out[0]):
                raise _error(n, f"it broadcasts a value split over the batch ({list(shape)}) to {list(out)}")
        for i in n.inputs:
            if self._effective(n, i) == BROADCAST and OPS[n.op].kind == "pointwise" and split:
                shape = g.node(i).type.shape
                if len(shape) == len(out) and shape[0] == out[0] and out[0] > 1:
                    raise _error(n, f"it combines a whole value of shape {list(shape)} with one split over the "
                                    "batch row by row")
        return SPLIT

    def _batch_statistics(self, n: Node) -> str:
        """Statistics over the batch of a value split by rows: each rank's, made global (synced).
        The mirrored view normalises each rank's own batch, as OneFlow's does."""
        if self.mirrored:
            return SPLIT
        if n.attr("axis") == 0:
            raise _error(n, "its channels are the batch axis")
        self.synced.add(n.id)
        return BROADCAST

    def _gather(self, n: Node) -> str:
        """A gather per example (batch_dims >= 1: BERT's masked positions) stays split, and so does its
        gradient; a lookup in a whole table (an embedding) is split like its indices, and its gradient
        sums the batch's rows into the table: partial."""
        per_example = n.attr("batch_dims") >= 1
        if n.op == "gather_grad":
            if per_example:
                return SPLIT
            if n.attr("axis") != 0:
                raise _error(n, f"it scatters into axis {n.attr('axis')} of a table")
            return PARTIAL
        params, indices = (self._effective(n, i) for i in n.inputs)
        if per_example and params == indices == SPLIT:
            return SPLIT
        if not per_example and n.attr("axis") == 0 and params == BROADCAST and indices == SPLIT:
            return SPLIT           # rows of a whole table: the result's axis 0 is the indices' (the batch)
        raise _error(n, f"it gathers from a {params} value with {indices} indices (batch_dims="
                        f"{n.attr('batch_dims')})")

    def _matmul(self, n: Node) -> str:
        a, b = (self._effective(n, i) for i in n.inputs)
        ta, tb = n.attr("transpose_a"), n.attr("transpose_b")
        rank = len(n.type.shape)
        if rank > 2:
            if a == b == SPLIT:
                return SPLIT
        elif a == SPLIT and b == BROADCAST and not ta:
            return SPLIT
        elif a == SPLIT and b == SPLIT and ta and not tb:
            return PARTIAL
        raise _error(n, f"its operands are {a} and {b} (transpose_a={ta}, transpose_b={tb})")


def distribute(graph: Graph, ranks: int, bucket_bytes: int, mirrored: bool = False,
               split_variables: dict[str, str] | None = None, rank: int = 0) -> tuple[Graph, Distribution]:
    """`graph` for rank `rank` of `ranks` ranks, with its collectives; and the layouts decided.

    `mirrored` (OneFlow's mirrored view): `graph` already is one rank's job (its placeholders are
    each device's own batch), so no shape changes; the gradients are averaged over the ranks (an
    all_reduce scaled by 1/ranks before each update: each rank's loss is the mean over its own
    batch) and nothing in the forward pass is summed.  `split_variables` (name -> the line that
    split it): the variables held as slices along axis 0 (compiler/passes/model_parallel.py).  A batch
    that divides over the ranks gives every rank the same graph; one that does not is split as
    OneFlow's BalancedSplitter does (compiler/passes/batch_split.py), and `rank` picks the graph."""
    if ranks < 2:
        raise ValueError(f"distribute: ranks must be >= 2, got {ranks}")
    if not 0 <= rank < ranks:
        raise ValueError(f"distribute: rank must be in [0, {ranks}), got {rank}")
    split_variables = {v: line for v, line in (split_variables or {}).items() if v in graph.variables}
    if mirrored and split_variables:
        var, line = next(iter(split_variables.items()))
        raise TraceError(f"{line}: variable {var!r} is split over the devices (model parallelism) in a job of the "
                         "mirrored view, where each device runs its own model: use the consistent view (the "
                         "default) or declare it without distribute")
    split = BatchSplit(ranks) if mirrored else _batch_split(graph, ranks)
    rules = _Layouts(graph, ranks, mirrored, split_variables, split)
    layout = rules.run()
    scale = 1.0
    if mirrored:
        # only the gradients, where the update reads them: each rank's own forward and backward stand
        rules.reduced = {(c, i) for c, i in rules.reduced if graph.node(c).role == "update"}
        layout = {n: (BROADCAST if kind == PARTIAL else kind) for n, kind in layout.items()}
        scale = 1.0 / ranks
    _check_assigns(graph, layout, split_variables, mirrored)
    builder = GraphBuilder()
    new_id: dict[int, int] = {}
    reduced: dict[int, int] = {}          # original operand -> its all_reduce (one per value)
    boxed: dict[tuple[int, str], int] = {}   # (original operand, layout) -> its exchange (one per pair)

    def at(node: Node, where: Node):
        """Adds nodes to the ranks' graph at `node`'s line and device, in `where`'s role."""
        return lambda op, inputs, attrs: builder.add(op, inputs, attrs, loc=node.loc, role=where.role,
                                                     device=node.type.device)

    def in_float32(add, value: int, dtype: str, collective) -> int:
        """`collective(value, dtype)`; a float16 value goes through it as float32, as flowc computes
        float16 values (no engine moves or sums float16)."""
        if dtype != "float16":
            return collective(value, dtype)
        return add("cast", [collective(add("cast", [value], {"dtype": "float32"}), "float32")], {"dtype": "float16"})

    def summed(i: int, where: Node) -> int:
        if i not in reduced:
            node, add = graph.node(i), at(graph.node(i), where)
            attrs = {"ranks": ranks, "scale": scale, "bucket_bytes": bucket_bytes}
            try:
                reduced[i] = in_float32(add, new_id[i], node.type.dtype,
                                        lambda value, dtype: add("all_reduce", [value], attrs))
            except ShapeError as err:
                raise _error(where, f"it reads a sum over the ranks that flowc cannot make ({err})") from None
        return reduced[i]

    def changed(i: int, target: str, where: Node) -> int:
        if (i, target) not in boxed:
            node, add = graph.node(i), at(graph.node(i), where)

            def move(value: int, dtype: str) -> int:
                if not split.even and (layout[i], target) in BALANCED_BOXING:     # the batch's rows, in padded blocks
                    return BALANCED_BOXING[layout[i], target](add, value, split, node.type.shape, dtype, rank)
                return model_parallel.box(builder, value, layout[i], target, ranks, node.type.shape,
                                          loc=node.loc, role=where.role, device=node.type.device)
            try:
                boxed[i, target] = in_float32(add, new_id[i], node.type.dtype, move)
            except ShapeError as err:
                raise _error(where, f"it reads a {layout[i]} value as {target}, which flowc cannot make "
                                    f"({err})") from None
        return boxed[i, target]

    def operand(i: int, n: Node) -> int:
        if rules.sums(n, i):
            return summed(i, n)
        if (n.id, i) in rules.converted:
            return changed(i, rules.converted[n.id, i], n)
        return new_id[i]

    def added_at(where: Node):
        """Adds nodes to the ranks' graph at `where`'s line, role and device."""
        return lambda op, inputs, attrs: builder.add(op, inputs, attrs, loc=where.loc, role=where.role,
                                                     device=where.type.device)

    rank_node: list[int] = []        # the runtime scalar data_parallel_rank, once a random draw is split

    def rank_scalar() -> int:
        if not rank_node:
            rank_node.append(builder.add("scalar", [], {"name": RANK_SCALAR, "shape": (), "dtype": "int64"}))
        return rank_node[0]

    for n in graph.nodes:
        inputs = [operand(i, n) for i in n.inputs]
        attrs = n.attr_dict if mirrored else _local_attrs(n, layout[n.id], split, rank)
        op = n.op
        if op in RANDOM_DRAWS and layout[n.id] == SPLIT:     # this rank's share of the draw, not the first one
            op, inputs = f"{op}_shard", inputs + [rank_scalar()]
            attrs.update(_draw_share(n, split, rank, mirrored))
        try:
            new_id[n.id] = builder.add(op, inputs, attrs, loc=n.loc, name=n.name, role=n.role, device=n.type.device)
        except ShapeError as err:
            raise _error(n, f"its attributes fix the batch size ({err})") from None
        if n.id in rules.synced:
            try:
                weights = None if split.batch is None else [split.examples(r) / split.batch for r in range(ranks)]
                new_id[n.id] = synced_statistics(added_at(n), new_id[n.id], ranks, n.type.shape[1], n.type.dtype,
                                                 weights)
            except ShapeError as err:
                raise _error(n, f"it computes batch statistics that flowc cannot synchronise over the ranks "
                                f"({err})") from None
        want = n.type.shape if mirrored else _local_shape(n.type.shape, layout[n.id], split, rank)
        if builder.types[new_id[n.id]].shape != want:     # an attribute holding a shape this pass did not rewrite
            raise _error(n, f"its share on each rank would be {list(builder.types[new_id[n.id]].shape)}, not the "
                            f"{list(want)} its layout ({layout[n.id]}) makes")
    assigns = {}
    for var, value in graph.assigns.items():
        if layout[value] == PARTIAL:         # a gradient summed over the batch: the whole sum, or this rank's rows
            assigns[var] = changed(value, MODEL, graph.node(value)) if var in split_variables else \
                summed(value, graph.node(value))
        else:
            assigns[var] = new_id[value]
    scalars = dict(graph.scalars, **({RANK_SCALAR: "int64"} if rank_node else {}))
    variables = {var: replace(t, shape=_local_shape(t.shape, MODEL, split, rank)) if var in split_variables else t
                 for var, t in graph.variables.items()}
    local = Graph(graph.name, builder.nodes, [new_id[o] for o in graph.outputs], assigns, variables,
                  scalars, [new_id[p] for p in graph.placeholders])
    local.verify()
    outputs = [layout[o] for o in graph.outputs]
    return local, Distribution(layout, outputs, mirrored, tuple(sorted(split_variables)),
                               tuple(layout[p] for p in graph.placeholders), split, graph)


def _batch_split(graph: Graph, ranks: int) -> BatchSplit:
    """How the consistent view's batch lies over the ranks: evenly when every split placeholder's
    batch axis divides, else balanced, which needs one batch size for all of them."""
    batches: dict[int, Node] = {}
    for p in graph.placeholders:
        node = graph.node(p)
        if node.attr("batch_axis", 0) == 0 and node.type.shape:
            batches.setdefault(node.type.shape[0], node)
    if all(b % ranks == 0 for b in batches):
        return BatchSplit(ranks)
    if len(batches) > 1:
        uneven = next(n for b, n in batches.items() if b % ranks)
        raise TraceError(f"{uneven.loc}: placeholder {uneven.name or uneven.attr('index')!r} of shape "
                         f"{list(uneven.type.shape)}: its batch axis does not divide over the {ranks} ranks, and the "
                         f"job's placeholders have several batch sizes ({', '.join(map(str, sorted(batches)))}): "
                         f"flowc splits an uneven batch only when every placeholder has the same one")
    (batch, node), = batches.items()
    if batch < ranks:
        raise TraceError(f"{node.loc}: placeholder {node.name or node.attr('index')!r} of shape "
                         f"{list(node.type.shape)}: a batch of {batch} leaves some of the {ranks} ranks without an "
                         "example; use a batch of at least one example per rank")
    return BatchSplit(ranks, batch)


def _draw_share(n: Node, split: BatchSplit, rank: int, mirrored: bool) -> dict:
    """Where this rank's share of a random draw starts in the one-process draw: element
    i + rank·share + first.  Evenly split, `share` is every rank's size and the ranks share one
    graph; an uneven batch fixes each rank's first element in its own graph."""
    if mirrored:
        return {"share": n.type.size, "first": 0}
    if split.even:
        return {"share": n.type.size // split.ranks, "first": 0}
    extent = n.type.shape[0]
    return {"share": 0, "first": split.first_row(extent, rank) * (n.type.size // extent)}


def _check_assigns(graph: Graph, layout: dict[int, str], split_variables: dict[str, str], mirrored: bool) -> None:
    """Each variable's new value lies as the variable does: whole (or a sum), or a model-split slice."""
    for var, value in graph.assigns.items():
        kind = layout[value]
        if var in split_variables:
            if kind not in (MODEL, PARTIAL):
                raise _error(graph.node(value), f"variable {var!r} is split over the ranks (line "
                                                f"{split_variables[var]}) but its new value is {kind}")
        elif kind in (MODEL, COLS) or (kind == SPLIT and not mirrored):
            raise _error(graph.node(value), f"variable {var!r} would be assigned a value split over the "
                                            f"{'batch' if kind == SPLIT else 'ranks'}")


def _local_shape(shape: tuple[int, ...], layout: str, split: BatchSplit, rank: int) -> tuple[int, ...]:
    """The shape of rank `rank`'s share of a value of logical `shape` laid out as `layout`."""
    if layout == SPLIT and shape:
        return (split.rows(shape[0], rank),) + shape[1:]
    if layout == MODEL and shape:        # a variable's rows, which divide over the ranks (_model_variable)
        return (shape[0] // split.ranks,) + shape[1:]
    if layout == COLS:
        return shape[:-1] + (shape[-1] // split.ranks,)
    return shape


def _local_attrs(n: Node, layout: str, split: BatchSplit, rank: int) -> dict:
    attrs = n.attr_dict
    for key in SHAPE_ATTRS.get(n.op, ()):
        attrs[key] = _local_shape(tuple(attrs[key]), layout, split, rank)
    return attrs
