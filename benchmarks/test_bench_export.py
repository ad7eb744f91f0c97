"""The serving row: LeNet predict per call at batch 1 and batch 100, as the library `flowc export`
writes called from C, as the Python job, and in PyTorch eager (benchmarks/serve.py).

    python -m pytest benchmarks/test_bench_export.py --framework=flowc       # or: make bench
"""
from __future__ import annotations

from typing import Any

import pytest

from benchmarks.peers import C_FRAMEWORK, NotApplicable
from benchmarks.serve import SERVE_BATCHES, c_call_seconds, python_step
from benchmarks.settings import BenchSettings
from benchmarks.timing import time_step
from benchmarks.workloads import batch


@pytest.mark.parametrize("size", SERVE_BATCHES)
def test_serve_python(benchmark: Any, peer: Any, settings: BenchSettings, record: Any, size: int) -> None:
    benchmark.group = f"serve-b{size}"
    images, labels = batch()
    try:
        step = python_step(settings.framework, peer, size, images, labels)
    except NotApplicable as why:
        pytest.skip(str(why))
    time_step(benchmark, step, settings.step_seconds)
    record("lenet_predict", "serve", variant=f"b{size}", steps_per_call=size)


@pytest.mark.parametrize("size", SERVE_BATCHES)
def test_serve_exported_from_c(benchmark: Any, settings: BenchSettings, size: int) -> None:
    """The exported library, timed by its C caller; pytest-benchmark times that whole program once,
    and the report reads the program's own median call (`call_s`)."""
    if settings.framework != "flowc":
        pytest.skip("the exported library is timed in flowc's process")
    benchmark.group = f"serve-b{size}"
    figures: dict[str, float] = {}

    def run() -> None:
        figures.update(c_call_seconds(size, settings.threads, settings.step_seconds))

    try:
        benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    except NotApplicable as why:
        pytest.skip(str(why))
    benchmark.extra_info.update(framework=C_FRAMEWORK, workload="lenet_predict", kind="serve", variant=f"b{size}",
                                round=settings.round, threads=settings.threads, steps_per_call=size,
                                call_s=figures["median_s"], calls=figures["calls"])
