"""Options and fixtures of the benchmark suites: one framework per pytest process.

    python -m pytest benchmarks --framework=torch_eager --benchmark-json=out.json

`make bench` (benchmarks/run_bench.py) runs one such process per framework and round.  Nothing
here imports NumPy or a framework at module level: the thread settings must be in place first.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

from benchmarks.peers import FRAMEWORKS, load, unavailable
from benchmarks.settings import BenchSettings
from benchmarks.threads import DEFAULT_THREADS, pin


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flowc benchmarks")
    group.addoption("--framework", default=os.environ.get("BENCH_FRAMEWORK", "flowc"), choices=list(FRAMEWORKS),
                    help="the framework this process benchmarks (default flowc, or $BENCH_FRAMEWORK)")
    group.addoption("--bench-round", type=int, default=0, help="round number recorded with each result")
    group.addoption("--threads", type=int, default=DEFAULT_THREADS, help="threads (and CPUs) for every framework")
    group.addoption("--step-seconds", type=float, default=1.0, help="time budget of each steps/s benchmark")
    group.addoption("--latency-repeats", type=int, default=1, help="fresh processes per first-call benchmark")


def pytest_configure(config: pytest.Config) -> None:
    pin(config.getoption("--threads"))


@pytest.fixture(scope="session")
def settings(request: pytest.FixtureRequest) -> BenchSettings:
    option = request.config.getoption
    return BenchSettings(option("--framework"), option("--bench-round"), option("--threads"),
                         option("--step-seconds"), option("--latency-repeats"))


@pytest.fixture(scope="session")
def peer(settings: BenchSettings) -> Any:
    """The framework's module (benchmarks/peers/); skips every test if it is not installed."""
    why = unavailable(settings.framework)
    if why:
        pytest.skip(why)
    module = load(settings.framework)
    module.configure(settings.threads)
    return module


@pytest.fixture(autouse=True)
def fresh_state(peer: Any):
    """Each benchmark starts from a clean framework state (flowc: a fresh session; kernels stay cached)."""
    peer.reset()
    yield
    peer.reset()


@pytest.fixture
def record(benchmark: Any, settings: BenchSettings):
    """Tag the benchmark's JSON entry with what the report needs (benchmarks.summary reads it)."""
    def tag(workload: str, kind: str, **extra: Any) -> None:
        benchmark.extra_info.update(framework=settings.framework, workload=workload, kind=kind,
                                    round=settings.round, threads=settings.threads, **extra)
    return tag
