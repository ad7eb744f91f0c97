"""OneFlow 0.3.4's optimizers and training extras against NumPy implementations of its formulas.

The oracle below is written from OneFlow's kernels (model_update_kernel_util.h, the learning-rate
schedule kernel, the loss-scale and clipping passes), in float64, step by step, so the state
evolves.  Most tests run the traced graph (forward, backward, update) on the NumPy reference
executor: tracing costs milliseconds, compiling a job about a second, so only a few jobs are
compiled in the fast tier (their C++ agrees with the reference and the oracle); the slow tier
compiles every rule.

Model: w (3, 4), b (3,); per-sample loss sum((x @ w^T + b - y)^2, axis=1), shape (N,), so
OneFlow's update uses the gradient of the mean over the N samples.
"""
import math
import os

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import default_session

N, IN, OUT = 6, 4, 3
W_INIT = flow.random_uniform_initializer(-0.5, 0.5, seed=31)
B_INIT = flow.random_uniform_initializer(-0.5, 0.5, seed=32)
_rng = np.random.RandomState(77)
X = _rng.uniform(-1.0, 1.0, (N, IN)).astype(np.float32)
Y = _rng.uniform(-1.0, 1.0, (N, OUT)).astype(np.float32)
STEPS = 6


def per_sample_loss(x, y, w_reg=None, b_reg=None):
    w = flow.get_variable("w", shape=(OUT, IN), initializer=W_INIT, regularizer=w_reg)
    b = flow.get_variable("b", shape=(OUT,), initializer=B_INIT, regularizer=b_reg)
    r = flow.matmul(x, w, transpose_b=True) + b - y
    return flow.math.reduce_sum(r * r, axis=1)


def make_job(name, make_optimizer, w_reg=None, b_reg=None, two_losses=False):
    def job(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = per_sample_loss(x, y, w_reg, b_reg)
        if two_losses:      # a second loss of the same shape: its gradient adds to the first's
            b = flow.get_variable("b", shape=(OUT,), initializer=B_INIT)
            second = flow.math.reduce_sum(x, axis=1) * flow.math.reduce_sum(b * b)
            make_optimizer().minimize([loss, second])
        else:
            make_optimizer().minimize(loss)
        return loss
    job.__name__ = job.__qualname__ = name
    return flow.global_function(type="train")(job)


def const_lr(lr):
    return flow.optimizer.PiecewiseConstantScheduler([], [lr])


# ---------------------------------------------------------------------------------------------
# The oracle: OneFlow's formulas in NumPy
# ---------------------------------------------------------------------------------------------

def initial_params():
    return {"w": W_INIT.sample((OUT, IN), np.dtype(np.float32), default_seed=0).astype(np.float64),
            "b": B_INIT.sample((OUT,), np.dtype(np.float32), default_seed=0).astype(np.float64)}


def mean_grads(p, x=X, y=Y, two_losses=False):
    x, y = x.astype(np.float64), y.astype(np.float64)
    r = x @ p["w"].T + p["b"] - y
    grads = {"w": 2 * r.T @ x / N, "b": 2 * r.sum(axis=0) / N}
    if two_losses:   # second_i = sum(x_i) * sum(b^2): d/db of its sum, over N instances
        grads["b"] = grads["b"] + x.sum() * 2 * p["b"] / N
    return grads


def numpy_sign(w):
    return (w >= 0).astype(np.float64) - (w <= 0).astype(np.float64)


def oneflow_step(rule, hp, p, g, s, lr, t, name):
    """One update of variable `name` (OneFlow's kernel for `rule`); `s` holds the state by OneFlow's names."""
    w = p[name]
    wd = hp.get("weight_decay", 0.0) if name in hp.get("decayed", ("w", "b")) else 0.0

    def state(suffix, init=0.0):
        return s.get(f"{name}-{suffix}", np.full_like(w, init) if not isinstance(init, str) else None)

    if rule == "sgd":
        p[name] = w - lr * (g + wd * w)
    elif rule == "momentum":
        m = hp["momentum"] * state("momentum") - lr * g
        s[f"{name}-momentum"] = m
        p[name] = w + m - lr * wd * w
    elif rule == "adam":
        b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
        m = b1 * state("m") + (1 - b1) * g
        v = b2 * state("v") + (1 - b2) * g * g
        if hp.get("do_bias_correction"):
            lr = lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
        s[f"{name}-m"], s[f"{name}-v"] = m, v
        p[name] = w - lr * (m / (np.sqrt(v) + eps) + wd * w)
    elif rule == "lazy_adam":
        b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
        b1t = s.get(f"{name}-beta1_t", np.array([b1]))
        b2t = s.get(f"{name}-beta2_t", np.array([b2]))
        m = b1 * state("m") + (1 - b1) * g
        v = b2 * state("v") + (1 - b2) * g * g
        lr_t = lr * np.sqrt(1 - b2t) / (1 - b1t)
        s[f"{name}-m"], s[f"{name}-v"] = m, v
        s[f"{name}-beta1_t"], s[f"{name}-beta2_t"] = b1t * b1, b2t * b2
        p[name] = w - lr_t * m / (np.sqrt(v) + eps)
    elif rule == "rmsprop":
        d, eps = hp["decay_rate"], hp["epsilon"]
        ms = (1 - d) * g * g + d * state("mean_square")
        s[f"{name}-mean_square"] = ms
        denom = ms
        if hp["centered"]:
            mg = (1 - d) * g + d * state("mean_gradient")
            s[f"{name}-mean_gradient"] = mg
            denom = ms - mg * mg
        p[name] = w - lr * g / np.sqrt(denom + eps)
    elif rule == "lars":
        w_norm, g_norm = math.sqrt(np.mean(w * w)), math.sqrt(np.mean(g * g))
        local = lr * hp["lars_coefficient"] * w_norm / (hp["epsilon"] + g_norm)
        m = hp["momentum_beta"] * state("momentum") - local * g
        s[f"{name}-momentum"] = m
        p[name] = w + m
    elif rule == "lamb":
        b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
        b1t = s.get(f"{name}-beta1_t", np.array([b1])) * b1      # multiplied before use
        b2t = s.get(f"{name}-beta2_t", np.array([b2])) * b2
        m = b1 * state("m") + (1 - b1) * g
        v = b2 * state("v") + (1 - b2) * g * g
        adam = (m / (1 - b1t)) / np.sqrt(v / (1 - b2t) + eps)
        w_norm, a_norm = np.linalg.norm(w), np.linalg.norm(adam)
        trust = w_norm / a_norm if w_norm > 0 and a_norm > 0 else 1.0
        s[f"{name}-m"], s[f"{name}-v"], s[f"{name}-beta1_t"], s[f"{name}-beta2_t"] = m, v, b1t, b2t
        p[name] = w - lr * trust * adam
    else:
        raise AssertionError(rule)


def oneflow_training(rule, hp, lrs, steps, regularizers=None, clip=None, inputs=None, two_losses=False):
    """Train in float64 as OneFlow would: mean gradient, + l1 sign(w) + l2 w, global-norm clip, update."""
    p, s = initial_params(), {}
    for t in range(steps):
        x, y = inputs[t] if inputs else (X, Y)
        grads = mean_grads(p, x, y, two_losses)
        for name, (l1, l2) in (regularizers or {}).items():
            grads[name] = grads[name] + l1 * numpy_sign(p[name]) + l2 * p[name]
        if clip is not None:
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
            grads = {k: g * clip / max(norm, clip) for k, g in grads.items()}
        for name in ("w", "b"):
            oneflow_step(rule, hp, p, grads[name], s, lrs(t), t, name)
    return {**p, **s}


# ---------------------------------------------------------------------------------------------
# Running a traced graph on the reference executor (no compile)
# ---------------------------------------------------------------------------------------------

def reference_training(job, steps, inputs=None):
    """The job's graph on the NumPy reference executor, with the runtime scalars the job would get."""
    traced = job._trace(default_session())
    graph = traced.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    for t in range(steps):
        feeds = list(inputs[t]) if inputs else [X, Y]
        _, updates = run_reference(graph, feeds, values, _runtime_scalars(traced, t))
        values.update(updates)
    return graph, values


def assert_values(actual, expected, rtol, what):
    for name, want in expected.items():
        got = np.asarray(actual[name], np.float64).reshape(np.shape(want))
        atol = rtol * 1e-2 * max(float(np.max(np.abs(want))), 1e-30)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{what}: {name}")


RULES = {   # id: (optimizer factory, oracle rule, hyperparameters, OneFlow's state names of w)
    "sgd": (lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0), "sgd", {}, []),
    "momentum": (lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0.8), "momentum", {"momentum": 0.8},
                 ["w-momentum"]),
    "sgdw": (lambda: flow.optimizer.SGDW(const_lr(0.1), momentum=0, weight_decay=0.3), "sgd",
             {"weight_decay": 0.3}, []),
    "sgdw_momentum": (lambda: flow.optimizer.SGDW(const_lr(0.1), momentum=0.7, weight_decay=0.3,
                                                  weight_decay_excludes=["^b$"]),
                      "momentum", {"momentum": 0.7, "weight_decay": 0.3, "decayed": ("w",)}, ["w-momentum"]),
    "adam": (lambda: flow.optimizer.Adam(const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-3), "adam",
             {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3}, ["w-m", "w-v"]),
    "adam_bias_correction": (lambda: flow.optimizer.Adam(const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-3,
                                                         do_bias_correction=True), "adam",
                             {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3, "do_bias_correction": True},
                             ["w-m", "w-v"]),
    "adamw": (lambda: flow.optimizer.AdamW(const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-3,
                                           do_bias_correction=True, weight_decay=0.5, weight_decay_includes="w"),
              "adam", {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3, "do_bias_correction": True,
                       "weight_decay": 0.5, "decayed": ("w",)}, ["w-m", "w-v"]),
    "rmsprop": (lambda: flow.optimizer.RMSProp(const_lr(0.01), decay_rate=0.9, epsilon=1e-4), "rmsprop",
                {"decay_rate": 0.9, "epsilon": 1e-4, "centered": False}, ["w-mean_square"]),
    "rmsprop_centered": (lambda: flow.optimizer.RMSProp(const_lr(0.01), decay_rate=0.9, epsilon=1e-4,
                                                        centered=True), "rmsprop",
                         {"decay_rate": 0.9, "epsilon": 1e-4, "centered": True},
                         ["w-mean_square", "w-mean_gradient"]),
    "lazy_adam": (lambda: flow.optimizer.LazyAdam(const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-3),
                  "lazy_adam", {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3},
                  ["w-m", "w-v", "w-beta1_t", "w-beta2_t"]),
    "lars": (lambda: flow.optimizer.LARS(const_lr(0.5), momentum_beta=0.8, epsilon=1e-9, lars_coefficient=0.1),
             "lars", {"momentum_beta": 0.8, "epsilon": 1e-9, "lars_coefficient": 0.1}, ["w-momentum"]),
    "lamb": (lambda: flow.optimizer.LAMB(const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-6), "lamb",
             {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-6}, ["w-m", "w-v", "w-beta1_t", "w-beta2_t"]),
}
JOBS = {rid: make_job(f"rule_{rid}", spec[0]) for rid, spec in RULES.items()}


@pytest.mark.parametrize("rid", list(RULES))
def test_update_rule_matches_oneflow_formula_step_by_step(rid):
    _, rule, hp, w_states = RULES[rid]
    job = JOBS[rid]
    sched = job._trace(default_session()).optimizer.lr_scheduler
    expected = oneflow_training(rule, hp, sched.learning_rate, STEPS)
    graph, values = reference_training(job, STEPS)
    states = set(w_states) | {s.replace("w-", "b-", 1) for s in w_states}
    assert set(graph.assigns) == {"w", "b"} | states        # OneFlow's state names
    for state in states:
        assert state in default_session().variables
        slot = default_session().variables[state]
        assert not slot.trainable
        assert slot.type.shape == ((1,) if state.endswith("_t") else default_session().variables[state[0]].type.shape)
    assert_values(values, expected, 2e-5, rid)
    # the rule did something: the values moved away from the initial ones
    assert not np.allclose(values["w"], initial_params()["w"], rtol=1e-3)


def test_lamb_and_lazy_adam_state_starts_at_beta():
    job = JOBS["lamb"]
    _ = job.graph   # traces: declares the state
    session = default_session()
    np.testing.assert_array_equal(session.value("w-beta1_t"), np.array([0.8], np.float32))
    np.testing.assert_array_equal(session.value("w-beta2_t"), np.array([0.9], np.float32))
    assert not session.value("w-m").any()


# ---------------------------------------------------------------------------------------------
# Schedulers and warmup: values per step against OneFlow's formulas
# ---------------------------------------------------------------------------------------------

def np_piecewise(boundaries, values):
    return lambda t: values[int(np.searchsorted(boundaries, t, side="left"))]


SCHEDULES = {
    "piecewise_constant": (flow.optimizer.PiecewiseConstantScheduler([3, 7], [0.1, 0.05, 0.01]),
                           np_piecewise([3, 7], [0.1, 0.05, 0.01])),
    "piecewise_scaling": (flow.optimizer.PiecewiseScalingScheduler(0.2, [3, 7], [0.5, 0.1]),
                          lambda t: 0.2 * np_piecewise([3, 7], [1.0, 0.5, 0.1])(t)),
    "piecewise_scaling_one_scale": (flow.optimizer.PiecewiseScalingScheduler(0.2, [3, 7], 0.5),
                                    lambda t: 0.2 * np_piecewise([3, 7], [1.0, 0.5, 0.5])(t)),
    "polynomial": (flow.optimizer.PolynomialScheduler(0.1, 8, end_learning_rate=0.001, power=2.0),
                   lambda t: (0.1 - 0.001) * (1 - min(t, 8) / 8) ** 2 + 0.001),
    "polynomial_cycle": (flow.optimizer.PolynomialScheduler(0.1, 5, end_learning_rate=0.01, power=1.5, cycle=True),
                         lambda t: (0.1 - 0.01) * (1 - max(t, 1) / (5 * np.ceil(max(t, 1) / 5))) ** 1.5 + 0.01),
    "cosine": (flow.optimizer.CosineScheduler(0.1, 10, alpha=0.2),
               lambda t: 0.1 * ((1 - 0.2) * 0.5 * (1 + np.cos(np.pi * min(t, 10) / 10)) + 0.2)),
    "linear_cosine": (flow.optimizer.LinearCosineScheduler(0.1, 10, num_periods=1.5, alpha=0.1, beta=0.01),
                      lambda t: 0.1 * ((0.1 + (10 - min(t, 10)) / 10)
                                       * 0.5 * (1 + np.cos(2 * np.pi * 1.5 * min(t, 10) / 10)) + 0.01)),
    "exponential": (flow.optimizer.ExponentialScheduler(0.1, 4, 0.5), lambda t: 0.1 * 0.5 ** (t / 4)),
    "exponential_staircase": (flow.optimizer.ExponentialScheduler(0.1, 4, 0.5, staircase=True),
                              lambda t: 0.1 * 0.5 ** np.floor(t / 4)),
    "inverse_time": (flow.optimizer.InverseTimeScheduler(0.1, 4, 0.9), lambda t: 0.1 / (1 + 0.9 * t / 4)),
    "inverse_time_staircase": (flow.optimizer.InverseTimeScheduler(0.1, 4, 0.9, staircase=True),
                               lambda t: 0.1 / (1 + 0.9 * np.floor(t / 4))),
    "natural_exp": (flow.optimizer.NaturalExpScheduler(0.1, 4, 0.5), lambda t: 0.1 * np.exp(-0.5 * t / 4)),
    "natural_exp_staircase": (flow.optimizer.NaturalExpScheduler(0.1, 4, 0.5, staircase=True),
                              lambda t: 0.1 * np.exp(-0.5 * np.floor(t / 4))),
    # warmup replaces the schedule while step < warmup steps, scaling the base rate
    "constant_warmup_alone": (flow.optimizer.PiecewiseConstantScheduler(
        [], [0.01], warmup=flow.optimizer.warmup.constant(4, 0.1)), lambda t: 0.001 if t < 4 else 0.01),
    "linear_warmup_alone": (flow.optimizer.PiecewiseConstantScheduler(
        [], [0.01], warmup=flow.optimizer.warmup.linear(5, 0.2)),
        lambda t: 0.01 * (0.2 + 0.8 * t / 5) if t < 5 else 0.01),
    "linear_warmup_cosine": (flow.optimizer.CosineScheduler(0.1, 10, warmup=flow.optimizer.warmup.linear(3, 0.0)),
                             lambda t: 0.1 * t / 3 if t < 3 else 0.1 * 0.5 * (1 + np.cos(np.pi * min(t, 10) / 10))),
    "constant_warmup_piecewise": (flow.optimizer.PiecewiseConstantScheduler(
        [6], [0.1, 0.01], warmup=flow.optimizer.warmup.constant(3, 0.5)),
        lambda t: 0.05 if t < 3 else (0.1 if t <= 6 else 0.01)),
}


@pytest.mark.parametrize("sid", list(SCHEDULES))
def test_scheduler_matches_oneflow_formula_per_step(sid):
    scheduler, formula = SCHEDULES[sid]
    got = [scheduler.learning_rate(t) for t in range(25)]
    want = [float(formula(t)) for t in range(25)]
    np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=sid)


def test_piecewise_boundary_step_keeps_the_earlier_value():
    """OneFlow's kernel: values[i] while step <= boundaries[i] (its docstring says <)."""
    sched = flow.optimizer.PiecewiseConstantScheduler([5], [1.0, 2.0])
    assert [sched.learning_rate(t) for t in (4, 5, 6)] == [1.0, 1.0, 2.0]


def test_scheduled_learning_rate_drives_the_update():
    sched = flow.optimizer.ExponentialScheduler(0.2, 2, 0.5, warmup=flow.optimizer.warmup.linear(2, 0.5))
    job = make_job("sched_sgd", lambda: flow.optimizer.SGD(sched, momentum=0.5))
    _, values = reference_training(job, STEPS)
    expected = oneflow_training("momentum", {"momentum": 0.5}, sched.learning_rate, STEPS)
    assert_values(values, expected, 2e-5, "scheduled momentum")


def test_polynomial_schduler_is_oneflows_deprecated_alias():
    assert flow.optimizer.PolynomialSchduler is flow.optimizer.PolynomialScheduler


@pytest.mark.parametrize("make, message", [
    (lambda: flow.optimizer.warmup.constant(3, 1.5), "multiplier"),
    (lambda: flow.optimizer.warmup.linear(3, -0.1), "start_multiplier"),
    (lambda: flow.optimizer.CosineScheduler(0.1, 0), "steps"),
    (lambda: flow.optimizer.PiecewiseScalingScheduler(0.1, [1, 2], [0.5]), "one scale per boundary"),
    (lambda: flow.optimizer.CustomScheduler("lr_blob/out"), "CustomScheduler"),
    (lambda: flow.optimizer.SGD(const_lr(0.1), train_step_lbn="step/out"), "train_step_lbn"),
    (lambda: flow.optimizer.SGDW(const_lr(0.1), weight_decay=0.1, weight_decay_includes="w",
                                 weight_decay_excludes="b"), "not both"),
    (lambda: flow.optimizer.SGD(const_lr(0.1), loss_scale_factor=2.0,
                                loss_scale_policy=flow.optimizer.loss_scale.static_loss_scale(2.0)), "not both"),
    (lambda: flow.optimizer.Adam(const_lr(0.1), grad_clipping=1.0), "by_global_norm"),
    (lambda: flow.optimizer.loss_scale.dynamic_loss_scale(multiplier=1.0), "multiplier"),
    (lambda: flow.optimizer.CombinedOptimizer([]), "CombinedOptimizer"),
    (lambda: flow.regularizers.l2(-1.0), "flow.regularizers.l2"),
])
def test_bad_arguments_are_clear_errors(make, message):
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=message):
        make()


# ---------------------------------------------------------------------------------------------
# Regularizers, clipping, loss scale, several losses
# ---------------------------------------------------------------------------------------------

def test_regularizers_add_to_the_gradient_as_oneflow_does():
    job = make_job("regularized", lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0.5),
                   w_reg=flow.regularizers.l1_l2(l1=0.05, l2=0.2), b_reg=flow.regularizers.l1(0.1))
    _, values = reference_training(job, STEPS)
    expected = oneflow_training("momentum", {"momentum": 0.5}, lambda t: 0.1, STEPS,
                                regularizers={"w": (0.05, 0.2), "b": (0.1, 0.0)})
    assert_values(values, expected, 2e-5, "regularized")
    plain = oneflow_training("momentum", {"momentum": 0.5}, lambda t: 0.1, STEPS)
    assert not np.allclose(values["w"], plain["w"], rtol=1e-3)     # the regularizer mattered


def test_layer_regularizers_reach_their_variables():
    @flow.global_function(type="train")
    def dense_job(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        out = flow.layers.dense(x, OUT, kernel_initializer=W_INIT, bias_initializer=B_INIT, name="fc",
                                kernel_regularizer=flow.regularizers.l2(0.3),
                                bias_regularizer=flow.regularizers.l1_l2(0.1, 0.0))
        r = out - y
        loss = flow.math.reduce_sum(r * r, axis=1)
        flow.optimizer.SGD(const_lr(0.1), momentum=0).minimize(loss)
        return loss

    traced = dense_job._trace(default_session())
    graph = traced.graph
    values = {name: default_session().value(name).copy() for name in graph.variables}
    for t in range(STEPS):
        _, updates = run_reference(graph, [X, Y], values, _runtime_scalars(traced, t))
        values.update(updates)
    expected = oneflow_training("sgd", {}, lambda t: 0.1, STEPS, regularizers={"w": (0.0, 0.3), "b": (0.1, 0.0)})
    assert_values({"w": values["fc-weight"], "b": values["fc-bias"]}, {"w": expected["w"], "b": expected["b"]},
                  2e-5, "dense regularizers")


def test_conv2d_and_batch_norm_regularizers_are_recorded():
    from flowc.compiler.trace import TraceContext, tracing
    ctx = TraceContext("conv_reg", "train", default_session())
    from flowc.compiler.trace import emit
    with tracing(ctx):
        x = emit("input", [], {"index": 0, "shape": (1, 2, 5, 5), "dtype": "float32"}, name="x", loc="t:1")
        flow.layers.conv2d(x, 3, 3, name="conv", kernel_regularizer=flow.regularizers.l2(0.01),
                           bias_regularizer=flow.regularizers.l1(0.02))
        flow.layers.batch_normalization(x, axis=1, name="bn", gamma_regularizer=flow.regularizers.l2(0.03),
                                        beta_regularizer=flow.regularizers.l1_l2(0.04, 0.05))
    assert ctx.regularizers == {"conv-weight": (0.0, 0.01), "conv-bias": (0.02, 0.0), "bn-gamma": (0.0, 0.03),
                                "bn-beta": (0.04, 0.05)}


def test_a_bad_regularizer_names_the_variable():
    @flow.global_function(type="train")
    def bad_reg(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = per_sample_loss(x, y, w_reg=0.1)
        flow.optimizer.SGD(const_lr(0.1)).minimize(loss)
        return loss

    with pytest.raises(flow.TraceError, match="regularizer of 'w'"):
        _ = bad_reg.graph


@pytest.mark.parametrize("clip", [0.05, 100.0], ids=["clips", "below_the_norm"])
def test_clip_by_global_norm(clip):
    job = make_job(f"clipped_{int(clip * 100)}", lambda: flow.optimizer.Adam(
        const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-3,
        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(clip)),
        w_reg=flow.regularizers.l2(0.1))
    _, values = reference_training(job, STEPS)
    hp = {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3}
    expected = oneflow_training("adam", hp, lambda t: 0.05, STEPS, regularizers={"w": (0.0, 0.1)}, clip=clip)
    assert_values(values, expected, 2e-5, f"clip {clip}")
    unclipped = oneflow_training("adam", hp, lambda t: 0.05, STEPS, regularizers={"w": (0.0, 0.1)})
    assert np.allclose(values["w-m"], unclipped["w-m"], rtol=1e-4) == (clip > 10)


def test_static_loss_scale_leaves_the_update_unchanged():
    for make in (lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0.5, loss_scale_factor=1024.0),
                 lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0.5,
                                            loss_scale_policy=flow.optimizer.loss_scale.static_loss_scale(8.0))):
        flow.clear_default_session()
        job = make_job("static_scale", make)
        graph, values = reference_training(job, STEPS)
        expected = oneflow_training("momentum", {"momentum": 0.5}, lambda t: 0.1, STEPS)
        assert_values(values, expected, 2e-5, "static loss scale")
        constants = [n.attr("value") for n in graph.nodes if n.op == "constant"]
        assert any(c == pytest.approx(1.0 / job._trace(default_session()).optimizer.loss_scale_policy
                                      .loss_scale_factor) for c in constants)


def test_minimize_a_list_of_losses_adds_their_gradients():
    job = make_job("two_losses", lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0), two_losses=True)
    _, values = reference_training(job, STEPS)
    expected = oneflow_training("sgd", {}, lambda t: 0.1, STEPS, two_losses=True)
    assert_values(values, expected, 2e-5, "two losses")


def test_losses_of_different_shapes_are_a_trace_error():
    @flow.global_function(type="train")
    def mismatched(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = per_sample_loss(x, y)
        flow.optimizer.SGD(const_lr(0.1)).minimize([loss, flow.math.reduce_sum(loss)])
        return loss

    with pytest.raises(flow.TraceError, match="same shape"):
        _ = mismatched.graph


def test_add_loss_twice_adds_the_gradients():
    config = flow.function_config()
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})

    @flow.global_function(type="train", function_config=config)
    def old_two(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = per_sample_loss(x, y)
        b = flow.get_variable("b", shape=(OUT,), initializer=B_INIT)
        flow.losses.add_loss(loss)
        flow.losses.add_loss(flow.math.reduce_sum(x, axis=1) * flow.math.reduce_sum(b * b))
        return loss

    _, values = reference_training(old_two, STEPS)
    assert_values(values, oneflow_training("sgd", {}, lambda t: 0.1, STEPS, two_losses=True), 2e-5, "add_loss x2")


def _old_style_job(conf, lr=0.05):
    config = flow.function_config()
    config.train.primary_lr(lr)
    config.train.model_update_conf(conf)

    def old_style(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = per_sample_loss(x, y)
        flow.losses.add_loss(loss)
        return loss
    return flow.global_function(type="train", function_config=config)(old_style)


@pytest.mark.parametrize("conf, rule, hp", [
    ({"rmsprop_conf": {"decay_rate": 0.9, "epsilon": 1e-4, "centered": True}}, "rmsprop",
     {"decay_rate": 0.9, "epsilon": 1e-4, "centered": True}),
    ({"lars_conf": {"momentum_beta": 0.8, "lars_coefficient": 0.1}}, "lars",
     {"momentum_beta": 0.8, "epsilon": 1e-9, "lars_coefficient": 0.1}),
    ({"lazy_adam_conf": {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3}}, "lazy_adam",
     {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3}),
    ({"lamb_conf": {"beta1": 0.8, "beta2": 0.9}}, "lamb", {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-6}),
], ids=["rmsprop_conf", "lars_conf", "lazy_adam_conf", "lamb_conf"])
def test_old_style_model_update_confs(conf, rule, hp):
    _, values = reference_training(_old_style_job(conf), STEPS)
    assert_values(values, oneflow_training(rule, hp, lambda t: 0.05, STEPS), 2e-5, rule)


def test_old_style_extras_decay_warm_up_clip_and_decay_weights():
    # OneFlow-Benchmark's BERT (optimizer_util.gen_model_update_conf): the NormalModelUpdateOpUserConf extras
    conf = {"adam_conf": {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3},
            "learning_rate_decay": {"polynomial_conf": {"decay_batches": 5, "end_learning_rate": 0.01, "power": 2.0}},
            "warmup_conf": {"linear_conf": {"warmup_batches": 2, "start_multiplier": 0.25}},
            "clip_conf": {"clip_by_global_norm": {"clip_norm": 0.05}},
            "weight_decay_conf": {"weight_decay_rate": 0.3, "excludes": {"pattern": ["^b$"]}}}

    def lr(t):      # OneFlow's kernel: the linear warmup from the primary lr, then the polynomial decay
        if t < 2:
            return 0.05 * (0.25 + 0.75 * t / 2)
        return (0.05 - 0.01) * (1 - min(t, 5) / 5) ** 2 + 0.01
    _, values = reference_training(_old_style_job(conf), STEPS)
    hp = {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-3, "weight_decay": 0.3, "decayed": ("w",)}
    assert_values(values, oneflow_training("adam", hp, lr, STEPS, clip=0.05), 2e-5, "adam with extras")


def test_old_style_momentum_with_piecewise_values_and_decay_of_named_weights():
    conf = {"momentum_conf": {"beta": 0.7},
            "learning_rate_decay": {"piecewise_constant_conf": {"boundaries": [1], "values": [0.2, 0.02]}},
            "warmup_conf": {"constant_conf": {"warmup_batches": 1, "multiplier": 0.5}},
            "weight_decay_conf": {"weight_decay_rate": 0.1, "includes": {"pattern": ["w"]}}}
    # step 0: the warmup, from the primary lr (0.05); step 1: values[0] (boundaries are inclusive); then values[1]
    _, values = reference_training(_old_style_job(conf), STEPS)
    expected = oneflow_training("momentum", {"momentum": 0.7, "weight_decay": 0.1, "decayed": ("w",)},
                                lambda t: 0.025 if t == 0 else (0.2 if t <= 1 else 0.02), STEPS)
    assert_values(values, expected, 2e-5, "momentum with extras")


@pytest.mark.parametrize("conf, message", [
    ({"adam_conf": {}, "warmup": {}}, "got the keys 'adam_conf', 'warmup'"),
    ({"rmsprop_conf": {}, "weight_decay_conf": {"weight_decay_rate": 0.1}}, "not to rmsprop_conf"),
    ({"naive_conf": {}, "learning_rate_decay": {"polynomial_conf": {}}}, "polynomial_conf needs 'decay_batches'"),
    ({"naive_conf": {}, "learning_rate_decay": {"step_conf": {}}}, "learning_rate_decay must be a dict of one of"),
    ({"naive_conf": {}, "weight_decay_conf": {"weight_decay_rate": 0.1, "excludes": ["b"]}},
     "excludes must be {'pattern': \\[...\\]}"),
], ids=["unknown key", "decay of rmsprop", "missing field", "unknown decay", "bare pattern list"])
def test_old_style_extras_name_what_is_wrong(conf, message):
    with pytest.raises(ValueError, match=message):
        reference_training(_old_style_job(conf), 1)


def test_optimizer_variables_argument_limits_the_update():
    job = make_job("only_w", lambda: flow.optimizer.SGD(const_lr(0.1), momentum=0, variables=["w"]))
    graph, values = reference_training(job, 2)
    assert set(graph.assigns) == {"w"}
    np.testing.assert_array_equal(values["b"], default_session().value("b"))


# ---------------------------------------------------------------------------------------------
# Compiled jobs (fast tier: two compiles)
# ---------------------------------------------------------------------------------------------

def _inputs_with_inf(steps, bad):
    out = []
    for t in range(steps):
        x = X.copy()
        if t in bad:
            x[0, 0] = np.inf
        out.append((x, Y))
    return out


def test_compiled_lamb_with_clipping_and_regularizer_matches_the_oracle(tmp_path):
    job = make_job("compiled_lamb", lambda: flow.optimizer.LAMB(
        const_lr(0.05), beta1=0.8, beta2=0.9, epsilon=1e-6,
        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.5)), w_reg=flow.regularizers.l1_l2(0.01, 0.1))
    for _ in range(STEPS):
        job(X, Y)
    session = default_session()
    expected = oneflow_training("lamb", {"beta1": 0.8, "beta2": 0.9, "epsilon": 1e-6}, lambda t: 0.05, STEPS,
                                regularizers={"w": (0.01, 0.1)}, clip=0.5)
    assert_values({name: session.value(name) for name in expected}, expected, 5e-5, "compiled LAMB")
    # OneFlow's state names are what a checkpoint holds
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    saved = set(os.listdir(tmp_path / "ckpt"))
    assert {"w", "b", "w-m", "w-v", "w-beta1_t", "w-beta2_t", "b-m", "b-v", "b-beta1_t", "b-beta2_t"} <= saved


DYNAMIC = dict(initial_loss_scale=2.0 ** 10, increment_period=2, multiplier=2.0)


def dynamic_job():
    return make_job("dyn_scale", lambda: flow.optimizer.RMSProp(
        const_lr(0.01), decay_rate=0.9, epsilon=1e-4, centered=True,
        loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(**DYNAMIC)))


def oracle_dynamic(inputs, steps):
    """OneFlow's dynamic loss scale: skip the update on non-finite gradients; adjust the scale."""
    p, s = initial_params(), {}
    scale, counter, history = DYNAMIC["initial_loss_scale"], 0, []
    hp = {"decay_rate": 0.9, "epsilon": 1e-4, "centered": True}
    for t in range(steps):
        grads = mean_grads(p, *inputs[t])
        if all(np.isfinite(g).all() for g in grads.values()):
            for name in ("w", "b"):
                oneflow_step("rmsprop", hp, p, grads[name], s, 0.01, t, name)
            counter += 1
            if counter >= DYNAMIC["increment_period"]:
                scale, counter = scale * DYNAMIC["multiplier"], 0
        else:
            scale, counter = max(scale / DYNAMIC["multiplier"], 1.0), 0
        history.append((scale, counter, p["w"].copy()))
    return {**p, **s}, history


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the inf input, on purpose
def test_compiled_dynamic_loss_scale_skips_non_finite_steps(tmp_path):
    job = dynamic_job()
    steps, bad = 7, {2, 3}
    inputs = _inputs_with_inf(steps, bad)
    expected, history = oracle_dynamic(inputs, steps)
    session = default_session()
    scale_name = "System-Train-DynamicLossScale-dyn_scale-LossScale"
    counter_name = "System-Train-DynamicLossScale-dyn_scale-GoodStepCounter"
    before = None
    for t in range(steps):
        job(*inputs[t])
        scale, counter, w = history[t]
        assert session.value(scale_name).tolist() == [scale], t
        assert session.value(counter_name).tolist() == [counter], t
        assert session.value(counter_name).dtype == np.int64
        if t in bad:
            np.testing.assert_array_equal(session.value("w"), before)     # the step changed no variable
        before = session.value("w").copy()
    assert_values({name: session.value(name) for name in expected}, expected, 5e-5, "dynamic loss scale")
    flow.checkpoint.save(str(tmp_path / "ckpt"))       # the scale and its counter are saved by OneFlow's names
    assert {scale_name, counter_name, "w-mean_square", "w-mean_gradient"} <= set(os.listdir(tmp_path / "ckpt"))
    # the reference executor runs the same graph to the same values
    flow.clear_default_session()
    _, values = reference_training(dynamic_job(), steps, inputs)
    assert_values(values, expected, 5e-5, "dynamic loss scale, reference")
    assert values[scale_name].tolist() == [history[-1][0]]


# ---------------------------------------------------------------------------------------------
# The select_nonzero op: C++ and the CUDA emulator against its reference
# ---------------------------------------------------------------------------------------------

def _select_graph():
    from flowc.compiler.ir import Graph, GraphBuilder
    b = GraphBuilder()
    cond = b.add("input", [], {"index": 0, "shape": (4, 3), "dtype": "float32"}, loc="t:1")
    x = b.add("input", [], {"index": 1, "shape": (4, 3), "dtype": "float64"}, loc="t:1")
    y = b.add("input", [], {"index": 2, "shape": (3,), "dtype": "float64"}, loc="t:1")
    counter = b.add("input", [], {"index": 3, "shape": (1,), "dtype": "int64"}, loc="t:1")
    out = b.add("select_nonzero", [cond, x, y], {}, loc="t:2")
    zero = b.add("constant", [], {"value": 0.0, "shape": (), "dtype": "int64"}, loc="t:3")
    out2 = b.add("select_nonzero", [cond, counter, zero], {}, loc="t:3")
    return Graph("select", list(b.nodes), [out, out2], {}, {}, {}, [cond, x, y, counter])


def _select_feeds():
    rng = np.random.default_rng(3)
    cond = rng.choice([0.0, 1.0, -2.5, np.nan, -0.0], size=(4, 3)).astype(np.float32)
    return [cond, rng.normal(size=(4, 3)), np.array([np.inf, -1.0, np.nan]), np.array([7], np.int64)]


def test_select_nonzero_compiles_to_its_reference():
    from flowc.compiler.pipeline import compile_graph
    from flowc.runtime.executor import CpuLoadedStep
    from flowc.runtime.session import Session
    graph, feeds = _select_graph(), _select_feeds()
    got = CpuLoadedStep(compile_graph(graph), Session()).run(feeds)
    want, _ = run_reference(graph, feeds, {})
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert want[0].dtype == np.float64 and want[1].dtype == np.int64
    # a NaN condition is nonzero (C++ and NumPy agree): it picks the first branch
    np.testing.assert_array_equal(want[0], np.where(feeds[0] != 0, feeds[1], feeds[2]))


def test_select_nonzero_in_the_cuda_emulator(tmp_path):
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the emulator")
    from flowc.compiler.pipeline import lower
    from tests.test_cuda_codegen import Emulator, render, replay
    graph, feeds = _select_graph(), _select_feeds()
    program = lower(graph)
    step = render(program, prefix="sel_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    want, _ = run_reference(program.graph, feeds, {})
    assert status == 0
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the inf input, on purpose
def test_cuda_train_step_with_every_extra_equals_the_reference_in_the_emulator(tmp_path):
    """LAMB's norms, clipping, a regularizer and the dynamic loss scale's skip, as CUDA kernels."""
    import shutil
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the emulator")
    from flowc.compiler.pipeline import lower
    from tests.test_cuda_codegen import Emulator, render, replay
    job = make_job("cuda_extras", lambda: flow.optimizer.LAMB(
        const_lr(0.05), beta1=0.8, beta2=0.9, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.5),
        loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(**DYNAMIC)),
        w_reg=flow.regularizers.l1_l2(0.01, 0.1))
    traced = job._trace(default_session())
    program = lower(traced.graph)
    step = render(program, prefix="extras_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches], "-O1")
    graph = program.graph
    reference = {name: default_session().value(name).copy() for name in graph.variables}
    device = {name: value.copy() for name, value in reference.items()}
    inputs = _inputs_with_inf(3, {1})
    for t in range(3):
        scalars = _runtime_scalars(traced, t)
        got, status = replay(emulator, lib, program, step, list(inputs[t]), device, scalars)
        want, updates = run_reference(graph, list(inputs[t]), reference, scalars)
        reference.update(updates)
        assert status == 0
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
        for name in updates:
            np.testing.assert_allclose(device[name], reference[name], rtol=1e-5, atol=1e-7, err_msg=f"{name} @ {t}")
    assert device["System-Train-DynamicLossScale-cuda_extras-LossScale"].tolist() == [2.0 ** 9]


# ---------------------------------------------------------------------------------------------
# Slow tier: every rule compiled, against the oracle
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("rid", list(RULES))
def test_every_rule_compiled_matches_oneflow_formula(rid):
    _, rule, hp, _ = RULES[rid]
    job = make_job(f"compiled_{rid}", RULES[rid][0])
    for _ in range(10):
        job(X, Y)
    sched = job._trace(default_session()).optimizer.lr_scheduler
    expected = oneflow_training(rule, hp, sched.learning_rate, 10)
    session = default_session()
    assert_values({name: session.value(name) for name in expected}, expected, 1e-4, rid)
