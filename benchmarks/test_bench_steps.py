"""Steps per second of the seed MLP and LeNet (batch 100, train and predict) and the sgemm ceiling,
for the framework this process runs (--framework).

    python -m pytest benchmarks/test_bench_steps.py --framework=flowc     # or: make bench
"""
from __future__ import annotations

from typing import Any

import pytest

from benchmarks.settings import BenchSettings
from benchmarks.peers import NotApplicable
from benchmarks.timing import time_step
from benchmarks.workloads import SGEMM_SIZE, STEP_WORKLOADS, batch_for, sgemm_gflop


@pytest.mark.parametrize("workload", list(STEP_WORKLOADS))
def test_step(benchmark: Any, peer: Any, settings: BenchSettings, record: Any, workload: str) -> None:
    benchmark.group = workload
    images, labels = batch_for(workload)
    try:
        step = peer.build(STEP_WORKLOADS[workload], images, labels)
    except NotApplicable as why:
        pytest.skip(str(why))
    time_step(benchmark, step, settings.step_seconds)
    record(workload, "steps", gflop=STEP_WORKLOADS[workload].gflop)


def test_sgemm(benchmark: Any, peer: Any, settings: BenchSettings, record: Any) -> None:
    """The machine's GEMM ceiling as this framework reaches it, in the same run as the steps."""
    benchmark.group = "sgemm"
    try:
        product = peer.build_sgemm(SGEMM_SIZE)
    except NotApplicable as why:
        pytest.skip(str(why))
    time_step(benchmark, product, settings.step_seconds)
    record("sgemm", "sgemm", gflop=sgemm_gflop(SGEMM_SIZE), size=SGEMM_SIZE)
