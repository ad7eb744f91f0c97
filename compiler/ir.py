"""The typed graph every stage of flowc reads and writes.

A `Graph` is a list of `Node`s in topological order.  Each node produces one
tensor value, named by the node's id; inputs refer to producer ids.  Shapes and
dtypes are static: a job is traced once per placeholder signature.

Besides its values, a graph records what a step must do with them:
`outputs` (returned to the caller) and `assigns` (variable name -> id of the
node holding the variable's next value; the optimizer update of a train job).

Graphs are treated as immutable by the passes: a pass builds a new graph with
`GraphBuilder` or `Graph.replace(...)` rather than editing nodes in place.

Numbers enter the graph as exact built-in `bool`, `int` and `float` (attributes, shapes): a user's
subclass with its own `__repr__` or `__format__`, or a NumPy scalar, is converted when the node is
made, so only the numeric value can ever reach generated code.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import numpy as np

# dtype names used throughout the IR, with their NumPy and C++ spellings.
DTYPES: dict[str, tuple[np.dtype, str]] = {
    "float16": (np.dtype(np.float16), "flowc::half"),   # stored as 2 bytes, computed in float32
    "float32": (np.dtype(np.float32), "float"),
    "float64": (np.dtype(np.float64), "double"),
    "int8": (np.dtype(np.int8), "int8_t"),
    "uint8": (np.dtype(np.uint8), "uint8_t"),
    "int32": (np.dtype(np.int32), "int32_t"),
    "int64": (np.dtype(np.int64), "int64_t"),
}
FLOAT_DTYPES = ("float16", "float32", "float64")


def dtype_name(dtype: Any) -> str:
    """Canonical IR name of a dtype given as IR name, NumPy dtype or flow dtype."""
    name = getattr(dtype, "ir_name", None)
    if name is not None:
        if name not in DTYPES:       # a flow dtype name flowc has no kernels for
            raise TypeError(f"flow.{name} is not supported by flowc's kernels; flowc supports "
                            f"{', '.join(DTYPES)}")
        return name
    if dtype is None:
        raise TypeError("dtype must be given (e.g. flow.float32); None is not a dtype")
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    try:
        np_name = np.dtype(dtype).name
    except TypeError:
        np_name = None
    if np_name in DTYPES:
        return np_name
    raise TypeError(f"unsupported dtype {dtype!r}; flowc supports {', '.join(DTYPES)}")


def numpy_dtype(name: str) -> np.dtype:
    return DTYPES[name][0]


def c_type(name: str) -> str:
    return DTYPES[name][1]


def is_number(value: Any) -> bool:
    """Is `value` a Python or NumPy bool, int or float?"""
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


def plain_number(value: Any) -> bool | int | float:
    """A number as an exact built-in `bool`, `int` or `float` (NumPy scalars and subclasses too).

    A subclass of int or float may override `__repr__`, `__str__`, `__format__`, `__int__` or
    `__float__`; the base types' own conversions are called here, so only the value survives.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def plain_dim(value: Any) -> int:
    """A shape's dimension as an exact `int` (NumPy integers and int subclasses too)."""
    return int.__int__(operator.index(value))


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"

    def __post_init__(self) -> None:
        if type(self.shape) is not tuple or any(type(d) is not int for d in self.shape):
            object.__setattr__(self, "shape", tuple(plain_dim(d) for d in self.shape))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * numpy_dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.dtype}[{dims}]"


def freeze_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes as a sorted tuple so that nodes hash (CSE relies on it); numbers and strings as
    exact built-in values (see the module docstring)."""
    def freeze(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return tuple(freeze(x) for x in v)
        if isinstance(v, np.generic):
            v = v.item()
        if is_number(v):
            return plain_number(v)
        if isinstance(v, str):
            return str.__str__(v)
        return v
    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))


@dataclass(frozen=True)
class Node:
    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    type: TensorType
    loc: str = "<unknown>"          # user file:line that created the node
    name: str = ""                  # user-visible name (layer names, variables)
    role: str = "forward"           # forward | backward | update: for dumps and pictures

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)


@dataclass
class Graph:
    """A job's graph: nodes in topological order, outputs and variable assigns."""
    name: str
    nodes: list[Node]
    outputs: list[int]
    assigns: dict[str, int] = field(default_factory=dict)
    # name -> TensorType of every variable the graph reads (by `variable` nodes)
    variables: dict[str, TensorType] = field(default_factory=dict)
    # runtime scalars fed per step (learning rate, ...): name -> dtype
    scalars: dict[str, str] = field(default_factory=dict)
    placeholders: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_id = {n.id: n for n in self.nodes}

    def node(self, node_id: int) -> Node:
        return self._by_id[node_id]

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._by_id

    def consumers(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    def roots(self) -> list[int]:
        """Ids whose values the step must produce: outputs then assigned values."""
        return list(self.outputs) + list(self.assigns.values())

    def verify(self) -> None:
        """Check the structural invariants every pass must keep; raise on the first broken one."""
        from flowc.compiler.ops import OPS  # late import: ops import ir
        seen: set[int] = set()
        for n in self.nodes:
            if n.id in seen:
                raise AssertionError(f"{self.name}: node %{n.id} defined twice")
            for i in n.inputs:
                if i not in seen:
                    raise AssertionError(f"{self.name}: %{n.id} ({n.op}) uses %{i} before its definition")
            if n.op not in OPS:
                raise AssertionError(f"{self.name}: %{n.id} has unknown op {n.op!r}")
            expected = OPS[n.op].infer([self.node(i).type for i in n.inputs], n.attr_dict)
            if (expected.shape, expected.dtype) != (n.type.shape, n.type.dtype):
                raise AssertionError(f"{self.name}: %{n.id} ({n.op}) typed {n.type}, inference says {expected}")
            seen.add(n.id)
        for r in self.roots():
            if r not in seen:
                raise AssertionError(f"{self.name}: root %{r} is not defined")
        for var, value in self.assigns.items():
            vt, nt = self.variables[var], self.node(value).type
            if (vt.shape, vt.dtype) != (nt.shape, nt.dtype):
                raise AssertionError(f"{self.name}: assign to {var} of {nt}, variable is {vt}")

    def format(self, node_ids: Iterable[int] | None = None) -> str:
        """Readable text form: one line per node, with its user location."""
        keep = set(node_ids) if node_ids is not None else None
        lines = [f"graph {self.name} {{"]
        for n in self.nodes:
            if keep is not None and n.id not in keep:
                continue
            args = ", ".join(f"%{i}" for i in n.inputs)
            attrs = ", ".join(f"{k}={_short(v)}" for k, v in n.attrs)
            extra = f" {{{attrs}}}" if attrs else ""
            label = f"  # {n.name}" if n.name else ""
            lines.append(f"  %{n.id}: {n.type} = {n.op}({args}){extra}   [{n.role} @ {n.loc}]{label}")
        outs = ", ".join(f"%{o}" for o in self.outputs)
        lines.append(f"  return ({outs})")
        for var, value in self.assigns.items():
            lines.append(f"  assign {var} <- %{value}")
        lines.append("}")
        return "\n".join(lines)

    __str__ = format


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class GraphBuilder:
    """Appends nodes with fresh ids, inferring their types from the op table."""

    def __init__(self, start_id: int = 0) -> None:
        self.nodes: list[Node] = []
        self.types: dict[int, TensorType] = {}
        self.next_id = start_id

    def add(self, op: str, inputs: Iterable[int], attrs: dict[str, Any] | None = None, *,
            loc: str = "<unknown>", name: str = "", role: str = "forward",
            device: str = "cpu") -> int:
        from flowc.compiler.ops import OPS
        inputs = tuple(inputs)
        attrs = attrs or {}
        rule = OPS[op]
        inferred = rule.infer([self.types[i] for i in inputs], attrs)
        node = Node(self.next_id, op, inputs, freeze_attrs(attrs),
                    replace(inferred, device=device), loc, name, role)
        self.next_id += 1
        self.nodes.append(node)
        self.types[node.id] = node.type
        return node.id

    def copy_node(self, node: Node, inputs: tuple[int, ...] | None = None) -> int:
        """Re-add an existing node (keeping op, attrs, loc) with new input ids."""
        return self.add(node.op, node.inputs if inputs is None else inputs, node.attr_dict,
                        loc=node.loc, name=node.name, role=node.role, device=node.type.device)
