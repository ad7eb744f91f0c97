"""Soak: 10,000 asynchronous predict steps of the seed MLP without memory growth."""
from __future__ import annotations

import os

import numpy as np
import pytest

import flow
from tests.test_mlp import load_example

pytestmark = pytest.mark.slow      # 10,000 steps

async_demo = load_example("seeds/async_batch_job")   # eval_job -> tp.Callback[Tuple[...]]


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_ten_thousand_async_predict_steps_keep_memory_flat():
    images = np.random.default_rng(0).random((100, 1, 28, 28), dtype=np.float32)
    labels = np.zeros(100, np.int32)
    counted = []

    def count(result):
        counted.append(result[1].shape[0])

    for _ in range(1000):                       # warm-up: compile, allocator pools, thread stacks
        async_demo.eval_job(images, labels)(count)
    flow.sync_default_session()
    before = resident_bytes()
    for _ in range(9000):
        async_demo.eval_job(images, labels)(count)
    flow.sync_default_session()
    growth = (resident_bytes() - before) / before
    assert len(counted) == 10000 and all(c == 100 for c in counted)
    assert growth < 0.05, f"resident memory grew {growth * 100:.1f}% over 9,000 steps"
