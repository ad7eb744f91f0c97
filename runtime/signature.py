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

import numpy as np

from flowc.compiler import dtypes
from flowc.compiler.errors import TraceError
from flowc.compiler.ir import dtype_name


# How a placeholder's argument is passed (OneFlow's three kinds of input blob definitions):
#   numpy:      one ndarray of exactly the declared shape (a consistent, static blob);
#   list:       `tp.ListNumpy`, a list with one ndarray per device (a mirrored blob), which may be
#               smaller than declared: same rank, at most as many elements (a dynamic blob);
#   list_list:  `tp.ListListNumpy`, a list per device of a list of ndarrays (a tensor list), together
#               at most as many elements as declared.
PLACEHOLDER_KINDS = ("numpy", "list", "list_list")


@dataclass(frozen=True)
class PlaceholderSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str          # IR dtype name
    kind: str = "numpy"     # one of PLACEHOLDER_KINDS
    batch_axis: int | None = 0

    @property
    def as_list(self) -> bool:
        """The argument comes as a list with one entry per device (one per rank of a mirrored-view job
        on several ranks, else one)."""
        return self.kind != "numpy"

    @property
    def is_dynamic(self) -> bool:
        """A mirrored input: its arrays may be smaller than the declared shape."""
        return self.kind != "numpy"


class NumpyPlaceholder:
    """What `tp.Numpy.Placeholder(shape, dtype, batch_axis=0)` returns: the declaration of one input.

    `batch_axis` (an axis or None) says which axis holds the samples; on one device it only is
    checked and recorded.  On several ranks (consistent view) the input is split along axis 0, or
    given whole to every rank with batch_axis=None; another axis is refused at the trace.  `name`
    names the input op in OneFlow; flowc names inputs after their parameters and keeps `name` for
    display only.
    """
    kind = "numpy"

    def __init__(self, shape, dtype=dtypes.float32, batch_axis: int | None = 0, name: str | None = None) -> None:
        what = f"{type(self).__qualname__.replace('Placeholder', '.Placeholder')}"
        try:
            self.shape = tuple(int(d) for d in shape)
        except TypeError:
            raise TypeError(f"{what}: shape must be a tuple of ints, got {shape!r}") from None
        if any(d < 0 for d in self.shape):
            raise ValueError(f"{what}: shape must not have negative dims, got {self.shape}")
        try:
            self.dtype = dtype_name(dtype)
        except TypeError as err:
            raise TypeError(f"{what}: {err}") from None
        if batch_axis is not None:
            if isinstance(batch_axis, bool) or not isinstance(batch_axis, int) or \
                    not -len(self.shape) <= batch_axis < max(len(self.shape), 1):
                raise ValueError(f"{what}: batch_axis must be None or an axis of the shape {self.shape}, "
                                 f"got {batch_axis!r}")
            batch_axis %= max(len(self.shape), 1)
        self.batch_axis = batch_axis
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{what}: name must be a str or None, got {type(name).__name__}")
        self.name = name

    def __repr__(self) -> str:
        kind = {"numpy": "Numpy", "list": "ListNumpy", "list_list": "ListListNumpy"}[self.kind]
        return f"{kind}.Placeholder({self.shape}, dtype=flow.{self.dtype})"


class ListNumpyPlaceholder(NumpyPlaceholder):
    """What `tp.ListNumpy.Placeholder(shape, dtype)` returns: a mirrored input, one array per device,
    each at most the declared shape (a dynamic blob: see `JobFunction` on how it is compiled)."""
    kind = "list"


class ListListNumpyPlaceholder(NumpyPlaceholder):
    """What `tp.ListListNumpy.Placeholder(shape, dtype)` returns: a tensor list per device."""
    kind = "list_list"


class Numpy:
    """Annotation for a job result returned as a `numpy.ndarray`; `Numpy.Placeholder` declares inputs.

    Example:
        def job(x: tp.Numpy.Placeholder((100, 784), dtype=flow.float)) -> tp.Numpy: ...
    """
    Placeholder = NumpyPlaceholder


class ListNumpy:
    """Annotation for a result returned as a list with one `numpy.ndarray` per device: one, unless a
    mirrored-view job runs on several ranks (then one per rank).

    Example:
        def job(x: tp.ListNumpy.Placeholder((100, 784))) -> tp.ListNumpy: ...
    """
    Placeholder = ListNumpyPlaceholder


class ListListNumpy:
    """Annotation for a result returned as a list per device of a list of `numpy.ndarray` (a tensor
    list): `[[array]]` on one device, one inner list per rank of a mirrored-view job on several ranks.

    An input declared `tp.ListListNumpy.Placeholder(shape)` takes `[[a, b, ...]]`: arrays of the
    declared rank holding at most the declared number of elements together.  The job sees them
    joined along axis 0, the way a tensor list lays out its data.

    Example:
        def job(x: tp.ListListNumpy.Placeholder((8, 4))) -> tp.ListListNumpy: ...
        job([[np.ones((3, 4), np.float32), np.ones((2, 4), np.float32)]])   # [[array of shape (5, 4)]]
    """
    Placeholder = ListListNumpyPlaceholder


class _Subscriptable:
    """`tp.Callback[T]` and `tp.Bundle[T]` as annotations that remember T."""

    def __init__(self, name: str, inner=None) -> None:
        self.name, self.inner = name, inner

    def __getitem__(self, inner) -> _Subscriptable:
        return _Subscriptable(self.name, inner)

    def __repr__(self) -> str:
        return f"tp.{self.name}[{self.inner!r}]" if self.inner is not None else f"tp.{self.name}"


Callback = _Subscriptable("Callback")   # -> tp.Callback[T]: asynchronous call, result passed to a callback
Bundle = _Subscriptable("Bundle")       # -> tp.Bundle[T]: T, or any nesting of tuples/lists/dicts of T


# A parameter's layout: the index of its placeholder in the flat list, or, for a parameter annotated
# `Tuple[tp.Numpy.Placeholder(...), ...]` (nesting allowed), a tuple of layouts.
ParamLayout = Any


def placeholders_of(fn: Callable) -> list[PlaceholderSpec]:
    """The job's placeholders in order (the members of Tuple-annotated parameters flattened)."""
    return parameters_of(fn)[0]


def parameters_of(fn: Callable) -> tuple[list[PlaceholderSpec], list[tuple[str, ParamLayout]]]:
    """(the flat placeholders, each parameter's name and layout).  Every parameter must be annotated
    with a placeholder, a `typing.Tuple` of them, or have a placeholder as default value (old API)."""
    specs: list[PlaceholderSpec] = []
    hints = _annotations(fn)

    def leaf(decl: NumpyPlaceholder, name: str) -> int:
        specs.append(PlaceholderSpec(name, decl.shape, decl.dtype, decl.kind, decl.batch_axis))
        return len(specs) - 1

    def walk(decl: Any, name: str, param: str) -> ParamLayout:
        if isinstance(decl, NumpyPlaceholder):
            return leaf(decl, name)
        if typing.get_origin(decl) is tuple:
            members = typing.get_args(decl)
            if not members or Ellipsis in members:
                raise TypeError(f"job function {fn.__name__!r}: parameter {param!r}: Tuple[...] must list "
                                f"one placeholder per member, got {decl!r}")
            return tuple(walk(m, f"{name}_{i}", param) for i, m in enumerate(members))
        raise TypeError(f"job function {fn.__name__!r}: parameter {param!r} needs an annotation such as "
                        f"tp.Numpy.Placeholder((100, 784), dtype=flow.float) or a Tuple of them, got {decl!r}")

    layouts = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY, p.KEYWORD_ONLY):
            raise TypeError(f"job function {fn.__name__!r}: parameter {p.name!r}: *args and **kwargs "
                            "cannot be job inputs; declare one parameter per input")
        decl = hints.get(p.name, p.annotation)
        if not isinstance(decl, NumpyPlaceholder) and isinstance(p.default, NumpyPlaceholder):
            decl = p.default
        layouts.append((p.name, walk(decl, p.name, p.name)))
    return specs, layouts


def pack_arguments(layouts: list[tuple[str, ParamLayout]], flat: list) -> list:
    """The job function's arguments from the flat placeholders: tuples where a parameter is a Tuple."""
    def pack(layout: ParamLayout):
        return flat[layout] if isinstance(layout, int) else tuple(pack(x) for x in layout)
    return [pack(layout) for _, layout in layouts]


def _annotations(fn: Callable) -> dict[str, Any]:
    # Annotations are evaluated objects here (placeholders are instances), so read them raw;
    # string annotations (from __future__ import annotations) are resolved in fn's globals.
    raw = dict(getattr(fn, "__annotations__", {}))
    closure = {name: cell.cell_contents for name, cell in
               zip(fn.__code__.co_freevars, fn.__closure__ or ()) if _has_value(cell)}
    for key, value in raw.items():
        if isinstance(value, str):
            try:
                raw[key] = eval(value, fn.__globals__, closure)  # noqa: S307 - the user's own annotation
            except NameError as err:
                raise TypeError(f"job function {fn.__name__!r}: cannot evaluate the annotation {value!r} of "
                                f"{key!r} ({err}); with `from __future__ import annotations` the names in "
                                "placeholder annotations must be visible from the module") from None
    return raw


def _has_value(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - reading an empty cell raises ValueError
    except ValueError:
        return False
    return True


# --- results ----------------------------------------------------------------------------

_LEAF_NAMES = {"numpy": "tp.Numpy", "list_numpy": "tp.ListNumpy", "list_list_numpy": "tp.ListListNumpy",
               "auto": "Blobs"}


@dataclass(frozen=True)
class ResultSpec:
    """The shape of a job's result: kind is numpy | list_numpy | list_list_numpy | tuple | list | dict |
    bundle | none,
    or auto (no annotation: the old `.get()` API, any nesting of Blobs)."""
    kind: str
    items: tuple[ResultSpec, ...] = ()

    def flatten(self, value: Any, where: str) -> tuple[list, Any]:
        """The Blobs a job returned (in order) and the layout that rebuilds its result from arrays."""
        return flatten_result(self, value, where)

    def describe(self) -> str:
        if self.kind in _LEAF_NAMES:
            return _LEAF_NAMES[self.kind]
        if self.kind == "none":
            return "None"
        inner = ", ".join(i.describe() for i in self.items)
        if self.kind == "dict":
            return f"Dict[str, {inner}]"
        return f"{self.kind.capitalize()}[{inner}]"


def result_spec_of(fn: Callable) -> tuple[ResultSpec, bool]:
    """(the result's spec, whether calls are asynchronous with a callback)."""
    hints = _annotations(fn)
    if "return" not in hints:
        return ResultSpec("auto"), False
    ann = hints["return"]
    if isinstance(ann, _Subscriptable) and ann.name == "Callback":
        if ann.inner is None:
            raise TypeError(f"job function {fn.__name__!r}: tp.Callback needs the result type, "
                            "e.g. -> tp.Callback[tp.Numpy]")
        return parse_result(ann.inner, fn.__name__), True
    return parse_result(ann, fn.__name__), False


def parse_result(ann: Any, job: str) -> ResultSpec:
    if ann is None or ann is type(None):
        return ResultSpec("none")
    if ann is Numpy:
        return ResultSpec("numpy")
    if ann is ListNumpy:
        return ResultSpec("list_numpy")
    if ann is ListListNumpy:
        return ResultSpec("list_list_numpy")
    if isinstance(ann, _Subscriptable) and ann.name == "Bundle" and ann.inner is not None:
        return ResultSpec("bundle", (parse_result(ann.inner, job),))
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
    from flowc.compiler.trace import Blob
    flat: list = []

    def walk(s: ResultSpec, v: Any, path: str) -> Any:
        if s.kind == "none":
            if v is not None:
                raise TraceError(f"{where}: annotated -> None but returned {type(v).__name__}")
            return None
        if s.kind == "auto" or s.kind == "bundle":
            leaf = s.items[0] if s.kind == "bundle" else ResultSpec("numpy")
            if isinstance(v, (tuple, list)):
                return type(v)(walk(s, x, f"{path}[{k}]") for k, x in enumerate(v))
            if isinstance(v, dict):
                return {k: walk(s, x, f"{path}[{k!r}]") for k, x in v.items()}
            if v is None and s.kind == "auto":
                return None
            return walk(leaf, v, path)
        if s.kind in ("list_numpy", "list_list_numpy"):
            if not isinstance(v, Blob):
                raise TraceError(f"{where}: result{path} is annotated {_LEAF_NAMES[s.kind]} but is "
                                 f"{type(v).__name__}")
            flat.append(v)
            return PerDevice(len(flat) - 1, tensor_list=s.kind == "list_list_numpy")
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


class PerRank(list):
    """One result of a distributed mirrored job: its array on each rank, in rank order
    (runtime/distributed.py).  A `tp.ListNumpy` result gives them as its per-device list; a `tp.Numpy`
    result and `LocalBlob.numpy()` give them joined (OneFlow's mirrored blob as one array)."""

    def joined(self) -> np.ndarray:
        """The ranks' arrays one after the other along axis 0, as OneFlow joins a mirrored blob's
        device arrays; a scalar on each rank has no axis to join along, and is an error that says so."""
        if self[0].ndim == 0:
            raise ValueError(f"a result of this mirrored-view job is a scalar on each of its {len(self)} ranks, "
                             "which do not join into one array (a tp.Numpy result or LocalBlob.numpy() joins "
                             "the ranks' arrays along axis 0): annotate it tp.ListNumpy for the list of them, or "
                             "take one rank's with LocalBlob.numpy(parallel_id)")
        return np.concatenate(self, axis=0)


def whole(value: Any) -> Any:
    """`value` as one array: a distributed mirrored result's arrays joined (`PerRank.joined`)."""
    return value.joined() if isinstance(value, PerRank) else value


@dataclass(frozen=True)
class PerDevice:
    """Layout leaf of a `tp.ListNumpy` result: a list with one array per device (`PerRank`);
    of a `tp.ListListNumpy` result (tensor_list): a list per device of a list of arrays."""
    index: int
    tensor_list: bool = False


def rebuild_result(layout: Any, arrays: list, leaf: Callable[[Any], Any] = whole) -> Any:
    """The user's result from the step's output arrays; `leaf` makes each tp.Numpy result's value
    from its array, or from its `PerRank` list in a distributed mirrored job (old API: LocalBlob)."""
    if layout is None:
        return None
    if isinstance(layout, PerDevice):
        value = arrays[layout.index]
        if isinstance(value, PerRank):     # a distributed mirrored job: one array per rank
            return [[v] for v in value] if layout.tensor_list else list(value)
        return [[value]] if layout.tensor_list else [value]
    if isinstance(layout, int):
        return leaf(arrays[layout])
    if isinstance(layout, (tuple, list)):
        return type(layout)(rebuild_result(x, arrays, leaf) for x in layout)
    return {k: rebuild_result(x, arrays, leaf) for k, x in layout.items()}


def _describe(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)}"
    return type(v).__name__
