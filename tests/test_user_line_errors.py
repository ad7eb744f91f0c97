"""Errors about a job's definition name the user's file:line: an integer loss, a job called inside
a job (itself included).  Only the thread that traces is refused: another thread may call jobs
meanwhile."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import JobCallError, TraceError

HERE = os.path.basename(__file__)


def _line_of(marker: str) -> str:
    with open(__file__) as f:
        number = next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))
    return f"{HERE}:{number}"


def _sgd():
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0)


def test_integer_loss_in_minimize_names_the_users_line():
    @flow.global_function(type="train")
    def int_loss_job(x: tp.Numpy.Placeholder((4, 3), dtype=flow.int32)) -> tp.Numpy:
        flow.get_variable("w", shape=(3,))
        loss = flow.math.reduce_sum(x)
        _sgd().minimize(loss)  # MINIMIZE
        return loss

    with pytest.raises(TraceError) as info:
        int_loss_job(np.ones((4, 3), np.int32))
    message = str(info.value)
    assert message.startswith(f"{_line_of('MINIMIZE')}: optimizer.minimize: the loss must be floating point")
    assert "int32" in message and "flow.cast" in message


def test_integer_loss_in_add_loss_names_the_users_line():
    config = flow.function_config()
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})

    @flow.global_function(type="train", function_config=config)
    def int_add_loss_job(x: tp.Numpy.Placeholder((4, 3), dtype=flow.int32)) -> tp.Numpy:
        flow.get_variable("w", shape=(3,))
        loss = flow.math.reduce_sum(x)
        flow.losses.add_loss(loss)  # ADD_LOSS
        return loss

    with pytest.raises(TraceError, match=f"^{_line_of('ADD_LOSS')}: flow.losses.add_loss: the loss must be "
                                         "floating point"):
        int_add_loss_job(np.ones((4, 3), np.int32))


def test_minimize_of_a_non_blob_names_the_users_line():
    @flow.global_function(type="train")
    def number_loss_job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.get_variable("w", shape=(3,))
        _sgd().minimize(1.0)  # NUMBER
        return x

    with pytest.raises(TraceError, match=f"^{_line_of('NUMBER')}: optimizer.minimize: the loss must be a Blob"):
        number_loss_job(np.ones(3, np.float32))


def make_inner():
    @flow.global_function(type="predict")
    def inner(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.math.relu(x)
    return inner


@pytest.mark.parametrize("argument", ["blob", "array"])
def test_a_job_called_inside_a_job_names_the_users_line(argument):
    inner = make_inner()

    @flow.global_function(type="predict")
    def outer(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        y = inner(x if argument == "blob" else np.ones(3, np.float32))  # NESTED
        return x + y

    with pytest.raises(JobCallError) as info:
        outer(np.ones(3, np.float32))
    message = str(info.value)
    assert message.startswith(f"{_line_of('NESTED')}: job 'inner' is called inside job 'outer'")
    assert "a job function cannot call another job function" in message


def test_a_job_calling_itself_is_refused_not_traced_without_end():
    @flow.global_function(type="predict")
    def recursive(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return recursive(np.ones(3, np.float32))  # RECURSIVE

    with pytest.raises(JobCallError, match=f"^{_line_of('RECURSIVE')}: job 'recursive' is called inside "
                                           "job 'recursive'"):
        recursive(np.ones(3, np.float32))


def test_another_thread_may_call_a_job_while_one_traces():
    inner = make_inner()
    np.testing.assert_array_equal(inner(np.array([-1, 0, 2], np.float32)), [0, 0, 2])   # compiled now
    tracing = threading.Event()
    called = threading.Event()
    result: dict[str, object] = {}

    @flow.global_function(type="predict")
    def slow_to_trace(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        tracing.set()
        called.wait(60)               # bounded: the test fails, never hangs, if the other call is stuck
        return x + 1

    def call_inner_meanwhile() -> None:
        tracing.wait(60)
        try:
            result["inner"] = inner(np.array([-3, 4, 5], np.float32))
        except BaseException as exc:   # noqa: BLE001 - asserted below
            result["inner"] = exc
        called.set()

    other = threading.Thread(target=call_inner_meanwhile, daemon=True)
    other.start()
    np.testing.assert_array_equal(slow_to_trace(np.zeros(3, np.float32)), [1, 1, 1])
    other.join(60)
    assert not other.is_alive()
    assert not isinstance(result["inner"], BaseException), result["inner"]
    np.testing.assert_array_equal(result["inner"], [0, 4, 5])
