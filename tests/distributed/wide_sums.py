"""A consistent-view test program whose sums over the ranks are not all float32: a float64 model
(`double_job`, whose output layer is split over the ranks, model parallelism: its exchanges move
and sum float64 values; its variables match one process's to float64 precision), a float64 layer feeding a
float32 one (`mixed_job`: its gradients fill float64 and float32 buckets), a loss weighted by an
int32 count over the whole batch that the step reads on, and an int64 sum over the batch taken
modulo 7.

    python wide_sums.py OUT.npz                  # one process
    mpiexec -n 2 python wide_sums.py OUT.npz     # two ranks, half the batch each

Both launches train the same model on the same global batch and save the same values.
"""
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp

OUT = sys.argv[1]
BATCH = 8


@flow.global_function(type="train")
def double_job(x: tp.Numpy.Placeholder((BATCH, 5), dtype=flow.float64),
               y: tp.Numpy.Placeholder((BATCH, 4), dtype=flow.float64)) -> tp.Numpy:
    init = flow.random_normal_initializer(stddev=0.3)
    hidden = flow.layers.dense(x, 6, activation=flow.math.tanh, kernel_initializer=init, name="double_hidden")
    guess = flow.layers.dense(hidden, 4, kernel_initializer=init, name="double_out",
                              model_distribute=flow.distribute.split(0))
    loss = flow.math.reduce_mean(flow.math.square(guess - y))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss


@flow.global_function(type="train")
def mixed_job(x: tp.Numpy.Placeholder((BATCH, 5), dtype=flow.float64),
              y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
    init = flow.random_normal_initializer(stddev=0.3)
    hidden = flow.layers.dense(x, 7, activation=flow.math.tanh, kernel_initializer=init, name="wide")
    logits = flow.layers.dense(flow.cast(hidden, flow.float32), 3, kernel_initializer=init, name="narrow")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    # weighted by the share of the batch's labels that are not class 0: a sum over every rank's rows
    not_first = flow.math.reduce_sum(flow.cast(flow.math.greater(y, 0), flow.int32))
    weight = flow.cast(not_first, flow.float32) / float(BATCH)
    flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(
        flow.math.reduce_mean(loss) * weight)
    checksum = flow.math.mod(flow.math.reduce_sum(flow.cast(y, flow.int64) * 1000003),
                             flow.constant(7, dtype=flow.int64))
    return flow.math.reduce_sum(flow.cast(hidden, flow.float64)), not_first, checksum


rng = np.random.default_rng(5)
results = []
for _ in range(4):
    x = rng.standard_normal((BATCH, 5))
    y = rng.integers(0, 3, BATCH).astype(np.int32)
    total, count, checksum = mixed_job(x, y)
    loss = double_job(x, rng.standard_normal((BATCH, 4)))
    results.append([total.item(), count.item(), checksum.item(), loss.item()])
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, results=np.array(results, dtype=np.float64), **{f"var:{k}": v for k, v in values.items()})
print("wide_sums: done", flush=True)
