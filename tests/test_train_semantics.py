"""Train jobs behave as OneFlow's do (issue 14, semantic bugs):

* a train job that returns a variable, or an expression `simplify` reduces to it (`w * 1.0`, a cast
  to its own dtype, `reduce_sum(w, axis=[])`, a reshape of it), returns the value the forward pass
  read, not the value after this step's update; on the CPU and on the CUDA backend (emulated);
* a job whose results are computed values gets no copy: its graph is unchanged by the pass;
* a non-scalar loss that is (a multiple of) a `transpose` (an NHWC conv or pool output) trains
  instead of crashing in `simplify` on the uniform seed of its gradient.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.passes.snapshot import read_from_assigned_variable, snapshot_assigned_variables
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.runtime.session import Session

LR, MOMENTUM = 0.5, 0.9
W0 = np.arange(6, dtype=np.float32).reshape(2, 3) / 4


def _sgd():
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=MOMENTUM)


def returns_variable(x: tp.Numpy.Placeholder((2, 3))) -> tuple[tp.Numpy, ...]:
    w = flow.get_variable("w", shape=(2, 3), initializer=flow.constant_initializer(0.0))
    loss = x * w * w
    _sgd().minimize(loss)
    return (w, w * 1.0, flow.cast(w, flow.float32), flow.math.reduce_sum(w, axis=[]),
            flow.reshape(w, (3, 2)), loss)


returns_variable.__annotations__["return"] = tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]


@pytest.fixture(scope="module")
def job():
    flow.clear_default_session()
    fn = flow.global_function(type="train")(returns_variable)
    fn(np.zeros((2, 3), np.float32))          # builds; then start from W0
    flow.clear_default_session()
    return fn


def _numpy_steps(x: np.ndarray, steps: int):
    """(w read by each step, the variable after the last) under SGD with momentum, mean loss."""
    w, m = W0.astype(np.float64), np.zeros_like(W0, np.float64)
    read = []
    for _ in range(steps):
        read.append(w.copy())
        g = 2 * x * w / x.size
        m = MOMENTUM * m - LR * g
        w = w + m
    return read, w


def test_results_of_an_updated_variable_are_the_values_the_forward_pass_read(job):
    from flowc.runtime.session import default_session
    x = np.array([[1, -2, 3], [0.5, 1, -1]], np.float32)
    job(x)                                            # in this session: trace, compile (cached), load
    default_session().value("w")[...] = W0
    read, after = _numpy_steps(x, 3)
    for step in range(3):
        results = job(x)
        for got in results[:4]:
            np.testing.assert_allclose(got, read[step], rtol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(results[4], read[step].reshape(3, 2), rtol=1e-6)
        np.testing.assert_allclose(results[5], x * read[step] ** 2, rtol=1e-5)
    flow.sync_default_session()
    np.testing.assert_allclose(default_session().value("w"), after, rtol=1e-5)


def test_only_results_read_from_an_updated_variable_get_a_copy(job):
    graph = job.graph
    before = lower_graph_before_snapshot(graph)
    # w, w * 1, the cast and reduce_sum(axis=[]) are the variable node itself by now; the reshape views it
    assert [before.node(o).op for o in before.outputs[:5]] == ["variable"] * 4 + ["reshape"]
    assert read_from_assigned_variable(before) == before.outputs[:1] + before.outputs[4:5]
    program = lower(graph)
    assert [program.graph.node(o).op for o in program.graph.outputs] == ["snapshot"] * 5 + ["multiply"]
    assert len({o for o in program.graph.outputs[:4]}) == 1      # one copy serves the four
    assert "w updated by copy" not in " ".join(program.memory.notes)   # still updated in place


def lower_graph_before_snapshot(graph):
    """The graph as the snapshot pass sees it (after both simplify passes)."""
    from flowc.compiler.pipeline import PASSES, Program
    program = Program(graph)
    for name, run in PASSES:
        if name == "snapshot_outputs":
            return program.graph
        program = run(program)
    raise AssertionError("no snapshot_outputs pass")


def test_a_job_returning_computed_values_is_left_alone():
    def plain(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w_plain", shape=(2, 3), initializer=flow.ones_initializer())
        loss = x * w
        _sgd().minimize(loss)
        return loss
    job = flow.global_function(type="train")(plain)
    graph = lower_graph_before_snapshot(job.graph)
    assert snapshot_assigned_variables(graph) is graph


def test_a_predict_job_returning_a_variable_gets_no_copy():
    def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.get_variable("w_predict", shape=(2, 3), initializer=flow.ones_initializer()) * 1.0
    job = flow.global_function(type="predict")(predict)
    graph = lower_graph_before_snapshot(job.graph)
    assert snapshot_assigned_variables(graph) is graph
    np.testing.assert_array_equal(job(np.zeros((2, 3), np.float32)), np.ones((2, 3), np.float32))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
def test_the_cuda_step_returns_the_forward_values_too(job, tmp_path):
    from tests.test_cuda_codegen import Emulator, render, replay
    session = Session()
    from flowc.compiler.build import build_job_graph
    graph = build_job_graph(job.name, job.job_type, job.fn, job.placeholders, job.result_spec, session,
                            job.config).graph
    program = lower(graph)
    step = render(program, prefix="semantics_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    x = np.array([[1, -2, 3], [0.5, 1, -1]], np.float32)
    device = {name: session.value(name).copy() for name in graph.variables}
    device["w"][...] = W0
    reference = {name: value.copy() for name, value in device.items()}
    scalars = {name: LR for name in graph.scalars}
    for _ in range(2):
        got, status = replay(emulator, lib, program, step, [x], device, scalars)
        want, updates = run_reference(graph, [x], reference, scalars)
        assert status == 0
        np.testing.assert_allclose(got[0], reference["w"], rtol=1e-6)    # the value before the update
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
        reference.update(updates)
    np.testing.assert_allclose(device["w"], reference["w"], rtol=1e-5)


# --- a loss that is a transpose ------------------------------------------------------------------

def test_a_transposed_loss_trains():
    x = np.array([[1, -2, 3], [0.5, 1, -1]], np.float32)

    @flow.global_function(type="train")
    def transposed(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w_t", shape=(2, 3), initializer=flow.ones_initializer())
        loss = flow.transpose(x * w, perm=[1, 0])
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss
    np.testing.assert_allclose(transposed(x), x.T)
    flow.sync_default_session()
    from flowc.runtime.session import default_session
    np.testing.assert_allclose(default_session().value("w_t"), 1 - LR * x / x.size, rtol=1e-6)


def test_a_multiple_of_an_nhwc_pool_output_as_the_loss_trains():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 4, 2)).astype(np.float32)

    @flow.global_function(type="train")
    def pooled(x: tp.Numpy.Placeholder((1, 4, 4, 2))) -> tp.Numpy:
        w = flow.get_variable("w_pool", shape=(1, 4, 4, 2), initializer=flow.ones_initializer())
        loss = 2.0 * flow.nn.max_pool2d(x * w, ksize=2, strides=2, padding="VALID", data_format="NHWC")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss
    got = pooled(x)
    windows = x.reshape(1, 2, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4, 5).reshape(1, 2, 2, 4, 2)
    np.testing.assert_allclose(got, 2 * windows.max(axis=3), rtol=1e-6)
    # the gradient of the mean loss: 2 / 8 at each window's maximum, times x there
    grad = np.zeros_like(x)
    for i in range(2):
        for j in range(2):
            for c in range(2):
                win = x[0, 2 * i:2 * i + 2, 2 * j:2 * j + 2, c]
                a, b = np.unravel_index(np.argmax(win), (2, 2))
                grad[0, 2 * i + a, 2 * j + b, c] = 2 / got.size * win[a, b]
    flow.sync_default_session()
    from flowc.runtime.session import default_session
    np.testing.assert_allclose(default_session().value("w_pool"), 1 - LR * grad, rtol=1e-6)
