"""The session's initialization, as OneFlow's: every job function is traced at the session's first job
call, `get_all_variables()` or checkpoint operation, so variables exist before any job ran; and a
variable one job trains while another declares it `trainable=False` is one variable, trained only
where it is trainable."""
import threading

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from flowc.runtime.session import default_session


def sgd(lr=0.1):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9)


def make_jobs(traces=None):
    """A train job (w, with momentum) and a predict job (w and u)."""
    traces = traces if traces is not None else []

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        traces.append("train_job")
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(3.0))
        loss = flow.math.reduce_sum(x * w)
        sgd().minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict_job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        traces.append("predict_job")
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(3.0))
        u = flow.get_variable("u", shape=(4,), initializer=flow.constant_initializer(2.0))
        return x * w + u
    return train_job, predict_job


X = np.arange(4, dtype=np.float32)
ALL = {"w": np.full(4, 3.0, np.float32), "u": np.full(4, 2.0, np.float32), "w-momentum": np.zeros(4, np.float32)}


def assert_values(got: dict, expected: dict):
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_get_all_variables_before_any_call_lists_every_jobs_initialized_variables():
    traces = []
    make_jobs(traces)
    assert_values({k: v.numpy() for k, v in flow.get_all_variables().items()}, ALL)
    assert traces == ["train_job", "predict_job"]
    flow.get_all_variables()
    assert traces == ["train_job", "predict_job"]            # traced once


def test_the_first_job_call_traces_every_job_once():
    traces = []
    train_job, predict_job = make_jobs(traces)
    np.testing.assert_array_equal(predict_job(X), X * 3 + 2)
    assert sorted(traces) == ["predict_job", "train_job"]
    assert "w-momentum" in default_session().variables       # declared by the train job, not yet called
    train_job(X)
    assert sorted(traces) == ["predict_job", "train_job"]    # the first call reused the trace


@pytest.mark.parametrize("save", [flow.checkpoint.save, lambda path: flow.train.CheckPoint().save(path)])
def test_save_before_any_call_writes_every_variable(tmp_path, save):
    make_jobs()
    save(str(tmp_path / "m"))
    saved = flow.checkpoint.get(str(tmp_path / "m"))
    assert_values({k: v.numpy() for k, v in saved.items()}, ALL)


def test_load_before_any_call_reaches_every_jobs_variables():
    train_job, predict_job = make_jobs()
    loaded = {"w": np.full(4, -1.0, np.float32), "u": np.full(4, 0.5, np.float32)}
    # every name is declared by now: an unknown one would fail with ignore_mismatch=False
    flow.load_variables(loaded, ignore_mismatch=False)
    assert not default_session().pending_values
    np.testing.assert_array_equal(predict_job(X), X * -1.0 + 0.5)


def test_checkpoint_init_before_any_call_initializes_every_variable():
    make_jobs()
    flow.train.CheckPoint().init()
    assert {name for name, slot in default_session().variables.items() if slot.value is not None} == set(ALL)


def test_a_trace_error_during_initialization_names_the_users_line_and_the_job():
    train_job, _ = make_jobs()

    @flow.global_function(type="predict")
    def broken(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x + flow.get_variable("b", shape=(4, -1))       # the line the error names
    line = broken.fn.__code__.co_firstlineno + 2
    for action in (flow.get_all_variables, lambda: train_job(X)):
        with pytest.raises(TraceError, match=rf"^test_session_init.py:{line}: flow.get_variable: shape") as info:
            action()
        notes = getattr(info.value, "__notes__", [""])
        assert "broken" in notes[0] or not hasattr(info.value, "add_note")


def test_concurrent_initialization_traces_each_job_once():
    traces = []
    train_job, predict_job = make_jobs(traces)
    results, errors = [], []

    def worker(i):
        try:
            if i % 2:
                results.append(sorted(flow.get_all_variables()))
            else:
                results.append(predict_job(X).tolist())
        except BaseException as err:            # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not errors
    assert sorted(traces) == ["predict_job", "train_job"]
    assert results.count(sorted(ALL)) == 3 and results.count((X * 3 + 2).tolist()) == 3


# -- trainable in one job, not in another ----------------------------------------------------------------
def test_a_variable_trained_in_one_job_is_read_but_not_trained_in_another():
    @flow.global_function(type="train")
    def trains_w(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(1.0), trainable=True)
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.0).minimize(loss)
        return loss

    @flow.global_function(type="train")
    def reads_w(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(1.0), trainable=False)
        v = flow.get_variable("v", shape=(4,), initializer=flow.constant_initializer(0.0))
        loss = flow.math.reduce_sum(x * w * v + x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.0).minimize(loss)
        return w * 1.0

    x = np.ones(4, np.float32)
    trains_w(x)                                      # w: 1 - 0.1 * x
    trained = np.full(4, 0.9, np.float32)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), trained, rtol=1e-6)
    np.testing.assert_allclose(reads_w(x), trained, rtol=1e-6)          # reads the trained value
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    np.testing.assert_allclose(after["w"], trained, rtol=1e-6)         # its own step leaves w alone
    np.testing.assert_allclose(after["v"], -0.1 * x * trained, rtol=1e-6)   # and trains v
    assert "w-momentum" not in after
    trains_w(x)                                      # still trained where trainable
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), np.full(4, 0.8), rtol=1e-6)


def test_get_all_variables_inside_a_job_body_does_not_trace_again():
    seen = []

    @flow.global_function(type="predict")
    def peeks(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(3.0))
        seen.append(sorted(flow.get_all_variables()))     # while traced: what is declared so far
        return x * w
    np.testing.assert_array_equal(peeks(X), X * 3)
    assert seen == [["w"]]
