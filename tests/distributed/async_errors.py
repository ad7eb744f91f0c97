"""An asynchronous call whose labels are out of range, on one process and on 2 ranks: the call
returns, and its error comes at the next sync point (`flow.sync_default_session()`); the refused
step changes no variable and the session goes on.

    python async_errors.py OUT.npz                  # one process
    mpiexec -n 2 python async_errors.py OUT.npz     # two ranks: the bad label lies in rank 1's share

Both print the same lines (the job function's own print at its trace too: only the master's
shows) and save the same values.
"""
import sys

import numpy as np

import flow
import flow.typing as tp

OUT = sys.argv[1]
BATCH, CLASSES = 8, 5


@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((BATCH, 6)), y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)
              ) -> tp.Callback[tp.Numpy]:
    print("tracing train_job", flush=True)      # by the master alone on 2 ranks, as in one process
    logits = flow.layers.dense(x, CLASSES, kernel_initializer=flow.truncated_normal(0.1), name="output")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss


rng = np.random.default_rng(0)
losses = []
for step in range(4):
    x = rng.standard_normal((BATCH, 6)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    if step == 2:
        bad = y.copy()
        bad[-1] = CLASSES          # the last row: rank 1's share on 2 ranks
        train_job(x, bad)(losses.append)
        print("the call returned", flush=True)
        try:
            flow.sync_default_session()
        except flow.StepError as err:
            print(f"sync point: {err}", flush=True)
    train_job(x, y)(losses.append)
flow.sync_default_session()
print(f"{len(losses)} losses", flush=True)
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, losses=np.stack(losses), **{f"var:{k}": v for k, v in values.items()})
print("async_errors: done", flush=True)
