"""No generated kernel opens an OpenMP region that cannot be active (an if-clause false at codegen time).

Such a region is not free: inside it, a GEMM's own parallel region becomes a nested team, whose
threads libgomp creates afresh on every call while the top-level team's threads spin.  ResNet-50's
batch-1 1x1 convolutions ran 10x slower that way (0.4 -> 4 ms each) until the templates emitted the
per-image region only for more than one image.  Batch-1 jobs through every convolution path that
loops over images: the 1x1 GEMM (forward, input and filter gradient), the few-taps stem, the
im2col input gradient.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import flow
import flow.typing as tp

# `#pragma omp parallel ... if(<int> > 1)` with the int at most 1: a region that never runs in parallel
_DEAD_IF = re.compile(r"#pragma omp parallel[^\n]*\bif\((\d+) > 1\)")


def _train_source(shape: tuple[int, ...], kernel: tuple[int, ...], strides: int, padding: str) -> str:
    flow.clear_default_session()

    @flow.global_function(type="train")
    def fit(x: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        # the input through a variable, so that the convolution's input gradient is computed too
        bias = flow.get_variable("omp_in_bias", shape=shape, initializer=flow.zeros_initializer())
        w = flow.get_variable("omp_w", shape=kernel, initializer=flow.random_normal_initializer(seed=1))
        loss = flow.math.reduce_mean(flow.nn.conv2d(x + bias, w, strides=strides, padding=padding))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    try:
        fit(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        return fit.compiled.generated.source
    finally:
        flow.clear_default_session()


@pytest.mark.parametrize("shape, kernel, strides, padding", [
    ((1, 8, 6, 6), (16, 8, 1, 1), 1, "VALID"),        # 1x1 as a GEMM per image
    ((1, 8, 8, 8), (16, 8, 1, 1), 2, "VALID"),        # strided 1x1
    ((1, 1, 12, 12), (8, 1, 3, 3), 1, "SAME"),        # few taps: filters as rows
    ((1, 4, 12, 12), (8, 4, 3, 3), 1, "SAME"),        # the implicit GEMM and its input gradient
])
def test_batch_one_convolutions_open_no_region_that_cannot_be_active(shape, kernel, strides, padding) -> None:
    source = _train_source(shape, kernel, strides, padding)
    dead = [m.group(0) for m in _DEAD_IF.finditer(source) if int(m.group(1)) <= 1]
    assert not dead, dead
