"""Tracing: running a job function once on placeholder `Blob`s to record its graph.

While a job function runs under `tracing(...)`, every flow op appends a node to
the current `TraceContext` through `emit`.  Each node records the user's file:line
(the first stack frame outside flowc), and an op misused by the user raises a
`TraceError` whose message starts with that line.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Iterator

import numpy as np

from flowc.compiler import dtypes
from flowc.compiler.errors import JobCallError, TraceError
from flowc.compiler.ir import GraphBuilder, TensorType, plain_number
from flowc.compiler.ops import ShapeError

# flowc's own modules, told apart by module name (not path: the packages load through `flowc/`,
# and a wheel puts them elsewhere again).
_OWN_PACKAGES = ("flow", "flowc")


def is_flowc_frame(frame) -> bool:
    """Is `frame` running flowc's own code (or the import machinery), not the user's?"""
    module = frame.f_globals.get("__name__", "")
    return (module.split(".", 1)[0] in _OWN_PACKAGES or module.startswith("importlib")
            or "importlib" in frame.f_code.co_filename)


def user_location() -> str:
    """`file:line` of the innermost stack frame that is not flowc's own code."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if not is_flowc_frame(frame):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclass(frozen=True)
class WatchSpec:
    """One `flow.watch` / `flow.watch_diff` of a traced job: what is watched and who receives it.

    `kind` is "value" or "diff"; `node` the watched Blob's node; `handler` the user's function,
    called with the value converted as `convert` says ("numpy", "list_numpy" or "blob": the
    old API's LocalBlob, for a handler without annotation); `loc` the user's line that asked.
    `quiet`: a diff without a gradient is dropped without a warning (a `flow.watch_scope` watches
    every Blob made inside it, most of which have none).
    """
    kind: str
    node: int
    handler: Any
    convert: str
    loc: str
    quiet: bool = False


@dataclass
class TraceContext:
    """Everything recorded while one job function is traced."""
    job_name: str
    job_type: str                                   # "train" | "predict"
    session: Any                                    # runtime.session.Session
    builder: GraphBuilder = field(default_factory=GraphBuilder)
    placeholders: list[int] = field(default_factory=list)
    variable_nodes: dict[str, int] = field(default_factory=dict)
    trainable_variables: set[str] = field(default_factory=set)   # declared trainable=True in this job
    # variable -> (the user's line, axis) of a `distribute=flow.distribute.split(axis)` (model parallelism: one
    # device holds all of it; on several ranks each holds a slice, compiler/passes/model_parallel.py)
    split_variables: dict[str, tuple[str, int]] = field(default_factory=dict)
    # variable -> its optimizer state variables of its own shape (momentum, Adam's moments): held as it is
    state_variables: dict[str, list[str]] = field(default_factory=dict)
    # (machine_device_ids, the user's line) of every flow.scope.placement entered while tracing
    placements: list[tuple[str, str]] = field(default_factory=list)
    losses: list[Blob] = field(default_factory=list)
    optimizers: list[tuple[Any, Blob]] = field(default_factory=list)   # (optimizer, loss)
    device_stack: list[str] = field(default_factory=lambda: ["cpu"])
    name_counts: dict[str, int] = field(default_factory=dict)
    default_dtype: str = "float32"                  # function_config().default_data_type
    logical_view: str = "consistent"                # function_config().default_logical_view
    assigns: dict[str, int] = field(default_factory=dict)   # variable -> next value, set by layers
    assign_lines: dict[str, str] = field(default_factory=dict)   # variable -> user line of its flow.assign
    dynamic_inputs: set[int] = field(default_factory=set)   # placeholders of mirrored (dynamic) inputs
    regularizers: dict[str, tuple[float, float]] = field(default_factory=dict)   # variable -> (l1, l2)
    watches: list[WatchSpec] = field(default_factory=list)  # flow.watch / flow.watch_diff, in call order
    # the flow.watch_scope blocks entered, innermost last: each watches every Blob made inside (`watch_once`)
    watch_scopes: list[Any] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)     # flow.scope.namespace, outermost first
    function_config: Any = None      # the job's FunctionConfig (flow.current_global_function_desc reads it)
    thread_id: int = field(default_factory=threading.get_ident)   # the thread that traces

    @property
    def device(self) -> str:
        return self.device_stack[-1]

    def unique_name(self, prefix: str) -> str:
        """OneFlow-style default op names: `Dense_0`, `Dense_1`, ..."""
        count = self.name_counts.get(prefix, 0)
        self.name_counts[prefix] = count + 1
        return f"{prefix}_{count}"


_current: list[TraceContext] = []


@contextlib.contextmanager
def tracing(ctx: TraceContext) -> Iterator[TraceContext]:
    _current.append(ctx)
    try:
        yield ctx
    finally:
        _current.pop()


def current(what: str = "this op") -> TraceContext:
    """The trace in progress; a clear error when a flow op is used outside a job function."""
    if not _current:
        raise TraceError(f"{user_location()}: {what} can only be used inside a function decorated "
                         "with @flow.global_function (it builds the job's graph)")
    return _current[-1]


def tracing_in_this_thread() -> bool:
    """Is this thread tracing a job function now?"""
    me = threading.get_ident()
    return any(ctx.thread_id == me for ctx in _current)


def refuse_job_call_while_tracing(job_name: str) -> None:
    """Raise JobCallError, naming the user's line, if this thread is tracing a job function.

    A job's body builds a graph; calling a job there would run a compiled step (or, for the job
    itself, trace it again without end) in the middle of that graph.  Other threads' traces do
    not count: a thread may call jobs while another one traces.
    """
    me = threading.get_ident()
    outer = next((ctx for ctx in reversed(_current) if ctx.thread_id == me), None)
    if outer is not None:
        raise JobCallError(f"{user_location()}: job {job_name!r} is called inside job {outer.job_name!r} "
                           f"while that job is traced; a job function cannot call another job function. "
                           f"Move the shared ops into a plain Python function and call that from both")


def emit(op: str, inputs: list[Blob] | tuple = (), attrs: dict | None = None, *,
         name: str = "", api: str | None = None, loc: str | None = None) -> Blob:
    """Append one node to the current job's graph and return its Blob.

    `api` is the user-facing op name used in error messages (e.g. `flow.matmul`); `loc` overrides
    the user's source line found on the stack.  Inside `flow.scope.namespace("a")` every op is
    named `a-<name>` (an unnamed one `a-<op>_<id>`), as OneFlow's user_op_builder prefixes the given
    and the generated op names; a variable's node carries its variable name, which get_variable has
    prefixed already.
    """
    ctx = current(api or op)
    if ctx.namespaces and op != "variable":
        name = "-".join(ctx.namespaces + [name or f"{op}_{ctx.builder.next_id}"])
    for b in inputs:
        if b.ctx is not ctx:
            raise TraceError(f"{user_location()}: {api or op}: a Blob of job {b.ctx.job_name!r} "
                             f"was used while tracing job {ctx.job_name!r}")
    loc = loc or user_location()
    try:
        node_id = ctx.builder.add(op, [b.id for b in inputs], attrs or {}, loc=loc, name=name,
                                  device=ctx.device)
    except ShapeError as err:
        raise TraceError(f"{loc}: {api or op}: {err}") from None
    blob = Blob(ctx, node_id)
    for scope in ctx.watch_scopes:
        scope.watch_once(blob)
    return blob


def scalar_blob(value: float | int, like: Blob) -> Blob:
    return emit("constant", [], {"value": value, "shape": (), "dtype": like.type.dtype})


def as_blob(value: Any, like: Blob, api: str) -> Blob:
    if isinstance(value, Blob):
        return value
    if isinstance(value, np.number):
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # the value only: a subclass's own __repr__/__format__ never reaches the graph or the source
        return scalar_blob(plain_number(value), like)
    raise TraceError(f"{user_location()}: {api}: expected a Blob or a Python number, got {type(value).__name__}")


class Blob:
    """A value inside a job function: it has a shape and dtype but no data until the job runs.

    Example:
        hidden = flow.nn.relu(x * 2.0 + 1.0)
        hidden.shape  # (100, 512)
    """

    __array_priority__ = 1000  # so that `np.float32(2) * blob` defers to Blob

    def __init__(self, ctx: TraceContext, node_id: int) -> None:
        self.ctx = ctx
        self.id = node_id

    @property
    def type(self) -> TensorType:
        return self.ctx.builder.types[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> dtypes.DType:
        return dtypes.BY_NAME[self.type.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def logical_blob_name(self) -> str:
        return f"{self.ctx.job_name}/%{self.id}"

    @property
    def op_name(self) -> str:
        """The name of the op that computes this Blob: the name given to it, else `<op>_<id>`; inside
        `flow.scope.namespace` blocks either is prefixed by them, as in OneFlow.

        Example:
            with flow.scope.namespace("enc"):
                y = flow.math.relu(x, name="act")
            y.op_name          # "enc-act"
        """
        nodes = self.ctx.builder.nodes
        node = nodes[self.id] if self.id < len(nodes) and nodes[self.id].id == self.id else \
            next(n for n in nodes if n.id == self.id)
        return node.name or f"{node.op}_{self.id}"

    def __repr__(self) -> str:
        return f"Blob(%{self.id}: {self.type})"

    @property
    def is_dynamic(self) -> bool:
        """Whether the Blob is computed from a mirrored input (`tp.ListNumpy.Placeholder`), whose arrays
        may be smaller than declared.  flowc traces such a job for the shapes it is called with, so
        `.shape` is the actual shape, where OneFlow reports the declared maximum."""
        if not self.ctx.dynamic_inputs:
            return False
        nodes, seen, todo = self.ctx.builder.nodes, set(), [self.id]
        while todo:
            node_id = todo.pop()
            if node_id in self.ctx.dynamic_inputs:
                return True
            if node_id not in seen:
                seen.add(node_id)
                todo.extend(nodes[node_id].inputs)
        return False

    @property
    def is_tensor_list(self) -> bool:
        """OneFlow's tensor-list blobs; flowc joins a tensor-list input into one tensor."""
        return False

    def with_distribute(self, distribute) -> Blob:
        """`blob.with_distribute(flow.distribute.split(0))`: a parallel-distribution hint.  On one
        device every distribution is the whole blob, so the hint is checked and the Blob returned."""
        from flowc.compiler.distribute import check_distribute
        check_distribute(distribute, self, "Blob.with_distribute")
        return self

    def with_split_distribute(self, axis: int) -> Blob:
        """`blob.with_split_distribute(axis)`, the same as `with_distribute(flow.distribute.split(axis))`."""
        from flowc.compiler.distribute import Split
        return self.with_distribute(Split(axis))

    def with_broadcast_distribute(self) -> Blob:
        """`blob.with_broadcast_distribute()`, the same as `with_distribute(flow.distribute.broadcast())`."""
        from flowc.compiler.distribute import Broadcast
        return self.with_distribute(Broadcast())

    def _binary(self, op: str, other: Any, api: str, reverse: bool = False) -> Blob:
        other = as_blob(other, self, api)
        a, b = (other, self) if reverse else (self, other)
        return emit(op, [a, b], api=api)

    def __add__(self, o): return self._binary("add", o, "+")
    def __radd__(self, o): return self._binary("add", o, "+", True)
    def __sub__(self, o): return self._binary("subtract", o, "-")
    def __rsub__(self, o): return self._binary("subtract", o, "-", True)
    def __mul__(self, o): return self._binary("multiply", o, "*")
    def __rmul__(self, o): return self._binary("multiply", o, "*", True)
    def __truediv__(self, o): return self._binary("divide", o, "/")
    def __rtruediv__(self, o): return self._binary("divide", o, "/", True)
    def __neg__(self): return emit("negative", [self], api="unary -")
    # OneFlow's Blob operators for flow.math.mod and the comparisons (int8 0/1).  == and != stay
    # Python's identity comparison here: Blobs are kept in lists and dicts while tracing.
    def __mod__(self, o): return self._binary("mod", o, "%")
    def __lt__(self, o): return self._binary("less", o, "<")
    def __le__(self, o): return self._binary("less_equal", o, "<=")
    def __gt__(self, o): return self._binary("greater", o, ">")
    def __ge__(self, o): return self._binary("greater_equal", o, ">=")

    def __bool__(self) -> bool:
        # OneFlow's Blob has no __bool__, so there `if blob:` is always true, and `if loss > 0:` too:
        # refused here, since the second is always a bug; the first is a None test, said below
        raise TraceError(f"{user_location()}: a Blob has no value while the job is traced, so it cannot "
                         "be used in `if`/`while`; compute both branches or use flow ops (flow.where). "
                         "To test whether a Blob was given, write `if blob is not None:`")
