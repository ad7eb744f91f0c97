"""A mirrored-view test program: each device gets its own batch as one entry of a tp.ListNumpy, the
gradients are averaged over the devices, and each device's results come back as a list.

    python mirrored.py OUT.npz                  # one process, one device: the two batches concatenated
    mpiexec -n 2 python mirrored.py OUT.npz     # two ranks, one batch each (mirrored view)

The two launches train the same model: the mean gradient over both batches.
"""
import sys
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp
from flowc.runtime.world import detect_world

OUT = sys.argv[1]
PER_DEVICE = 16
DEVICES = detect_world().size
BATCH = PER_DEVICE if DEVICES > 1 else 2 * PER_DEVICE       # one process sees both batches at once

config = flow.function_config()
if DEVICES > 1:
    config.default_logical_view(flow.scope.mirrored_view())


def mlp(x):
    init = flow.truncated_normal(0.1)
    x = flow.layers.dense(x, 32, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="output")


@flow.global_function(type="train", function_config=config)
def train_job(x: tp.ListNumpy.Placeholder((BATCH, 20), dtype=flow.float),
              y: tp.ListNumpy.Placeholder((BATCH,), dtype=flow.int32)) -> Tuple[tp.ListNumpy, tp.ListNumpy]:
    logits = mlp(x)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss, logits


# What the watch handlers saw, by their annotation: each is the whole batch's logits
watched: dict[str, list] = {"numpy": [], "list": [], "blob": []}


def keep_whole(v: tp.Numpy):
    watched["numpy"].append(v)                           # the ranks' arrays joined


def keep_listed(v: tp.ListNumpy):
    assert len(v) == DEVICES
    watched["list"].append(np.concatenate(v))


def keep_blob(v):
    assert v.parallel_num() == DEVICES
    watched["blob"].append(np.concatenate(v.numpy_list()))


@flow.global_function(function_config=config)
def eval_job(x: tp.ListNumpy.Placeholder((BATCH, 20), dtype=flow.float)) -> tp.Numpy:
    logits = mlp(x)
    flow.watch(logits, keep_whole)
    return logits


@flow.global_function(function_config=config)
def old_api_job(x: tp.ListNumpy.Placeholder((BATCH, 20), dtype=flow.float)):
    logits = mlp(x)
    flow.watch(logits, keep_listed)
    flow.watch(logits, keep_blob)
    return logits, flow.math.reduce_mean(logits)


@flow.global_function(function_config=config)
def scalar_job(x: tp.ListNumpy.Placeholder((BATCH, 20), dtype=flow.float)) -> tp.Numpy:
    return flow.math.reduce_mean(mlp(x))


rng = np.random.default_rng(3)
losses, logits = [], []
for _ in range(4):
    xs = [rng.standard_normal((PER_DEVICE, 20)).astype(np.float32) for _ in range(2)]
    ys = [rng.integers(0, 10, PER_DEVICE).astype(np.int32) for _ in range(2)]
    if DEVICES > 1:
        loss, out = train_job(xs, ys)
        assert isinstance(loss, list) and len(loss) == 2 and loss[0].shape == (PER_DEVICE,)
        losses.append(np.concatenate(loss))
        logits.append(np.concatenate(out))
    else:
        loss, out = train_job([np.concatenate(xs)], [np.concatenate(ys)])
        losses.append(loss[0])
        logits.append(out[0])
if DEVICES > 1:        # smaller arrays than the placeholder's: refused on several ranks, naming the shapes
    try:
        train_job([xs[0][:4], xs[1][:4]], [ys[0][:4], ys[1][:4]])
    except ValueError as err:
        print("smaller refused:", "must have shape (16, 20)" in str(err), flush=True)
# Results of a mirrored job in one array: tp.Numpy and the old API's LocalBlob join the ranks' arrays
xs = [rng.standard_normal((PER_DEVICE, 20)).astype(np.float32) for _ in range(2)]
feed = xs if DEVICES > 1 else [np.concatenate(xs)]
evaluated = eval_job(feed)
blob, mean = old_api_job(feed).get()
assert blob.parallel_num() == DEVICES and len(blob.numpy_list()) == DEVICES
if DEVICES > 1:
    np.testing.assert_array_equal(blob.numpy(1), blob.numpy_list()[1])
    np.testing.assert_array_equal(blob.numpy(), np.concatenate(blob.numpy_list()))
    # a full reduction has shape (1,) on each rank, as in OneFlow: a tp.Numpy result joins them
    per_rank = scalar_job(feed)
    print("means joined:", per_rank.shape == (DEVICES,) and
          np.allclose(per_rank, evaluated.reshape(DEVICES, -1).mean(axis=1), rtol=1e-5), flush=True)
    means = mean.numpy_list()            # each rank's mean over its own batch: their mean is the whole's
    mean_of_all = np.mean(means)
else:
    mean_of_all = mean.numpy()
np.testing.assert_array_equal(evaluated, blob.numpy())
results = dict(evaluated=evaluated, old_api=np.asarray(blob), mean=mean_of_all,
               **{f"watched:{k}": v[0] for k, v in watched.items()})
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, losses=np.stack(losses), logits=np.stack(logits), **results,
         **{f"var:{k}": v for k, v in values.items()})
print("mirrored: done", flush=True)
