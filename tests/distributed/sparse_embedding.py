"""A consistent-view test program whose embeddings take sparse (indexed-slices) updates: each rank
all-gathers the batch's indices and gradient rows, so every rank updates the rows the whole batch
used, as one process does.

    python sparse_embedding.py OUT.npz [BATCH]                  # one process
    mpiexec -n 2 python sparse_embedding.py OUT.npz [BATCH]     # two ranks, half the batch each

BATCH (8) may be odd: 7 is split 4 + 3, and the ranks gather their shares of unequal size.

Two train jobs: LazyAdam on an int64-indexed table (always sparse), and momentum SGD on an
int32-indexed table named in indexed_slices_optimizer_conf (sparse by request, as in OneFlow), with
a repeated index across the ranks' shares.  Both launches save the same values.
"""
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp

OUT = sys.argv[1]
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 8
FIELDS, VOCAB, DIM = 3, 50, 4


def scores(ids, table: str):
    weights = flow.get_variable(table, shape=(VOCAB, DIM), initializer=flow.random_normal_initializer(0.0, 0.1))
    rows = flow.gather(weights, ids)
    flat = flow.reshape(rows, [BATCH, FIELDS * DIM])
    return flow.layers.dense(flat, 1, kernel_initializer=flow.truncated_normal(0.2), name=f"{table}-out")


def loss_of(logits, clicks):
    return flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(clicks, logits))


@flow.global_function(type="train")
def lazy_job(ids: tp.Numpy.Placeholder((BATCH, FIELDS), dtype=flow.int64),
             clicks: tp.Numpy.Placeholder((BATCH, 1), dtype=flow.float)) -> tp.Numpy:
    loss = loss_of(scores(ids, "lazy_table"), clicks)
    flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
    return loss


config = flow.FunctionConfig()
config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["sgd_table"])))


@flow.global_function(type="train", function_config=config)
def sgd_job(ids: tp.Numpy.Placeholder((BATCH, FIELDS), dtype=flow.int32),
            clicks: tp.Numpy.Placeholder((BATCH, 1), dtype=flow.float)) -> Tuple[tp.Numpy, tp.Numpy]:
    logits = scores(ids, "sgd_table")
    loss = loss_of(logits, clicks)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss, logits


rng = np.random.default_rng(3)
losses = []
for _ in range(4):
    ids = rng.integers(0, VOCAB, (BATCH, FIELDS))
    ids[0, 0] = ids[-1, -1] = 7          # one row used by both ranks' shares: its gradient rows add up
    clicks = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    losses.append(lazy_job(ids.astype(np.int64), clicks))
    loss, logits = sgd_job(ids.astype(np.int32), clicks)
    losses.append(loss)
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, losses=np.stack(losses), logits=logits, **{f"var:{k}": v for k, v in values.items()})
print("sparse_embedding: done", flush=True)
