"""Asynchronous vs synchronous calls when each step's host-side data preparation costs about as
much as its compute: the seed MLP train step, 50 steps per round.

The preparation is I/O-like (reading the next batch: it waits, the way a data loader waits on a
disk or a decoder, and holds no core), so with asynchronous calls it overlaps the previous step's
compute, whose foreign call releases the GIL.  Expect async ~1.5-2x the sync throughput.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import flow
from tests.test_mlp import load_example

demo = load_example("mlp_train_demo")          # -> tp.Numpy: synchronous
async_demo = load_example("seeds/async_single_job")   # its train_job -> tp.Callback[tp.Numpy]
STEPS = 50
rng = np.random.default_rng(0)
IMAGES = rng.random((100, 1, 28, 28), dtype=np.float32)
LABELS = rng.integers(0, 10, 100).astype(np.int32)


def compute_seconds() -> float:
    demo.train_job(IMAGES, LABELS)
    start = time.perf_counter()
    for _ in range(50):
        demo.train_job(IMAGES, LABELS)
    return (time.perf_counter() - start) / 50


@pytest.fixture(scope="module")
def prep_seconds():
    flow.clear_default_session()
    seconds = compute_seconds()
    flow.clear_default_session()
    return seconds


def load_batch(seconds: float):
    time.sleep(seconds)                 # the I/O part of preparing a batch
    return IMAGES, LABELS


@pytest.mark.benchmark(group="async-vs-sync")
def test_sync_calls_with_host_work(benchmark, prep_seconds):
    flow.clear_default_session()
    demo.train_job(IMAGES, LABELS)

    def run():
        for _ in range(STEPS):
            demo.train_job(*load_batch(prep_seconds))
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group="async-vs-sync")
def test_async_calls_with_host_work(benchmark, prep_seconds):
    flow.clear_default_session()
    async_demo.train_job(IMAGES, LABELS)(lambda loss: None)
    flow.sync_default_session()

    def run():
        for _ in range(STEPS):
            async_demo.train_job(*load_batch(prep_seconds))(lambda loss: None)
        flow.sync_default_session()
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
