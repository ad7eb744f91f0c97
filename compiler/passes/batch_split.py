"""How the batch axis of a consistent-view job lies over its ranks: OneFlow's balanced split.

A batch that divides over the ranks gives each rank `batch / ranks` examples, and any value split
along axis 0 (placeholders, activations, a reshaped (B·T, H) sequence) its extent over the ranks: the
ranks then run one and the same graph.  A batch that does not divide is split as OneFlow's
`BalancedSplitter` does: the first `batch % ranks` ranks take one example more (5 over 2 ranks:
3 and 2).  A split value's extent must then be a whole number of rows per example (E = k·B), and
rank r holds k times its examples; the ranks' graphs differ in those shapes.  `gather_balanced_rows`
brings such a value back whole on every rank (a sparse update's indices and gradient rows).

Example::

    >>> split = BatchSplit(ranks=2, batch=5)
    >>> [split.rows(5, r) for r in range(2)], [split.rows(10, r) for r in range(2)]
    ([3, 2], [6, 4])
    >>> split.first_row(10, 1)
    6
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["BatchSplit", "gather_balanced_rows"]


@dataclass(frozen=True)
class BatchSplit:
    """`batch`: the placeholders' batch when it does not divide over `ranks`, else None (every
    split extent is divided evenly, as the ranks' one shared graph needs)."""
    ranks: int
    batch: int | None = None

    @property
    def even(self) -> bool:
        return self.batch is None

    def examples(self, rank: int) -> int:
        """How many of an uneven batch's examples rank `rank` holds."""
        assert self.batch is not None
        per_rank, extra = divmod(self.batch, self.ranks)
        return per_rank + (rank < extra)

    def divides(self, extent: int) -> bool:
        """Can a value with `extent` rows along axis 0 be split like the batch?"""
        if self.batch is None:
            return extent % self.ranks == 0
        return extent % self.batch == 0

    def rows(self, extent: int, rank: int) -> int:
        """Rank `rank`'s rows of a split value with `extent` rows (`divides(extent)` holds)."""
        if self.batch is None:
            return extent // self.ranks
        return extent // self.batch * self.examples(rank)

    def first_row(self, extent: int, rank: int) -> int:
        """The first of rank `rank`'s rows of a split value with `extent` rows."""
        return sum(self.rows(extent, r) for r in range(rank))

    def describe(self) -> str:
        """How a split value's rows must lie, for an error message."""
        if self.batch is None:
            return f"over {self.ranks} ranks"
        shares = " + ".join(str(self.examples(r)) for r in range(self.ranks))
        return f"like the batch of {self.batch} examples ({shares} over {self.ranks} ranks): a multiple of {self.batch}"


def gather_balanced_rows(add: Callable[[str, list, dict], int], x: int, split: BatchSplit, shape: tuple[int, ...],
                         dtype: str, rank: int) -> int:
    """Node id of split value `x` (logical `shape`, this rank's rows of an uneven batch) whole on
    every rank, in rank order: what a sparse update reads of the batch's indices and gradient rows.

    MPI's and NCCL's plain all-gather moves equal blocks, so each rank pads its rows with zeros to one
    block, the ranks gather the blocks, and each rank cuts every rank's rows out of them.  A block is
    the largest share plus one example's rows, so that every rank pads (rank 0 by one example): the
    ranks' graphs keep the same ops in the same order (only shapes differ), and so call the engine's
    collectives in the same order, as MPI requires.

    `add(op, inputs, attrs)` adds a node to this rank's graph and returns its id."""
    assert split.batch is not None and split.divides(shape[0]), (split, shape)
    per_example = shape[0] // split.batch
    block = split.rows(shape[0], 0) + per_example
    rest = tuple(shape[1:])
    mine = split.rows(shape[0], rank)
    padding = add("constant", [], {"value": 0, "shape": (block - mine,) + rest, "dtype": dtype})
    blocks = add("all_gather", [add("concat", [x, padding], {"axis": 0})], {"ranks": split.ranks})
    parts = [add("slice_axis", [blocks], {"axis": 0, "begin": r * block, "end": r * block + split.rows(shape[0], r)})
             for r in range(split.ranks)]
    return add("concat", parts, {"axis": 0})
