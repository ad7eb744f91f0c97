"""Training jobs against two oracles.

* The NumPy reference executor (`compiler.reference.run_reference`) runs the very graph the job
  compiled (forward + backward + update); the compiled step must agree with it to rtol 1e-5 after
  one step and 1e-4 after 20.  This checks lowering, fusion and code generation.
* A hand-written NumPy training loop of the same tiny linear model (float64) checks the graph
  itself: the gradients and OneFlow's update rules (SGD, momentum, Adam with and without bias
  correction, piecewise-constant learning rates).

Model: pred = x @ w^T + b with w (3, 4), b (3,); loss = sum((pred - y)^2).
"""
import inspect
import math
import os

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from flowc.runtime.session import default_session

THIS_FILE = os.path.basename(__file__)
N, IN, OUT = 8, 4, 3
LR_SCALAR = "learning_rate:float32"
W_INIT = flow.random_uniform_initializer(-0.5, 0.5, seed=21)
B_INIT = flow.random_uniform_initializer(-0.5, 0.5, seed=22)

_rng = np.random.RandomState(1234)
X = _rng.uniform(-0.5, 0.5, (N, IN)).astype(np.float32)
Y = _rng.uniform(-0.5, 0.5, (N, OUT)).astype(np.float32)


def residual(x, y, b_trainable=True):
    w = flow.get_variable("w", shape=(OUT, IN), initializer=W_INIT)
    b = flow.get_variable("b", shape=(OUT,), initializer=B_INIT, trainable=b_trainable)
    return flow.matmul(x, w, transpose_b=True) + b - y


def squared_loss(x, y, b_trainable=True):
    r = residual(x, y, b_trainable)
    return flow.math.reduce_sum(r * r)


def constant(lr):
    return flow.optimizer.PiecewiseConstantScheduler([], [lr])


def make_train_job(make_optimizer, name, *, per_sample_loss=False, b_trainable=True):
    """One train job per optimizer; the body (and so every node's source line) is shared."""
    def train_job(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        if per_sample_loss:
            r = residual(x, y, b_trainable)
            loss = flow.math.reduce_sum(r * r, axis=1)          # shape (N,)
        else:
            loss = squared_loss(x, y, b_trainable)
        make_optimizer().minimize(loss)
        return loss
    train_job.__name__ = train_job.__qualname__ = name
    return flow.global_function(type="train")(train_job)


def make_old_style_job(update_conf, name, lr=0.1):
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(lr)
    config.train.model_update_conf(update_conf)

    def old_train_job(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = squared_loss(x, y)
        flow.losses.add_loss(loss)
        return loss
    old_train_job.__name__ = old_train_job.__qualname__ = name
    return flow.global_function(type="train", function_config=config)(old_train_job)


# ---------------------------------------------------------------------------------------------
# The hand-written oracle
# ---------------------------------------------------------------------------------------------

def numpy_training(rule, lrs, steps, b_trainable=True, **hp):
    """Train the linear model in float64; return (losses, {variable or state: value})."""
    w = W_INIT.sample((OUT, IN), np.dtype(np.float32), default_seed=0).astype(np.float64)
    b = B_INIT.sample((OUT,), np.dtype(np.float32), default_seed=0).astype(np.float64)
    x, y = X.astype(np.float64), Y.astype(np.float64)
    params = {"w": w, "b": b}
    state = {}
    losses = []
    for t in range(steps):
        r = x @ params["w"].T + params["b"] - y
        losses.append((r * r).sum())
        grads = {"w": 2 * r.T @ x, "b": 2 * r.sum(axis=0)}
        lr = lrs(t)
        for name, g in grads.items():
            if name == "b" and not b_trainable:
                continue
            if rule == "sgd":
                params[name] = params[name] - lr * g
            elif rule == "momentum":
                m = hp["beta"] * state.get(f"{name}-momentum", 0.0) - lr * g
                state[f"{name}-momentum"] = m
                params[name] = params[name] + m
            elif rule == "adam":
                b1, b2, eps = hp.get("beta1", 0.9), hp.get("beta2", 0.999), hp.get("epsilon", 1e-8)
                m = b1 * state.get(f"{name}-m", 0.0) + (1 - b1) * g
                v = b2 * state.get(f"{name}-v", 0.0) + (1 - b2) * g * g
                state[f"{name}-m"], state[f"{name}-v"] = m, v
                step_lr = lr
                if hp.get("do_bias_correction"):
                    step_lr = lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
                params[name] = params[name] - step_lr * m / (np.sqrt(v) + eps)
            else:
                raise AssertionError(rule)
    return np.array(losses), {**params, **state}


def piecewise(boundaries, values):
    def lr(step):
        for boundary, value in zip(boundaries, values):
            if step <= boundary:        # OneFlow's kernel: values[i] through step == boundaries[i]
                return value
        return values[-1]
    return lr


# ---------------------------------------------------------------------------------------------
# Running the compiled job next to the reference executor
# ---------------------------------------------------------------------------------------------

def _assert_close(actual, expected, rtol, what):
    # rtol as asked; atol only for entries that are ~0 relative to the tensor's scale
    # (a momentum/Adam state component that is 1e-9 cannot meet an rtol after float32 rounding).
    atol = rtol * 1e-2 * float(np.max(np.abs(expected))) if np.size(expected) else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def train_against_reference(job, lrs, steps=20, inputs=(X, Y)):
    """Run `steps` compiled steps and `steps` reference steps side by side; return compiled losses.

    Step 1 is compared at rtol 1e-5 and step `steps` at rtol 1e-4 (each oracle keeps its own
    variables: errors may accumulate, as in real training).
    """
    graph = job.graph
    session = default_session()
    assert set(graph.scalars) == {LR_SCALAR}
    ref_vars = {name: session.value(name).copy() for name in graph.variables}
    losses = []
    for t in range(steps):
        ref_out, ref_assign = run_reference(graph, list(inputs), ref_vars, {LR_SCALAR: lrs(t)})
        ref_vars.update(ref_assign)
        loss = job(*inputs)
        losses.append(loss)
        if t == 0 or t == steps - 1:
            rtol = 1e-5 if t == 0 else 1e-4
            _assert_close(loss, ref_out[0], rtol, f"loss at step {t + 1}")
            for name in graph.assigns:
                _assert_close(session.value(name), ref_vars[name], rtol, f"{name} after step {t + 1}")
    # variables that are read but not assigned keep their value in both
    for name in set(graph.variables) - set(graph.assigns):
        np.testing.assert_array_equal(session.value(name), ref_vars[name])
    return np.array(losses)


def assert_matches_numpy(oracle, losses, rtol=2e-4):
    np_losses, np_values = oracle
    # (a full reduction's loss has shape (1,), as in OneFlow)
    np.testing.assert_allclose(np.reshape(losses, np.shape(np_losses)), np_losses, rtol=rtol,
                               err_msg="losses vs hand-written NumPy")
    session = default_session()
    for name, value in np_values.items():
        _assert_close(session.value(name), value, rtol, f"{name} vs hand-written NumPy")


# ---------------------------------------------------------------------------------------------
# Optimizers, new style: optimizer.minimize(loss)
# ---------------------------------------------------------------------------------------------

sgd_job = make_train_job(lambda: flow.optimizer.SGD(constant(0.05), momentum=0), "sgd_job")
momentum_job = make_train_job(lambda: flow.optimizer.SGD(constant(0.05), momentum=0.9), "momentum_job")
adam_job = make_train_job(lambda: flow.optimizer.Adam(constant(0.05)), "adam_job")
adam_bc_job = make_train_job(lambda: flow.optimizer.Adam(constant(0.05), beta1=0.8, beta2=0.99,
                                                         do_bias_correction=True), "adam_bc_job")
piecewise_job = make_train_job(
    lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([5, 10], [0.1, 0.05, 0.01]),
                               momentum=0), "piecewise_job")

CONSTANT_05 = piecewise([], [0.05])
PIECEWISE = piecewise([5, 10], [0.1, 0.05, 0.01])


def _bias_corrected(lr, b1, b2):
    return lambda t: lr * math.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))


@pytest.mark.parametrize("job, ref_lrs, rule, hp, states", [
    (sgd_job, CONSTANT_05, "sgd", {}, []),
    (momentum_job, CONSTANT_05, "momentum", {"beta": 0.9}, ["w-momentum", "b-momentum"]),
    (adam_job, CONSTANT_05, "adam", {}, ["w-m", "w-v", "b-m", "b-v"]),
    (adam_bc_job, _bias_corrected(0.05, 0.8, 0.99), "adam",
     {"beta1": 0.8, "beta2": 0.99, "do_bias_correction": True}, ["w-m", "w-v", "b-m", "b-v"]),
], ids=["sgd", "momentum", "adam", "adam_bias_correction"])
def test_optimizer_matches_reference_and_numpy(job, ref_lrs, rule, hp, states):
    losses = train_against_reference(job, ref_lrs, steps=20)
    assert losses[-1] < losses[0] * 0.8, losses          # it actually trains
    assert_matches_numpy(numpy_training(rule, CONSTANT_05, 20, **hp), losses)
    variables = default_session().variables
    for state in states:
        assert state in variables, (state, sorted(variables))
    assert set(job.graph.assigns) == {"w", "b", *states}


def test_one_step_of_sgd_by_hand():
    w0 = W_INIT.sample((OUT, IN), np.dtype(np.float32), default_seed=0)
    b0 = B_INIT.sample((OUT,), np.dtype(np.float32), default_seed=0)
    loss = sgd_job(X, Y)
    r = X @ w0.T + b0 - Y
    np.testing.assert_allclose(loss, (r * r).sum(), rtol=1e-5)
    np.testing.assert_allclose(default_session().value("w"), w0 - 0.05 * 2 * r.T @ X, rtol=1e-5)
    np.testing.assert_allclose(default_session().value("b"), b0 - 0.05 * 2 * r.sum(axis=0), rtol=1e-5)


def test_piecewise_constant_scheduler_changes_lr_after_steps_5_and_10():
    sched = flow.optimizer.PiecewiseConstantScheduler([5, 10], [0.1, 0.05, 0.01])
    assert [sched.learning_rate(t) for t in (0, 5, 6, 10, 11, 19)] == [0.1, 0.1, 0.05, 0.05, 0.01, 0.01]
    losses = train_against_reference(piecewise_job, PIECEWISE, steps=20)
    assert_matches_numpy(numpy_training("sgd", PIECEWISE, 20), losses)
    # The schedule matters: a constant 0.1 would end elsewhere.
    const_losses, const_values = numpy_training("sgd", piecewise([], [0.1]), 20)
    assert not np.allclose(default_session().value("w"), const_values["w"], rtol=1e-3)


def test_piecewise_boundaries_are_counted_in_train_steps_of_the_session():
    """Calls of a predict job do not advance the schedule; only train steps do."""
    @flow.global_function(type="predict")
    def peek(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        return squared_loss(x, y)

    oracle_losses, oracle = numpy_training("sgd", PIECEWISE, 7)
    for t in range(7):
        np.testing.assert_allclose(peek(X, Y), oracle_losses[t], rtol=1e-4)
        piecewise_job(X, Y)
    np.testing.assert_allclose(default_session().value("w"), oracle["w"], rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Old style: flow.losses.add_loss with config.train.*
# ---------------------------------------------------------------------------------------------

old_naive = make_old_style_job({"naive_conf": {}}, "old_naive")
old_momentum = make_old_style_job({"momentum_conf": {"beta": 0.9}}, "old_momentum", lr=0.05)
old_adam = make_old_style_job({"adam_conf": {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8,
                                             "do_bias_correction": True}}, "old_adam")


@pytest.mark.parametrize("job, lr, rule, hp", [
    (old_naive, 0.1, "sgd", {}),
    (old_momentum, 0.05, "momentum", {"beta": 0.9}),
    (old_adam, 0.1, "adam", {"do_bias_correction": True}),
], ids=["naive_conf", "momentum_conf", "adam_conf"])
def test_old_style_add_loss(job, lr, rule, hp):
    ref_lrs = _bias_corrected(lr, 0.9, 0.999) if hp.get("do_bias_correction") else piecewise([], [lr])
    losses = train_against_reference(job, ref_lrs, steps=20)
    assert losses[-1] < losses[0], losses
    assert_matches_numpy(numpy_training(rule, piecewise([], [lr]), 20, **hp), losses)


def test_old_positional_config_with_train_settings_makes_a_train_job():
    config = flow.function_config()
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    with pytest.warns(DeprecationWarning):
        decorate = flow.global_function(config)

    def positional_old(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = squared_loss(x, y)
        flow.losses.add_loss(loss)
        return loss
    job = decorate(positional_old)
    assert job.job_type == "train"


@pytest.mark.parametrize("conf", [{"naive_conf": {}, "momentum_conf": {}}, {"adagrad_conf": {}}, "naive"])
def test_bad_model_update_conf_is_a_clear_error(conf):
    job = make_old_style_job(conf, "bad_conf")
    with pytest.raises(ValueError, match="model_update_conf"):
        job(X, Y)


def test_add_loss_without_train_config_is_a_trace_error():
    def no_conf(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = squared_loss(x, y)
        flow.losses.add_loss(loss)
        return loss
    job = flow.global_function(type="train")(no_conf)
    with pytest.raises(flow.TraceError, match="primary_lr"):
        job(X, Y)


# ---------------------------------------------------------------------------------------------
# Losses, trainability, misuse
# ---------------------------------------------------------------------------------------------

per_sample_job = make_train_job(lambda: flow.optimizer.SGD(constant(0.05), momentum=0), "per_sample_job",
                                per_sample_loss=True)
frozen_bias_job = make_train_job(lambda: flow.optimizer.SGD(constant(0.05), momentum=0.9), "frozen_bias_job",
                                 b_trainable=False)


def test_non_scalar_loss_trains_on_the_gradient_of_its_mean():
    """OneFlow's rule: d(sum(loss))/dw divided by the loss's instance count (here N)."""
    losses = train_against_reference(per_sample_job, CONSTANT_05, steps=20)
    assert losses[0].shape == (N,)
    np_losses, np_values = numpy_training("sgd", piecewise([], [0.05 / N]), 20)
    np.testing.assert_allclose(losses.sum(axis=1), np_losses, rtol=2e-4)
    for name in ("w", "b"):
        _assert_close(default_session().value(name), np_values[name], 2e-4, name)


def test_variable_with_trainable_false_is_not_updated():
    b0 = B_INIT.sample((OUT,), np.dtype(np.float32), default_seed=0)
    losses = train_against_reference(frozen_bias_job, CONSTANT_05, steps=5)
    np.testing.assert_array_equal(default_session().value("b"), b0)
    assert "b" not in frozen_bias_job.graph.assigns and "w" in frozen_bias_job.graph.assigns
    assert "b-momentum" not in default_session().variables
    assert "w-momentum" in default_session().variables
    assert_matches_numpy(numpy_training("momentum", CONSTANT_05, 5, b_trainable=False, beta=0.9), losses)


MARK: dict = {}


def _next_line():
    return inspect.currentframe().f_back.f_lineno + 1


def test_train_job_without_minimize_is_a_trace_error():
    @flow.global_function(type="train")
    def forgot_minimize(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        return squared_loss(x, y)

    with pytest.raises(flow.TraceError) as info:
        forgot_minimize(X, Y)
    msg = str(info.value)
    assert "'forgot_minimize'" in msg and "minimize" in msg and THIS_FILE in msg
    assert forgot_minimize.loaded is None


def test_minimize_in_a_predict_job_is_a_trace_error():
    @flow.global_function(type="predict")
    def sneaky(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = squared_loss(x, y)
        MARK["minimize"] = _next_line()
        flow.optimizer.SGD(constant(0.1), momentum=0).minimize(loss)
        return loss

    with pytest.raises(flow.TraceError) as info:
        sneaky(X, Y)
    msg = str(info.value)
    assert msg.startswith(f"{THIS_FILE}:{MARK['minimize']}:"), msg
    assert "train" in msg and "'sneaky'" in msg


def test_two_minimize_calls_are_a_trace_error():
    @flow.global_function(type="train")
    def twice(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N, OUT))) -> tp.Numpy:
        loss = squared_loss(x, y)
        flow.optimizer.SGD(constant(0.1), momentum=0).minimize(loss)
        flow.optimizer.SGD(constant(0.1), momentum=0).minimize(loss)
        return loss

    with pytest.raises(flow.TraceError, match="exactly one loss"):
        twice(X, Y)


def test_minimize_outside_a_job_is_a_trace_error():
    with pytest.raises(flow.TraceError, match="global_function"):
        flow.optimizer.SGD(constant(0.1), momentum=0).minimize(None)


def test_train_step_and_session_reset():
    """clear_default_session forgets trained values: the next session starts from the initializers."""
    sgd_job(X, Y)
    sgd_job(X, Y)
    assert default_session().train_steps["sgd_job"] == 2
    trained = default_session().value("w").copy()
    flow.clear_default_session()
    first_loss = sgd_job(X, Y)
    assert sgd_job.compiled.compiled is False          # the retrace was a compile-cache hit
    assert default_session().train_steps["sgd_job"] == 1
    np_losses, _ = numpy_training("sgd", CONSTANT_05, 1)
    np.testing.assert_allclose(first_loss, np_losses[0], rtol=1e-5)
    assert not np.allclose(default_session().value("w"), trained)


def test_learning_rate_schedule_counts_the_steps_of_its_own_job():
    for _ in range(6):
        sgd_job(X, Y)                       # another train job on the same variables
    session = default_session()
    w, b = session.value("w").copy().astype(np.float64), session.value("b").copy().astype(np.float64)
    piecewise_job(X, Y)                     # its own first step: lr must be 0.1, not the value at step 6
    r = X @ w.T + b - Y
    np.testing.assert_allclose(session.value("w"), w - 0.1 * 2 * r.T @ X, rtol=1e-5)
