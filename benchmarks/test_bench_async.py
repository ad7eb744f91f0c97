"""Asynchronous vs synchronous calls when each step's host-side data preparation costs about as
much as its compute: the seed MLP train step, STEPS steps per timed round.

The preparation is I/O-like (reading the next batch: it waits, the way a data loader waits on a
disk or a decoder, and holds no core), so with asynchronous calls (flowc: a job returning
tp.Callback; JAX: async dispatch) it overlaps the previous step's compute.  The wait is the
framework's own synchronous step time, so the ideal speed-up is 2x for every framework.
"""
from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks.peers import NotApplicable
from benchmarks.settings import BenchSettings
from benchmarks.timing import warm_up
from benchmarks.workloads import ASYNC_WORKLOADS, STEP_WORKLOADS, batch_for

STEPS = 50
ROUNDS = 5
ESTIMATE_SECONDS = 0.3
_host_work: dict[str, float] = {}     # workload -> seconds: the same wait for the sync and the async test


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("workload", ASYNC_WORKLOADS)
def test_host_work(benchmark: Any, peer: Any, settings: BenchSettings, record: Any, workload: str, mode: str) -> None:
    benchmark.group = f"async-vs-sync-{workload}"
    images, labels = batch_for(workload)
    try:
        submit, wait = peer.build_async(STEP_WORKLOADS[workload], images, labels)
    except NotApplicable as why:
        pytest.skip(str(why))
    sync_step = peer.build(STEP_WORKLOADS[workload], images, labels)
    if workload not in _host_work:
        _host_work[workload] = warm_up(sync_step, ESTIMATE_SECONDS)     # median time of a synchronous step
    host_work = _host_work[workload]

    def sync_round() -> None:
        for _ in range(STEPS):
            time.sleep(host_work)              # the I/O part of preparing the next batch
            sync_step()

    def async_round() -> None:
        for _ in range(STEPS):
            time.sleep(host_work)
            submit()
        wait()

    submit()
    wait()                                    # compile the asynchronous variant outside the timing
    benchmark.pedantic(sync_round if mode == "sync" else async_round, rounds=ROUNDS, warmup_rounds=1)
    record(workload, "io", variant=mode, steps_per_call=STEPS, host_work_s=host_work)
