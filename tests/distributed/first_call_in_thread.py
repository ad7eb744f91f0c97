"""A consistent-view test program whose job calls are all made from a second Python thread (a
training loop in a worker thread, the main thread waiting for it).  A worker serves the master
from that thread; when the master's script ends, the worker must end with it and never run the
rest of the script itself.

    python first_call_in_thread.py OUT.npz                  # one process
    mpiexec -n 2 python first_call_in_thread.py OUT.npz     # two ranks
"""
import sys
import threading

import numpy as np

import flow
import flow.typing as tp

OUT = sys.argv[1]
BATCH = 8


@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((BATCH, 6), dtype=flow.float),
              y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 3, kernel_initializer=flow.truncated_normal(0.2), name="out")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss


rng = np.random.default_rng(2)
batches = [(rng.standard_normal((BATCH, 6)).astype(np.float32), rng.integers(0, 3, BATCH).astype(np.int32))
           for _ in range(3)]
losses = []
trainer = threading.Thread(target=lambda: losses.extend(train_job(x, y) for x, y in batches))
trainer.start()
trainer.join()
losses.append(train_job(*batches[0]))        # and one from the main thread, after it
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, losses=np.stack(losses), **{f"var:{k}": v for k, v in values.items()})
print("first_call_in_thread: done", flush=True)
