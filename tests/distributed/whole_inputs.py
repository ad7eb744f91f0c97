"""A consistent-view test program with placeholders declared without a batch axis
(`batch_axis=None`): OneFlow gives such an input whole to every device, and splits the others
along their batch axis.  Also a job without any placeholder, and two jobs of one name (made by one
factory): every rank must run the one called, not the first of that name.

    python whole_inputs.py OUT.npz                  # one process
    mpiexec -n 2 python whole_inputs.py OUT.npz     # two ranks: x and y split, scale and table whole

Both launches train the same model on the same global batch and save the same values.
"""
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp
from flowc.runtime.world import detect_world

OUT = sys.argv[1]
BATCH = 16
RANKS = detect_world().size


@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((BATCH, 20), dtype=flow.float),
              y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32),
              scale: tp.Numpy.Placeholder((20,), dtype=flow.float, batch_axis=None),
              table: tp.Numpy.Placeholder((2, 10), dtype=flow.float, batch_axis=None),
              ) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
    init = flow.truncated_normal(0.1)
    hidden = flow.layers.dense(x * scale, 32, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    offset = flow.math.reduce_sum(table, axis=[0])
    logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output") + offset
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss, logits, flow.math.reduce_sum(table * table)      # the last: from whole inputs only


@flow.global_function()
def no_inputs_job() -> tp.Numpy:          # no placeholder at all: nothing to split or send
    bias = flow.get_variable("output-bias", shape=(10,), initializer=flow.zeros_initializer())
    return bias * 2.0


def scaled_by(factor):
    @flow.global_function()
    def scaled(x: tp.Numpy.Placeholder((BATCH, 20), dtype=flow.float)) -> tp.Numpy:
        return x * factor
    return scaled


doubling, tripling = scaled_by(2.0), scaled_by(3.0)     # both called "scaled"
rng = np.random.default_rng(5)
losses, logits, squares = [], [], []
for _ in range(4):
    x = rng.standard_normal((BATCH, 20)).astype(np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int32)
    scale = rng.uniform(0.5, 2.0, 20).astype(np.float32)
    table = rng.standard_normal((2, 10)).astype(np.float32)
    if len(losses) % 2:        # column-major arrays: each rank's share must still be its rows, in order
        x, table = np.asfortranarray(x), np.asfortranarray(table)
    loss, out, square = train_job(x, y, scale, table)
    losses.append(loss)
    logits.append(out)
    squares.append(square)
    np.testing.assert_allclose(square, np.sum(table * table), rtol=1e-5)
doubled = no_inputs_job()
np.testing.assert_array_equal(tripling(x), 3 * x)
np.testing.assert_array_equal(doubling(x), 2 * x)
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.testing.assert_array_equal(doubled, 2 * values["output-bias"])
np.savez(OUT, losses=np.stack(losses), logits=np.stack(logits), squares=np.stack(squares), doubled=doubled,
         **{f"var:{k}": v for k, v in values.items()})
print("whole_inputs: done", flush=True)
