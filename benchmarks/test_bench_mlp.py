"""Seed MLP (784-512-10, batch 100) train and predict steps: flowc against the NumPy reference executor.

    make bench            # or: .venv/bin/python -m pytest benchmarks --benchmark-only

pytest-benchmark reports seconds per step; steps/s is 1 / mean.  The side-by-side
comparison with PyTorch belongs to the benchmark harness issue.
"""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import flow
from compiler.reference import run_reference
from runtime.session import default_session

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
_spec = importlib.util.spec_from_file_location("mlp_train_demo", EXAMPLES / "mlp_train_demo.py")
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)

rng = np.random.default_rng(0)
IMAGES = rng.random((100, 1, 28, 28), dtype=np.float32)
LABELS = rng.integers(0, 10, 100).astype(np.int32)


def _warm(job):
    job(IMAGES, LABELS)        # trace + compile (or cache hit) outside the timing


@pytest.mark.benchmark(group="mlp-train")
def test_flowc_mlp_train_step(benchmark):
    _warm(demo.train_job)
    benchmark(demo.train_job, IMAGES, LABELS)


@pytest.mark.benchmark(group="mlp-train")
def test_reference_mlp_train_step(benchmark):
    graph = demo.train_job.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    scalars = {"learning_rate:float32": 0.1}

    def step():
        _, updates = run_reference(graph, [IMAGES, LABELS], values, scalars)
        values.update(updates)
    benchmark(step)


@pytest.mark.benchmark(group="mlp-predict")
def test_flowc_mlp_predict_step(benchmark):
    _warm(demo.eval_job)
    benchmark(demo.eval_job, IMAGES, LABELS)


@pytest.mark.benchmark(group="mlp-predict")
def test_reference_mlp_predict_step(benchmark):
    graph = demo.eval_job.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    benchmark(run_reference, graph, [IMAGES, LABELS], values)
