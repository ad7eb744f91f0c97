"""A distributed-training test program: train MODEL for STEPS steps on a fixed global batch stream and
save (rank 0) the results, the predict job's outputs and every variable to OUT.npz.

    python train_models.py mlp 4 out.npz                 # one process (MODEL: mlp lenet deep hybrid mixed bn)
    mpiexec -n 2 python train_models.py mlp 4 out.npz    # the same logical job over 2 ranks

The script is the same in both runs, as in OneFlow: only the launch differs.  Options:
    --load DIR / --save DIR   a checkpoint loaded before the first step / saved after the last
    --skip N                  draw (and drop) the first N batches: continue a run that saved after N steps
    --announce                each rank prints "pid RANK PID" before the first call; the steps then pause
    --mismatch                rank 1 builds a wider hidden layer (a script that differs between ranks)
    --bad-label               the last step's last label is out of range (it lies in rank 1's share)
    --clear-after N           flow.clear_default_session() after N steps (training starts afresh)
    --load-after-clear DIR    and then load a checkpoint (past the first call: the master alone runs it)
    --batch N                 the global batch (32; one that does not divide over the ranks is split as
                              OneFlow's balanced splitter does: 31 over 2 ranks is 16 + 15)
    --bucket-mb N             flow.config.collective_boxing.nccl_fusion_threshold_mb(N) (0: one gradient per bucket)
    --whole-eval              (hybrid) the predict job declares the split layer without model_distribute:
                              it reads the variables whole, which the train job holds in slices
    --end-before-call R:HOW   rank R never reaches the first job call: HOW is "raise" (an error at once) or
                              "exit" (a normal end, 2 s later, while the other ranks wait for it)
    --save-before-call DIR    a checkpoint of the initial variables, saved before the first job call (every
                              rank still runs the script then: the master alone writes it)
"""
import os
import sys
import time
from typing import Tuple

import numpy as np

import flow
import flow.typing as tp

MODEL, STEPS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
OPTIONS = sys.argv[4:]


def option(name, default=None):
    return OPTIONS[OPTIONS.index(name) + 1] if name in OPTIONS else default


BATCH = int(option("--batch", 32))
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
HIDDEN = 96 if "--mismatch" in OPTIONS and RANK == 1 else 64


def mlp(x, train=True):
    init = flow.truncated_normal(0.1)
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="output")


def lenet(x, train=True):
    # the quick-start LeNet, dropout included: each rank draws its share of the one-process mask
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(x, 8, 5, padding="SAME", activation=flow.nn.relu, name="conv1", kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    x = flow.layers.conv2d(x, 16, 5, padding="SAME", activation=flow.nn.relu, name="conv2", kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 64, activation=flow.nn.relu, kernel_initializer=init, name="dense1")
    if train:
        x = flow.nn.dropout(x, rate=0.5, name="dropout")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="dense2")


def deep(x, train=True):
    # three hidden layers of one shape: their kernels share generated functions (a bucket's start must
    # still be code after a shared function's call)
    init = flow.truncated_normal(0.1)
    x = flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 32, activation=flow.nn.relu, kernel_initializer=init,
                          name="hidden0")
    for i in range(1, 4):
        x = flow.layers.dense(x, 32, activation=flow.nn.relu, kernel_initializer=init, name=f"hidden{i}")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="output")


def hybrid(x, train=True):
    # OneFlow's hybrid-parallel MLP: a data-parallel hidden layer, the output layer split by unit over the
    # devices (model parallelism); a predict job with --whole-eval reads the output layer whole
    init = flow.truncated_normal(0.1)
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 64, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
    split = None if "--whole-eval" in OPTIONS and not train else flow.distribute.split(0)
    return flow.layers.dense(x, 10, kernel_initializer=init, name="output", model_distribute=split)


def mixed(x, train=True):
    # OneFlow's mixed-parallel LeNet: data-parallel convolutions, a model-parallel hidden layer with dropout
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(x, 8, 5, padding="SAME", activation=flow.nn.relu, name="conv1", kernel_initializer=init)
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 64, activation=flow.nn.relu, kernel_initializer=init, name="dense1",
                          model_distribute=flow.distribute.split(0))
    if train:
        x = flow.nn.dropout(x, rate=0.5, name="dropout")
    return flow.layers.dense(x, 10, kernel_initializer=init, name="dense2")


def bn(x, train=True):
    # batch normalisation after a convolution (NCHW) and after a dense layer: the train job normalises with
    # the whole batch's statistics on every rank (synchronised), the predict job with the moving averages
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(x, 8, 5, padding="SAME", name="conv1", kernel_initializer=init, use_bias=False)
    x = flow.nn.relu(flow.layers.batch_normalization(x, axis=1, momentum=0.9, training=train, name="bn1"))
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW")
    x = flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 32, kernel_initializer=init, name="dense1",
                          use_bias=False)
    x = flow.nn.relu(flow.layers.batch_normalization(x, axis=1, momentum=0.9, training=train, name="bn2"))
    return flow.layers.dense(x, 10, kernel_initializer=init, name="dense2")


if option("--bucket-mb") is not None:
    flow.config.collective_boxing.nccl_fusion_threshold_mb(int(option("--bucket-mb")))
NET = {"mlp": mlp, "lenet": lenet, "deep": deep, "hybrid": hybrid, "mixed": mixed, "bn": bn}[MODEL]


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    logits = NET(images)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9).minimize(loss)
    return loss


@flow.global_function(type="predict")
def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
    logits = NET(images, train=False)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    return logits, flow.math.reduce_mean(loss)


def batch(rng):
    return rng.standard_normal((BATCH, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, BATCH).astype(np.int32)


rng = np.random.default_rng(7)
for _ in range(int(option("--skip", 0))):
    batch(rng)
if option("--load"):
    flow.load_variables(flow.checkpoint.get(option("--load")))
if option("--save-before-call"):
    flow.checkpoint.save(option("--save-before-call"))
if "--announce" in OPTIONS:
    print(f"pid {RANK} {os.getpid()}", flush=True)
if option("--end-before-call"):
    rank, how = option("--end-before-call").split(":")
    if int(rank) == RANK and how == "raise":
        raise FileNotFoundError(f"rank {RANK} cannot find its data")
    if int(rank) == RANK:
        time.sleep(2)
        sys.exit(0)
losses = []
for step in range(STEPS):
    x, y = batch(rng)
    if "--bad-label" in OPTIONS and step == STEPS - 1:
        bad = y.copy()
        bad[-1] = 10
        try:
            train_job(x, bad)
        except flow.StepError as err:
            print(f"refused: {err}", flush=True)
    losses.append(train_job(x, y))
    if option("--clear-after") and step + 1 == int(option("--clear-after")):
        flow.clear_default_session()
        if option("--load-after-clear"):
            flow.load_variables(flow.checkpoint.get(option("--load-after-clear")))
    if "--announce" in OPTIONS:
        print(f"step {step}", flush=True)
        time.sleep(0.5)
logits, mean_loss = eval_job(x, y)
if option("--save"):
    flow.checkpoint.save(option("--save"))
print(f"{MODEL}: losses {[round(float(v.mean()), 5) for v in losses]}", flush=True)
values = {name: blob.numpy() for name, blob in flow.get_all_variables().items()}
np.savez(OUT, losses=np.stack(losses), logits=logits, mean_loss=mean_loss, **{f"var:{k}": v for k, v in values.items()})
