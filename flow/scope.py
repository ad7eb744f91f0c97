"""`flow.scope`: device placement of the ops created inside a `with` block."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from flowc.compiler.backends import DeviceName, device_names
from flowc.compiler.trace import _current, user_location


class PlacementScope:
    """What `flow.scope.placement(...)` returns: a `with` block that places the ops created inside, or
    a job's `function_config().default_placement_scope(...)`.  It may be entered again (each trace of
    the job enters it)."""

    def __init__(self, device_tag: str, machine_device_ids) -> None:
        self.device_tag = device_tag
        self.machine_device_ids = machine_device_ids
        self._entered: list[Any] = []       # the trace context each open `with` pushed onto

    def __enter__(self) -> None:
        ctx = _current[-1] if _current else None
        if ctx is not None:
            ctx.device_stack.append(self.device_tag)
            ctx.placements.append((str(self.machine_device_ids), user_location()))
        self._entered.append(ctx)

    def __exit__(self, *exc: object) -> None:
        ctx = self._entered.pop()
        if ctx is not None:
            ctx.device_stack.pop()

    def __repr__(self) -> str:
        return f"flow.scope.placement({self.device_tag!r}, {self.machine_device_ids!r})"


def placement(device_tag: DeviceName, machine_device_ids="0:0") -> PlacementScope:
    """`with flow.scope.placement("cpu", "0:0"):` places the ops created inside on that device.

    The device tags are the registered backends' ("cpu", "gpu"); where a placement's backend cannot
    run (no GPU here), the job runs on the CPU with a warning.  Also the argument of
    `function_config().default_placement_scope`, which places the whole job.

    Example:
        with flow.scope.placement("cpu", "0:0"):
            logits = mlp(images)
    """
    names = device_names()
    if device_tag not in names:
        raise ValueError(f"flow.scope.placement: device_tag must be {' or '.join(map(repr, names))}, "
                         f"got {device_tag!r}")
    return PlacementScope(device_tag, machine_device_ids)


# The views entered by `with flow.scope.mirrored_view():` / `consistent_view()` blocks, innermost last
# (OneFlow keeps the same stack on its session).
_view_stack: list[str] = []


class LogicalView(str):
    """What `flow.scope.consistent_view()` and `flow.scope.mirrored_view()` return, as OneFlow 0.3.4's
    DistributeConsistentStrategy / DistributeMirroredStrategy: the value of
    `function_config().default_logical_view(...)`, and a `with` block inside which
    `flow.scope.mirrored_view_enabled()` / `consistent_view_enabled()` answer for that view.  It is
    also the string "consistent" or "mirrored".  On one device both views compute the same values; on
    several ranks they differ in what a call passes and gets back (docs/distributed.md).
    """

    @property
    def is_mirrored(self) -> bool:
        return self == "mirrored"

    def __enter__(self) -> LogicalView:
        _view_stack.append(str(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _view_stack.pop()

    def __repr__(self) -> str:
        return f"flow.scope.{self}_view()"


def consistent_view() -> LogicalView:
    """`flow.scope.consistent_view()`: the consistent logical view, for
    `function_config().default_logical_view(...)` or a `with` block.

    Example:
        config.default_logical_view(flow.scope.consistent_view())
        with flow.scope.consistent_view():
            assert flow.scope.consistent_view_enabled()
    """
    return LogicalView("consistent")


def mirrored_view() -> LogicalView:
    """`flow.scope.mirrored_view()`: the mirrored logical view, for
    `function_config().default_logical_view(...)` or a `with` block.

    Example:
        config.default_logical_view(flow.scope.mirrored_view())
        with flow.scope.mirrored_view():
            assert flow.scope.mirrored_view_enabled()
    """
    return LogicalView("mirrored")


def namespace(name: str) -> contextlib.AbstractContextManager[None]:
    """`with flow.scope.namespace("backbone"):` prefixes the variables created inside with
    `backbone-`; namespaces nest (`backbone-branch-var`), as in OneFlow, and a layer's variables
    get the prefix too (`backbone-dense1-weight`).  Only names change: two namespaces of one name
    share their variables.

    Example:
        with flow.scope.namespace("encoder"):
            w = flow.get_variable("w", shape=(4, 4))     # the variable "encoder-w"
    """
    from flowc.compiler.errors import TraceError
    from flowc.compiler.trace import current, user_location
    ctx = current("flow.scope.namespace")
    if not isinstance(name, str) or not name:       # checked here, where the user's line is on the stack
        raise TraceError(f"{user_location()}: flow.scope.namespace: name must be a non-empty string, "
                         f"got {name!r}")
    return _pushed(ctx.namespaces, name)


@contextlib.contextmanager
def _pushed(stack: list[str], name: str) -> Iterator[None]:
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def consistent_view_enabled() -> bool:
    """`flow.scope.consistent_view_enabled()`: see flow/more_ops.py.

    Example:
        flow.scope.consistent_view_enabled()     # True outside a mirrored job
    """
    from flow.more_ops import consistent_view_enabled as enabled
    return enabled()


def mirrored_view_enabled() -> bool:
    """`flow.scope.mirrored_view_enabled()`: see flow/more_ops.py.

    Example:
        flow.scope.mirrored_view_enabled()       # False outside a mirrored job
    """
    from flow.more_ops import mirrored_view_enabled as enabled
    return enabled()
