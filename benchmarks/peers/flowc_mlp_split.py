"""The seeds' MLP (784-512-10, SGD 0.1) with its hidden layer split over the ranks by unit
(`model_distribute=flow.distribute.split(0)`, OneFlow's model parallelism): the scaling row's
model-parallel line (benchmarks/scaling.py).  On one process the split is a no-op, so the 1-rank
baseline is the plain MLP.

    train_job = split_hidden_train_job()
    loss = train_job(images, labels)          # (100,) per-example losses, before the update
"""
# No `from __future__ import annotations`: the placeholder annotations are read when the job is traced.

from functools import cache
from typing import Any

import flow
import flow.typing as tp
from benchmarks.workloads import BATCH, CLASSES, LEARNING_RATE, MLP_HIDDEN


@cache
def split_hidden_train_job() -> Any:
    """The train job (defined once per process: every rank must define the same jobs)."""
    @flow.global_function(type="train")
    def mlp_split_hidden_train(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                               labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        initializer = flow.truncated_normal(0.1)
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, MLP_HIDDEN, activation=flow.nn.relu, kernel_initializer=initializer,
                                   name="hidden", model_distribute=flow.distribute.split(0))
        logits = flow.layers.dense(hidden, CLASSES, kernel_initializer=initializer, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LEARNING_RATE]), momentum=0).minimize(loss)
        return loss
    return mlp_split_hidden_train
