"""`flow.sbp`: OneFlow's newer names of the `flow.distribute` hints (split, broadcast, auto).

On one device a hint changes nothing; see flow/distribute.py.

Example:
    w = flow.get_variable("w", shape=(10, 784), distribute=flow.sbp.split(0))
"""
from __future__ import annotations

from flowc.compiler.distribute import Auto, Broadcast, Split
from flow import distribute as _distribute


def split(axis: int) -> Split:
    """`flow.sbp.split(axis)`, the same as `flow.distribute.split`.

    Example:
        x = x.with_distribute(flow.sbp.split(0))
    """
    return _distribute.split(axis)


def broadcast() -> Broadcast:
    """`flow.sbp.broadcast()`, the same as `flow.distribute.broadcast`.

    Example:
        x = x.with_distribute(flow.sbp.broadcast())
    """
    return _distribute.broadcast()


def auto() -> Auto:
    """`flow.sbp.auto()`, the same as `flow.distribute.auto`.

    Example:
        x = x.with_distribute(flow.sbp.auto())
    """
    return _distribute.auto()


def assert_is_valid_sbp(sbp_descripiton) -> None:
    """`flow.sbp.assert_is_valid_sbp(sbp)` (OneFlow's spelling of the argument kept): raise unless it is
    one of these hints.

    Example:
        flow.sbp.assert_is_valid_sbp(flow.sbp.split(0))
    """
    _distribute.assert_is_valid_distribute(sbp_descripiton)


__all__ = ["split", "broadcast", "auto", "assert_is_valid_sbp"]
