"""Optimizers, learning-rate schedules and training extras, OneFlow's `flow.optimizer.*`.

An optimizer contributes two things to a train job:
* at trace time, update nodes: for each trainable variable, its next value (and the next value
  of its state variables, named as OneFlow names them: `<var>-momentum`, `<var>-m`, `<var>-v`,
  `<var>-mean_square`, `<var>-beta1_t`, ...) as IR, so fusion can fold the update into the kernel
  that makes the gradient;
* at every step, runtime scalars (the learning rate, with Adam's bias correction folded in),
  computed in Python from the train step counter.

The update rules are one table, `UPDATE_RULES`: one row per rule, each written in other ops
through a `GradEmitter`.  What happens to a gradient before its rule sees it (loss scaling,
regularizers, clipping, the skip of a dynamic loss scale) is `compiler/build.py`'s, in
OneFlow's order.

The formulas are OneFlow 0.3.4's kernels (oneflow/user/kernels/model_update_kernel_util.h), not
its docstrings where the two differ; each row says where OneFlow's behaviour is odd.
"""
from __future__ import annotations

import bisect
import collections.abc
import math
import re
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flowc.compiler.errors import TraceError

# ---------------------------------------------------------------------------------------------
# Warmup and learning-rate schedules
# ---------------------------------------------------------------------------------------------


class WarmupConf:
    """Base of `flow.optimizer.warmup.*`: the learning rate of the first `steps` train steps."""
    steps: int

    def multiplier(self, step: int) -> float:
        raise NotImplementedError


class ConstantWarmup(WarmupConf):
    """`flow.optimizer.warmup.constant(steps, multiplier)`: `base_lr * multiplier` while
    `step < steps`, then the scheduler's own rate.

    Example:
        flow.optimizer.PiecewiseConstantScheduler([], [0.01], warmup=flow.optimizer.warmup.constant(10, 0.1))
    """

    def __init__(self, steps: int, multiplier: float) -> None:
        if int(steps) < 0:
            raise ValueError(f"warmup.constant: steps must be >= 0, got {steps}")
        if not 0.0 < multiplier < 1.0:
            raise ValueError(f"warmup.constant: multiplier must be in (0, 1), got {multiplier}")
        self.steps, self._multiplier = int(steps), float(multiplier)

    def multiplier(self, step: int) -> float:
        return self._multiplier


class LinearWarmup(WarmupConf):
    """`flow.optimizer.warmup.linear(steps, start_multiplier)`: while `step < steps` the rate is
    `base_lr * (start_multiplier + (1 - start_multiplier) * step / steps)`.

    Example:
        flow.optimizer.PiecewiseConstantScheduler([], [0.01], warmup=flow.optimizer.warmup.linear(10, 0.1))
    """

    def __init__(self, steps: int, start_multiplier: float) -> None:
        if int(steps) < 0:
            raise ValueError(f"warmup.linear: steps must be >= 0, got {steps}")
        if not 0.0 <= start_multiplier < 1.0:
            raise ValueError(f"warmup.linear: start_multiplier must be in [0, 1), got {start_multiplier}")
        self.steps, self.start_multiplier = int(steps), float(start_multiplier)

    def multiplier(self, step: int) -> float:
        return self.start_multiplier + (1.0 - self.start_multiplier) * (step / self.steps)


warmup = types.SimpleNamespace(constant=ConstantWarmup, linear=LinearWarmup)


class LrScheduler:
    """Base of the schedulers: `learning_rate(step)` for 0-based train step `step`.

    As in OneFlow, a warmup replaces the schedule while `step < warmup.steps` (it scales
    `base_lr`), and the schedule counts steps from 0, warmup steps included.
    """

    def __init__(self, base_lr: float, warmup: WarmupConf | None = None) -> None:
        if warmup is not None and not isinstance(warmup, WarmupConf):
            raise TypeError(f"{type(self).__name__}: warmup must be flow.optimizer.warmup.constant(...) or "
                            f"flow.optimizer.warmup.linear(...), got {type(warmup).__name__}")
        self.base_lr = float(base_lr)
        self.warmup = warmup

    def learning_rate(self, step: int) -> float:
        if self.warmup is not None and step < self.warmup.steps:
            return self.base_lr * self.warmup.multiplier(step)
        return self.decayed(step)

    def decayed(self, step: int) -> float:
        return self.base_lr


def _positive_steps(cls: str, steps) -> int:
    if int(steps) <= 0:
        raise ValueError(f"{cls}: steps must be positive, got {steps}")
    return int(steps)


def _increasing(cls: str, boundaries: Sequence[int]) -> list[int]:
    bounds = [int(b) for b in boundaries]
    if bounds != sorted(bounds):
        raise ValueError(f"{cls}: boundaries must be increasing, got {bounds}")
    return bounds


class PiecewiseConstantScheduler(LrScheduler):
    """`values[i]` for the steps in `(boundaries[i-1], boundaries[i]]`: OneFlow's kernel keeps
    `values[i]` through the step equal to `boundaries[i]` (its docstring says `<`; programs got `<=`).

    Example:
        flow.optimizer.PiecewiseConstantScheduler([1000], [0.1, 0.01])
    """

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], warmup: WarmupConf | None = None) -> None:
        if len(values) != len(boundaries) + 1:
            raise ValueError(f"PiecewiseConstantScheduler: needs len(values) == len(boundaries) + 1, "
                             f"got {len(values)} values for {len(boundaries)} boundaries")
        self.boundaries = _increasing("PiecewiseConstantScheduler", boundaries)
        self.values = [float(v) for v in values]
        super().__init__(self.values[0], warmup)

    def decayed(self, step: int) -> float:
        return self.values[bisect.bisect_left(self.boundaries, step)]


class PiecewiseScalingScheduler(LrScheduler):
    """`base_lr * scale[i-1]` after `boundaries[i-1]` (`base_lr` up to and including `boundaries[0]`);
    a single `scale` applies to every boundary.

    Example:
        flow.optimizer.PiecewiseScalingScheduler(base_lr=0.1, boundaries=[5, 10], scale=[0.5, 0.1])
    """

    def __init__(self, base_lr: float, boundaries: Sequence[int], scale, warmup: WarmupConf | None = None) -> None:
        super().__init__(base_lr, warmup)
        self.boundaries = _increasing("PiecewiseScalingScheduler", boundaries)
        if not isinstance(scale, collections.abc.Sequence):
            scale = [scale] * len(self.boundaries)
        if len(scale) != len(self.boundaries):
            raise ValueError(f"PiecewiseScalingScheduler: needs one scale per boundary, got {len(scale)} "
                             f"scales for {len(self.boundaries)} boundaries")
        self.scale = [1.0] + [float(s) for s in scale]

    def decayed(self, step: int) -> float:
        return self.base_lr * self.scale[bisect.bisect_left(self.boundaries, step)]


class PolynomialScheduler(LrScheduler):
    """`(base_lr - end_learning_rate) * (1 - step / decay) ** power + end_learning_rate` with
    `decay = steps` and `step` capped at `steps`; with `cycle`, `decay = steps * ceil(step / steps)`
    (step 0 counts as 1), so the decay restarts every `steps` steps.

    Example:
        flow.optimizer.PolynomialScheduler(base_lr=0.001, steps=5, end_learning_rate=0.00001, power=2)
    """

    def __init__(self, base_lr: float, steps: int, end_learning_rate: float = 0.0001, power: float = 1.0,
                 cycle: bool = False, warmup: WarmupConf | None = None) -> None:
        super().__init__(base_lr, warmup)
        self.steps = _positive_steps("PolynomialScheduler", steps)
        self.end_learning_rate, self.power, self.cycle = float(end_learning_rate), float(power), bool(cycle)

    def decayed(self, step: int) -> float:
        current, decay = float(step), float(self.steps)
        if self.cycle:
            current = current or 1.0
            decay *= math.ceil(current / decay)
        else:
            current = min(current, decay)
        return (self.base_lr - self.end_learning_rate) * (1.0 - current / decay) ** self.power + self.end_learning_rate


PolynomialSchduler = PolynomialScheduler    # OneFlow's misspelt, deprecated name


class CosineScheduler(LrScheduler):
    """`base_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, steps) / steps)) + alpha)`.

    Example:
        flow.optimizer.CosineScheduler(base_lr=0.01, steps=10, alpha=0.1)
    """

    def __init__(self, base_lr: float, steps: int, alpha: float = 0.0, warmup: WarmupConf | None = None) -> None:
        super().__init__(base_lr, warmup)
        self.steps, self.alpha = _positive_steps("CosineScheduler", steps), float(alpha)

    def decayed(self, step: int) -> float:
        current = min(float(step), self.steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * current / self.steps))
        return self.base_lr * ((1.0 - self.alpha) * cosine + self.alpha)


class LinearCosineScheduler(LrScheduler):
    """`base_lr * ((alpha + (steps - s) / steps) * 0.5 * (1 + cos(2 pi num_periods s / steps)) + beta)`
    with `s = min(step, steps)`.

    Example:
        flow.optimizer.LinearCosineScheduler(base_lr=0.1, steps=10)
    """

    def __init__(self, base_lr: float, steps: int, num_periods: float = 0.5, alpha: float = 0.0,
                 beta: float = 0.001, warmup: WarmupConf | None = None) -> None:
        super().__init__(base_lr, warmup)
        self.steps = _positive_steps("LinearCosineScheduler", steps)
        self.num_periods, self.alpha, self.beta = float(num_periods), float(alpha), float(beta)

    def decayed(self, step: int) -> float:
        current = min(float(step), self.steps)
        linear = (self.steps - current) / self.steps
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * self.num_periods * current / self.steps))
        return self.base_lr * ((self.alpha + linear) * cosine + self.beta)


class _RatioScheduler(LrScheduler):
    """Schedules of `p = step / steps` (floored with `staircase`)."""

    def __init__(self, base_lr: float, steps: int, decay_rate: float, staircase: bool = False,
                 warmup: WarmupConf | None = None) -> None:
        super().__init__(base_lr, warmup)
        self.steps = _positive_steps(type(self).__name__, steps)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)

    def ratio(self, step: int) -> float:
        p = step / self.steps
        return math.floor(p) if self.staircase else p


class ExponentialScheduler(_RatioScheduler):
    """`base_lr * decay_rate ** p`, `p = step / steps` (floored with `staircase`).

    Example:
        flow.optimizer.ExponentialScheduler(base_lr=0.1, steps=10, decay_rate=0.9, staircase=True)
    """

    def decayed(self, step: int) -> float:
        return self.base_lr * self.decay_rate ** self.ratio(step)


class InverseTimeScheduler(_RatioScheduler):
    """`base_lr / (1 + decay_rate * p)`, `p = step / steps` (floored with `staircase`: OneFlow floors
    the ratio, not `decay_rate * ratio` as its docstring says).

    Example:
        flow.optimizer.InverseTimeScheduler(base_lr=0.1, steps=5, decay_rate=0.9)
    """

    def decayed(self, step: int) -> float:
        return self.base_lr / (1.0 + self.decay_rate * self.ratio(step))


class NaturalExpScheduler(_RatioScheduler):
    """`base_lr * exp(-decay_rate * p)`, `p = step / steps` (floored with `staircase`).

    Example:
        flow.optimizer.NaturalExpScheduler(base_lr=0.1, steps=10, decay_rate=0.5)
    """

    def decayed(self, step: int) -> float:
        return self.base_lr * math.exp(-self.decay_rate * self.ratio(step))


def _names(variables, where: str) -> list[str]:
    """Variable names from a list of names (or of variable Blobs, whose op name is the variable's)."""
    if isinstance(variables, str) or not hasattr(variables, "__iter__"):
        raise TypeError(f"{where}: variables must be a list of variable names (or a callable returning one), "
                        f"got {variables!r}")
    return [v if isinstance(v, str) else str(getattr(v, "op_name", v)) for v in variables]


def _as_scheduler(lr) -> LrScheduler:
    if isinstance(lr, (int, float)):
        return PiecewiseConstantScheduler([], [float(lr)])
    if not hasattr(lr, "learning_rate"):
        raise TypeError(f"lr_scheduler: expected a scheduler such as flow.optimizer.PiecewiseConstantScheduler "
                        f"or a number, got {type(lr).__name__}")
    return lr


# ---------------------------------------------------------------------------------------------
# Gradient clipping and loss scaling
# ---------------------------------------------------------------------------------------------


class ClipByGlobalNorm:
    """`flow.optimizer.grad_clipping.by_global_norm(clip_norm)`: every gradient of the job times
    `clip_norm / max(global_norm, clip_norm)`, `global_norm` the L2 norm of all of them together
    (after loss scaling and regularizers).  This is the documented rule; OneFlow 0.3.4's pass
    multiplies by `1 / max(global_norm, clip_norm)`, which agrees only for clip_norm = 1 (the
    documentation's example) and was corrected later.

    Example:
        flow.optimizer.Adam(lr, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)).minimize(loss)
    """

    def __init__(self, clip_norm: float) -> None:
        if not clip_norm > 0:
            raise ValueError(f"grad_clipping.by_global_norm: clip_norm must be positive, got {clip_norm}")
        self.clip_norm = float(clip_norm)


grad_clipping = types.SimpleNamespace(by_global_norm=ClipByGlobalNorm)


class StaticLossScalePolicy:
    """`flow.optimizer.loss_scale.static_loss_scale(factor)`: the backward pass starts from
    `factor` instead of 1 and the gradients are multiplied by `1 / factor` before the update.

    Example:
        flow.optimizer.SGD(lr, loss_scale_policy=flow.optimizer.loss_scale.static_loss_scale(1024.0))
    """

    def __init__(self, loss_scale_factor: float) -> None:
        if not loss_scale_factor > 0:
            raise ValueError(f"static_loss_scale: loss_scale_factor must be positive, got {loss_scale_factor}")
        self.loss_scale_factor = float(loss_scale_factor)


class DynamicLossScalePolicy:
    """`flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=2**30, increment_period=2000,
    multiplier=2.0)`: the loss scale is a variable `System-Train-DynamicLossScale-<job>-LossScale`
    (float32, shape (1,)) with its counter `...-GoodStepCounter` (int64).  A step whose gradients
    hold a NaN or an infinity changes no variable and divides the scale by `multiplier` (not below
    1); after `increment_period` good steps in a row the scale is multiplied by `multiplier`.

    Example:
        flow.optimizer.Adam(lr, loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale()).minimize(loss)
    """

    def __init__(self, initial_loss_scale: float = 2.0 ** 30, increment_period: int = 2000,
                 multiplier: float = 2.0) -> None:
        if not initial_loss_scale > 0:
            raise ValueError(f"dynamic_loss_scale: initial_loss_scale must be positive, got {initial_loss_scale}")
        if int(increment_period) < 1:
            raise ValueError(f"dynamic_loss_scale: increment_period must be >= 1, got {increment_period}")
        if not multiplier > 1:
            raise ValueError(f"dynamic_loss_scale: multiplier must be > 1, got {multiplier}")
        self.initial_loss_scale = float(initial_loss_scale)
        self.increment_period = int(increment_period)
        self.multiplier = float(multiplier)


loss_scale = types.SimpleNamespace(static_loss_scale=StaticLossScalePolicy, dynamic_loss_scale=DynamicLossScalePolicy)


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


def combine_losses(losses: Sequence, api: str, loc: str):
    """One loss Blob for several (OneFlow adds their gradients): their sum, so its gradient is the
    sum of theirs.  As in OneFlow they must agree in shape and dtype (the gradient is divided by
    one loss's element count)."""
    from flowc.compiler.trace import emit
    first = losses[0]
    for other in losses[1:]:
        if other.type != first.type:
            raise TraceError(f"{loc}: {api}: every loss must have the same shape and dtype, got "
                             f"{first.type} and {other.type}")
    total = first
    for other in losses[1:]:
        total = emit("add", [total, other], api=api)
    return total


# ---------------------------------------------------------------------------------------------
# The update rules: one row per rule
# ---------------------------------------------------------------------------------------------


@dataclass
class Update:
    """What an update rule sees for one variable: node ids, and the optimizer's hyperparameters.

    `w` is the variable, `g` its gradient after loss scaling, regularizers and clipping, `lr` the
    learning-rate scalar (Adam's bias correction folded in on the host), `state` the state
    variables by suffix, `weight_decay` the decay that applies to this variable.
    """
    e: Any                   # compiler.autodiff.GradEmitter
    w: int
    g: int
    lr: int
    state: dict[str, int]
    opt: Any                 # the Optimizer subclass: its hyperparameters (beta1, epsilon, ...)
    weight_decay: float

    def const(self, value: float) -> int:
        return self.e.const(value, self.w)

    def op(self, name: str, *inputs: int, **attrs) -> int:
        return self.e.op(name, *inputs, **attrs)

    def scaled(self, value: float, x: int) -> int:
        return self.op("multiply", self.const(value), x)

    def norm(self, x: int, mean: bool = False) -> int:
        """sqrt(sum(x**2)) (or of the mean of x**2), a scalar node."""
        shape = self.e.type(x).shape
        total = self.op("reduce_sum", self.op("multiply", x, x), axes=tuple(range(len(shape))), keepdims=False)
        if mean:
            total = self.op("divide", total, self.const(float(max(math.prod(shape), 1))))
        return self.op("sqrt", total)


@dataclass(frozen=True)
class StateSpec:
    """A state variable `<var>-<suffix>`: the variable's shape, or (1,) when `scalar`; `initial` is
    a hyperparameter's name (its value initializes the state) or a number."""
    suffix: str
    scalar: bool = False
    initial: str | float = 0.0


@dataclass(frozen=True)
class UpdateRule:
    state: Callable[[Any], tuple[StateSpec, ...]]     # optimizer -> its state variables
    emit: Callable[[Update], tuple[int, dict[str, int]]]


def _sgd(u: Update):
    # model - lr * (g + wd * model)
    step = u.op("add", u.g, u.scaled(u.weight_decay, u.w)) if u.weight_decay else u.g
    return u.op("subtract", u.w, u.op("multiply", u.lr, step)), {}


def _momentum(u: Update):
    # m = beta * m - lr * g;  model = model + m - lr * wd * model
    step = u.op("multiply", u.lr, u.g)
    m = u.op("subtract", u.scaled(u.opt.momentum, u.state["momentum"]), step)
    w = u.op("add", u.w, m)
    if u.weight_decay:
        w = u.op("subtract", w, u.op("multiply", u.lr, u.scaled(u.weight_decay, u.w)))
    return w, {"momentum": m}


def _moments(u: Update) -> tuple[int, int]:
    b1, b2 = u.opt.beta1, u.opt.beta2
    m = u.op("add", u.scaled(b1, u.state["m"]), u.scaled(1 - b1, u.g))
    decayed_v = u.scaled(b2, u.state["v"])
    one_minus_b2 = u.const(1 - b2)      # before g*g: the node order (and code) flowc's Adam always had
    v = u.op("add", decayed_v, u.op("multiply", one_minus_b2, u.op("multiply", u.g, u.g)))
    return m, v


def _adam(u: Update):
    # model - lr * (m / (sqrt(v) + eps) + wd * model); lr bias-corrected on the host
    m, v = _moments(u)
    denom = u.op("add", u.op("sqrt", v), u.const(u.opt.epsilon))
    if not u.weight_decay:     # (lr * m) / denom: the association flowc's Adam always had (golden sources)
        return u.op("subtract", u.w, u.op("divide", u.op("multiply", u.lr, m), denom)), {"m": m, "v": v}
    step = u.op("add", u.op("divide", m, denom), u.scaled(u.weight_decay, u.w))
    return u.op("subtract", u.w, u.op("multiply", u.lr, step)), {"m": m, "v": v}


def _lazy_adam(u: Update):
    # Adam with bias correction from the state beta1_t, beta2_t (beta1**t, beta2**t, updated after use);
    # OneFlow's kernel leaves an element whose gradient is below 1e-12 in magnitude untouched (value, m
    # and v): that is what makes it lazy (a NaN gradient is not below, so it still propagates).
    m, v = _moments(u)
    b1t, b2t = u.state["beta1_t"], u.state["beta2_t"]
    one = u.const(1.0)
    lr = u.op("divide", u.op("multiply", u.lr, u.op("sqrt", u.op("subtract", one, b2t))), u.op("subtract", one, b1t))
    step = u.op("divide", m, u.op("add", u.op("sqrt", v), u.const(u.opt.epsilon)))
    w = u.op("subtract", u.w, u.op("multiply", lr, step))
    skip = u.op("less", u.op("abs", u.g), u.const(1e-12))

    def unless_skipped(new: int, old: int) -> int:
        return u.op("select_nonzero", skip, old, new)
    return unless_skipped(w, u.w), {
        "m": unless_skipped(m, u.state["m"]), "v": unless_skipped(v, u.state["v"]),
        "beta1_t": u.scaled(u.opt.beta1, b1t), "beta2_t": u.scaled(u.opt.beta2, b2t)}


def _rmsprop(u: Update):
    # ms = (1 - d) g^2 + d ms; centered: mg = (1 - d) g + d mg, denom = ms - mg^2; model -= lr g / sqrt(denom + eps)
    d = u.opt.decay_rate
    ms = u.op("add", u.scaled(1 - d, u.op("multiply", u.g, u.g)), u.scaled(d, u.state["mean_square"]))
    new_state = {"mean_square": ms}
    denom = ms
    if u.opt.centered:
        mg = u.op("add", u.scaled(1 - d, u.g), u.scaled(d, u.state["mean_gradient"]))
        new_state["mean_gradient"] = mg
        denom = u.op("subtract", ms, u.op("multiply", mg, mg))
    scale = u.op("divide", u.lr, u.op("sqrt", u.op("add", denom, u.const(u.opt.epsilon))))
    return u.op("subtract", u.w, u.op("multiply", scale, u.g)), new_state


def _lars(u: Update):
    # local_lr = lr * coef * rms(model) / (eps + rms(g));  m = beta m - local_lr g;  model += m
    # (OneFlow 0.3.4 uses root-mean-square norms here, and LARS has no weight_decay argument.)
    local = u.op("divide", u.op("multiply", u.lr, u.scaled(u.opt.lars_coefficient, u.norm(u.w, mean=True))),
                 u.op("add", u.const(u.opt.epsilon), u.norm(u.g, mean=True)))
    m = u.op("subtract", u.scaled(u.opt.momentum_beta, u.state["momentum"]), u.op("multiply", local, u.g))
    return u.op("add", u.w, m), {"momentum": m}


def _lamb(u: Update):
    # beta1_t *= beta1 and beta2_t *= beta2 BEFORE use (OneFlow 0.3.4's kernel, with beta1_t starting
    # at beta1: step t is corrected with beta1**(t+1)); adam = (m / (1 - b1t)) / sqrt(v / (1 - b2t) + eps);
    # trust = |model| / |adam| when both are > 0 else 1;  model -= lr * trust * adam
    m, v = _moments(u)
    b1t, b2t = u.scaled(u.opt.beta1, u.state["beta1_t"]), u.scaled(u.opt.beta2, u.state["beta2_t"])
    one = u.const(1.0)
    m_hat = u.op("divide", m, u.op("subtract", one, b1t))
    v_hat = u.op("divide", v, u.op("subtract", one, b2t))
    adam = u.op("divide", m_hat, u.op("sqrt", u.op("add", v_hat, u.const(u.opt.epsilon))))
    w_norm, a_norm = u.norm(u.w), u.norm(adam)
    zero = u.const(0.0)
    both_positive = u.op("multiply", u.op("subtract", one, u.op("eq_mask", w_norm, zero)),
                         u.op("subtract", one, u.op("eq_mask", a_norm, zero)))
    safe_a_norm = u.op("select_nonzero", both_positive, a_norm, one)
    trust = u.op("select_nonzero", both_positive, u.op("divide", w_norm, safe_a_norm), one)
    step = u.op("add", adam, u.scaled(u.weight_decay, u.w)) if u.weight_decay else adam
    new_w = u.op("subtract", u.w, u.op("multiply", u.op("multiply", u.lr, trust), step))
    return new_w, {"m": m, "v": v, "beta1_t": b1t, "beta2_t": b2t}


def _no_state(opt) -> tuple[StateSpec, ...]:
    return ()


UPDATE_RULES: dict[str, UpdateRule] = {
    "sgd": UpdateRule(_no_state, _sgd),
    "momentum": UpdateRule(lambda opt: (StateSpec("momentum"),), _momentum),
    "adam": UpdateRule(lambda opt: (StateSpec("m"), StateSpec("v")), _adam),
    "lazy_adam": UpdateRule(lambda opt: (StateSpec("m"), StateSpec("v"), StateSpec("beta1_t", True, "beta1"),
                                         StateSpec("beta2_t", True, "beta2")), _lazy_adam),
    "rmsprop": UpdateRule(lambda opt: (StateSpec("mean_square"),) + ((StateSpec("mean_gradient"),)
                                                                       if opt.centered else ()), _rmsprop),
    "lars": UpdateRule(lambda opt: (StateSpec("momentum"),), _lars),
    "lamb": UpdateRule(lambda opt: (StateSpec("m"), StateSpec("v"), StateSpec("beta1_t", True, "beta1"),
                                    StateSpec("beta2_t", True, "beta2")), _lamb),
}


# ---------------------------------------------------------------------------------------------
# The optimizers
# ---------------------------------------------------------------------------------------------


def _patterns(value, cls: str, arg: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not all(isinstance(p, str) for p in value):
        raise TypeError(f"{cls}: {arg} must be a string or a sequence of strings (regular expressions), got {value!r}")
    return list(value)


class Optimizer:
    """Base: `minimize(loss)` marks the loss of the train job being traced; `rule` names the row of
    UPDATE_RULES that updates each variable."""
    rule = "sgd"

    def __init__(self, lr_scheduler, loss_scale_factor: float | None = None, grad_clipping=None,
                 train_step_lbn: str | None = None, loss_scale_policy=None, variables=None,
                 weight_decay: float | None = None, weight_decay_includes=None, weight_decay_excludes=None) -> None:
        cls = type(self).__name__
        self.lr_scheduler = _as_scheduler(lr_scheduler)
        if train_step_lbn is not None:
            raise NotImplementedError(f"{cls}: train_step_lbn (a train step read from a blob by its logical blob "
                                      "name) is not supported by flowc; each train job counts its own steps")
        if loss_scale_factor is not None:
            if loss_scale_policy is not None:
                raise ValueError(f"{cls}: give loss_scale_factor or loss_scale_policy, not both")
            loss_scale_policy = StaticLossScalePolicy(loss_scale_factor)
        if loss_scale_policy is not None and not isinstance(loss_scale_policy,
                                                            (StaticLossScalePolicy, DynamicLossScalePolicy)):
            raise TypeError(f"{cls}: loss_scale_policy must be flow.optimizer.loss_scale.static_loss_scale(...) "
                            f"or dynamic_loss_scale(...), got {type(loss_scale_policy).__name__}")
        self.loss_scale_policy = loss_scale_policy
        if grad_clipping is not None and not isinstance(grad_clipping, ClipByGlobalNorm):
            raise TypeError(f"{cls}: grad_clipping must be flow.optimizer.grad_clipping.by_global_norm(...), "
                            f"got {type(grad_clipping).__name__}")
        self.grad_clipping = grad_clipping
        # names, or OneFlow's callable giving them, called when the job is traced (minimize)
        self._variables = variables if variables is None or callable(variables) else _names(variables, cls)
        self.variables: list[str] | None = None if callable(variables) else self._variables
        self.weight_decay = 0.0 if weight_decay is None else float(weight_decay)
        self.weight_decay_includes = _patterns(weight_decay_includes, cls, "weight_decay_includes")
        self.weight_decay_excludes = _patterns(weight_decay_excludes, cls, "weight_decay_excludes")
        if self.weight_decay_includes is not None and self.weight_decay_excludes is not None:
            raise ValueError(f"{cls}: give weight_decay_includes or weight_decay_excludes, not both")

    def minimize(self, loss) -> None:
        """Train the job's variables to minimize `loss`, or the sum of a list of losses.

        Example:
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        """
        from flowc.compiler.trace import current, user_location
        ctx = current("optimizer.minimize")
        loc = user_location()
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        if not losses:
            raise TraceError(f"{loc}: optimizer.minimize: the list of losses is empty")
        for one in losses:
            check_loss(one, "optimizer.minimize", loc)
        if ctx.job_type != "train":
            raise TraceError(f"{loc}: optimizer.minimize() is only allowed in a job declared "
                             f"with @flow.global_function(type=\"train\"); {ctx.job_name!r} is {ctx.job_type!r}")
        if callable(self._variables):
            self.variables = _names(self._variables(), f"{loc}: optimizer.minimize: the variables callable")
        ctx.optimizers.append((self, combine_losses(losses, "optimizer.minimize", loc)))

    def Variables(self) -> list[str]:  # noqa: N802 - OneFlow's name
        """The names of the variables this optimizer updates: its `variables` (called if a callable),
        else, as OneFlow's default, every variable of the job being traced.

        Example:
            names = optimizer.Variables()
        """
        if callable(self._variables):
            return _names(self._variables(), "optimizer.Variables(): the variables callable")
        if self._variables is not None:
            return list(self._variables)
        from flowc.compiler.trace import current
        return sorted(current("optimizer.Variables() without a variables argument").variable_nodes)

    # -- what the build asks ----------------------------------------------------------
    def updates(self, var: str) -> bool:
        """Whether this optimizer updates variable `var` (its `variables` argument; default: all)."""
        return self.variables is None or var in self.variables

    def weight_decay_for(self, var: str) -> float:
        """OneFlow's weight_decay_conf: the decay, unless the patterns (regular expressions, searched
        in the variable's name) leave `var` out."""
        if not self.weight_decay:
            return 0.0
        if self.weight_decay_includes is not None:
            return self.weight_decay if any(re.search(p, var) for p in self.weight_decay_includes) else 0.0
        if self.weight_decay_excludes is not None:
            return 0.0 if any(re.search(p, var) for p in self.weight_decay_excludes) else self.weight_decay
        return self.weight_decay

    def state_specs(self) -> tuple[StateSpec, ...]:
        return UPDATE_RULES[self.rule].state(self)

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.suffix for s in self.state_specs())

    def state_initial(self, spec: StateSpec) -> float:
        return float(getattr(self, spec.initial)) if isinstance(spec.initial, str) else float(spec.initial)

    def update(self, e, var: int, grad: int, state: dict[str, int], lr: int, weight_decay: float = 0.0
               ) -> tuple[int, dict[str, int]]:
        """Return (next value of var, {state suffix: next state value}) as IR node ids."""
        return UPDATE_RULES[self.rule].emit(Update(e, var, grad, lr, state, self, weight_decay))

    def scalars(self, step: int) -> dict[str, float]:
        """Runtime scalars for train step `step` (0-based)."""
        return {"learning_rate": self.lr_scheduler.learning_rate(step)}

    def describe(self) -> str:
        return type(self).__name__


def _check_beta(cls: str, arg: str, value: float) -> float:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{cls}: {arg} must be in [0, 1), got {value}")
    return float(value)


class SGD(Optimizer):
    """Stochastic gradient descent: `w -= lr * g`; with momentum > 0, OneFlow's momentum rule
    `m = momentum * m - lr * g; w = w + m` (state `<var>-momentum`).

    Example:
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    """

    def __init__(self, lr_scheduler, loss_scale_factor: float | None = None, momentum: float = 0.9,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy, variables)
        self._momentum_args(momentum)

    def _momentum_args(self, momentum: float) -> None:
        self.momentum = _check_beta(type(self).__name__, "momentum", momentum)
        self.rule = "momentum" if self.momentum > 0 else "sgd"


class SGDW(SGD):
    """SGD with decoupled weight decay: `w -= lr * (g + weight_decay * w)`; with momentum,
    `m = momentum * m - lr * g; w = w + m - lr * weight_decay * w`.

    Example:
        flow.optimizer.SGDW(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9,
                            weight_decay=0.00005).minimize(loss)
    """

    def __init__(self, lr_scheduler, loss_scale_factor: float | None = None, momentum: float = 0.9,
                 weight_decay: float | None = None, weight_decay_includes=None, weight_decay_excludes=None,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None) -> None:
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                           variables, weight_decay, weight_decay_includes, weight_decay_excludes)
        self._momentum_args(momentum)


class Adam(Optimizer):
    """Adam, OneFlow's kernel: `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w -= lr * m / (sqrt(v) + epsilon)`; with `do_bias_correction` (off by default, as in OneFlow)
    the learning rate is scaled by `sqrt(1 - beta2^t) / (1 - beta1^t)` (on the host, t = step + 1),
    so epsilon is not bias-corrected.  State `<var>-m`, `<var>-v`.

    Example:
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
    """
    rule = "adam"

    def __init__(self, lr_scheduler, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 do_bias_correction: bool = False, loss_scale_factor: float | None = None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy, variables)
        self._adam_args(beta1, beta2, epsilon, do_bias_correction)

    def _adam_args(self, beta1, beta2, epsilon, do_bias_correction) -> None:
        cls = type(self).__name__
        self.beta1, self.beta2 = _check_beta(cls, "beta1", beta1), _check_beta(cls, "beta2", beta2)
        if epsilon < 0:
            raise ValueError(f"{cls}: epsilon must be >= 0, got {epsilon}")
        self.epsilon = float(epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def scalars(self, step: int) -> dict[str, float]:
        lr = self.lr_scheduler.learning_rate(step)
        if self.do_bias_correction:
            t = step + 1
            lr *= math.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t)
        return {"learning_rate": lr}


class AdamW(Adam):
    """Adam with decoupled weight decay: `w -= lr * (m / (sqrt(v) + epsilon) + weight_decay * w)`,
    lr bias-corrected as in Adam (the decay term too, as OneFlow's kernel does).

    Example:
        flow.optimizer.AdamW(flow.optimizer.PiecewiseConstantScheduler([], [0.001]),
                             do_bias_correction=False, weight_decay=0.00005).minimize(loss)
    """

    def __init__(self, lr_scheduler, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 do_bias_correction: bool = False, loss_scale_factor: float | None = None,
                 weight_decay: float | None = None, weight_decay_includes=None, weight_decay_excludes=None,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None) -> None:
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                           variables, weight_decay, weight_decay_includes, weight_decay_excludes)
        self._adam_args(beta1, beta2, epsilon, do_bias_correction)


class LazyAdam(Adam):
    """LazyAdam: Adam with bias correction always on, kept in the state `<var>-beta1_t` and
    `<var>-beta2_t` (shape (1,), from beta1 and beta2, multiplied by them after each step), with
    `<var>-m`, `<var>-v`.  As OneFlow's kernel, it leaves every element whose gradient is below 1e-12
    in magnitude untouched (value, m and v), so the rows of an embedding without a gradient keep
    their value and state; a variable read only by a gather is moreover updated at the batch's rows
    only (compiler/indexed_slices.py), which gives the same values without touching the other rows.

    Example:
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.001])).minimize(loss)
    """
    rule = "lazy_adam"

    def __init__(self, lr_scheduler, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 loss_scale_factor: float | None = None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None) -> None:
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                           variables)
        self._adam_args(beta1, beta2, epsilon, False)


class LAMB(Adam):
    """LAMB (OneFlow 0.3.4's kernel): Adam's moments, bias-corrected by the state `<var>-beta1_t`,
    `<var>-beta2_t` (shape (1,), starting at beta1, beta2 and multiplied by them before each step,
    so step t uses beta**(t+1): OneFlow's behaviour), then a per-variable trust ratio
    `|w| / |adam step|` scales the learning rate.

    Example:
        flow.optimizer.LAMB(flow.optimizer.PiecewiseConstantScheduler([], [0.001])).minimize(loss)
    """
    rule = "lamb"

    def __init__(self, lr_scheduler, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-6,
                 loss_scale_factor: float | None = None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None) -> None:
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy,
                           variables)
        self._adam_args(beta1, beta2, epsilon, False)


class RMSProp(Optimizer):
    """RMSProp: `ms = (1 - decay_rate) g^2 + decay_rate ms` (state `<var>-mean_square`); with
    `centered`, also `mg = (1 - decay_rate) g + decay_rate mg` (`<var>-mean_gradient`) and the
    denominator is `ms - mg^2`; `w -= lr * g / sqrt(denominator + epsilon)`.

    Example:
        flow.optimizer.RMSProp(flow.optimizer.PiecewiseConstantScheduler([], [0.001])).minimize(loss)
    """
    rule = "rmsprop"

    def __init__(self, lr_scheduler, decay_rate: float = 0.99, epsilon: float = 1e-8, centered: bool = False,
                 loss_scale_factor: float | None = None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy, variables)
        self.decay_rate = _check_beta("RMSProp", "decay_rate", decay_rate)
        if epsilon < 0:
            raise ValueError(f"RMSProp: epsilon must be >= 0, got {epsilon}")
        self.epsilon, self.centered = float(epsilon), bool(centered)


class LARS(Optimizer):
    """LARS (OneFlow 0.3.4's kernel): `local_lr = lr * lars_coefficient * rms(w) / (epsilon + rms(g))`
    with root-mean-square norms; `m = momentum_beta * m - local_lr * g; w = w + m` (state
    `<var>-momentum`).

    Example:
        flow.optimizer.LARS(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum_beta=0.9).minimize(loss)
    """
    rule = "lars"

    def __init__(self, lr_scheduler, momentum_beta: float = 0.9, epsilon: float = 1e-9,
                 lars_coefficient: float = 0.0001, loss_scale_factor: float | None = None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None) -> None:
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn, loss_scale_policy, variables)
        self.momentum_beta = _check_beta("LARS", "momentum_beta", momentum_beta)
        self.epsilon, self.lars_coefficient = float(epsilon), float(lars_coefficient)


# The old style's update rules (NormalModelUpdateOpUserConf's one-of): conf key -> (the optimizer, from the
# job's learning-rate scheduler, the rule's parameters and the extras' keyword arguments).
# A weight_decay_conf makes SGD and Adam their decoupled forms (OneFlow's kernels decay the same way).
_UPDATE_CONFS: dict[str, Callable[..., Optimizer]] = {
    "naive_conf": lambda lr, p, **kw: (SGDW if "weight_decay" in kw else SGD)(lr, momentum=0.0, **kw),
    "momentum_conf": lambda lr, p, **kw: (SGDW if "weight_decay" in kw else SGD)(lr, momentum=p.get("beta", 0.9),
                                                                                 **kw),
    "adam_conf": lambda lr, p, **kw: (AdamW if "weight_decay" in kw else Adam)(
        lr, beta1=p.get("beta1", 0.9), beta2=p.get("beta2", 0.999), epsilon=p.get("epsilon", 1e-8),
        do_bias_correction=p.get("do_bias_correction", False), **kw),
    "rmsprop_conf": lambda lr, p, **kw: RMSProp(lr, decay_rate=p.get("decay_rate", 0.99),
                                                epsilon=p.get("epsilon", 1e-8), centered=p.get("centered", False),
                                                **kw),
    "lars_conf": lambda lr, p, **kw: LARS(lr, momentum_beta=p.get("momentum_beta", 0.9),
                                          epsilon=p.get("epsilon", 1e-9),
                                          lars_coefficient=p.get("lars_coefficient", 0.0001), **kw),
    "lazy_adam_conf": lambda lr, p, **kw: LazyAdam(lr, beta1=p.get("beta1", 0.9), beta2=p.get("beta2", 0.999),
                                                   epsilon=p.get("epsilon", 1e-8), **kw),
    "lamb_conf": lambda lr, p, **kw: LAMB(lr, beta1=p.get("beta1", 0.9), beta2=p.get("beta2", 0.999),
                                          epsilon=p.get("epsilon", 1e-6), **kw),
}
# The rules whose optimizers take a weight decay (OneFlow's weight_decay_conf).
_DECAYING_RULES = ("naive_conf", "momentum_conf", "adam_conf")
# LearningRateDecayConf's one-of -> the scheduler, from the primary lr, the conf and the warmup.
_LR_DECAYS: dict[str, Callable[[float, dict, WarmupConf | None], LrScheduler]] = {
    "exponential_conf": lambda lr, c, w: ExponentialScheduler(lr, c["decay_batches"], c["decay_rate"],
                                                              c.get("staircase", False), warmup=w),
    "inverse_time_conf": lambda lr, c, w: InverseTimeScheduler(lr, c["decay_batches"], c["decay_rate"],
                                                               c.get("staircase", False), warmup=w),
    "natural_exp_conf": lambda lr, c, w: NaturalExpScheduler(lr, c["decay_batches"], c["decay_rate"],
                                                             c.get("staircase", False), warmup=w),
    "piecewise_constant_conf": lambda lr, c, w: _warmed_from(lr, PiecewiseConstantScheduler(
        c["boundaries"], c["values"], warmup=w)),
    "piecewise_scaling_conf": lambda lr, c, w: PiecewiseScalingScheduler(lr, c["boundaries"], c["scales"], warmup=w),
    "polynomial_conf": lambda lr, c, w: PolynomialScheduler(lr, c["decay_batches"], c.get("end_learning_rate", 0.0001),
                                                            c.get("power", 1.0), c.get("cycle", False), warmup=w),
    "cosine_conf": lambda lr, c, w: CosineScheduler(lr, c["decay_batches"], c.get("alpha", 0.0), warmup=w),
    "linear_cosine_conf": lambda lr, c, w: LinearCosineScheduler(lr, c["decay_batches"], c.get("num_periods", 0.5),
                                                                 c.get("alpha", 0.0), c.get("beta", 0.001), warmup=w),
}
_WARMUPS: dict[str, Callable[[dict], WarmupConf]] = {
    "constant_conf": lambda c: ConstantWarmup(c["warmup_batches"], c["multiplier"]),
    "linear_conf": lambda c: LinearWarmup(c["warmup_batches"], c["start_multiplier"]),
}
_EXTRAS = ("learning_rate_decay", "warmup_conf", "clip_conf", "weight_decay_conf")


def _warmed_from(lr: float, scheduler: LrScheduler) -> LrScheduler:
    # OneFlow's kernel warms up from the primary lr, whatever the piecewise values are
    scheduler.base_lr = float(lr)
    return scheduler


def _one_of(conf: Any, field: str, table: dict) -> tuple[str, dict]:
    """The one entry of a protobuf one-of given as a dict, checked against `table`'s keys."""
    if not isinstance(conf, dict) or len(conf) != 1 or next(iter(conf)) not in table:
        raise ValueError(f"model_update_conf: {field} must be a dict of one of {', '.join(table)}, got {conf!r}")
    (kind, params), = conf.items()
    if not isinstance(params, dict):
        raise ValueError(f"model_update_conf: {field}.{kind} must be a dict, got {params!r}")
    return kind, params


def _built(what: str, build: Callable[[], Any]) -> Any:
    try:
        return build()
    except KeyError as missing:
        raise ValueError(f"model_update_conf: {what} needs {missing}") from None


def from_model_update_conf(conf: dict, lr: float) -> Optimizer:
    """The old style: `config.train.model_update_conf({...})` with `config.train.primary_lr(lr)`.
    `conf` is OneFlow's NormalModelUpdateOpUserConf as a dict: one update rule (`naive_conf`,
    `momentum_conf`, `adam_conf`, ...) and, optionally, `learning_rate_decay`, `warmup_conf`,
    `clip_conf` (`clip_by_global_norm`) and `weight_decay_conf` (`weight_decay_rate`, and `includes`
    or `excludes` as `{"pattern": [...]}`)."""
    if not isinstance(conf, dict):
        raise ValueError(f"model_update_conf: expected a dict, got {conf!r}")
    rules = [key for key in conf if key in _UPDATE_CONFS]
    unknown = [key for key in conf if key not in _UPDATE_CONFS and key not in _EXTRAS]
    if unknown or len(rules) != 1:
        raise ValueError(f"model_update_conf: expected one update rule ({', '.join(_UPDATE_CONFS)}) and any of "
                         f"{', '.join(_EXTRAS)}; got the keys {', '.join(map(repr, conf)) or 'none'}")
    kind = rules[0]
    warmup_conf = None
    if "warmup_conf" in conf:
        warm_kind, warm = _one_of(conf["warmup_conf"], "warmup_conf", _WARMUPS)
        warmup_conf = _built(f"warmup_conf.{warm_kind}", lambda: _WARMUPS[warm_kind](warm))
    scheduler: LrScheduler = PiecewiseConstantScheduler([], [float(lr)], warmup=warmup_conf)
    if "learning_rate_decay" in conf:
        decay_kind, decay = _one_of(conf["learning_rate_decay"], "learning_rate_decay", _LR_DECAYS)
        scheduler = _built(f"learning_rate_decay.{decay_kind}", lambda: _LR_DECAYS[decay_kind](lr, decay, warmup_conf))
    extras: dict[str, Any] = {}
    if "clip_conf" in conf:
        _, clip = _one_of(conf["clip_conf"], "clip_conf", {"clip_by_global_norm": None})
        extras["grad_clipping"] = _built("clip_conf.clip_by_global_norm", lambda: ClipByGlobalNorm(clip["clip_norm"]))
    if "weight_decay_conf" in conf:
        decay_conf = conf["weight_decay_conf"]
        if kind not in _DECAYING_RULES:
            raise ValueError(f"model_update_conf: flowc applies weight_decay_conf to "
                             f"{', '.join(_DECAYING_RULES)} only, not to {kind}")
        extras.update(_weight_decay(decay_conf))
    return _UPDATE_CONFS[kind](scheduler, conf[kind] or {}, **extras)


def _weight_decay(conf: Any) -> dict[str, Any]:
    """WeightDecayConf: `weight_decay_rate`, and `includes` or `excludes` as `{"pattern": [...]}`."""
    if not isinstance(conf, dict) or "weight_decay_rate" not in conf or \
            set(conf) - {"weight_decay_rate", "includes", "excludes"}:
        raise ValueError(f"model_update_conf: weight_decay_conf takes weight_decay_rate and includes or excludes "
                         f"({{'pattern': [...]}}), got {conf!r}")
    out: dict[str, Any] = {"weight_decay": conf["weight_decay_rate"]}
    for which in ("includes", "excludes"):
        if which in conf:
            patterns = conf[which]
            if not isinstance(patterns, dict) or set(patterns) != {"pattern"}:
                raise ValueError(f"model_update_conf: weight_decay_conf.{which} must be {{'pattern': [...]}}, "
                                 f"got {patterns!r}")
            out[f"weight_decay_{which}"] = patterns["pattern"]
    return out
