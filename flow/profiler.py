"""`flow.profiler`: OneFlow's named ranges for its profiler.  flowc's profile is per kernel
(`job.profile()` with FLOWC_PROFILE=1), so the ranges are accepted and mark nothing.

Example:
    flow.profiler.range_push("epoch 1")
    ...
    flow.profiler.range_pop()
"""
from __future__ import annotations

from flow.unsupported import accepted

__all__ = ["range_push", "range_pop"]
_RANGES = "flowc profiles per kernel (FLOWC_PROFILE=1, job.profile()); ranges mark nothing"


@accepted(_RANGES)
def range_push(range_name: str) -> None:
    """Accepted: OneFlow opens a profiler range named `range_name`; flowc records nothing."""
    if not isinstance(range_name, str):
        raise TypeError(f"flow.profiler.range_push: range_name must be a str, got {type(range_name).__name__}")


@accepted(_RANGES)
def range_pop() -> None:
    """Accepted: OneFlow closes the innermost profiler range; flowc records nothing."""
