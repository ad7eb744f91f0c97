"""The vectorised CPU pooling kernels (pool2d*.cpp.j2, planned by compiler/codegen/pooling.py) against
the NumPy reference executor, forward and gradient, on random inputs.

Every path of the plan: row cases (interior rows, top and bottom rows partly in the padding, more
row cases than are written out), interior and edge columns (more edge columns than are written
out), short rows in overlapping fixed-width blocks (LeNet's 14 and 7 columns), rows longer than one
256-column chunk of the gradient, windows too large to write out (global pooling, a window wider
than 16 columns), an OpenMP region or none, float64.  Max pooling's
tie and NaN rules (dy to the first maximum in row-major order, or to the first NaN) with ties, NaN,
-inf and +inf inside interior windows, at the edges and across the fallback search.  Several poolings
share one graph, so each group is one compilation.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
from flowc.compiler.codegen.pooling import pool_plan
from tests.oracle import compile_case, finite_difference_check
from tests.test_ops import assert_outputs_match

rng = np.random.default_rng(15)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def pads(top, bottom, left, right):
    return [[0, 0], [0, 0], [top, bottom], [left, right]]


def max_pool(k, s, p, fmt="NCHW"):
    return lambda x: flow.nn.max_pool2d(x, ksize=k, strides=s, padding=p, data_format=fmt)


def avg_pool(k, s, p, fmt="NCHW"):
    return lambda x: flow.nn.avg_pool2d(x, ksize=k, strides=s, padding=p, data_format=fmt)


def tied(*shape):
    """Values from {0, 1, 2}: most windows hold ties for their maximum."""
    return rng.integers(0, 3, size=shape).astype(np.float32)


def special(*shape):
    """Random values with NaN, -inf and +inf at interior, edge and corner positions, and one
    window of all -inf."""
    x = rand(*shape)
    x[0, 0, 0, 0] = np.nan                  # a corner: an edge column of the first row case
    x[0, 0, 5, 6] = np.nan                  # interior
    x[0, 0, 5, 7] = np.nan                  # two NaNs in one window: the first gets dy
    x[0, -1, 3, -1] = np.nan                # the last column
    x[-1, 0, 4, 4] = np.inf
    x[-1, 1, 6, 2] = -np.inf
    x[-1, -1, 2:5, 2:5] = -np.inf           # windows of -inf only: dy to their first real tap
    return x


# name -> (pooling, input): each pooling's value and input gradient are checked.
VARIANTS = {
    "resnet_stem_same": (max_pool(3, 2, pads(1, 0, 1, 0)), rand(1, 4, 22, 22)),   # ResNet-50's stem, smaller
    "resnet18_stem_batch": (max_pool(3, 2, "SAME"), rand(3, 5, 16, 16)),
    "lenet_2x2": (max_pool(2, 2, "SAME"), rand(4, 3, 28, 28)),                      # 14-column rows, blocks of 8
    "lenet_2x2_narrow": (max_pool(2, 2, "VALID"), rand(2, 3, 14, 15)),             # 7 columns: blocks of 4, a leftover
    "max_3x3_s1_same": (max_pool(3, 1, "SAME"), rand(2, 3, 9, 11)),
    "max_2x2_s1_valid": (max_pool(2, 1, "VALID"), rand(2, 2, 7, 6)),
    "max_3x2_odd": (max_pool([3, 2], [2, 1], pads(1, 1, 0, 1)), rand(1, 3, 13, 9)),
    "max_5x5_row_cases": (max_pool(5, 1, pads(2, 2, 2, 2)), rand(1, 2, 9, 10)),    # 5 row cases: one left over
    "max_wide_window": (max_pool([1, 11], 1, pads(0, 0, 5, 5)), rand(1, 2, 3, 14)),  # 10 edge columns
    "max_global": (max_pool(6, 6, "VALID"), rand(2, 3, 6, 6)),                      # 36 taps: the general loops
    "max_long_rows": (max_pool(2, 2, "VALID"), rand(1, 1, 4, 600)),                 # 300 columns: two chunks
    "max_nhwc": (max_pool(3, 2, "SAME", "NHWC"), rand(2, 9, 10, 3)),
    "max_parallel": (max_pool(3, 2, "SAME"), rand(4, 16, 56, 56)),                  # an OpenMP region
    "avg_3x3_s2_same": (avg_pool(3, 2, "SAME"), rand(2, 3, 11, 12)),
    "avg_2x2_lenet": (avg_pool(2, 2, "VALID"), rand(2, 3, 14, 14)),
    "avg_3x3_s1_pads": (avg_pool(3, 1, pads(1, 1, 1, 1)), rand(1, 3, 8, 9)),
    "avg_wide_window": (avg_pool([2, 18], [1, 2], pads(0, 1, 3, 3)), rand(1, 2, 5, 30)),   # > 16 columns
    "avg_global": (avg_pool(7, 7, "VALID"), rand(3, 4, 7, 7)),
    "avg_nhwc": (avg_pool(2, 2, "SAME", "NHWC"), rand(2, 7, 9, 3)),
    "avg_parallel": (avg_pool(3, 2, "SAME"), rand(4, 16, 56, 56)),
    "max_float64": (max_pool(3, 2, "SAME"), rand(2, 3, 11, 10, dtype=np.float64)),
    "avg_float64": (avg_pool(3, 2, pads(1, 0, 1, 0)), rand(2, 3, 11, 10, dtype=np.float64)),
}
GROUPS = {
    "resnet_and_lenet": ["resnet_stem_same", "resnet18_stem_batch", "lenet_2x2", "lenet_2x2_narrow"],
    "max_shapes": ["max_3x3_s1_same", "max_2x2_s1_valid", "max_3x2_odd", "max_5x5_row_cases",
                   "max_wide_window", "max_global", "max_long_rows", "max_nhwc"],
    "avg_shapes": ["avg_3x3_s2_same", "avg_2x2_lenet", "avg_3x3_s1_pads", "avg_wide_window", "avg_global",
                   "avg_nhwc"],
    "parallel": ["max_parallel", "avg_parallel"],
    "float64": ["max_float64", "avg_float64"],
}


def combined(names):
    fns = [VARIANTS[n][0] for n in names]

    def fn(*blobs):
        return tuple(f(b) for f, b in zip(fns, blobs))
    return fn, [VARIANTS[n][1] for n in names]


def assert_match_with_nan(got, want):
    """NaN exactly where the reference has NaN, everything else within the usual tolerance."""
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    assert_outputs_match([np.nan_to_num(g, nan=7.0) for g in got], [np.nan_to_num(w, nan=7.0) for w in want])


def test_groups_cover_every_variant():
    assert sorted(n for names in GROUPS.values() for n in names) == sorted(VARIANTS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_pool_values_and_gradients_match_reference(group):
    fn, inputs = combined(GROUPS[group])
    case = compile_case(fn, inputs)
    assert len(case.compiled) == 2 * len(inputs)
    assert_outputs_match(case.compiled, case.reference)


def test_the_variants_reach_every_path_of_the_plan():
    """The plan's paths the variants above are named for (a change to pooling.py's limits that
    moves a variant off its path fails here, not silently)."""
    def plan(h, w, oh, ow, k, s, pt, pl):
        return pool_plan(h, w, oh, ow, k, s, pt, pl)
    stem = plan(22, 22, 11, 11, (3, 3), (2, 2), 1, 1)
    assert stem["cases"] == [(0, 3), (1, 3)] and [c for c, _ in stem["edges"]] == [0]
    assert plan(28, 28, 14, 14, (2, 2), (2, 2), 0, 0)["column_block"] == 8
    assert plan(14, 15, 7, 7, (2, 2), (2, 2), 0, 0)["column_block"] == 4
    assert len(plan(9, 10, 9, 10, (5, 5), (1, 1), 2, 2)["cases"]) == 4          # of 5
    assert plan(3, 14, 3, 14, (1, 11), (1, 1), 0, 5)["cases"] == []             # 10 edge columns
    assert plan(6, 6, 1, 1, (6, 6), (6, 6), 0, 0)["cases"] == []                # 36 taps
    assert plan(4, 600, 2, 300, (2, 2), (2, 2), 0, 0)["interior"] == (0, 300)   # > one 256-column chunk


def test_max_pool_ties_nan_and_infinities_match_reference():
    """Ties go to the first maximum, a NaN to the first NaN, -inf windows to their first real tap;
    windows with NaN or inf take the gradient's exact fallback search."""
    fns = [max_pool(3, 2, pads(1, 0, 1, 0)), max_pool(2, 2, "VALID"), max_pool(3, 1, "SAME"),
           max_pool(3, 2, "SAME"), max_pool(2, 2, "VALID")]
    inputs = [tied(2, 3, 12, 12), tied(2, 3, 14, 14), tied(1, 2, 7, 9), special(2, 3, 12, 12),
              special(2, 3, 14, 14)]

    def fn(*blobs):
        return tuple(f(b) for f, b in zip(fns, blobs))
    case = compile_case(fn, inputs)
    assert any(np.isnan(g).any() for g in case.reference)       # the NaN cases do reach the outputs
    assert_match_with_nan(case.compiled, case.reference)


def test_tied_gradient_goes_to_the_first_maximum():
    """A constant plane: every window is one tie, so dy goes to each window's top-left tap."""
    x = np.ones((1, 1, 6, 8), np.float32)
    case = compile_case(max_pool(2, 2, "VALID"), [x])
    dx = case.compiled[1][0, 0]
    assert np.count_nonzero(dx) == 12 and np.all(dx[::2, ::2] != 0)
    assert_outputs_match(case.compiled, case.reference)


@pytest.mark.parametrize("name", ["resnet_stem_same", "lenet_2x2_narrow", "max_5x5_row_cases",
                                  "avg_3x3_s1_pads", "avg_wide_window"])
def test_gradients_match_finite_differences(name):
    fn, x = VARIANTS[name]
    finite_difference_check(fn, [x])
