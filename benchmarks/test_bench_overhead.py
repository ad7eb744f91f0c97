"""Per-call overhead of a short step: the mean time of a call minus the mean time inside its kernels.

The step is built with per-kernel timers (flowc: FLOWC_PROFILE=1); over the timed calls, the time
the kernels reported is subtracted from the wall time of the calls as the caller sees it.  The
kernels' total is read once before the calls and once after them, so that no job.profile() table
is built between the calls measured.  What
remains is everything a call costs besides computing: argument checks, binding the inputs, the
foreign call, the checks between kernels, copying the outputs out, returning to Python.  The
kernels' own OpenMP wake-ups count as kernel time.  Only frameworks with such timers take part
(flowc); the others skip.

    python -m pytest benchmarks/test_bench_overhead.py --framework=flowc     # or: make bench
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks.peers import NotApplicable
from benchmarks.settings import BenchSettings
from benchmarks.timing import time_step
from benchmarks.workloads import OVERHEAD_WORKLOADS, STEP_WORKLOADS, batch_for


@pytest.mark.parametrize("workload", OVERHEAD_WORKLOADS)
def test_call_overhead(benchmark: Any, peer: Any, settings: BenchSettings, record: Any, workload: str) -> None:
    benchmark.group = f"overhead-{workload}"
    images, labels = batch_for(workload)
    try:
        step, kernel_seconds = peer.build_profiled(STEP_WORKLOADS[workload], images, labels)
    except NotApplicable as why:
        pytest.skip(str(why))
    totals = {"calls": 0, "wall": 0.0}

    def timed() -> None:
        start = time.perf_counter()
        step()
        totals["wall"] += time.perf_counter() - start
        totals["calls"] += 1

    kernels_before = kernel_seconds()
    time_step(benchmark, timed, settings.step_seconds)
    totals["kernels"] = kernel_seconds() - kernels_before     # every call in between went through timed
    calls = max(totals["calls"], 1)
    record(workload, "overhead", overhead_s=(totals["wall"] - totals["kernels"]) / calls,
           kernel_s=totals["kernels"] / calls, calls=totals["calls"])
