"""The ResNet-18-style block (benchmarks.workloads: RESNET_CONVS) as flowc job functions, written
with the OneFlow API a user would write it with: flow.layers.conv2d without bias,
flow.layers.batch_normalization over the channels, flow.nn.relu, a strided 1x1 shortcut, global
average pooling, a dense classifier and SGD with momentum.

    train_job, predict_job = block_jobs()            # batch 32, 32x32, as the benchmark runs them
    loss = train_job(images, labels)                 # mean cross entropy of the batch, before the update

`block_jobs(batch, hw)` builds the same network for other shapes (the tests use small ones).
"""
# No `from __future__ import annotations`: the placeholder annotations name block_jobs' arguments.

from functools import cache
from typing import Any

import flow
import flow.typing as tp
from benchmarks.workloads import (BN_EPSILON, BN_MOMENTUM, CLASSES, INIT_STDDEV, RESNET_BATCH, RESNET_CONVS, RESNET_HW,
                                  RESNET_IN, RESNET_LEARNING_RATE, RESNET_MOMENTUM)

_CONVS = {name: (c_out, kernel, stride) for name, _, c_out, kernel, stride, _, _ in RESNET_CONVS}


def _conv_bn(x: Any, name: str, relu: bool) -> Any:
    """conv (no bias) -> batch norm over the channels (batch statistics in train jobs) -> ReLU."""
    filters, kernel, stride = _CONVS[name]
    y = flow.layers.conv2d(x, filters, kernel, strides=stride, padding="SAME", use_bias=False,
                           kernel_initializer=flow.truncated_normal(INIT_STDDEV), name=name)
    y = flow.layers.batch_normalization(y, axis=1, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name + "_bn")
    return flow.nn.relu(y) if relu else y


def block_logits(images: Any) -> Any:
    """Stem, one downsampling basic block, global average pooling, dense: (N, 3, H, W) -> (N, 10)."""
    x = _conv_bn(images, "stem", relu=True)
    residual = _conv_bn(_conv_bn(x, "conv1", relu=True), "conv2", relu=False)
    shortcut = _conv_bn(x, "shortcut", relu=False)
    y = flow.nn.relu(residual + shortcut)
    pooled = flow.math.reduce_mean(y, axis=[2, 3])
    return flow.layers.dense(pooled, CLASSES, kernel_initializer=flow.truncated_normal(INIT_STDDEV), name="fc")


@cache
def block_jobs(batch: int = RESNET_BATCH, hw: int = RESNET_HW) -> tuple[Any, Any]:
    """(train job, predict job) of the block on `batch` images of RESNET_IN x hw x hw.

    Example:
        train_job, predict_job = block_jobs(8, 16)
        loss = train_job(images, labels)      # images float32 (8, 3, 16, 16), labels int32 (8,)
    """
    @flow.global_function(type="train")
    def resnet_block_train(images: tp.Numpy.Placeholder((batch, RESNET_IN, hw, hw), dtype=flow.float),
                           labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = block_logits(images)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        schedule = flow.optimizer.PiecewiseConstantScheduler([], [RESNET_LEARNING_RATE])
        flow.optimizer.SGD(schedule, momentum=RESNET_MOMENTUM).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def resnet_block_predict(images: tp.Numpy.Placeholder((batch, RESNET_IN, hw, hw), dtype=flow.float)) -> tp.Numpy:
        return block_logits(images)

    return resnet_block_train, resnet_block_predict
