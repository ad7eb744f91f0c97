"""The seeds' LeNet at batch 100: train and predict steps, flowc against the NumPy reference executor.

    make bench     # steps/s = 1 / mean
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
from compiler.reference import run_reference
from runtime.session import default_session
from tests.test_mlp import load_example

seed_train = load_example("seeds/synchronize_single_job")
seed_eval = load_example("seeds/synchronize_batch_job")
rng = np.random.default_rng(0)
IMAGES = rng.random((100, 1, 28, 28), dtype=np.float32)
LABELS = rng.integers(0, 10, 100).astype(np.int32)


@pytest.mark.benchmark(group="lenet-train")
def test_flowc_lenet_train_step(benchmark):
    seed_train.train_job(IMAGES, LABELS)
    benchmark.pedantic(seed_train.train_job, (IMAGES, LABELS), rounds=30, warmup_rounds=2)


@pytest.mark.benchmark(group="lenet-train")
def test_reference_lenet_train_step(benchmark):
    graph = seed_train.train_job.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    scalars = {"learning_rate:float32": 0.1, "train_step": 0}
    benchmark.pedantic(run_reference, (graph, [IMAGES, LABELS], values, scalars), rounds=3)


@pytest.mark.benchmark(group="lenet-predict")
def test_flowc_lenet_predict_step(benchmark):
    seed_eval.eval_job(IMAGES, LABELS)
    benchmark.pedantic(seed_eval.eval_job, (IMAGES, LABELS), rounds=50, warmup_rounds=2)


@pytest.mark.benchmark(group="lenet-predict")
def test_reference_lenet_predict_step(benchmark):
    graph = seed_eval.eval_job.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    benchmark.pedantic(run_reference, (graph, [IMAGES, LABELS], values), rounds=3)
