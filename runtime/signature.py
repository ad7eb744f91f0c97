"""Job signatures: placeholders from parameter annotations, results from the return annotation.

`flow.typing.Numpy.Placeholder(shape, dtype)` declares an input; the return
annotation (`tp.Numpy`, `Tuple[...]`, `List[...]`, `Dict[str, ...]`, `None`, nested)
says how the step's flat list of output arrays is given back to the caller.
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable

from compiler import dtypes
from compiler.errors import TraceError
from compiler.ir import dtype_name


@dataclass(frozen=True)
class PlaceholderSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str          # IR dtype name


class NumpyPlaceholder:
    """What `tp.Numpy.Placeholder(shape, dtype)` returns: the declaration of one input."""

    def __init__(self, shape, dtype=dtypes.float32) -> None:
        try:
            self.shape = tuple(int(d) for d in shape)
        except TypeError:
            raise TypeError(f"Numpy.Placeholder: shape must be a tuple of ints, got {shape!r}") from None
        if any(d < 0 for d in self.shape):
            raise ValueError(f"Numpy.Placeholder: shape must not have negative dims, got {self.shape}")
        self.dtype = dtype_name(dtype)

    def __repr__(self) -> str:
        return f"Numpy.Placeholder({self.shape}, dtype=flow.{self.dtype})"


class Numpy:
    """Annotation for a job result returned as a `numpy.ndarray`; `Numpy.Placeholder` declares inputs.

    Example:
        def job(x: tp.Numpy.Placeholder((100, 784), dtype=flow.float)) -> tp.Numpy: ...
    """
    Placeholder = NumpyPlaceholder


def placeholders_of(fn: Callable) -> list[PlaceholderSpec]:
    """Every parameter must be annotated with a placeholder (or have one as default)."""
    specs = []
    hints = _annotations(fn)
    for p in inspect.signature(fn).parameters.values():
        decl = hints.get(p.name, p.annotation)
        if not isinstance(decl, NumpyPlaceholder) and isinstance(p.default, NumpyPlaceholder):
            decl = p.default
        if not isinstance(decl, NumpyPlaceholder):
            raise TypeError(f"job function {fn.__name__!r}: parameter {p.name!r} needs an annotation such as "
                            f"tp.Numpy.Placeholder((100, 784), dtype=flow.float), got {decl!r}")
        specs.append(PlaceholderSpec(p.name, decl.shape, decl.dtype))
    return specs


def _annotations(fn: Callable) -> dict[str, Any]:
    # Annotations are evaluated objects here (placeholders are instances), so read them raw;
    # string annotations (from __future__ import annotations) are resolved in fn's globals.
    raw = dict(getattr(fn, "__annotations__", {}))
    for key, value in raw.items():
        if isinstance(value, str):
            raw[key] = eval(value, fn.__globals__)  # noqa: S307 - the user's own annotation
    return raw


# --- results ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ResultSpec:
    """The shape of a job's result: kind is numpy | tuple | list | dict | none."""
    kind: str
    items: tuple["ResultSpec", ...] = ()

    def describe(self) -> str:
        if self.kind == "numpy":
            return "tp.Numpy"
        if self.kind == "none":
            return "None"
        inner = ", ".join(i.describe() for i in self.items)
        if self.kind == "dict":
            return f"Dict[str, {inner}]"
        return f"{self.kind.capitalize()}[{inner}]"


def result_spec_of(fn: Callable) -> ResultSpec:
    hints = _annotations(fn)
    if "return" not in hints:
        raise TypeError(f"job function {fn.__name__!r} needs a return annotation such as -> tp.Numpy "
                        "(or -> None)")
    return parse_result(hints["return"], fn.__name__)


def parse_result(ann: Any, job: str) -> ResultSpec:
    if ann is None or ann is type(None):
        return ResultSpec("none")
    if ann is Numpy:
        return ResultSpec("numpy")
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is tuple:
        return ResultSpec("tuple", tuple(parse_result(a, job) for a in args))
    if origin is list and len(args) == 1:
        return ResultSpec("list", (parse_result(args[0], job),))
    if origin is dict and len(args) == 2 and args[0] is str:
        return ResultSpec("dict", (parse_result(args[1], job),))
    raise TypeError(f"job function {job!r}: unsupported return annotation {ann!r}; use tp.Numpy, "
                    "Tuple[...], List[...], Dict[str, ...] of them, or None")


def flatten_result(spec: ResultSpec, value: Any, where: str) -> tuple[list, Any]:
    """(flat list of Blobs, layout to rebuild the value from arrays); errors name `where`."""
    from compiler.trace import Blob
    flat: list = []

    def walk(s: ResultSpec, v: Any, path: str) -> Any:
        if s.kind == "none":
            if v is not None:
                raise TraceError(f"{where}: annotated -> None but returned {type(v).__name__}")
            return None
        if s.kind == "numpy":
            if not isinstance(v, Blob):
                raise TraceError(f"{where}: result{path} is annotated tp.Numpy but is {type(v).__name__}, "
                                 "not a Blob")
            flat.append(v)
            return len(flat) - 1
        if s.kind == "tuple":
            if not isinstance(v, tuple) or len(v) != len(s.items):
                raise TraceError(f"{where}: result{path} is annotated {s.describe()} but is {_describe(v)}")
            return tuple(walk(i, x, f"{path}[{k}]") for k, (i, x) in enumerate(zip(s.items, v)))
        if s.kind == "list":
            if not isinstance(v, (list, tuple)):
                raise TraceError(f"{where}: result{path} is annotated {s.describe()} but is {_describe(v)}")
            return [walk(s.items[0], x, f"{path}[{k}]") for k, x in enumerate(v)]
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise TraceError(f"{where}: result{path} is annotated {s.describe()} but is {_describe(v)}")
        return {k: walk(s.items[0], x, f"{path}[{k!r}]") for k, x in v.items()}

    layout = walk(spec, value, "")
    return flat, layout


def rebuild_result(layout: Any, arrays: list) -> Any:
    if layout is None:
        return None
    if isinstance(layout, int):
        return arrays[layout]
    if isinstance(layout, tuple):
        return tuple(rebuild_result(x, arrays) for x in layout)
    if isinstance(layout, list):
        return [rebuild_result(x, arrays) for x in layout]
    return {k: rebuild_result(x, arrays) for k, x in layout.items()}


def _describe(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)}"
    return type(v).__name__
