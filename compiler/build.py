"""From a job function to its complete graph: trace, then (train jobs) backward and update.

    traced = build_job_graph("train_job", "train", fn, placeholders, result_spec, session, config)
    traced.graph       # forward + backward + update nodes, outputs and variable assigns
    traced.layout      # how to rebuild the user's result from the output arrays
    traced.optimizer   # supplies the per-step runtime scalars (learning rate)
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from flowc.compiler.autodiff import GradEmitter, differentiate
from flowc.compiler.errors import TraceError, UnsupportedError
from flowc.compiler.indexed_slices import emit_sparse_update, named_variables, sparse_update_plan
from flowc.compiler.ir import Graph, GraphBuilder, TensorType
from flowc.compiler.passes.data_parallel import DEFAULT_BUCKET_BYTES, Distribution, distribute
from flowc.compiler.optimizers import (DynamicLossScalePolicy, Optimizer, StaticLossScalePolicy, combine_losses,
                                       from_model_update_conf)
from flowc.compiler.trace import Blob, TraceContext, WatchSpec, emit, tracing


@dataclass
class TracedJob:
    graph: Graph
    layout: Any
    optimizer: Optimizer | None
    # (watch, index in graph.outputs) of every watch whose handler is called, in registration order
    watches: list[tuple[WatchSpec, int]] = field(default_factory=list)
    # In a distributed session: how the logical job lies over the ranks (each output's layout);
    # `graph` is then one rank's share of the job.  None in one process.
    distribution: Distribution | None = None


def build_job_graph(name: str, job_type: str, fn: Callable, placeholders: Sequence, result_spec,
                    session, config, pack_arguments: Callable[[list], list] | None = None) -> TracedJob:
    """Trace `fn` on placeholder Blobs and complete its graph.

    The compiler sits below the runtime and never imports it: what it needs of the runtime's
    objects is their methods: `result_spec.flatten(value, where)` (the Blobs the job returns and
    how to rebuild its result), `session.declare_variable(...)` and
    `session.declare_state_variable(name, type, loc)` (an optimizer's zero-initialized state).
    A placeholder with a true `is_dynamic` (a mirrored input) makes the Blobs computed from it dynamic
    (`Blob.is_dynamic`); `pack_arguments` turns the flat placeholder Blobs into `fn`'s arguments.
    """
    ctx = TraceContext(name, job_type, session, default_dtype=config.default_dtype)
    ctx.logical_view = getattr(config, "logical_view", "consistent")
    ctx.function_config = config
    if config.default_device is not None:      # function_config().default_placement_scope: the whole body
        ctx.device_stack = [config.default_device]
    code = fn.__code__
    signature_line = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"   # placeholders live there
    with tracing(ctx):
        args = [emit("input", [], _input_attrs(i, p), name=p.name, loc=signature_line)
                for i, p in enumerate(placeholders)]
        ctx.placeholders = [a.id for a in args]
        ctx.dynamic_inputs = {a.id for a, p in zip(args, placeholders) if getattr(p, "is_dynamic", False)}
        result = fn(*(pack_arguments(args) if pack_arguments is not None else args))
    where = f"job function {name!r} ({signature_line})"
    flat, layout = result_spec.flatten(result, where)
    optimizer, loss = _training_target(ctx, config, where)
    if getattr(config, "auto_mixed_precision", False):
        flat, loss = _mixed_precision(ctx, flat, loss)
    graph = Graph(name, list(ctx.builder.nodes), [b.id for b in flat], {},
                  {var: session.variables[var].type for var in ctx.variable_nodes},
                  {}, list(ctx.placeholders))
    diffs: dict[int, int] = {}
    if optimizer is not None:
        assert loss is not None           # _training_target gives both or neither
        graph, diffs = _add_backward_and_update(ctx, graph, optimizer, loss, named_variables(config))
    _check_assigns(ctx, graph)
    graph.assigns.update(ctx.assigns)     # layer state updated by train steps (moving averages)
    graph.scalars.update({n.attr("name"): n.type.dtype for n in graph.nodes if n.op == "scalar"})
    watches = _watch_outputs(ctx, graph, diffs)
    graph.verify()
    distribution = None
    ranks = getattr(session, "ranks", 1)
    if ranks > 1:          # a distributed session: the graph of one rank (compiler/passes/data_parallel.py)
        if getattr(config, "numerics_checked", False):
            # a rank that stops at a NaN leaves the others waiting in the step's sums
            raise UnsupportedError(f"{where}: function_config().check_numerics on {ranks} ranks is not supported "
                                   "yet: run the job in one process to find the NaN")
        if ctx.logical_view == "mirrored":
            _check_mirrored_inputs(placeholders, ranks, where)
        split = _split_variables(ctx, ranks)
        _warn_device_placements(ctx, ranks)
        graph, distribution = distribute(graph, ranks, getattr(session, "bucket_bytes", DEFAULT_BUCKET_BYTES),
                                         mirrored=ctx.logical_view == "mirrored", split_variables=split,
                                         rank=getattr(session, "rank", 0))
    return TracedJob(graph, layout, optimizer, watches, distribution)


def _check_mirrored_inputs(placeholders: Sequence, ranks: int, where: str) -> None:
    """In the mirrored view each rank runs its own batch: its inputs come one array per device
    (tp.ListNumpy), not as a global batch for flowc to split (that is the consistent view)."""
    for p in placeholders:
        if getattr(p, "kind", "numpy") == "numpy":
            raise TraceError(f"{where}: placeholder {p.name!r} is a tp.Numpy.Placeholder in the mirrored view on "
                             f"{ranks} ranks, where each device runs its own batch: declare it "
                             "tp.ListNumpy.Placeholder (one array per device), or use the consistent view, which "
                             "splits a tp.Numpy input's global batch over the ranks")


def _input_attrs(index: int, placeholder: Any) -> dict[str, Any]:
    """The input op's attributes.  A batch axis other than OneFlow's default 0 is recorded, for the
    consistent view on several ranks (compiler/passes/data_parallel.py): None is the whole input on
    every rank; left out when 0, so the usual graphs' fingerprints stay as they were."""
    attrs = {"index": index, "shape": placeholder.shape, "dtype": placeholder.dtype}
    batch_axis = getattr(placeholder, "batch_axis", 0)
    if batch_axis != 0:
        attrs["batch_axis"] = batch_axis
    return attrs


def _split_variables(ctx: TraceContext, ranks: int) -> dict[str, str]:
    """name -> line of the variables split along axis 0 (model parallelism), their optimizer state
    included; another axis is refused, naming the line."""
    split: dict[str, str] = {}
    for var, (line, axis) in ctx.split_variables.items():
        if axis != 0:
            raise UnsupportedError(f"{line}: variable {var!r} is declared split along axis {axis} over the devices: "
                                   f"flowc splits variables along axis 0 on {ranks} ranks (a dense layer's weight "
                                   "is (units, inputs): split(0) splits its units); declare it split(0) or broadcast")
        split[var] = line
        for state in ctx.state_variables.get(var, ()):
            split[state] = line
    return split


def _warn_device_placements(ctx: TraceContext, ranks: int) -> None:
    """A placement on one device other than the first ("0:1": OneFlow's placement-based model or
    pipeline parallelism) does not move ops between ranks: every rank runs every op on its share of
    the batch.  The results are the logical job's; say so once per job rather than let it pass."""
    for ids, line in ctx.placements:
        devices = ids.split(":", 1)[-1]
        if devices not in ("0", f"0-{ranks - 1}"):
            warnings.warn(f"{line}: flow.scope.placement(..., {ids!r}) in job {ctx.job_name!r} on {ranks} ranks: "
                          "flowc does not place ops on particular devices of a distributed job (model or "
                          "pipeline parallelism); every rank runs them on its share of the batch (data "
                          "parallelism), which computes the same logical job", UserWarning, stacklevel=2)
            return


def _check_assigns(ctx: TraceContext, graph: Graph) -> None:
    """A variable written by flow.assign must not also be written by the optimizer's update: OneFlow
    gives the two writes no order, so the step's result would depend on which ran last."""
    for var in sorted(set(ctx.assigns) & set(graph.assigns)):
        line = ctx.assign_lines.get(var, "<unknown>")
        raise TraceError(f"{line}: flow.assign: variable {var!r} is also updated by this job's optimizer; "
                         f"OneFlow gives the two updates no order.  Declare it trainable=False, or assign "
                         f"it in another job")


def _mixed_precision(ctx: TraceContext, flat: list[Blob], loss: Blob | None) -> tuple[list[Blob], Blob | None]:
    """function_config().enable_auto_mixed_precision(True): rewrite the traced forward graph
    (compiler/passes/mixed_precision.py) and point everything the trace recorded at the new nodes."""
    from flowc.compiler.passes.mixed_precision import auto_mixed_precision
    builder, new_id = auto_mixed_precision(ctx.builder.nodes)
    ctx.builder = builder
    ctx.placeholders = [new_id(p) for p in ctx.placeholders]
    ctx.dynamic_inputs = {new_id(p) for p in ctx.dynamic_inputs}
    ctx.variable_nodes = {var: new_id(n) for var, n in ctx.variable_nodes.items()}
    ctx.assigns = {var: new_id(n) for var, n in ctx.assigns.items()}
    ctx.watches = [replace(w, node=new_id(w.node)) for w in ctx.watches]
    return [Blob(ctx, new_id(b.id)) for b in flat], (Blob(ctx, new_id(loss.id)) if loss is not None else None)


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
            if (ctx.job_type != "train" or node not in diffs) and w.quiet:
                continue
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
                         "(with a list to minimize several losses), or flow.losses.add_loss with config.train.* set")
    if ctx.optimizers:
        return ctx.optimizers[0]
    if ctx.losses:
        lr, update_conf = config.primary_lr, config.model_update_conf
        if lr is None or update_conf is None:
            raise TraceError(f"{where}: flow.losses.add_loss() needs config.train.primary_lr(...) and "
                             "config.train.model_update_conf(...) in the job's function_config")
        loss = ctx.losses[0]
        if len(ctx.losses) > 1:   # OneFlow adds the gradients of every loss
            with tracing(ctx):
                loss = combine_losses(ctx.losses, "flow.losses.add_loss", where)
        return from_model_update_conf(update_conf, lr), loss
    raise TraceError(f"{where}: a train job must call optimizer.minimize(loss), e.g. "
                     "flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)")


def _add_backward_and_update(ctx: TraceContext, graph: Graph, optimizer: Optimizer, loss: Blob,
                             indexed_slices: frozenset[str] | None = None) -> tuple[Graph, dict[int, int]]:
    """The backward pass and the update, in OneFlow's order: gradients of the loss (scaled by the
    loss scale) divided by its instance count; the loss scale undone; the variables' regularizers
    added; the global norm clipped; then each variable's update rule.  A dynamic loss scale keeps
    every variable of a step whose gradients are not all finite and adjusts the scale.

    A variable whose gradient comes from one gather gets a sparse update where OneFlow makes one
    (compiler/indexed_slices.py; `indexed_slices` names the variables of the job's
    indexed_slices_optimizer_conf).  Returns the graph and {node: its diff} for the nodes the job
    watches with `flow.watch_diff` that have one."""
    session, builder = ctx.session, ctx.builder
    trainable = {var: node for var, node in ctx.variable_nodes.items()
                 if var in ctx.trainable_variables and optimizer.updates(var)}
    if not trainable:
        raise TraceError(f"{builder.nodes[loss.id].loc}: optimizer.minimize: the job has no trainable variables")
    e = GradEmitter(builder)
    e.loc = builder.nodes[loss.id].loc
    policy = optimizer.loss_scale_policy
    # OneFlow's rule: the update uses the gradient of the summed loss divided by the loss's
    # instance count (its TotalLossInstanceNum), i.e. the gradient of the mean loss.
    instances = max(builder.types[loss.id].size, 1)
    target, seed, dynamic = loss.id, 1.0 / instances, None
    if isinstance(policy, StaticLossScalePolicy):
        seed *= policy.loss_scale_factor
    elif isinstance(policy, DynamicLossScalePolicy):
        dynamic = _dynamic_loss_scale(ctx, policy, e.loc)
        e.role = "backward"
        target = e.op("multiply", loss.id, _as_dtype(e, dynamic.scale, builder.types[loss.id].dtype))
    watched = [w.node for w in ctx.watches if w.kind == "diff"]
    by_node = differentiate(builder, target, trainable.values(), scale=seed, also=watched)
    diffs = _watched_diffs(builder, by_node, watched, instances)
    e.role = "update"
    grads = {var: by_node[node] for var, node in trainable.items() if node in by_node}
    if not grads:
        raise TraceError(f"{builder.nodes[loss.id].loc}: the loss does not depend on any trainable variable")
    plans = {var: sparse_update_plan(optimizer, var, g, builder, indexed_slices, var in ctx.regularizers,
                                     optimizer.weight_decay_for(var)) for var, g in grads.items()}
    for var in sorted(set(indexed_slices or ()) & set(plans)):
        if not plans[var].sparse:     # the user asked for it by name: say why not (OneFlow is silent)
            warnings.warn(f"{session.variables[var].defined_at}: function_config().indexed_slices_optimizer_conf "
                          f"names {var!r}, but its update stays dense: {plans[var].reason}", UserWarning, stacklevel=2)
    for var, g in grads.items():
        e.loc = session.variables[var].defined_at
        if isinstance(policy, StaticLossScalePolicy):
            g = e.op("multiply", g, e.const(1.0 / policy.loss_scale_factor, g))
        elif dynamic is not None:
            g = e.op("multiply", g, _as_dtype(e, dynamic.inverse, builder.types[g].dtype))
        if var in ctx.regularizers:
            g = _regularize(e, trainable[var], g, *ctx.regularizers[var])
        grads[var] = g
    if optimizer.grad_clipping is not None:
        grads = _clip_by_global_norm(e, grads, optimizer.grad_clipping.clip_norm)
    assigns: dict[str, int] = {}
    scalars: dict[str, str] = {}
    for var, g in grads.items():
        var_node = trainable[var]
        var_type = builder.types[var_node]
        e.loc = session.variables[var].defined_at
        lr_name = f"learning_rate:{var_type.dtype}"
        scalars[lr_name] = var_type.dtype
        lr = e.op("scalar", name=lr_name, shape=(), dtype=var_type.dtype)
        state = {s.suffix: _state_variable(ctx, f"{var}-{s.suffix}",
                                           TensorType((1,) if s.scalar else var_type.shape, var_type.dtype),
                                           e.loc, optimizer.state_initial(s))
                 for s in optimizer.state_specs()}
        ctx.state_variables[var] = [f"{var}-{s.suffix}" for s in optimizer.state_specs() if not s.scalar]
        if plans[var].sparse:
            new_value, new_state = emit_sparse_update(e, optimizer, plans[var], var_node, state, lr)
        else:
            new_value, new_state = optimizer.update(e, var_node, g, state, lr, optimizer.weight_decay_for(var))
        assigns[var] = new_value
        for s, value in new_state.items():
            assigns[f"{var}-{s}"] = value
    if dynamic is not None:
        assert isinstance(policy, DynamicLossScalePolicy)
        e.loc = builder.nodes[loss.id].loc
        finite = _all_finite(e, list(grads.values()))
        for name, value in list(assigns.items()):
            assigns[name] = e.op("select_nonzero", finite, value, ctx.variable_nodes[name])
        assigns.update(_schedule_loss_scale(e, dynamic, policy, finite))
    variables = {var: session.variables[var].type for var in ctx.variable_nodes}
    return Graph(graph.name, list(builder.nodes), graph.outputs, assigns, variables, scalars,
                 graph.placeholders), diffs


def _watched_diffs(builder: GraphBuilder, grads: dict[int, int], watched: list[int], instances: int) -> dict[int, int]:
    """{watched node: its diff as OneFlow's watch_diff sees it}.

    OneFlow seeds the backward pass with ones times the loss scale (static or dynamic) and divides
    only the variables' gradients by the loss's instance count, after the watchers took theirs;
    flowc folds that division into the seed, so a watched diff is multiplied back here (exact when
    the count is a power of two, within a rounding otherwise).  The loss scale is already in the
    seed.  The nodes exist only in a job that watches diffs: other jobs' graphs are unchanged.
    """
    factor = float(max(instances, 1))
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


def _state_variable(ctx: TraceContext, name: str, var_type: TensorType, loc: str, initial: float = 0.0) -> int:
    ctx.session.declare_state_variable(name, TensorType(var_type.shape, var_type.dtype), loc, initial)
    node = ctx.builder.add("variable", [], {"name": name, "shape": var_type.shape, "dtype": var_type.dtype},
                           loc=loc, name=name, role="update")
    ctx.variable_nodes[name] = node
    return node


def _as_dtype(e: GradEmitter, x: int, dtype: str) -> int:
    return x if e.type(x).dtype == dtype else e.op("cast", x, dtype=dtype)


def _regularize(e: GradEmitter, w: int, g: int, l1: float, l2: float) -> int:
    """OneFlow's l1_l2_regularize_gradient: `g + l1 * sign(w) + l2 * w`, sign(w) computed as
    `(w >= 0) - (w <= 0)` (0 at 0 and at NaN)."""
    if l1:
        zero = e.const(0.0, w)
        sign = e.op("subtract", e.op("eq_mask", e.op("maximum", w, zero), w),
                    e.op("eq_mask", e.op("minimum", w, zero), w))
        g = e.op("add", g, e.op("multiply", e.const(l1, w), sign))
    if l2:
        g = e.op("add", g, e.op("multiply", e.const(l2, w), w))
    return g


def _square_sum(e: GradEmitter, x: int) -> int:
    axes = tuple(range(len(e.type(x).shape)))
    return e.op("reduce_sum", e.op("multiply", x, x), axes=axes, keepdims=False)


def _clip_by_global_norm(e: GradEmitter, grads: dict[str, int], clip_norm: float) -> dict[str, int]:
    """Every gradient times `clip_norm / max(global_norm, clip_norm)` (in float32 when the gradients'
    dtypes differ)."""
    dtypes = {e.type(g).dtype for g in grads.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
    total = None
    for g in grads.values():
        part = _square_sum(e, _as_dtype(e, g, dtype))
        total = part if total is None else e.op("add", total, part)
    assert total is not None            # grads is not empty
    clip = e.const(clip_norm, total)
    factor = e.op("divide", clip, e.op("maximum", e.op("sqrt", total), clip))
    return {var: e.op("multiply", g, _as_dtype(e, factor, e.type(g).dtype)) for var, g in grads.items()}


def _all_finite(e: GradEmitter, grads: list[int]) -> int:
    """A float32 scalar: 1 when every gradient element is finite, else 0 (the sum of g * 0 over all
    gradients is 0, or NaN when one element is NaN or infinite)."""
    total = None
    for g in grads:
        zeros = e.op("multiply", g, e.const(0.0, g))
        part = _as_dtype(e, e.op("reduce_sum", zeros, axes=tuple(range(len(e.type(g).shape))), keepdims=False),
                         "float32")
        total = part if total is None else e.op("add", total, part)
    assert total is not None
    return e.op("eq_mask", total, e.const(0.0, total))


@dataclass
class _DynamicScale:
    scale: int          # the loss scale variable, float32 (1,)
    inverse: int        # 1 / scale
    counter: int        # the good step counter, int64 (1,)
    scale_name: str
    counter_name: str


def _dynamic_loss_scale(ctx: TraceContext, policy: DynamicLossScalePolicy, loc: str) -> _DynamicScale:
    prefix = f"System-Train-DynamicLossScale-{ctx.job_name}"
    scale_name, counter_name = f"{prefix}-LossScale", f"{prefix}-GoodStepCounter"
    scale = _state_variable(ctx, scale_name, TensorType((1,), "float32"), loc, policy.initial_loss_scale)
    counter = _state_variable(ctx, counter_name, TensorType((1,), "int64"), loc, 0)
    e = GradEmitter(ctx.builder)
    e.loc, e.role = loc, "update"
    inverse = e.op("divide", e.const(1.0, scale), scale)
    return _DynamicScale(scale, inverse, counter, scale_name, counter_name)


def _schedule_loss_scale(e: GradEmitter, d: _DynamicScale, policy: DynamicLossScalePolicy,
                         finite: int) -> dict[str, int]:
    """OneFlow's dynamic_loss_scale_schedule: after a finite step the counter counts up and, at
    `increment_period`, resets while the scale grows by `multiplier` (at most FLT_MAX); after a
    non-finite step the counter resets and the scale shrinks by `multiplier` (at least 1)."""
    counted = e.op("add", d.counter, e.const(1, d.counter))
    period = e.const(policy.increment_period, d.counter)
    reached = e.op("eq_mask", e.op("minimum", counted, period), period)
    grown = e.op("minimum", e.op("multiply", d.scale, e.const(policy.multiplier, d.scale)),
                 e.const(3.4028234663852886e38, d.scale))
    shrunk = e.op("maximum", e.op("divide", d.scale, e.const(policy.multiplier, d.scale)), e.const(1.0, d.scale))
    good_scale = e.op("select_nonzero", reached, grown, d.scale)
    good_counter = e.op("select_nonzero", reached, e.const(0, d.counter), counted)
    return {d.scale_name: e.op("select_nonzero", finite, good_scale, shrunk),
            d.counter_name: e.op("select_nonzero", finite, good_counter, e.const(0, d.counter))}
