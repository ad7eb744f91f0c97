"""How long to time a step: a time budget per benchmark instead of a fixed round count, so that a
1 ms MLP step and a 2 s reference LeNet step each cost about the same wall time."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

MIN_ROUNDS = 3
MAX_ROUNDS = 5000
WARMUP_SHARE = 0.2      # of the budget, spent on untimed calls after the first: allocators, caches, JIT tiers settle


def rounds_within(seconds_per_call: float, budget_s: float, min_rounds: int = MIN_ROUNDS,
                  max_rounds: int = MAX_ROUNDS) -> int:
    """How many timed calls fit in `budget_s`, at least `min_rounds`."""
    if seconds_per_call <= 0:
        return max_rounds
    return max(min_rounds, min(max_rounds, int(budget_s / seconds_per_call)))


def warm_up(step: Callable[[], object], seconds: float) -> float:
    """Call `step` once (it may trace and compile), then for about `seconds` more (at least once);
    return the median time of those later calls as the estimate of one call."""
    step()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while not times or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_step(benchmark: Any, step: Callable[[], object], budget_s: float, min_rounds: int = MIN_ROUNDS) -> None:
    """Warm `step` up, then let pytest-benchmark time as many single calls as fit in `budget_s`."""
    estimate = warm_up(step, WARMUP_SHARE * budget_s)
    benchmark.pedantic(step, rounds=rounds_within(estimate, budget_s, min_rounds), iterations=1, warmup_rounds=0)
