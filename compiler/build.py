"""From a job function to its complete graph: trace, then (train jobs) backward and update.

    traced = build_job_graph("train_job", "train", fn, placeholders, result_spec, session, config)
    traced.graph       # forward + backward + update nodes, outputs and variable assigns
    traced.layout      # how to rebuild the user's result from the output arrays
    traced.optimizer   # supplies the per-step runtime scalars (learning rate)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flowc.compiler.autodiff import GradEmitter, differentiate
from flowc.compiler.errors import TraceError
from flowc.compiler.ir import Graph, TensorType
from flowc.compiler.optimizers import Optimizer, from_model_update_conf
from flowc.compiler.trace import Blob, TraceContext, emit, tracing


@dataclass
class TracedJob:
    graph: Graph
    layout: Any
    optimizer: Optimizer | None


def build_job_graph(name: str, job_type: str, fn: Callable, placeholders: Sequence, result_spec,
                    session, config) -> TracedJob:
    """Trace `fn` on placeholder Blobs and complete its graph.

    The compiler sits below the runtime and never imports it: what it needs of the runtime's
    objects is their methods: `result_spec.flatten(value, where)` (the Blobs the job returns and
    how to rebuild its result), `session.declare_variable(...)` and
    `session.declare_state_variable(name, type, loc)` (an optimizer's zero-initialized state).
    """
    ctx = TraceContext(name, job_type, session, default_dtype=config.default_dtype)
    if config.default_device is not None:      # function_config().default_placement_scope: the whole body
        ctx.device_stack = [config.default_device]
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
    if optimizer is not None:
        assert loss is not None           # _training_target gives both or neither
        graph = _add_backward_and_update(ctx, graph, optimizer, loss)
    graph.assigns.update(ctx.assigns)     # layer state updated by train steps (moving averages)
    graph.scalars.update({n.attr("name"): n.type.dtype for n in graph.nodes if n.op == "scalar"})
    graph.verify()
    return TracedJob(graph, layout, optimizer)


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
        lr, update_conf = config.primary_lr, config.model_update_conf
        if lr is None or update_conf is None:
            raise TraceError(f"{where}: flow.losses.add_loss() needs config.train.primary_lr(...) and "
                             "config.train.model_update_conf(...) in the job's function_config")
        return from_model_update_conf(update_conf, lr), ctx.losses[0]
    raise TraceError(f"{where}: a train job must call optimizer.minimize(loss), e.g. "
                     "flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)")


def _add_backward_and_update(ctx: TraceContext, graph: Graph, optimizer: Optimizer, loss: Blob) -> Graph:
    session, builder = ctx.session, ctx.builder
    trainable = {var: node for var, node in ctx.variable_nodes.items() if var in ctx.trainable_variables}
    if not trainable:
        raise TraceError(f"{builder.nodes[loss.id].loc}: optimizer.minimize: the job has no trainable variables")
    # OneFlow's rule: the update uses the gradient of the summed loss divided by the loss's
    # instance count (its TotalLossInstanceNum), i.e. the gradient of the mean loss.
    instances = builder.types[loss.id].size
    grads = differentiate(builder, loss.id, trainable.values(), scale=1.0 / max(instances, 1))
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
                 graph.placeholders)


def _state_variable(ctx: TraceContext, name: str, var_type: TensorType, loc: str) -> int:
    ctx.session.declare_state_variable(name, TensorType(var_type.shape, var_type.dtype), loc)
    node = ctx.builder.add("variable", [], {"name": name, "shape": var_type.shape, "dtype": var_type.dtype},
                           loc=loc, name=name, role="update")
    ctx.variable_nodes[name] = node
    return node
