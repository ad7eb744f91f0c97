"""Parallel-distribution hints (`flow.distribute.split / broadcast / auto / partical_sum`).

They tell OneFlow how a blob or a variable is laid out across devices.  flowc runs a job on one
device, where every layout is the whole blob, so a hint is validated and then has no effect; the
data-parallel runtime (issue 17) gives them their meaning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowc.compiler.errors import TraceError


class Distribute:
    """Base of the hints, as OneFlow's `distribute.Distribute`."""


@dataclass(frozen=True)
class Split(Distribute):
    axis: int

    def __post_init__(self) -> None:
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise TypeError(f"flow.distribute.split: axis must be an int, got {self.axis!r}")


@dataclass(frozen=True)
class Broadcast(Distribute):
    pass


@dataclass(frozen=True)
class PartialSum(Distribute):
    pass


@dataclass(frozen=True)
class Auto(Distribute):
    pass


def check_distribute(distribute: Any, blob: Any, api: str) -> None:
    """A hint must be one of the flow.distribute objects, and a split's axis one of the blob's."""
    from flowc.compiler.trace import user_location
    if not isinstance(distribute, Distribute):
        raise TraceError(f"{user_location()}: {api}: expected flow.distribute.split(axis), broadcast(), "
                         f"partical_sum() or auto(), got {distribute!r}")
    if isinstance(distribute, Split) and blob is not None:
        rank = len(blob.shape)
        if not -rank <= distribute.axis < max(rank, 1):
            raise TraceError(f"{user_location()}: {api}: split axis {distribute.axis} is not an axis of a "
                             f"blob of shape {list(blob.shape)}")
