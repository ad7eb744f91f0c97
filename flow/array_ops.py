"""Shape ops and matmul: `flow.reshape`, `flow.flatten`, `flow.transpose`, `flow.matmul`, `flow.cast`."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.ir import dtype_name
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import axes, check_blob


def reshape(x, shape, name: str | None = None) -> Blob:
    """`flow.reshape(x, shape)`; one dim may be -1.

    Example:
        flat = flow.reshape(images, [images.shape[0], -1])
    """
    api = "flow.reshape"
    x = check_blob(x, api, "x")
    dims = [int(d) for d in shape]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise TraceError(f"{user_location()}: {api}: shape {dims} may hold at most one -1 and no other negative")
    if -1 in dims:
        known = 1
        for d in dims:
            known *= d if d != -1 else 1
        total = x.type.size
        if known == 0 or total % known:
            raise TraceError(f"{user_location()}: {api}: cannot reshape {list(x.shape)} to {dims}")
        dims[dims.index(-1)] = total // known
    return emit("reshape", [x], {"shape": tuple(dims)}, name=name or "", api=api)


def flatten(input, start_dim: int = 0, end_dim: int = -1, name: str | None = None) -> Blob:
    """`flow.flatten(input, start_dim=0, end_dim=-1)`: merge dims start_dim..end_dim.

    Example:
        flat = flow.flatten(images, start_dim=1)
    """
    x = check_blob(input, "flow.flatten", "input")
    if not x.shape:
        return reshape(x, [1], name)
    start, end = axes(x, start_dim, "flow.flatten")[0], axes(x, end_dim, "flow.flatten")[0]
    if start > end:
        raise TraceError(f"{user_location()}: flow.flatten: start_dim {start_dim} is after end_dim {end_dim}")
    merged = 1
    for d in x.shape[start:end + 1]:
        merged *= d
    return reshape(x, list(x.shape[:start]) + [merged] + list(x.shape[end + 1:]), name)


def transpose(a, perm=None, conjugate: bool = False, batch_axis_non_change: bool = False,
              name: str | None = None) -> Blob:
    """`flow.transpose(a, perm)`; without perm, reverse the axes.  `batch_axis_non_change` only told
    OneFlow's batch-axis inference to keep axis 0 the batch axis: flowc infers layouts from the graph.

    Example:
        t = flow.transpose(x, perm=[0, 2, 1])
    """
    x = check_blob(a, "flow.transpose", "a")
    perm = tuple(range(len(x.shape)))[::-1] if perm is None else tuple(int(p) for p in perm)
    return emit("transpose", [x], {"perm": perm}, name=name or "", api="flow.transpose")


def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False, alpha: float = 1.0,
           name: str | None = None) -> Blob:
    """`flow.matmul(a, b, transpose_a=False, transpose_b=False)`; rank > 2 is batched.

    Example:
        logits = flow.matmul(hidden, weight, transpose_b=True)
    """
    api = "flow.matmul"
    a, b = check_blob(a, api, "a"), check_blob(b, api, "b")
    out = emit("matmul", [a, b], {"transpose_a": bool(transpose_a), "transpose_b": bool(transpose_b)},
               name=name or "", api=api)
    return out if alpha == 1.0 else out * float(alpha)


def concat(inputs=None, axis: int = 0, max_dim_size=None, name: str | None = None, values=None) -> Blob:
    """`flow.concat(inputs, axis=0)`: join Blobs along `axis` (negative counts from the end).
    `values` is OneFlow's other name of `inputs` (InceptionV3 passes `values=`).

    Example:
        both = flow.concat([a, b], axis=1)
    """
    api = "flow.concat"
    if (inputs is None) == (values is None):
        raise TraceError(f"{user_location()}: {api}: pass the Blobs as `inputs` or as `values`, "
                         f"{'not both' if values is not None else 'got neither'}")
    inputs = values if inputs is None else inputs
    blobs = [check_blob(x, api, f"inputs[{i}]") for i, x in enumerate(inputs)]
    if not blobs:
        raise TraceError(f"{user_location()}: {api}: needs at least one input")
    (ax,) = axes(blobs[0], axis, api)
    if len(blobs) == 1:
        return blobs[0]
    return emit("concat", blobs, {"axis": ax}, name=name or "", api=api)


def cast(x, dtype, name: str | None = None) -> Blob:
    """`flow.cast(x, dtype)`.

    Example:
        labels_f = flow.cast(labels, flow.float)
    """
    x = check_blob(x, "flow.cast", "x")
    try:
        target = dtype_name(dtype)
    except TypeError as err:
        raise TraceError(f"{user_location()}: flow.cast: {err}") from None
    if target == x.type.dtype:
        return x
    return emit("cast", [x], {"dtype": target}, name=name or "", api="flow.cast")
