"""The exchanges of values split like an uneven batch, in padded blocks of equal size.

A batch that does not divide over the ranks gives them shares of different sizes
(compiler/passes/batch_split.py), but MPI's and NCCL's plain collectives move equal blocks.  So
each change of layout that moves the batch's rows (OneFlow's boxing, compiler/passes/model_parallel.py)
is made of one block per rank: a rank's rows, then zeros up to the block's size.  A block holds the
largest share plus one example, so that every rank pads: the ranks' graphs keep the same ops in the
same order (only shapes differ), and so call the engine's collectives in the same order, as MPI
requires.  Each rank cuts the rows it needs out of the blocks it receives.

    split -> whole           gather_rows          its rows padded; all_gather; every rank's rows cut out
    partial -> split         scatter_sum          every rank's rows padded to a block each; reduce_scatter;
                                                  its own rows cut out of its block
    columns -> split         columns_to_rows      likewise, all_to_all: block s (rank s's rows of my
                                                  columns) goes to rank s, which puts the columns side by side
    split -> columns         rows_to_columns      its rows padded; all_to_all by column; every rank's rows
                                                  cut out

Each takes `add(op, inputs, attrs) -> node id` (adds a node to this rank's graph), the local value,
the split, the value's logical shape and dtype, and this rank.

Example::

    >>> BALANCED_BOXING[SPLIT, BROADCAST](add, x, BatchSplit(2, batch=5), (5, 4), "float32", 1)  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Callable

from flowc.compiler.ops import ShapeError
from flowc.compiler.passes.batch_split import BatchSplit
from flowc.compiler.passes.layouts import BROADCAST, COLS, PARTIAL, SPLIT

Add = Callable[[str, list, dict], int]


def _block(split: BatchSplit, extent: int) -> int:
    """Rows of one rank's block of a value with `extent` rows: the largest share and one example more."""
    if split.batch is None or not split.divides(extent):
        raise ShapeError(f"{extent} rows do not split {split.describe()}")
    return split.rows(extent, 0) + extent // split.batch


def _rows_and_units(shape: tuple[int, ...], ranks: int) -> tuple[int, int]:
    """(rows, units) of a (rows, units) value whose units divide over the ranks."""
    if len(shape) != 2 or shape[1] % ranks:
        raise ShapeError(f"a value of shape {list(shape)} is not (rows, units) with units dividing over {ranks} ranks")
    return shape[0], shape[1]


def _padded(add: Add, x: int, rows: int, block: int, rest: tuple[int, ...], dtype: str) -> int:
    """`x` (`rows` rows) and zeros below it up to `block` rows."""
    zeros = add("constant", [], {"value": 0, "shape": (block - rows,) + rest, "dtype": dtype})
    return add("concat", [x, zeros], {"axis": 0})


def _blocks_of_whole(add: Add, x: int, split: BatchSplit, extent: int, rest: tuple[int, ...], dtype: str) -> int:
    """Whole value `x` (`extent` rows on every rank) as one padded block per rank, in rank order."""
    block, begin, blocks = _block(split, extent), 0, []
    for r in range(split.ranks):
        rows = split.rows(extent, r)
        share = add("slice_axis", [x], {"axis": 0, "begin": begin, "end": begin + rows})
        blocks.append(_padded(add, share, rows, block, rest, dtype))
        begin += rows
    return add("concat", blocks, {"axis": 0})


def _whole_of_blocks(add: Add, blocks: int, split: BatchSplit, extent: int) -> int:
    """Every rank's rows cut out of its padded block (blocks in rank order, along axis 0)."""
    block = _block(split, extent)
    parts = [add("slice_axis", [blocks], {"axis": 0, "begin": r * block, "end": r * block + split.rows(extent, r)})
             for r in range(split.ranks)]
    return add("concat", parts, {"axis": 0})


def gather_rows(add: Add, x: int, split: BatchSplit, shape: tuple[int, ...], dtype: str, rank: int) -> int:
    """This rank's rows -> the whole value on every rank (a sparse update's indices and gradient rows)."""
    extent, rest = shape[0], tuple(shape[1:])
    mine = _padded(add, x, split.rows(extent, rank), _block(split, extent), rest, dtype)
    return _whole_of_blocks(add, add("all_gather", [mine], {"ranks": split.ranks}), split, extent)


def scatter_sum(add: Add, x: int, split: BatchSplit, shape: tuple[int, ...], dtype: str, rank: int) -> int:
    """Every rank's partial sums of the whole value -> this rank's rows of their sum."""
    extent, rest = shape[0], tuple(shape[1:])
    summed = add("reduce_scatter", [_blocks_of_whole(add, x, split, extent, rest, dtype)], {"ranks": split.ranks})
    return add("slice_axis", [summed], {"axis": 0, "begin": 0, "end": split.rows(extent, rank)})


def columns_to_rows(add: Add, x: int, split: BatchSplit, shape: tuple[int, ...], dtype: str, rank: int) -> int:
    """Every row of this rank's columns (N, u) -> this rank's rows of every column (n, U)."""
    extent, units = _rows_and_units(shape, split.ranks)
    ranks, block, width = split.ranks, _block(split, extent), units // split.ranks
    blocks = add("reshape", [_blocks_of_whole(add, x, split, extent, (width,), dtype)],
                 {"shape": (ranks, block, width)})
    # block s of the result holds rank s's columns of this rank's (padded) rows
    mine = add("transpose", [add("all_to_all", [blocks], {"ranks": ranks})], {"perm": (1, 0, 2)})
    rows = add("reshape", [mine], {"shape": (block, units)})
    return add("slice_axis", [rows], {"axis": 0, "begin": 0, "end": split.rows(extent, rank)})


def rows_to_columns(add: Add, x: int, split: BatchSplit, shape: tuple[int, ...], dtype: str, rank: int) -> int:
    """This rank's rows of every column (n, U) -> every row of this rank's columns (N, u)."""
    extent, units = _rows_and_units(shape, split.ranks)
    ranks, block, width = split.ranks, _block(split, extent), units // split.ranks
    padded = _padded(add, x, split.rows(extent, rank), block, (units,), dtype)
    # block s: this rank's (padded) rows of rank s's columns
    blocks = add("transpose", [add("reshape", [padded], {"shape": (block, ranks, width)})], {"perm": (1, 0, 2)})
    received = add("reshape", [add("all_to_all", [blocks], {"ranks": ranks})], {"shape": (ranks * block, width)})
    return _whole_of_blocks(add, received, split, extent)


# (from, to) -> how, for the changes of layout that move the batch's rows; the others (a model-split
# weight's rows, whole rows split by column) do not depend on the batch (model_parallel.BOXING).
BALANCED_BOXING = {
    (SPLIT, BROADCAST): gather_rows,
    (PARTIAL, SPLIT): scatter_sum,
    (COLS, SPLIT): columns_to_rows,
    (SPLIT, COLS): rows_to_columns,
}
