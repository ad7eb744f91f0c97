"""`flow.regularizers`: L1 and L2 penalties on a variable, for `flow.get_variable(regularizer=...)` and
the layers' `kernel_regularizer` / `bias_regularizer`.

As in OneFlow, a regularizer does not change the loss: the train job adds `l1 * sign(w) + l2 * w`
to the variable's gradient (after loss scaling, before gradient clipping and the update).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Regularizer:
    """An L1/L2 penalty: `l1 * sum(|w|) + l2 / 2 * sum(w**2)` in gradient terms."""
    l1: float = 0.0
    l2: float = 0.0


def _rate(value, api: str, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{api}: {arg} must be a number >= 0, got {value!r}")
    return float(value)


def l1_l2(l1: float = 0.01, l2: float = 0.01) -> Regularizer:
    """Both penalties: the gradient gets `l1 * sign(w) + l2 * w`.

    Example:
        w = flow.get_variable("w", shape=(4, 4), regularizer=flow.regularizers.l1_l2(l1=0.01, l2=0.001))
    """
    return Regularizer(_rate(l1, "flow.regularizers.l1_l2", "l1"), _rate(l2, "flow.regularizers.l1_l2", "l2"))


def l1(l: float = 0.01) -> Regularizer:  # noqa: E741 - OneFlow's argument name
    """The L1 penalty: the gradient gets `l * sign(w)`.

    Example:
        flow.layers.dense(x, 10, kernel_regularizer=flow.regularizers.l1(0.001))
    """
    return Regularizer(l1=_rate(l, "flow.regularizers.l1", "l"))


def l2(l: float = 0.01) -> Regularizer:  # noqa: E741 - OneFlow's argument name
    """The L2 penalty: the gradient gets `l * w`.

    Example:
        flow.layers.conv2d(x, 8, 3, kernel_regularizer=flow.regularizers.l2(0.0005))
    """
    return Regularizer(l2=_rate(l, "flow.regularizers.l2", "l"))


__all__ = ["Regularizer", "l1", "l1_l2", "l2"]
