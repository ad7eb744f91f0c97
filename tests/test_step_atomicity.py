"""A train step that fails (a label out of range) changes no variable -- weights, momentum, Adam's
moments -- and is not counted (the count drives the learning-rate schedule and Adam's bias
correction); the next good step is exactly the step the reference makes from the values before.

Labels fed as an input are checked before the first kernel runs (by the generated step on the
CPU, by the runtime before the first launch on the GPU), and the CPU step stops at the first
kernel that reports an error.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from flowc.runtime.job import _runtime_scalars
from flowc.runtime.session import Session, default_session
from tests.test_cuda_codegen import emulator, fake_pycuda, graph_of, needs_gxx, needs_nvcc  # noqa: F401

OPTIMIZERS = {
    "sgd_momentum": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9),
    "adam": lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])),
}
BATCH, FEATURES, CLASSES = 6, 5, 3


def train_job(optimizer: str):
    @flow.global_function(type="train")
    def atomic_train(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                     y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 8, activation=flow.nn.relu, name="atomic_hidden")
        logits = flow.layers.dense(h, CLASSES, name="atomic_out")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        OPTIMIZERS[optimizer]().minimize(loss)
        return loss
    return atomic_train


def batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH).astype(np.int32)


def bits(session: Session) -> dict[str, bytes]:
    """Every variable of the session (optimizer state included), bit for bit."""
    return {name: session.value(name).tobytes() for name in session.variables}


@pytest.mark.parametrize("bad_label", [CLASSES, -1])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_failing_train_step_changes_no_variable_and_is_not_counted(optimizer, bad_label):
    job = train_job(optimizer)
    x, y = batch(0)
    job(x, y)                                   # momentum / moments are non-zero from here on
    session = default_session()
    before, steps = bits(session), dict(session.train_steps)
    state = {name: session.value(name).copy() for name in session.variables}
    bad = y.copy()
    bad[BATCH // 2] = bad_label
    with pytest.raises(flow.StepError, match="out of range"):
        job(x, bad)
    assert bits(session) == before
    assert session.train_steps == steps
    # the next good step is the reference's step from the same values, with the same step number
    x2, y2 = batch(1)
    loss = job(x2, y2)
    graph = job.compiled.program.graph
    scalars = _runtime_scalars(job._traced, steps["atomic_train"])
    (want,), updates = run_reference(graph, [x2, y2], state, scalars)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    for name, value in updates.items():
        np.testing.assert_allclose(session.value(name), value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_the_first_step_failing_leaves_the_initial_values():
    job = train_job("adam")
    session = default_session()
    x, y = batch(2)
    y[0] = 99
    with pytest.raises(flow.StepError, match="out of range"):
        job(x, y)
    graph = job.compiled.program.graph
    initial = Session(seed=session.seed)
    for name in graph.variables:                 # the same initializers from the same seed
        slot = session.variables[name]
        initial.declare_variable(name, slot.type, slot.initializer, slot.trainable, slot.defined_at)
        np.testing.assert_array_equal(session.value(name), initial.value(name), err_msg=name)
    assert session.train_steps.get("atomic_train", 0) == 0


def test_labels_computed_in_the_step_stop_it_before_the_update():
    """Labels computed by the step itself are checked by the loss kernel: the CPU step stops there."""
    @flow.global_function(type="train")
    def computed_labels(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH,))) -> tp.Numpy:
        logits = flow.layers.dense(x, CLASSES, name="computed_out")
        labels = flow.cast(y, flow.int32)
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        OPTIMIZERS["sgd_momentum"]().minimize(loss)
        return loss

    x, y = batch(4)
    computed_labels(x, y.astype(np.float32))
    session = default_session()
    before = bits(session)
    with pytest.raises(flow.StepError, match="out of range"):
        computed_labels(x, np.full(BATCH, CLASSES + 0.5, np.float32))
    assert bits(session) == before
    assert session.train_steps["computed_labels"] == 1


@pytest.mark.slow
@needs_nvcc
@needs_gxx
def test_a_failing_gpu_step_changes_no_variable_on_an_emulated_device(fake_pycuda):  # noqa: F811
    """The CUDA runtime checks fed labels before the first launch (here on the emulated device)."""
    from flowc.compiler.pipeline import compile_graph
    from flowc.runtime.devices import load_step, sync_to_host
    session = Session()
    graph = graph_of(train_job("adam"), session)
    step = load_step(compile_graph(graph, device="gpu", arch="sm_80"), session)
    x, y = batch(3)
    scalars = {name: 0.01 for name in graph.scalars if name.startswith("learning_rate")}
    step.run([x, y], scalars)
    sync_to_host(session)
    before = bits(session)
    launches = fake_pycuda.launches
    bad = y.copy()
    bad[1] = CLASSES
    with pytest.raises(flow.StepError, match="out of range"):
        step.run([x, bad], scalars)
    assert fake_pycuda.launches == launches      # nothing ran
    sync_to_host(session)
    assert bits(session) == before


def test_a_failing_asynchronous_step_is_not_counted_either():
    """The counter advances when a step runs (under the step lock), so a failed asynchronous step
    goes back before any later step takes a number: the steps after it are numbered as if it had
    never been called."""
    @flow.global_function(type="train")
    def atomic_async(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                     y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
        logits = flow.layers.dense(x, CLASSES, name="atomic_async_out")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        OPTIMIZERS["adam"]().minimize(loss)
        return loss
    x, y = batch(3)
    bad = y.copy()
    bad[0] = CLASSES
    for labels in (y, bad, y, y):
        atomic_async(x, labels)(lambda loss: None)
    with pytest.raises(flow.StepError, match="out of range"):
        flow.sync_default_session()
    flow.sync_default_session()
    assert default_session().train_steps["atomic_async"] == 3
