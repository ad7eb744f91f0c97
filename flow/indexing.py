"""Sources, views and indexing with OneFlow 0.3's names: `flow.constant`, `flow.zeros_like`,
`flow.squeeze`, `flow.gather`, `flow.slice_v2`, `flow.one_hot`, `flow.where`, `flow.pad`, ...

Views (squeeze, expand_dims, identity) are reshapes and cost nothing at run time; `pad` and `stack`
are concatenations; the rest are the ops of compiler/ops/indexing.py.
"""
from __future__ import annotations

import builtins
import math
from typing import Sequence

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import dtype_name, plain_number
from flowc.compiler.trace import Blob, as_blob, current, emit, user_location
from flow._ops import axes, check_blob
from flow.array_ops import concat, reshape


def _fail(api: str, message: str) -> TraceError:
    return TraceError(f"{user_location()}: {api}: {message}")


def _dtype(dtype, default: str, api: str) -> str:
    if dtype is None:
        return default
    try:
        return dtype_name(dtype)
    except TypeError as err:
        raise _fail(api, str(err)) from None


def _number(value, api: str, arg: str):
    try:
        return plain_number(value)
    except TypeError:
        raise _fail(api, f"{arg} must be a number, got {type(value).__name__}") from None


def _shape(shape, api: str) -> tuple[int, ...]:
    if shape is None:
        return ()
    if isinstance(shape, int):
        return (shape,)
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise _fail(api, f"shape {list(dims)} has a negative dimension")
    return dims


# --- sources -------------------------------------------------------------------------------

def constant(value, dtype=None, shape=None, name: str | None = None) -> Blob:
    """`flow.constant(value, dtype=None, shape=None)`: a Blob filled with `value` (float32 unless told).

    Example:
        ones = flow.constant(1.0, dtype=flow.float, shape=(2, 3))
    """
    api = "flow.constant"
    return emit("constant", [], {"value": _number(value, api, "value"), "shape": _shape(shape, api),
                                 "dtype": _dtype(dtype, "float32", api)}, name=name or "", api=api)


def constant_scalar(value, dtype=None, name: str | None = None) -> Blob:
    """`flow.constant_scalar(value, dtype=None)`: `value` as a Blob of shape (1,), OneFlow's
    `flow.constant(value, dtype, shape=[1])`.

    Example:
        std = flow.constant_scalar(0.5, dtype=flow.float32)
    """
    api = "flow.constant_scalar"
    return emit("constant", [], {"value": _number(value, api, "value"), "shape": (1,),
                                 "dtype": _dtype(dtype, "float32", api)}, name=name or "", api=api)


def constant_like(like, value, dtype=None, name: str | None = None) -> Blob:
    """`flow.constant_like(like, value, dtype=None)`: `value` in the shape (and by default dtype) of `like`.

    Example:
        fives = flow.constant_like(x, 5.0)
    """
    api = "flow.constant_like"
    like = check_blob(like, api, "like")
    return emit("constant", [], {"value": _number(value, api, "value"), "shape": like.shape,
                                 "dtype": _dtype(dtype, like.type.dtype, api)}, name=name or "", api=api)


def ones_like(like, dtype=None, name: str | None = None) -> Blob:
    """`flow.ones_like(like, dtype=None)`.

    Example:
        mask = flow.ones_like(x)
    """
    return constant_like(like, 1, dtype, name)


def zeros_like(like, dtype=None, name: str | None = None) -> Blob:
    """`flow.zeros_like(like, dtype=None)`.

    Example:
        acc = flow.zeros_like(x)
    """
    return constant_like(like, 0, dtype, name)


def zeros(shape, dtype=None, name: str | None = None) -> Blob:
    """`flow.zeros(shape, dtype=float32)`.

    Example:
        z = flow.zeros((2, 3))
    """
    return constant(0, dtype, shape, name)


def ones(shape, dtype=None, name: str | None = None) -> Blob:
    """`flow.ones(shape, dtype=float32)`.

    Example:
        o = flow.ones((2, 3))
    """
    return constant(1, dtype, shape, name)


# --- views ---------------------------------------------------------------------------------

def identity(x, name: str | None = None) -> Blob:
    """`flow.identity(x)`: the same values (a view: no copy is made).

    Example:
        y = flow.identity(x)
    """
    x = check_blob(x, "flow.identity", "x")
    return emit("reshape", [x], {"shape": x.shape}, name=name or "", api="flow.identity")


def identity_n(inputs: Sequence[Blob], name: str | None = None) -> list[Blob]:
    """`flow.identity_n(inputs)`: `identity` of each Blob of a list.

    Example:
        a2, b2 = flow.identity_n([a, b])
    """
    return [identity(check_blob(x, "flow.identity_n", f"inputs[{i}]")) for i, x in enumerate(inputs)]


def cast_to_current_logical_view(x) -> Blob:
    """`flow.cast_to_current_logical_view(x)`: on one device every view is the logical one, so `x`.

    Example:
        x = flow.cast_to_current_logical_view(x)
    """
    return check_blob(x, "flow.cast_to_current_logical_view", "x")


def squeeze(input, axis=None, name: str | None = None) -> Blob:
    """`flow.squeeze(input, axis=None)`: drop the size-1 dims `axis` (all of them by default).

    Example:
        v = flow.squeeze(x, axis=[1])      # (4, 1, 3) -> (4, 3)
    """
    api = "flow.squeeze"
    x = check_blob(input, api, "input")
    drop = [d for d, n in enumerate(x.shape) if n == 1] if axis is None else axes(x, axis, api)
    bad = [d for d in drop if x.shape[d] != 1]
    if bad:
        raise _fail(api, f"axis {bad[0]} of {list(x.shape)} has size {x.shape[bad[0]]}, not 1")
    return reshape(x, [n for d, n in enumerate(x.shape) if d not in drop], name)


def expand_dims(input, axis: int, name: str | None = None) -> Blob:
    """`flow.expand_dims(input, axis)`: insert a size-1 dim at `axis` (-rank-1 <= axis <= rank).

    Example:
        col = flow.expand_dims(v, axis=1)  # (4,) -> (4, 1)
    """
    api = "flow.expand_dims"
    x = check_blob(input, api, "input")
    rank = len(x.shape)
    if not -rank - 1 <= int(axis) <= rank:
        raise _fail(api, f"axis {axis} is out of range [{-rank - 1}, {rank}]")
    at = int(axis) % (rank + 1)
    return reshape(x, list(x.shape[:at]) + [1] + list(x.shape[at:]), name)


def reshape_like(x, like, name: str | None = None) -> Blob:
    """`flow.reshape_like(x, like)`: `x` reshaped to the shape of `like`.

    Example:
        y = flow.reshape_like(x, like=template)
    """
    return reshape(check_blob(x, "flow.reshape_like", "x"), list(check_blob(like, "flow.reshape_like", "like").shape),
                   name)


def broadcast_like(x, like, broadcast_axes=None, name: str | None = None) -> Blob:
    """`flow.broadcast_like(x, like, broadcast_axes=None)`: `x` repeated along `broadcast_axes` of `like`.

    `x` has like's shape with the broadcast axes either of size 1 or left out.

    Example:
        rows = flow.broadcast_like(bias, like=x, broadcast_axes=(0,))   # (3,) -> (4, 3)
    """
    api = "flow.broadcast_like"
    x, like = check_blob(x, api, "x"), check_blob(like, api, "like")
    target = like.shape
    bcast = list(range(len(target))) if broadcast_axes is None else list(axes(like, broadcast_axes, api))
    if not bcast:
        raise _fail(api, "broadcast_axes must name at least one axis of like")
    kept = [1 if d in bcast else n for d, n in enumerate(target)]
    if x.type.size != math.prod(kept) or \
            [n for n in x.shape if n != 1] != [n for n in kept if n != 1]:
        raise _fail(api, f"x of shape {list(x.shape)} does not match like {list(target)} "
                         f"outside broadcast_axes {bcast}")
    if list(x.shape) != kept:
        x = reshape(x, kept)
    return emit("broadcast_to", [x], {"shape": target}, name=name or "", api=api)


def assign(ref, value, dtype=None, name: str | None = None) -> None:
    """`flow.assign(ref, value)`: after this step the variable `ref` holds `value` (in train and
    predict jobs).  Within the step every read of `ref` sees the value it had before the step, as in
    OneFlow, where the assignment runs after the ops that read the variable.  A variable the job's
    optimizer also updates cannot be assigned (OneFlow defines no order between the two writes): the
    trace fails naming the variable and this line.

    Example:
        counter = flow.get_variable("counter", shape=(1,), initializer=flow.zeros_initializer())
        flow.assign(counter, counter + 1.0)
    """
    api = "flow.assign"
    ref = check_blob(ref, api, "ref")
    ctx = current(api)
    var = next((n for n in ctx.builder.nodes if n.id == ref.id), None)
    if var is None or var.op != "variable":
        raise _fail(api, "ref must be a variable (the Blob flow.get_variable returns)")
    value = as_blob(value, ref, api)
    if value.shape != ref.shape:
        value = emit("broadcast_to", [value], {"shape": ref.shape}, api=api)
    if value.type.dtype != ref.type.dtype:
        value = emit("cast", [value], {"dtype": ref.type.dtype}, api=api)
    ctx.assigns[var.attr("name")] = value.id
    ctx.assign_lines[var.attr("name")] = user_location()


# --- indexing ------------------------------------------------------------------------------

def gather(params, indices, validate_indices=None, axis: int | None = None, batch_dims: int = 0,
           name: str | None = None) -> Blob:
    """`flow.gather(params, indices, axis=None, batch_dims=0)`: slices of `params` along `axis`
    (default `batch_dims`) picked by `indices`; its gradient is a deterministic scatter-add (the
    embedding backward).  An index outside [0, params.shape[axis]) fails the step with a StepError
    naming this line.

    Example:
        rows = flow.gather(embedding, word_ids)          # (vocab, dim), (N,) -> (N, dim)
    """
    api = "flow.gather"
    p, ix = check_blob(params, api, "params"), check_blob(indices, api, "indices")
    bd = int(batch_dims)
    if bd < 0:
        bd += len(ix.shape)
    ax = bd if axis is None else axes(p, axis, api)[0]
    if bd > 0 and ax == bd:
        # OneFlow 0.3 sends this case to its batch_gather op, whose batch is every axis of `indices`
        # but the last, whatever batch_dims says (BERT's pretraining gathers (B, S, H) by (B, P) with
        # axis=2, batch_dims=2 and gets (B, P, H))
        bd = ax = len(ix.shape) - 1
    return emit("gather", [p, ix], {"axis": ax, "batch_dims": bd}, name=name or "", api=api)


def _python_slice(start, stop, step, size: int, api: str, d: int) -> tuple[int, int, int]:
    """(start, step, count) of one dim's (start, stop, step), negative indices and clamping as Python's."""
    step = 1 if step is None else int(step)
    if step == 0:
        raise _fail(api, f"dim {d}: the slice step cannot be 0")
    if start is not None and not -size <= int(start) < max(size, 1):
        raise _fail(api, f"dim {d}: start {start} is outside [{-size}, {size})")
    first, _, _ = builtins.slice(start, stop, step).indices(size)
    count = len(range(*builtins.slice(start, stop, step).indices(size)))
    return (first if count else 0), step, count


def _slice_attrs(x: Blob, slice_tup_list, api: str) -> dict:
    items = list(slice_tup_list)
    if len(items) > len(x.shape):
        raise _fail(api, f"slice_tup_list has {len(items)} entries for a Blob of rank {len(x.shape)}")
    items += [(None, None, None)] * (len(x.shape) - len(items))
    start, step, shape = [], [], []
    for d, (item, size) in enumerate(zip(items, x.shape)):
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise _fail(api, f"slice_tup_list[{d}] must be (start, stop, step), got {item!r}")
        b, s, n = _python_slice(item[0], item[1], item[2], size, api, d)
        start.append(b)
        step.append(s)
        shape.append(n)
    return {"start": tuple(start), "step": tuple(step), "shape": tuple(shape)}


def slice_v2(x, slice_tup_list, name: str | None = None) -> Blob:
    """`flow.slice_v2(x, slice_tup_list)`: one (start, stop, step) per leading dim, as Python slices
    (None for a default, negative steps allowed); missing dims are kept whole.

    Example:
        every_other = flow.slice_v2(x, [(None, None, None), (0, 5, 2)])
    """
    api = "flow.slice_v2"
    x = check_blob(x, api, "x")
    return emit("strided_slice", [x], _slice_attrs(x, slice_tup_list, api), name=name or "", api=api)


def slice(x, begin, size, name: str | None = None) -> Blob:  # noqa: A001 - OneFlow's name
    """`flow.slice(x, begin, size)`: `size[d]` elements from `begin[d]` in every dim (None keeps a dim
    whole, a size of -1 runs to its end).  As in OneFlow, a size may be up to the dim's length and
    is cut at the dim's end: `begin=[1], size=[n]` is `x[1:]`.

    Example:
        head = flow.slice(x, begin=[None, 0], size=[None, 2])
    """
    api = "flow.slice"
    x = check_blob(x, api, "x")
    if len(begin) != len(x.shape) or len(size) != len(x.shape):
        raise _fail(api, f"begin and size need one entry per dim of {list(x.shape)}")
    tups = []
    for d, (b, s, n) in enumerate(zip(begin, size, x.shape)):
        if b is not None and not -n <= b < n:
            raise _fail(api, f"begin[{d}] = {b} is outside [{-n}, {n})")
        start = 0 if b is None else b % n
        if s is None or s == -1:
            tups.append((start, None, 1))
        elif s <= 0 or s > n:
            raise _fail(api, f"size[{d}] = {s} is outside [1, {n}], the size of dim {d} (or -1: to its end)")
        else:
            tups.append((start, min(start + s, n), 1))
    return emit("strided_slice", [x], _slice_attrs(x, tups, api), name=name or "", api=api)


def slice_update(x, update, slice_tup_list, name: str | None = None) -> Blob:
    """`flow.slice_update(x, update, slice_tup_list)`: `x` with the slice replaced by `update`.

    Example:
        y = flow.slice_update(x, zeros, [(None, None, None), (0, 2, 1)])
    """
    api = "flow.slice_update"
    x, update = check_blob(x, api, "x"), check_blob(update, api, "update")
    return emit("slice_update", [x, update], _slice_attrs(x, slice_tup_list, api), name=name or "", api=api)


def reverse(input, axis, name: str | None = None) -> Blob:
    """`flow.reverse(input, axis)`: the elements in reverse order along `axis` (an int or a list).

    Example:
        backwards = flow.reverse(x, axis=1)
    """
    api = "flow.reverse"
    x = check_blob(input, api, "input")
    tups = [(None, None, -1) if d in axes(x, axis, api) else (None, None, None) for d in range(len(x.shape))]
    return emit("strided_slice", [x], _slice_attrs(x, tups, api), name=name or "", api=api)


def one_hot(indices, depth: int, on_value=1, off_value=0, axis: int = -1, dtype=None,
            name: str | None = None) -> Blob:
    """`flow.one_hot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=None)`: `on_value` at each
    index along a new axis of size `depth`, `off_value` elsewhere (float32 unless told); an index
    outside [0, depth) gives all `off_value`.

    Example:
        targets = flow.one_hot(labels, depth=10)        # (N,) int32 -> (N, 10) float32
    """
    api = "flow.one_hot"
    ix = check_blob(indices, api, "indices")
    rank = len(ix.shape)
    if not -rank - 1 <= int(axis) <= rank:
        raise _fail(api, f"axis {axis} is out of range [{-rank - 1}, {rank}]")
    return emit("one_hot", [ix], {"depth": int(depth), "axis": int(axis) % (rank + 1),
                                  "on_value": _number(on_value, api, "on_value"),
                                  "off_value": _number(off_value, api, "off_value"),
                                  "dtype": _dtype(dtype, "float32", api)}, name=name or "", api=api)


def where(condition, x=None, y=None, name: str | None = None) -> Blob:
    """`flow.where(condition, x, y)`: x where condition is nonzero, else y, broadcasting like NumPy.
    The one-argument form (OneFlow's argwhere) has a data-dependent shape, which flowc does not
    support: it fails naming that.

    Example:
        clipped = flow.where(x > 0, x, flow.zeros_like(x))   # condition: any Blob, nonzero is true
    """
    api = "flow.where"
    cond = check_blob(condition, api, "condition")
    if x is None and y is None:
        raise _fail(api, "the one-argument form (argwhere) has a data-dependent shape, which flowc does "
                         "not support; pass x and y")
    if x is None or y is None:
        raise _fail(api, "pass both x and y, or neither")
    if not isinstance(x, Blob):
        y = check_blob(y, api, "y")
        x = as_blob(x, y, api)
    x = check_blob(x, api, "x")
    return emit("where", [cond, x, as_blob(y, x, api)], name=name or "", api=api)


def masked_fill(x, mask, value, name: str | None = None) -> Blob:
    """`flow.masked_fill(x, mask, value)`: `value` where mask is nonzero, else x.

    Example:
        scores = flow.masked_fill(scores, padding_mask, -1e9)
    """
    x = check_blob(x, "flow.masked_fill", "x")
    return where(mask, constant_like(x, value), x, name)


def pad(x, paddings, constant_value=0, name: str | None = None) -> Blob:
    """`flow.pad(x, paddings, constant_value=0)`: (before, after) elements of `constant_value` per dim.

    Example:
        framed = flow.pad(images, paddings=((0, 0), (0, 0), (1, 1), (2, 2)))
    """
    api = "flow.pad"
    x = check_blob(x, api, "x")
    pads = [tuple(int(v) for v in p) for p in paddings]
    if len(pads) != len(x.shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise _fail(api, f"paddings must hold one non-negative (before, after) pair per dim of {list(x.shape)}")
    value = _number(constant_value, api, "constant_value")
    out = x
    for d, (before, after) in enumerate(pads):
        parts = []
        for width in (before, None, after):
            if width is None:
                parts.append(out)
            elif width:
                shape = list(out.shape)
                shape[d] = width
                parts.append(emit("constant", [], {"value": value, "shape": tuple(shape), "dtype": x.type.dtype},
                                  api=api))
        out = concat(parts, axis=d) if len(parts) > 1 else out
    return out if out is not x else identity(x, name)


def stack(inputs: Sequence[Blob], axis: int = 0, name: str | None = None) -> Blob:
    """`flow.stack(inputs, axis=0)`: Blobs of one shape joined along a new axis.

    Example:
        pair = flow.stack([a, b], axis=1)      # (4, 3), (4, 3) -> (4, 2, 3)
    """
    api = "flow.stack"
    blobs = [check_blob(b, api, f"inputs[{i}]") for i, b in enumerate(inputs)]
    if not blobs:
        raise _fail(api, "needs at least one input")
    if any(b.shape != blobs[0].shape for b in blobs):
        raise _fail(api, f"every input must have the shape {list(blobs[0].shape)}")
    rank = len(blobs[0].shape)
    if not -rank - 1 <= int(axis) <= rank:
        raise _fail(api, f"axis {axis} is out of range [{-rank - 1}, {rank}]")
    at = int(axis) % (rank + 1)
    return concat([expand_dims(b, at) for b in blobs], axis=at, name=name)


def top_k(input, k: int = 1, sorted: bool = True, name: str | None = None) -> Blob:  # noqa: A002
    """`flow.math.top_k(input, k=1, sorted=True)`: the int32 indices of the k largest elements along
    the last axis, largest first (ties: the lower index first; a NaN counts as the largest).
    A k above the axis' length is clamped to it, as OneFlow does.

    Example:
        best5 = flow.math.top_k(logits, k=5)
    """
    api = "flow.math.top_k"
    x = check_blob(input, api, "input")
    if not x.shape:
        raise _fail(api, "input must have at least one axis")
    k = min(int(k), x.shape[-1])
    if k < 1:
        raise _fail(api, f"k must be positive, got {k}")
    return emit("top_k", [x], {"k": k}, name=name or "", api=api)
