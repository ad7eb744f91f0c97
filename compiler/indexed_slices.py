"""Sparse embedding updates: when a variable's gradient is the gradient of one gather, the update
touches only the rows the batch gathered (OneFlow's indexed slices).

    plan = sparse_update_plan(optimizer, var, grad_node, builder, conf_variables, ...)
    if plan.sparse: new_value, new_state = emit_sparse_update(e, optimizer, plan, var_node, state, lr)

The gradient of `gather(table, indices)` on axis 0 is kept as indexed slices: the unique indices
of the batch and, at each, the sum of the gathered gradient rows (`unique_indices`,
`indexed_slices_reduce_sum`, compiler/ops/indexed_slices.py); the optimizer's own update rule
(compiler/optimizers.py) runs on those rows of the variable and its state (`gather_rows`), and the
results are written back into those rows (`scatter_rows`, in place).  No (vocab, dim) buffer is
made, and a row the batch did not use keeps its value and its state, bit for bit.

When it applies follows OneFlow 0.3.4 (its IndexedSlicesOptimizerRewritePass and its LazyAdam):

* `LazyAdam` is always sparse: OneFlow's lazy_adam kernel leaves every element whose gradient is
  below 1e-12 in magnitude untouched, m and v included, so updating only the batch's rows (with the
  same rule, skip included: compiler/optimizers.py) gives the very values of the dense update.
* `SGD` (momentum 0 or not) and `Adam`/`AdamW` without weight decay are sparse only for the
  variables named in `function_config().indexed_slices_optimizer_conf(dict(include_op_names=
  dict(op_name=[...])))`, as in OneFlow: for them the sparse update differs from the dense one
  (momentum, m and v of untouched rows do not decay; Adam's untouched rows do not move).  Plain SGD
  gives the same values either way.
* Never with a loss scale (static or dynamic), a regularizer on the variable, weight decay or
  gradient clipping: OneFlow's pass refuses an update with a scale, l1, l2 or weight decay, and
  a global-norm clip or a dynamic scale reads every gradient element; the dense update is used and
  `sparse_update_plan` says why (LazyAdam's dense update is still lazy, by its 1e-12 skip).  Other
  optimizers (RMSProp, LARS, LAMB) are dense, as in OneFlow.
"""
from __future__ import annotations

from dataclasses import dataclass

from flowc.compiler.ir import GraphBuilder

ALWAYS_SPARSE = ("lazy_adam",)
SPARSE_WHEN_NAMED = ("sgd", "momentum", "adam")


@dataclass(frozen=True)
class SparsePlan:
    """Whether one variable's update is sparse; if so, the gather's indices and dy; else why not."""
    sparse: bool
    reason: str = ""
    indices: int = -1
    dy: int = -1
    vocab: int = 0


def _dense(reason: str) -> SparsePlan:
    return SparsePlan(False, reason)


def sparse_update_plan(optimizer, var: str, grad: int, builder: GraphBuilder, named: frozenset[str] | None,
                       regularized: bool, weight_decay: float) -> SparsePlan:
    """Decide whether variable `var`, whose raw gradient (before loss scaling, regularizers and
    clipping) is node `grad`, gets a sparse update; `named` is the variables of
    indexed_slices_optimizer_conf (None when the job does not set it)."""
    node = builder.nodes[grad]
    if node.op != "gather_grad" or node.attr("axis") != 0 or node.attr("batch_dims") != 0:
        return _dense("its gradient is not the gradient of one gather on axis 0")
    rule = optimizer.rule
    if rule not in ALWAYS_SPARSE + SPARSE_WHEN_NAMED:
        return _dense(f"{type(optimizer).__name__} has no indexed-slices update in OneFlow")
    if rule in SPARSE_WHEN_NAMED and (named is None or var not in named):
        return _dense("it is not named in function_config().indexed_slices_optimizer_conf")
    if optimizer.loss_scale_policy is not None:
        return _dense("the job has a loss scale")
    if optimizer.grad_clipping is not None:
        return _dense("the job clips gradients by their global norm")
    if regularized:
        return _dense("the variable has a regularizer")
    if weight_decay:
        return _dense("the variable has weight decay")
    indices, dy = node.inputs
    table = builder.types[grad]
    if builder.types[dy].dtype != table.dtype:
        return _dense("its gradient's dtype differs from the variable's")
    return SparsePlan(True, indices=indices, dy=dy, vocab=table.shape[0])


def emit_sparse_update(e, optimizer, plan: SparsePlan, var_node: int, state: dict[str, int],
                       lr: int) -> tuple[int, dict[str, int]]:
    """The variable's next value and its state's, written only at the batch's rows: the optimizer's
    own rule runs on (rows, dim) slices of the variable and of its state (scalar state, such as
    LazyAdam's beta1_t, is updated as in the dense update)."""
    role = e.role
    e.role = "backward"
    rows = e.op("unique_indices", plan.indices, vocab=plan.vocab)
    grad_rows = e.op("indexed_slices_reduce_sum", plan.indices, plan.dy, vocab=plan.vocab)
    e.role = role
    scalar = {s.suffix for s in optimizer.state_specs() if s.scalar}
    sliced = {s: (node if s in scalar else e.op("gather_rows", node, rows)) for s, node in state.items()}
    new_rows, new_state = optimizer.update(e, e.op("gather_rows", var_node, rows), grad_rows, sliced, lr, 0.0)
    written = {s: (value if s in scalar else e.op("scatter_rows", state[s], rows, value))
               for s, value in new_state.items()}
    return e.op("scatter_rows", var_node, rows, new_rows), written


def named_variables(config) -> frozenset[str] | None:
    """The variables of `function_config().indexed_slices_optimizer_conf(...)`, None when unset or
    `enable` is False (OneFlow's IsEnabled)."""
    conf = getattr(config, "values", {}).get("indexed_slices_optimizer_conf") if config is not None else None
    if not conf or not conf.get("enable", True):
        return None
    names = (conf.get("include_op_names") or {}).get("op_name") or []
    return frozenset([names] if isinstance(names, str) else (str(n) for n in names))
