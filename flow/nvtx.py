"""`flow.nvtx`: OneFlow's NVTX range markers, ops that pass their input through.  flowc's profile is
per kernel (`job.profile()` with FLOWC_PROFILE=1), so they mark nothing and return their input.

Example:
    x = flow.nvtx.range_push(x, "encoder")
    y = flow.nvtx.range_pop(encoder(x))
"""
from __future__ import annotations

from flow.unsupported import accepted

from flowc.compiler.trace import Blob
from flow._ops import check_blob

__all__ = ["range_push", "range_pop"]
_RANGES = "flowc profiles per kernel (FLOWC_PROFILE=1, job.profile()); ranges mark nothing"


@accepted(_RANGES)
def range_push(x: Blob, msg: str, name: str | None = None) -> Blob:
    """Accepted: returns `x` (OneFlow opens an NVTX range named `msg`)."""
    return check_blob(x, "flow.nvtx.range_push", "x")


@accepted(_RANGES)
def range_pop(x: Blob, name: str | None = None) -> Blob:
    """Accepted: returns `x` (OneFlow closes the innermost NVTX range)."""
    return check_blob(x, "flow.nvtx.range_pop", "x")
