"""Indexed slices: an embedding's gradient as rows at indices, and updates that touch only those rows.

When a variable's only gradient comes from `gather(table, indices)` on axis 0, the train job keeps
the gradient as OneFlow's indexed slices instead of a dense (vocab, ...) buffer, and the update
reads and writes only the rows the batch used (compiler/indexed_slices.py decides when):

* `unique_indices(indices)`: int64 (n,), n = indices.size: each index at its first occurrence, -1 at
  its repeats and where it is outside [0, vocab) (OneFlow's indexed_slices_reduce_sum's unique ids).
* `indexed_slices_reduce_sum(indices, values)`: (n, I) float: at the first occurrence of an index, the
  sum of the values rows of all its occurrences, added in index order (deterministic, the same on
  every backend); zeros at the repeats.  `values` is the gather's dy, shaped indices.shape + (I...).
* `gather_rows(table, rows)`: (n, I): table[rows[j]] viewed as (vocab, I), zeros where rows[j] is -1.
* `scatter_rows(table, rows, values)`: the table with row rows[j] replaced by values[j] where
  rows[j] >= 0, every other row unchanged.  Its kernel writes the variable in place
  (compiler/passes/memory.py), so a step costs O(n * I), not O(vocab * I).

None of them has a gradient: they only appear in the update.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import FLOAT_DTYPES, TensorType
from flowc.compiler.ops import OpRule, ShapeError, register

INDEX_DTYPES = ("int32", "int64")


def row_size(shape: tuple) -> int:
    """Elements per row of a table of `shape`, its first dim being the rows."""
    return int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1


def _check_indices(op: str, t: TensorType) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise ShapeError(f"{op}: indices must be int32 or int64, got {t.dtype}")


def _check_rows(op: str, rows: TensorType) -> int:
    if rows.dtype != "int64" or len(rows.shape) != 1:
        raise ShapeError(f"{op}: rows must be int64 of rank 1 (unique_indices' result), got {rows}")
    return rows.shape[0]


def _first_occurrences(indices: np.ndarray, vocab: int) -> np.ndarray:
    flat = indices.reshape(-1).astype(np.int64)
    out = np.full(flat.shape, -1, np.int64)
    seen: set[int] = set()
    for j, ix in enumerate(flat.tolist()):
        if 0 <= ix < vocab and ix not in seen:
            seen.add(ix)
            out[j] = ix
    return out


def _infer_unique(inputs: list, attrs: dict) -> TensorType:
    (indices,) = inputs
    _check_indices("unique_indices", indices)
    if attrs["vocab"] < 1:
        raise ShapeError(f"unique_indices: vocab must be positive, got {attrs['vocab']}")
    return TensorType((indices.size,), "int64")


def _infer_reduce_sum(inputs: list, attrs: dict) -> TensorType:
    indices, values = inputs
    _check_indices("indexed_slices_reduce_sum", indices)
    rank = len(indices.shape)
    if values.dtype not in FLOAT_DTYPES or tuple(values.shape[:rank]) != tuple(indices.shape):
        raise ShapeError(f"indexed_slices_reduce_sum: values {values} must be floating point and start "
                         f"with the indices' shape {list(indices.shape)}")
    inner = int(np.prod(values.shape[rank:], dtype=np.int64))
    return TensorType((indices.size, inner), values.dtype)


def _reduce_sum_reference(indices, values, vocab):
    first = _first_occurrences(indices, vocab)
    flat = indices.reshape(-1).astype(np.int64)
    rows = values.reshape(flat.size, -1)
    out = np.zeros(rows.shape, values.dtype)
    owner: dict[int, int] = {}
    for j, ix in enumerate(flat.tolist()):     # in index order, as the kernels add
        if first[j] >= 0:
            owner[ix] = j
            out[j] = rows[j]
        elif ix in owner:
            out[owner[ix]] += rows[j]
    return out


def _infer_gather_rows(inputs: list, attrs: dict) -> TensorType:
    table, rows = inputs
    n = _check_rows("gather_rows", rows)
    if len(table.shape) < 1:
        raise ShapeError(f"gather_rows: the table must have rows, got {table}")
    return TensorType((n, row_size(table.shape)), table.dtype)


def _gather_rows_reference(table, rows):
    flat = table.reshape(table.shape[0], -1)
    out = np.zeros((rows.size, flat.shape[1]), table.dtype)
    hit = rows >= 0
    out[hit] = flat[rows[hit]]
    return out


def _infer_scatter_rows(inputs: list, attrs: dict) -> TensorType:
    table, rows, values = inputs
    n = _check_rows("scatter_rows", rows)
    if len(table.shape) < 1 or values.shape != (n, row_size(table.shape)) or values.dtype != table.dtype:
        raise ShapeError(f"scatter_rows: values {values} must be {table.dtype}[{n}, {row_size(table.shape)}] "
                         f"for a table {table}")
    return TensorType(table.shape, table.dtype)


def _scatter_rows_reference(table, rows, values):
    out = table.copy().reshape(table.shape[0], -1)
    hit = rows >= 0
    out[rows[hit]] = values[hit]
    return out.reshape(table.shape)


register(OpRule("unique_indices", "window", _infer_unique,
                lambda indices, vocab: _first_occurrences(indices, vocab), differentiable=False))
register(OpRule("indexed_slices_reduce_sum", "window", _infer_reduce_sum, _reduce_sum_reference,
                differentiable=False))
register(OpRule("gather_rows", "window", _infer_gather_rows, _gather_rows_reference, differentiable=False))
register(OpRule("scatter_rows", "window", _infer_scatter_rows, _scatter_rows_reference, differentiable=False))
