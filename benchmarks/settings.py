"""The settings of one benchmark process (from the pytest options in conftest.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchSettings:
    framework: str
    round: int                # recorded with each result: the report pairs frameworks by round
    threads: int
    step_seconds: float       # time budget of each steps/s benchmark
    latency_repeats: int      # fresh processes per first-call benchmark
