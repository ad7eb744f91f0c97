"""`flow.scope`: device placement of the ops created inside a `with` block."""
from __future__ import annotations

import contextlib
from typing import Iterator

from flowc.compiler.backends import DeviceName, device_names
from flowc.compiler.trace import _current


@contextlib.contextmanager
def placement(device_tag: DeviceName, machine_device_ids="0:0") -> Iterator[None]:
    """`with flow.scope.placement("cpu", "0:0"):` places the ops created inside on that device.

    The device tags are the registered backends' ("cpu", "gpu"); where a placement's backend cannot
    run (no GPU here), the job runs on the CPU with a warning.

    Example:
        with flow.scope.placement("cpu", "0:0"):
            logits = mlp(images)
    """
    names = device_names()
    if device_tag not in names:
        raise ValueError(f"flow.scope.placement: device_tag must be {' or '.join(map(repr, names))}, "
                         f"got {device_tag!r}")
    ctx = _current[-1] if _current else None
    if ctx is not None:
        ctx.device_stack.append(device_tag)
    try:
        yield
    finally:
        if ctx is not None:
            ctx.device_stack.pop()


def consistent_view():
    """Accepted for compatibility: one device has a single logical view."""
    return "consistent"


def mirrored_view():
    """Accepted for compatibility: one device has a single logical view."""
    return "mirrored"
