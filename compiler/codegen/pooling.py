"""The compile-time plan of the CPU pooling kernels (codegen_templates/cpu/pool2d*.cpp.j2).

The kernels loop over output columns so that the loops vectorise, and never test bounds per element
inside them: which taps of a window read real (unpadded) input is decided here, once, and the
templates write the answers as literals.
  * Columns: output column `ow` reads input column `ow*sw - pl + j` for window column j; for each j
    the output columns where that is inside [0, W) form one range (`column_ranges`), and where every
    j is inside, the window's columns are all real (`interior_columns`).  The few other columns,
    the edge columns, are written out one by one with their real taps (`edge_columns`).
  * Rows: an output row's window rows inside the input, [i0, i1), take a handful of values over a
    whole pooling (all of them for interior rows, one or two at the top and the bottom); each gets
    a loop of its own with its taps written out (`row_cases`).
  * A window's maximum is a balanced tree of comparisons (`max_tree`).

    >>> column_ranges(width=112, out_width=56, kernel=3, stride=2, pad_left=1)
    [(1, 56), (0, 56), (0, 56)]
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

# Windows of up to this many taps take them all in one loop over the interior columns (written
# out: a longer window, a global pooling's, would make a long function for no gain).
FUSE_MAX_TAPS = 25
# At most this many row cases and edge columns are written out; a pooling with more (windows far
# larger than their stride, or padding wider than the window) runs the others in the general loops.
MAX_ROW_CASES = 4
MAX_EDGE_COLUMNS = 8


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def column_ranges(width: int, out_width: int, kernel: int, stride: int, pad_left: int) -> list[tuple[int, int]]:
    """For each window column j, the output columns [lo, hi) whose tap j reads a real input column
    (lo == hi when none does: a tap that lies wholly in the padding).

    Example:
        >>> column_ranges(width=5, out_width=3, kernel=2, stride=2, pad_left=0)   # the last column is left over
        [(0, 3), (0, 2)]
    """
    ranges = []
    for j in range(kernel):
        # 0 <= ow*stride - pad_left + j <= width - 1
        lo = max(0, _ceil_div(pad_left - j, stride))
        hi = min(out_width, (width - 1 + pad_left - j) // stride + 1)
        ranges.append((lo, max(lo, hi)))
    return ranges


def interior_columns(ranges: list[tuple[int, int]]) -> tuple[int, int]:
    """The output columns [lo, hi) whose every tap reads a real input column (lo == hi when none).

    Example:
        >>> interior_columns([(1, 56), (0, 56), (0, 56)])
        (1, 56)
    """
    lo = max(r[0] for r in ranges)
    hi = min(r[1] for r in ranges)
    return lo, max(lo, hi)


def edge_columns(ranges: list[tuple[int, int]], out_width: int) -> list[tuple[int, list[int]]]:
    """The output columns outside the interior, each with its window columns j that read real input.

    Example:
        >>> edge_columns([(1, 56), (0, 56), (0, 56)], 56)
        [(0, [1, 2])]
    """
    lo, hi = interior_columns(ranges)
    return [(ow, [j for j, (a, b) in enumerate(ranges) if a <= ow < b])
            for ow in list(range(lo)) + list(range(hi, out_width))]


def row_cases(height: int, out_height: int, kernel: int, stride: int, pad_top: int) -> list[tuple[int, int]]:
    """The distinct ranges [i0, i1) of window rows inside the input over the output rows, the most
    frequent first (ties: the first met), windows wholly in the padding left out.

    Example:
        >>> row_cases(height=112, out_height=56, kernel=3, stride=2, pad_top=1)
        [(0, 3), (1, 3)]
    """
    seen: Counter = Counter()
    for oh in range(out_height):
        top = oh * stride - pad_top
        i0, i1 = max(0, -top), min(kernel, height - top)
        if i1 > i0:
            seen[(i0, i1)] += 1
    return [case for case, _ in seen.most_common()]


def max_tree(taps: int) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """How a window's maximum is taken, as a balanced tree rather than a chain (its depth is the
    loop's latency): values 0..taps-1 are the taps, each merge (out, a, b) writes value `out` = the
    larger of `a` and `b`, and the last merge's `out` is the result (tap 0 itself when there is one
    tap).  A plain `a > b ? a : b` is one instruction but drops a NaN, so the NaN test is apart: one
    unordered comparison per pair of taps, `pairs` (a pair (t, t) for a last odd tap: t is unordered
    with itself when it is NaN).

    Example:
        >>> max_tree(3)
        ([(0, 1), (2, 2)], [(3, 0, 1), (4, 3, 2)])
    """
    pairs = [(t, min(t + 1, taps - 1)) for t in range(0, taps, 2)]
    level, merges, fresh = list(range(taps)), [], taps
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level) - 1, 2):
            merges.append((fresh, level[k], level[k + 1]))
            nxt.append(fresh)
            fresh += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return pairs, merges


def window_taps(r0: int, r1: int, columns: Iterable[int]) -> list[tuple[int, int]]:
    """The taps (i, j) of window rows [r0, r1) and window columns `columns`, in row-major order.

    Example:
        >>> window_taps(1, 3, [1, 2])
        [(1, 1), (1, 2), (2, 1), (2, 2)]
    """
    cols = list(columns)
    return [(i, j) for i in range(r0, r1) for j in cols]


def vector_block(width: int, tiled: bool) -> int:
    """How many output columns a short interior loop computes per block (0: one plain loop).

    g++ 12 sizes a loop's vectors by its trip count and finishes the remainder in scalar code, which
    for the gradient's selects is branchy: a 14-column row (LeNet) ran 6 of its columns that way, at
    a branch misprediction each, 4x slower.  Rows narrower than 32 columns whose windows tile them
    (window width = stride: each vector load is a whole interleaved group) run blocks of a power of
    two columns instead, the last one moved back to end at the last column (it overlaps the one
    before; the loops only write per-column results, so computing a column twice is harmless).
    Overlapping windows (3 wide, stride 2: a ResNet stem's 8-column rows) measured 1.3x (gradient)
    to 2x (forward) slower in blocks than in one loop, so they keep one loop.

    Example:
        >>> vector_block(14, True), vector_block(7, True), vector_block(7, False), vector_block(55, True)
        (8, 4, 0, 0)
    """
    if not tiled or width >= 32 or width < 2:
        return 0
    block = 1
    while block * 2 <= width:
        block *= 2
    return block


def pool_plan(height: int, width: int, out_height: int, out_width: int, ksize: tuple[int, int],
              strides: tuple[int, int], pad_top: int, pad_left: int) -> dict:
    """The template context the plan adds: `columns` (column_ranges), `interior`, `edges`, `cases`
    (the row cases written out; empty when the window is too large or has no interior column), and
    `column_block` (vector_block of the interior), and the functions `tree` (max_tree) and `taps`
    (window_taps) for the template to call.

    Example:
        >>> plan = pool_plan(28, 28, 14, 14, (2, 2), (2, 2), 0, 0)
        >>> plan["interior"], plan["edges"], plan["cases"]
        ((0, 14), [], [(0, 2)])
    """
    (kh, kw), (sh, sw) = ksize, strides
    columns = column_ranges(width, out_width, kw, sw, pad_left)
    lo, hi = interior_columns(columns)
    edges = edge_columns(columns, out_width)
    fused = lo < hi and kh * kw <= FUSE_MAX_TAPS and len(edges) <= MAX_EDGE_COLUMNS
    cases = row_cases(height, out_height, kh, sh, pad_top)[:MAX_ROW_CASES] if fused else []
    return dict(columns=columns, interior=(lo, hi), edges=edges, cases=cases,
                column_block=vector_block(hi - lo, kw == sw),
                tree=max_tree, taps=window_taps)
