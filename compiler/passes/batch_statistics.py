"""Synchronised batch normalisation: one rank's batch statistics made those of the whole batch.

In the consistent view a train job's batch normalisation normalises with the mean and variance of
the logical (global) batch, as the one-process job does.  Each rank computes its share's statistics
with `batch_norm_stats` (a (2, C) value: per-channel mean, biased variance); this module adds what
makes them global.  Every rank holds the same number of elements per channel, so the global ones
are the ranks' averages, the variance with the spread of the ranks' means added (Chan et al.'s
pairwise update, for equal counts):

    mean = 1/p Σ_r mean_r
    var  = 1/p Σ_r (var_r + (mean_r - mean)²)

Every term of the variance is non-negative: no cancellation, unlike E[x²] - E[x]², so a large mean
costs no accuracy.  The ranks' (2, C) statistics travel in one all_gather (2p·C floats), and every
rank combines them in rank order, so all ranks hold the same bits.

A batch that does not divide over the ranks (compiler/passes/batch_split.py) gives the ranks unequal
counts n_r: the averages are then weighted by w_r = n_r / n, which is the same update.

Example::

    global_stats = synced_statistics(add, local_stats, ranks=2, channels=16)
"""
from __future__ import annotations

from typing import Callable, Sequence

Add = Callable[[str, list, dict], int]


def synced_statistics(add: Add, stats: int, ranks: int, channels: int, dtype: str = "float32",
                      weights: Sequence[float] | None = None) -> int:
    """Node id of the global (2, C) statistics from this rank's `stats` (node id; `add(op, inputs,
    attrs)` adds a node to the ranks' graph).  `weights`: each rank's share of the batch's elements,
    when they differ (None: 1/ranks each)."""
    gathered = add("reshape", [add("all_gather", [stats], {"ranks": ranks})], {"shape": (ranks, 2, channels)})

    def row(i: int) -> int:
        return add("slice_axis", [gathered], {"axis": 1, "begin": i, "end": i + 1})

    def scalar(value: float) -> int:
        return add("constant", [], {"value": value, "shape": (), "dtype": dtype})

    def average(x: int) -> int:      # over the ranks: (p, 1, C) -> (1, 1, C)
        if weights is None:
            total = add("reduce_sum", [x], {"axes": (0,), "keepdims": True})
            return add("multiply", [total, scalar(1.0 / ranks)], {})
        terms = [add("multiply", [add("slice_axis", [x], {"axis": 0, "begin": r, "end": r + 1}), scalar(w)], {})
                 for r, w in enumerate(weights)]
        total = terms[0]
        for term in terms[1:]:       # rank order: every rank adds the same terms the same way
            total = add("add", [total, term], {})
        return total

    means = row(0)
    mean = average(means)
    spread = add("subtract", [means, mean], {})
    var = average(add("add", [row(1), add("multiply", [spread, spread], {})], {}))
    return add("reshape", [add("concat", [mean, var], {"axis": 1})], {"shape": (2, channels)})
