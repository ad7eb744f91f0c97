"""A test program whose collectives carry NaN, ±Inf and -0.0: every exchange of a distributed step
must leave them as one process computes them.

    python special_values.py OUT.npz                  # one process
    mpiexec -n 2 python special_values.py OUT.npz     # two ranks (consistent view)

On 2 ranks the predict job gathers x's rows (all_gather) for a layer split by unit, sums each
row's units over the ranks (reduce_scatter), turns the layer's columns back into rows (all_to_all)
and sums a column statistic over the batch (all_reduce).  A weight of ones on one input makes each
unit a copy of x, so no product with another entry hides a special value.
"""
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp

OUT = sys.argv[1]
BATCH, UNITS = 8, 4


@flow.global_function(type="predict")
def special_job(x: tp.Numpy.Placeholder((BATCH, 1), dtype=flow.float),
                v: tp.Numpy.Placeholder((BATCH, 5), dtype=flow.float)
                ) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
    w = flow.get_variable("w", shape=(UNITS, 1), initializer=flow.ones_initializer(),
                          distribute=flow.distribute.split(0))
    units = flow.matmul(x, w, transpose_b=True)            # (B, UNITS): every unit is x; split by unit
    # partial over the units, added to x's rows: each rank keeps its rows of the sum
    row_sums = flow.math.sqrt(flow.math.reduce_sum(units, axis=1, keepdims=True) + x)
    rows = units + x                                         # columns back to rows, next to x's rows
    column_stats = flow.math.sqrt(flow.math.reduce_sum(v, axis=0))   # partial over the batch: summed
    return units, row_sums, rows, column_stats


nan, inf = np.float32(np.nan), np.float32(np.inf)
x = np.array([[nan], [inf], [-inf], [-0.0], [0.0], [1.5], [-2.0], [3.0]], dtype=np.float32)
v = np.ones((BATCH, 5), dtype=np.float32)
v[:, 0] = -0.0                     # a sum of negative zeros: -0.0, whose sqrt keeps the sign
v[3, 1] = inf                      # +Inf among finite values
v[1, 2], v[6, 2] = inf, -inf       # +Inf and -Inf, one in each rank's rows: NaN
v[5, 3] = nan                      # NaN in the second rank's rows
units, row_sums, rows, column_stats = special_job(x, v)
np.savez(OUT, units=units, row_sums=row_sums, rows=rows, column_stats=column_stats)
print("special_values: done")
