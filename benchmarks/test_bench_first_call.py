"""First-call latency of the train jobs, each measured in a fresh process (benchmarks/first_call.py):
cold (empty compile cache) and warm (a cache filled by an earlier process).

The warm case is what a deployment sees after `flowc compile MODULE.py` filled the cache ahead of
time; running the job once in an earlier process fills it with the same entries, so that is what
this benchmark does, and it counts the compilations the warm process still makes (flowc: 0).
pytest-benchmark's own timing of these tests is the whole child process (interpreter start,
imports, first call); the report uses the first-call time the child measured itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.settings import BenchSettings
from benchmarks.threads import thread_env
from benchmarks.workloads import LATENCY_WORKLOADS

REPO = Path(__file__).resolve().parents[1]
CASES = [(workload, cache) for workload in LATENCY_WORKLOADS for cache in ("cold", "warm")]   # cold first: it fills
_filled: dict[str, Path] = {}      # workload -> a cache directory a cold run of this process filled


def run_child(settings: BenchSettings, workload: str, env: dict[str, str]) -> dict[str, Any]:
    """Run benchmarks/first_call.py in a fresh interpreter; return the JSON it printed."""
    command = [sys.executable, "-m", "benchmarks.first_call", "--framework", settings.framework,
               "--workload", workload, "--threads", str(settings.threads)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **thread_env(settings.threads), **env},
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("workload,cache", CASES)
def test_first_call(benchmark: Any, peer: Any, settings: BenchSettings, record: Any,
                    tmp_path_factory: pytest.TempPathFactory, workload: str, cache: str) -> None:
    benchmark.group = f"first-call-{workload}"
    if peer.cache_env("") is None and cache == "warm":
        pytest.skip(f"{settings.framework} keeps no compile cache: its warm start is its cold start")
    reports: list[dict[str, Any]] = []

    def new_cache() -> Path:
        return tmp_path_factory.mktemp(f"{settings.framework}-{workload}-cache")

    def env_for(directory: Path) -> dict[str, str]:
        return peer.cache_env(str(directory)) or {}

    if cache == "warm" and workload not in _filled:
        _filled[workload] = new_cache()
        run_child(settings, workload, env_for(_filled[workload]))

    def one_process() -> None:
        directory = new_cache() if cache == "cold" else _filled[workload]
        reports.append(run_child(settings, workload, env_for(directory)))
        if cache == "cold":
            _filled[workload] = directory

    benchmark.pedantic(one_process, rounds=settings.latency_repeats, iterations=1, warmup_rounds=0)
    record(workload, "first_call", variant=cache,
           first_call_s=[r["first_call_s"] for r in reports],
           second_call_s=[r["second_call_s"] for r in reports],
           setup_s=[r["setup_s"] for r in reports],
           compilations=[r["compilations"] for r in reports])
