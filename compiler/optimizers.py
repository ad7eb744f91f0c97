"""Optimizers and learning-rate schedules, OneFlow's `flow.optimizer.*`.

An optimizer contributes two things to a train job:
* at trace time, update nodes: for each trainable variable, its next value (and the
  next value of its state variables `<var>-momentum`, `<var>-m`, `<var>-v`) as
  pointwise IR, so fusion can fold the update into the kernel that makes the gradient;
* at every step, runtime scalars (the learning rate, with Adam's bias correction
  folded in), computed in Python from the train step counter.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

from flowc.compiler.errors import TraceError


class PiecewiseConstantScheduler:
    """`values[i]` for steps in `[boundaries[i-1], boundaries[i])`.

    Example:
        flow.optimizer.PiecewiseConstantScheduler([1000], [0.1, 0.01])
    """

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], warmup=None) -> None:
        if len(values) != len(boundaries) + 1:
            raise ValueError(f"PiecewiseConstantScheduler: needs len(values) == len(boundaries) + 1, "
                             f"got {len(values)} values for {len(boundaries)} boundaries")
        if list(boundaries) != sorted(boundaries):
            raise ValueError(f"PiecewiseConstantScheduler: boundaries must be increasing, got {list(boundaries)}")
        if warmup is not None:
            raise NotImplementedError("PiecewiseConstantScheduler: warmup is not supported yet")
        self.boundaries = [int(b) for b in boundaries]
        self.values = [float(v) for v in values]

    def learning_rate(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, step)]


def check_loss(loss, api: str, loc: str) -> None:
    """Raise a TraceError starting with the user's line `loc` unless `loss` is a floating-point Blob.

    Checked where the user names the loss (`minimize`, `flow.losses.add_loss`), so the message
    points at that line rather than at the job's definition once the backward pass is built.
    """
    from flowc.compiler.ir import FLOAT_DTYPES
    from flowc.compiler.trace import Blob
    if not isinstance(loss, Blob):
        raise TraceError(f"{loc}: {api}: the loss must be a Blob of the job (a flow op's result), "
                         f"got {type(loss).__name__}")
    if loss.type.dtype not in FLOAT_DTYPES:
        raise TraceError(f"{loc}: {api}: the loss must be floating point to have a gradient, got "
                         f"{loss.type}; compute it in floating point, or cast it with "
                         f"flow.cast(loss, flow.float32)")


def _as_scheduler(lr) -> PiecewiseConstantScheduler:
    if isinstance(lr, (int, float)):
        return PiecewiseConstantScheduler([], [float(lr)])
    if not hasattr(lr, "learning_rate"):
        raise TypeError(f"lr_scheduler: expected a scheduler such as flow.optimizer.PiecewiseConstantScheduler "
                        f"or a number, got {type(lr).__name__}")
    return lr


class Optimizer:
    """Base: `minimize(loss)` marks the loss of the train job being traced."""

    def __init__(self, lr_scheduler) -> None:
        self.lr_scheduler = _as_scheduler(lr_scheduler)

    def minimize(self, loss) -> None:
        from flowc.compiler.trace import current, user_location
        ctx = current("optimizer.minimize")
        check_loss(loss, "optimizer.minimize", user_location())
        if ctx.job_type != "train":
            raise TraceError(f"{user_location()}: optimizer.minimize() is only allowed in a job declared "
                             f"with @flow.global_function(type=\"train\"); {ctx.job_name!r} is {ctx.job_type!r}")
        ctx.optimizers.append((self, loss))

    # -- what subclasses define ------------------------------------------------------
    state_names: tuple[str, ...] = ()

    def update(self, e, var: int, grad: int, state: dict[str, int], lr: int) -> tuple[int, dict[str, int]]:
        """Return (next value of var, {state name: next state value}) as IR node ids."""
        raise NotImplementedError

    def scalars(self, step: int) -> dict[str, float]:
        """Runtime scalars for train step `step` (0-based)."""
        return {"learning_rate": self.lr_scheduler.learning_rate(step)}

    def describe(self) -> str:
        return type(self).__name__


class SGD(Optimizer):
    """Stochastic gradient descent; with momentum > 0, OneFlow's momentum rule:
    `m = momentum * m - lr * g; w = w + m`.

    Example:
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    """

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum: float = 0.9,
                 grad_clipping=None, train_step_lbn=None) -> None:
        super().__init__(lr_scheduler)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD: momentum must be in [0, 1), got {momentum}")
        if grad_clipping is not None or loss_scale_factor is not None:
            raise NotImplementedError("SGD: grad_clipping and loss_scale_factor are not supported yet")
        self.momentum = float(momentum)
        self.state_names = ("momentum",) if self.momentum > 0 else ()

    def update(self, e, var, grad, state, lr):
        step = e.op("multiply", lr, grad)
        if not self.momentum:
            return e.op("subtract", var, step), {}
        m = e.op("subtract", e.op("multiply", e.const(self.momentum, var), state["momentum"]), step)
        return e.op("add", var, m), {"momentum": m}


class Adam(Optimizer):
    """Adam, OneFlow's rule; with `do_bias_correction` the learning rate is scaled by
    `sqrt(1 - beta2^t) / (1 - beta1^t)` (computed per step on the host).

    Example:
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
    """
    state_names = ("m", "v")

    def __init__(self, lr_scheduler, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 do_bias_correction: bool = False, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None) -> None:
        super().__init__(lr_scheduler)
        for arg, value in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"Adam: {arg} must be in [0, 1), got {value}")
        if epsilon <= 0:
            raise ValueError(f"Adam: epsilon must be positive, got {epsilon}")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def update(self, e, var, grad, state, lr):
        b1, b2 = self.beta1, self.beta2
        m = e.op("add", e.op("multiply", e.const(b1, var), state["m"]),
                 e.op("multiply", e.const(1 - b1, var), grad))
        v = e.op("add", e.op("multiply", e.const(b2, var), state["v"]),
                 e.op("multiply", e.const(1 - b2, var), e.op("multiply", grad, grad)))
        denom = e.op("add", e.op("sqrt", v), e.const(self.epsilon, var))
        return e.op("subtract", var, e.op("divide", e.op("multiply", lr, m), denom)), {"m": m, "v": v}

    def scalars(self, step: int) -> dict[str, float]:
        lr = self.lr_scheduler.learning_rate(step)
        if self.do_bias_correction:
            t = step + 1
            lr *= math.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t)
        return {"learning_rate": lr}


def from_model_update_conf(conf: dict, lr: float) -> Optimizer:
    """The old style: `config.train.model_update_conf({...})` with `config.train.primary_lr(lr)`."""
    if not isinstance(conf, dict) or len(conf) != 1:
        raise ValueError(f"model_update_conf: expected one of {{'naive_conf': {{}}}}, {{'momentum_conf': "
                         f"{{'beta': ...}}}}, {{'adam_conf': {{...}}}}; got {conf!r}")
    (kind, params), = conf.items()
    params = params or {}
    if kind == "naive_conf":
        return SGD(lr, momentum=0.0)
    if kind == "momentum_conf":
        return SGD(lr, momentum=params.get("beta", 0.9))
    if kind == "adam_conf":
        return Adam(lr, beta1=params.get("beta1", 0.9), beta2=params.get("beta2", 0.999),
                    epsilon=params.get("epsilon", 1e-8),
                    do_bias_correction=params.get("do_bias_correction", False))
    raise ValueError(f"model_update_conf: unknown update rule {kind!r}; "
                     "use naive_conf, momentum_conf or adam_conf")
