"""`flow.distribute`: parallel-distribution hints and the old names of the logical views.

On one device a hint changes nothing (every device holds the whole blob); flowc checks it and keeps
the program's meaning.  On several MPI ranks, `split(0)` on a variable (`get_variable(distribute=)`,
a dense layer's `model_distribute=`) holds it in slices, one per rank (model parallelism:
compiler/passes/model_parallel.py, docs/distributed.md); a blob's `with_distribute` hint stays a hint.
See compiler/distribute.py.

Example:
    w = flow.get_variable("w", shape=(10, 784), distribute=flow.distribute.split(0))
    x = x.with_distribute(flow.distribute.broadcast())
"""
from __future__ import annotations

import warnings

from flowc.compiler.distribute import Auto, Broadcast, Distribute, PartialSum, Split, check_distribute
from flow import scope as _scope

__all__ = ["Distribute", "split", "broadcast", "auto", "partical_sum", "assert_is_valid_distribute",
           "mirrored_strategy", "consistent_strategy", "consistent_strategy_enabled", "mirrored_strategy_enabled"]


def split(axis: int) -> Split:
    """Split along `axis` across devices.

    Example:
        weight = weight.with_distribute(flow.distribute.split(1))
    """
    return Split(axis)


def broadcast() -> Broadcast:
    """Every device holds the whole blob.

    Example:
        ids = ids.with_distribute(flow.distribute.broadcast())
    """
    return Broadcast()


def partical_sum() -> PartialSum:
    """Each device holds a part of a sum (OneFlow's spelling, kept).

    Example:
        y = y.with_distribute(flow.distribute.partical_sum())
    """
    return PartialSum()


def auto() -> Auto:
    """Let the compiler choose (the default).

    Example:
        x = x.with_distribute(flow.distribute.auto())
    """
    return Auto()


def assert_is_valid_distribute(distribute) -> None:
    """Raise unless `distribute` is one of this module's hints.

    Example:
        flow.distribute.assert_is_valid_distribute(flow.distribute.split(0))
    """
    check_distribute(distribute, None, "flow.distribute.assert_is_valid_distribute")


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"flow.distribute.{old} is deprecated; use flow.scope.{new}", DeprecationWarning, stacklevel=3)


def mirrored_strategy():
    """Deprecated name of `flow.scope.mirrored_view()`."""
    _deprecated("mirrored_strategy", "mirrored_view")
    return _scope.mirrored_view()


def consistent_strategy():
    """Deprecated name of `flow.scope.consistent_view()`."""
    _deprecated("consistent_strategy", "consistent_view")
    return _scope.consistent_view()


def consistent_strategy_enabled() -> bool:
    """Deprecated name of `flow.scope.consistent_view_enabled()`.

    Example:
        flow.distribute.consistent_strategy_enabled()   # True outside a mirrored job
    """
    _deprecated("consistent_strategy_enabled", "consistent_view_enabled")
    return _scope.consistent_view_enabled()


def mirrored_strategy_enabled() -> bool:
    """Deprecated name of `flow.scope.mirrored_view_enabled()`.

    Example:
        flow.distribute.mirrored_strategy_enabled()     # False outside a mirrored job
    """
    _deprecated("mirrored_strategy_enabled", "mirrored_view_enabled")
    return _scope.mirrored_view_enabled()
