"""N-dimensional indexing with OneFlow 0.3's names: `gather_nd`, `scatter_nd`, `tensor_scatter_nd_update`,
`tensor_scatter_nd_add` and `dim_gather`.

None of them is an op of its own: each is composed from flowc's gather, reshape, transpose, one-hot
matrix product (`flow.math.unsorted_segment_sum`), `where` and casts, so every backend, the reference
executor and autodiff handle them with no new kernel.

In the `*_nd` functions the last axis of `indices`, of size K, holds coordinates into the first K axes
of the dense Blob (`params`, or `shape` for `scatter_nd`); the axes before it are a batch of such
coordinates, and each one names a whole slice `dense[i0, ..., iK-1, ...]`.  The coordinates are
flattened to row-major positions; every coordinate is checked against its own axis on the way (a
gather from [0, 1, ..., size) that fails the step for an index outside it), so an out-of-range
coordinate fails the step with a `StepError` naming the user's line instead of reading or writing a
neighbouring slice (the message reads "flow.gather: an index is out of range [0, size)": that gather is
the op that checks).  Negative indices are out of range too: OneFlow 0.3's kernels do not wrap them
(they read outside the Blob).

Example:
    @flow.global_function()
    def pick(x: tp.Numpy.Placeholder((3, 4)), at: tp.Numpy.Placeholder((2, 2), dtype=flow.int32)) -> tp.Numpy:
        return flow.gather_nd(x, at)     # [x[at[0, 0], at[0, 1]], x[at[1, 0], at[1, 1]]], shape (2,)

    @flow.global_function()
    def spread(at: tp.Numpy.Placeholder((3, 1), dtype=flow.int32), v: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.scatter_nd(at, v, shape=[8])     # zeros(8) with v[i] added at at[i, 0]
"""
from __future__ import annotations

import math

from flowc.compiler.errors import TraceError
from flowc.compiler.trace import Blob, emit, user_location
from flow._ops import check_blob, iota
from flow.math import unsorted_segment_sum

INDEX_DTYPES = ("int32", "int64")
_INT32_MAX = 2 ** 31 - 1


def _fail(api: str, message: str) -> TraceError:
    return TraceError(f"{user_location()}: {api}: {message}")


def _index_blob(indices, api: str, arg: str) -> Blob:
    ix = check_blob(indices, api, arg)
    if ix.type.dtype not in INDEX_DTYPES:
        raise _fail(api, f"{arg} must be int32 or int64, got {ix.type.dtype}")
    return ix


def _depth(ix: Blob, dense: tuple[int, ...], api: str, dense_arg: str) -> int:
    """K, the size of indices' last axis: how many leading axes of the dense shape a coordinate names."""
    if not ix.shape:
        raise _fail(api, "indices must have at least one axis (its last one holds the coordinates)")
    k = ix.shape[-1]
    if not 1 <= k <= len(dense):
        raise _fail(api, f"the last axis of indices {list(ix.shape)} has size {k}, but must be in "
                         f"[1, {len(dense)}], the rank of {dense_arg} {list(dense)}")
    return k


def _check_updates(u: Blob, ix: Blob, dense: tuple[int, ...], k: int, api: str, dense_arg: str) -> None:
    want = tuple(ix.shape[:-1]) + tuple(dense[k:])
    if tuple(u.shape) != want:
        raise _fail(api, f"updates must have shape {list(want)} (indices {list(ix.shape)} without its last "
                         f"axis, then {dense_arg} {list(dense)} after its first {k} axes), got {list(u.shape)}")


def _positions(ix: Blob, lead: tuple[int, ...], api: str, check_each: bool) -> Blob:
    """The row-major positions in `lead` (the dense shape's first K axes) of indices' coordinates, as a
    flat (M,) Blob.  With `check_each`, every coordinate goes through a gather from [0, size) of its
    axis: that fails the step for one out of range, which the flattened position alone could hide
    ([0, 5] in a (3, 3) is position 5, a valid [1, 2])."""
    k = ix.shape[-1]
    m = math.prod(ix.shape[:-1])
    # int64 arithmetic only where an int32 position could overflow
    dtype = "int64" if math.prod(lead) > _INT32_MAX else ix.type.dtype
    if dtype != ix.type.dtype:
        ix = emit("cast", [ix], {"dtype": dtype}, api=api)
    rows = emit("reshape", [ix], {"shape": (m, k)}, api=api)
    flat: Blob | None = None
    stride = 1
    for axis in reversed(range(k)):
        col = rows if k == 1 else emit("strided_slice", [rows], {"start": (0, axis), "step": (1, 1),
                                                                  "shape": (m, 1)}, api=api)
        col = emit("reshape", [col], {"shape": (m,)}, api=api)
        if check_each:
            col = emit("gather", [iota(lead[axis], dtype, api), col], {"axis": 0, "batch_dims": 0}, api=api)
        term = col if stride == 1 else col * stride
        flat = term if flat is None else flat + term
        stride *= lead[axis]
    assert flat is not None     # k >= 1
    return flat


def _scatter_rows(flat: Blob, rows: Blob, n: int, api: str) -> Blob:
    """(n, S): row p sums the rows of `rows` (M, S) whose position in `flat` is p (positions checked)."""
    dtype = rows.type.dtype
    if dtype in ("float32", "float64"):
        # a one-hot matrix product: differentiable in `rows`, on every backend
        return unsorted_segment_sum(rows, flat, n)
    if dtype == "float16":
        # summed in float32 (unsorted_segment_sum's matrix product takes float32 and float64)
        wide = emit("cast", [rows], {"dtype": "float32"}, api=api)
        return emit("cast", [unsorted_segment_sum(wide, flat, n)], {"dtype": dtype}, api=api)
    # integers have no gradient: gather's scatter-add gradient op sums them exactly, in index order
    return emit("gather_grad", [flat, rows], {"params_shape": (n, rows.shape[1]), "axis": 0, "batch_dims": 0},
                api=api)


def _scatter(ix: Blob, u: Blob, dense: tuple[int, ...], k: int, api: str) -> tuple[Blob, Blob, int, int]:
    """(summed (N, S), positions (M,), N, S): the updates added up per position of dense's first K axes."""
    n, s = math.prod(dense[:k]), math.prod(dense[k:])
    flat = _positions(ix, tuple(dense[:k]), api, check_each=True)
    rows = emit("reshape", [u], {"shape": (flat.shape[0], s)}, api=api)
    return _scatter_rows(flat, rows, n, api), flat, n, s


# --- the functions ---------------------------------------------------------------------------------

def gather_nd(params, indices, name: str | None = None) -> Blob:
    """`flow.gather_nd(params, indices)`: the slices of `params` at the coordinates in indices' last axis.

    indices (int32 or int64) has shape (..., K) with 1 <= K <= params' rank; the result has shape
    indices.shape[:-1] + params.shape[K:], its [i, ...] being params[indices[i, 0], ..., indices[i, K-1]].
    A coordinate outside [0, params.shape[axis]) fails the step (a `StepError` naming this line).
    Differentiable in `params`: the gradient adds up the cotangents of repeated coordinates.

    Example:
        corners = gather_nd(x, at)     # x (3, 4), at [[0, 0], [2, 3]] (int32) -> [x[0, 0], x[2, 3]]
        rows = gather_nd(x, first)     # K = 1: first [[0], [2]] -> whole rows x[0] and x[2], shape (2, 4)
    """
    api = "flow.gather_nd"
    p = check_blob(params, api, "params")
    ix = _index_blob(indices, api, "indices")
    k = _depth(ix, tuple(p.shape), api, "params")
    lead, tail = tuple(p.shape[:k]), tuple(p.shape[k:])
    # with K = 1 the gather below checks the one coordinate itself
    flat = _positions(ix, lead, api, check_each=k > 1)
    table = emit("reshape", [p], {"shape": (math.prod(lead),) + tail}, api=api)
    out = emit("gather", [table, flat], {"axis": 0, "batch_dims": 0}, api=api)
    return emit("reshape", [out], {"shape": tuple(ix.shape[:-1]) + tail}, name=name or "", api=api)


def scatter_nd(indices, updates, shape, name: str | None = None) -> Blob:
    """`flow.scatter_nd(indices, updates, shape)`: zeros of `shape` with the slices of `updates` added at
    the coordinates in indices' last axis.

    indices (int32 or int64) has shape (..., K), 1 <= K <= len(shape); updates has shape
    indices.shape[:-1] + shape[K:] and gives the result its dtype.  Updates at a repeated coordinate
    are summed, as OneFlow 0.3's kernel does (it zero-fills, then scatter-adds) and as TensorFlow does.
    A coordinate outside [0, shape[axis]) fails the step (a `StepError` naming this line), where a one-hot
    sum alone would drop it silently.  Differentiable in float `updates`.  The sum is a one-hot matrix
    product: M x N x S work and an (M, N) one-hot for M coordinates, N = prod(shape[:K]) positions and
    slices of S elements (integer updates are added directly, in M x S).

    Example:
        out = scatter_nd(at, v, shape=[8])    # at [[1], [6], [1]], v [1., 2., 3.] -> [0, 4, 0, 0, 0, 0, 2, 0]
    """
    api = "flow.scatter_nd"
    ix = _index_blob(indices, api, "indices")
    u = check_blob(updates, api, "updates")
    try:
        dense = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise _fail(api, f"shape must be a sequence of ints, got {shape!r}") from None
    if any(d <= 0 for d in dense):
        raise _fail(api, f"shape {list(dense)} must have positive dimensions")
    k = _depth(ix, dense, api, "shape")
    _check_updates(u, ix, dense, k, api, "shape")
    summed, _, _, _ = _scatter(ix, u, dense, k, api)
    return emit("reshape", [summed], {"shape": dense}, name=name or "", api=api)


def _tensor_scatter_args(params, indices, updates, api: str) -> tuple[Blob, Blob, Blob, int]:
    p = check_blob(params, api, "params")
    ix = _index_blob(indices, api, "indices")
    u = check_blob(updates, api, "updates")
    k = _depth(ix, tuple(p.shape), api, "params")
    _check_updates(u, ix, tuple(p.shape), k, api, "params")
    if u.type.dtype != p.type.dtype:
        raise _fail(api, f"updates ({u.type.dtype}) must have the dtype of params ({p.type.dtype})")
    return p, ix, u, k


def tensor_scatter_nd_update(params, indices, updates, name: str | None = None) -> Blob:
    """`flow.tensor_scatter_nd_update(params, indices, updates)`: `params` with the slices at the
    coordinates in indices' last axis replaced by `updates`.

    Shapes as in `scatter_nd` with shape = params.shape; updates has params' dtype.  A coordinate given
    several times gets the sum of its updates: OneFlow 0.3's kernel zeroes the indexed slices, then
    scatter-adds (TensorFlow keeps one of them instead).  A coordinate out of range fails the step.
    Differentiable in `params` (zero gradient at the replaced slices) and float `updates`.

    Example:
        y = tensor_scatter_nd_update(x, at, v)    # x (5, 3), at [[0], [4]], v (2, 3): rows 0 and 4 become v
    """
    api = "flow.tensor_scatter_nd_update"
    p, ix, u, k = _tensor_scatter_args(params, indices, updates, api)
    summed, flat, n, s = _scatter(ix, u, tuple(p.shape), k, api)
    # which positions are written: a count of hits per position (integers, so no gradient flows here)
    ones = emit("constant", [], {"value": 1, "shape": (flat.shape[0], 1), "dtype": "int32"}, api=api)
    hits = emit("gather_grad", [flat, ones], {"params_shape": (n, 1), "axis": 0, "batch_dims": 0}, api=api)
    # `where`, not params * (1 - hit) + summed: a NaN or inf in a replaced slice must not leak through
    kept = emit("reshape", [p], {"shape": (n, s)}, api=api)
    out = emit("where", [hits, summed, kept], api=api)
    return emit("reshape", [out], {"shape": tuple(p.shape)}, name=name or "", api=api)


def tensor_scatter_nd_add(params, indices, updates, name: str | None = None) -> Blob:
    """`flow.tensor_scatter_nd_add(params, indices, updates)`: `params` with `updates` added at the
    coordinates in indices' last axis (repeated coordinates add every one of their updates).

    Shapes as in `scatter_nd` with shape = params.shape; updates has params' dtype.  A coordinate out of
    range fails the step.  Differentiable in `params` and float `updates`.

    Example:
        y = tensor_scatter_nd_add(x, at, v)       # x (5, 3), at [[0], [0]], v (2, 3): x[0] + v[0] + v[1]
    """
    api = "flow.tensor_scatter_nd_add"
    p, ix, u, k = _tensor_scatter_args(params, indices, updates, api)
    summed, _, _, _ = _scatter(ix, u, tuple(p.shape), k, api)
    added = emit("reshape", [summed], {"shape": tuple(p.shape)}, api=api)
    return emit("add", [p, added], name=name or "", api=api)


def dim_gather(input, dim: int, index, name: str | None = None) -> Blob:  # noqa: A002 - OneFlow's name
    """`flow.dim_gather(input, dim, index)`: PyTorch's `gather` along `dim`: for a 3-D input and dim=1,
    out[i][j][k] = input[i][index[i][j][k]][k].

    index (int32 or int64) has input's rank and input's shape except along `dim` (any size >= 1 there),
    as OneFlow requires (PyTorch also accepts smaller sizes); the result has index's shape.  `dim` may be
    negative, counting from the last axis.  An index outside [0, input.shape[dim]) fails the step (a
    `StepError` naming this line).  Differentiable in `input`.

    Example:
        picked = dim_gather(x, 1, ix)       # x [[1, 2], [3, 4]], ix [[1, 0], [0, 1]] -> [[2, 1], [3, 4]]
    """
    api = "flow.dim_gather"
    x = check_blob(input, api, "input")
    ix = _index_blob(index, api, "index")
    rank = len(x.shape)
    if len(ix.shape) != rank or rank == 0:
        raise _fail(api, f"index {list(ix.shape)} must have the rank of input {list(x.shape)} (at least 1)")
    if not -rank <= int(dim) < rank:
        raise _fail(api, f"dim {dim} is out of range [{-rank}, {rank}) for input {list(x.shape)}")
    d = int(dim) % rank
    if any(a != b for axis, (a, b) in enumerate(zip(x.shape, ix.shape)) if axis != d):
        raise _fail(api, f"index {list(ix.shape)} must have the shape of input {list(x.shape)} except along "
                         f"dim {d}")
    last = rank - 1
    # a batched gather along the last axis, whose batch is every other axis: move `dim` there and back
    perm = tuple(a for a in range(rank) if a != d) + (d,)
    moved = d != last
    if moved:
        x = emit("transpose", [x], {"perm": perm}, api=api)
        ix = emit("transpose", [ix], {"perm": perm}, api=api)
    out = emit("gather", [x, ix], {"axis": last, "batch_dims": last}, name="" if moved else name or "", api=api)
    if not moved:
        return out
    inverse = tuple(perm.index(a) for a in range(rank))
    return emit("transpose", [out], {"perm": inverse}, name=name or "", api=api)
