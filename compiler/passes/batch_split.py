"""How the batch axis of a consistent-view job lies over its ranks: OneFlow's balanced split.

A batch that divides over the ranks gives each rank `batch / ranks` examples, and any value split
along axis 0 (placeholders, activations, a reshaped (B·T, H) sequence) its extent over the ranks: the
ranks then run one and the same graph.  A batch that does not divide is split as OneFlow's
`BalancedSplitter` does: the first `batch % ranks` ranks take one example more (5 over 2 ranks:
3 and 2).  A split value's extent must then be a whole number of rows per example (E = k·B), and
rank r holds k times its examples; the ranks' graphs differ in those shapes.  The exchanges of such
values go in padded blocks (compiler/passes/balanced_boxing.py).

Example::

    >>> split = BatchSplit(ranks=2, batch=5)
    >>> [split.rows(5, r) for r in range(2)], [split.rows(10, r) for r in range(2)]
    ([3, 2], [6, 4])
    >>> split.first_row(10, 1)
    6
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchSplit"]


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
