"""From a job function to its complete graph: trace, then (train jobs) backward and update.

    traced = build_job_graph("train_job", "train", fn, placeholders, result_spec, session, config)
    traced.graph       # forward + backward + update nodes, outputs and variable assigns
    traced.layout      # how to rebuild the user's result from the output arrays
    traced.optimizer   # supplies the per-step runtime scalars (learning rate)
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from flowc.compiler.autodiff import GradEmitter, differentiate
from flowc.compiler.errors import TraceError
from flowc.compiler.ir import Graph, GraphBuilder, TensorType
from flowc.compiler.optimizers import Optimizer, from_model_update_conf
from flowc.compiler.trace import Blob, TraceContext, WatchSpec, emit, tracing


@dataclass
class TracedJob:
    graph: Graph
    layout: Any
    optimizer: Optimizer | None
    # (watch, index in graph.outputs) of every watch whose handler is called, in registration order
    watches: list[tuple[WatchSpec, int]] = field(default_factory=list)


def build_job_graph(name: str, job_type: str, fn: Callable, placeholders: Sequence, result_spec,
                    session, config) -> TracedJob:
    """Trace `fn` on placeholder Blobs and complete its graph.

    The compiler sits below the runtime and never imports it: what it needs of the runtime's
    objects is their methods: `result_spec.flatten(value, where)` (the Blobs the job returns and
    how to rebuild its result), `session.declare_variable(...)` and
    `session.declare_state_variable(name, type, loc)` (an optimizer's zero-initialized state).
    """
    ctx = TraceContext(name, job_type, session, default_dtype=config.default_dtype)
    code = fn.__code__
    signature_line = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"   # placeholders live there
    with tracing(ctx):
        args = [emit("input", [], {"index": i, "shape": p.shape, "dtype": p.dtype}, name=p.name,
                     loc=signature_line) for i, p in enumerate(placeholders)]
        ctx.placeholders = [a.id for a in args]
        result = fn(*args)
    where = f"job function {name!r} ({signature_line})"
    flat, layout = result_spec.flatten(result, where)
    optimizer, loss = _training_target(ctx, config, where)
    graph = Graph(name, list(ctx.builder.nodes), [b.id for b in flat], {},
                  {var: session.variables[var].type for var in ctx.variable_nodes},
                  {}, list(ctx.placeholders))
    diffs: dict[int, int] = {}
    if optimizer is not None:
        assert loss is not None           # _training_target gives both or neither
        graph, diffs = _add_backward_and_update(ctx, graph, optimizer, loss)
    graph.assigns.update(ctx.assigns)     # layer state updated by train steps (moving averages)
    graph.scalars.update({n.attr("name"): n.type.dtype for n in graph.nodes if n.op == "scalar"})
    watches = _watch_outputs(ctx, graph, diffs)
    graph.verify()
    return TracedJob(graph, layout, optimizer, watches)


def _watch_outputs(ctx: TraceContext, graph: Graph, diffs: dict[int, int]) -> list[tuple[WatchSpec, int]]:
    """Make every watched value an extra result of the step (after the job's own results), in the
    order the job asked; return each watch with its index in `graph.outputs`.

    A result must exist in memory after the step: fusion stores it and the memory plan keeps it to
    the end of the step, as for any returned Blob.  Without watches the graph is unchanged.
    A `watch_diff` whose Blob has no gradient is dropped with a warning, as OneFlow skips it
    silently: in a predict job (no backward pass), or for a Blob that does not lie between a
    trainable variable and the loss (a placeholder, say).
    """
    watches = []
    for w in ctx.watches:
        node = w.node
        if w.kind == "diff":
            if ctx.job_type != "train" or node not in diffs:
                why = (f"job {ctx.job_name!r} is a {ctx.job_type} job, which has no backward pass"
                       if ctx.job_type != "train" else
                       "the loss does not depend on it through a trainable variable, so it has no gradient")
                warnings.warn(f"{w.loc}: flow.watch_diff: {why}; its handler is never called (as in OneFlow)",
                              UserWarning, stacklevel=2)
                continue
            node = diffs[node]
        graph.outputs.append(node)
        watches.append((w, len(graph.outputs) - 1))
    return watches


def _training_target(ctx: TraceContext, config, where: str) -> tuple[Optimizer | None, Blob | None]:
    if ctx.job_type != "train":
        if ctx.losses:
            raise TraceError(f"{where}: flow.losses.add_loss() needs @flow.global_function(type=\"train\")")
        return None, None
    if len(ctx.optimizers) + bool(ctx.losses) > 1:
        raise TraceError(f"{where}: a train job needs exactly one loss: call optimizer.minimize(loss) once "
                         "(or flow.losses.add_loss once with config.train.* set)")
    if ctx.optimizers:
        return ctx.optimizers[0]
    if ctx.losses:
        train = config.train
        if train.primary_lr_value is None or train.update_conf is None:
            raise TraceError(f"{where}: flow.losses.add_loss() needs config.train.primary_lr(...) and "
                             "config.train.model_update_conf(...) in the job's function_config")
        return from_model_update_conf(train.update_conf, train.primary_lr_value), ctx.losses[0]
    raise TraceError(f"{where}: a train job must call optimizer.minimize(loss), e.g. "
                     "flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)")


def _add_backward_and_update(ctx: TraceContext, graph: Graph, optimizer: Optimizer,
                             loss: Blob) -> tuple[Graph, dict[int, int]]:
    """The graph with its backward pass and optimizer updates, and {node: its diff} for the nodes
    the job watches with `flow.watch_diff` that have one."""
    session, builder = ctx.session, ctx.builder
    trainable = {var: node for var, node in ctx.variable_nodes.items() if session.variables[var].trainable}
    if not trainable:
        raise TraceError(f"{builder.nodes[loss.id].loc}: optimizer.minimize: the job has no trainable variables")
    # OneFlow's rule: the update uses the gradient of the summed loss divided by the loss's
    # instance count (its TotalLossInstanceNum), i.e. the gradient of the mean loss.
    instances = builder.types[loss.id].size
    watched = [w.node for w in ctx.watches if w.kind == "diff"]
    grads = differentiate(builder, loss.id, trainable.values(), scale=1.0 / max(instances, 1), also=watched)
    diffs = _watched_diffs(builder, grads, watched, instances, optimizer)
    e = GradEmitter(builder)
    e.role = "update"
    assigns: dict[str, int] = {}
    scalars: dict[str, str] = {}
    for var, var_node in trainable.items():
        if var_node not in grads:
            continue   # the loss does not depend on it: nothing to update
        var_type = builder.types[var_node]
        e.loc = session.variables[var].defined_at
        lr_name = f"learning_rate:{var_type.dtype}"
        scalars[lr_name] = var_type.dtype
        lr = e.op("scalar", name=lr_name, shape=(), dtype=var_type.dtype)
        state = {s: _state_variable(ctx, f"{var}-{s}", var_type, e.loc) for s in optimizer.state_names}
        new_value, new_state = optimizer.update(e, var_node, grads[var_node], state, lr)
        assigns[var] = new_value
        for s, value in new_state.items():
            assigns[f"{var}-{s}"] = value
    if not assigns:
        raise TraceError(f"{builder.nodes[loss.id].loc}: the loss does not depend on any trainable variable")
    variables = {var: session.variables[var].type for var in ctx.variable_nodes}
    return Graph(graph.name, list(builder.nodes), graph.outputs, assigns, variables, scalars,
                 graph.placeholders), diffs


def _watched_diffs(builder: GraphBuilder, grads: dict[int, int], watched: list[int], instances: int,
                   optimizer: Optimizer) -> dict[int, int]:
    """{watched node: its diff as OneFlow's watch_diff sees it}.

    OneFlow seeds the backward pass with ones (times the loss scale, where the optimizer has one)
    and divides only the variables' gradients by the loss's instance count, after the watchers
    took theirs; flowc folds that division into the seed instead, so a watched diff is scaled
    back here (exact when the count is a power of two, within a rounding otherwise).  The nodes
    exist only in a job that watches diffs: other jobs' graphs are unchanged.
    """
    factor = float(max(instances, 1)) * float(getattr(optimizer, "loss_scale_factor", None) or 1.0)
    e = GradEmitter(builder)
    e.role = "backward"
    diffs = {}
    for node in dict.fromkeys(watched):
        if node not in grads:
            continue
        g = grads[node]
        e.loc = builder.nodes[node].loc
        diffs[node] = g if factor == 1.0 else e.op("multiply", g, e.const(factor, g))
    return diffs


def _state_variable(ctx: TraceContext, name: str, var_type: TensorType, loc: str) -> int:
    ctx.session.declare_state_variable(name, TensorType(var_type.shape, var_type.dtype), loc)
    node = ctx.builder.add("variable", [], {"name": name, "shape": var_type.shape, "dtype": var_type.dtype},
                           loc=loc, name=name, role="update")
    ctx.variable_nodes[name] = node
    return node
