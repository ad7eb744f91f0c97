"""A consistent-view test program whose reduce_max, reduce_min, reduce_prod and reduce_logsumexp run
along the other axes than the batch axis: each rank reduces its own rows (as in one process).

    python row_reductions.py OUT.npz                  # one process
    mpiexec -n 2 python row_reductions.py OUT.npz     # two ranks, half the batch each

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
def train_job(x: tp.Numpy.Placeholder((BATCH, 12), dtype=flow.float),
              y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
    init = flow.truncated_normal(0.2)
    logits = flow.layers.dense(x, 6, kernel_initializer=init, name="scores")
    # a softmax cross entropy written out: the stable form subtracts each row's maximum
    shifted = logits - flow.math.reduce_max(logits, axis=[1], keepdims=True)
    picked = flow.math.reduce_sum(shifted * flow.one_hot(y, depth=6), axis=[1])
    loss = flow.math.reduce_logsumexp(shifted, axis=[1]) - picked
    spread = flow.math.reduce_max(logits, axis=[1]) - flow.math.reduce_min(logits, axis=[1])
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(
        flow.math.reduce_mean(loss) + 0.01 * flow.math.reduce_mean(spread))
    return loss, spread, flow.math.reduce_prod(flow.math.sigmoid(logits), axis=[1])


rng = np.random.default_rng(11)
results = []
for _ in range(4):
    x = rng.standard_normal((BATCH, 12)).astype(np.float32)
    y = rng.integers(0, 6, BATCH).astype(np.int32)
    results.append(np.stack(train_job(x, y)))
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, results=np.stack(results), **{f"var:{k}": v for k, v in values.items()})
print("row_reductions: done", flush=True)
