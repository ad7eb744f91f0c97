"""What the runtime waits for, and what it must not wait for: results nobody has decided on yet,
the watch handlers behind them, callbacks registered late, errors of earlier calls, the calls in
flight at exit and across fork.  Each test failed (a hang, a lost result or a wrong error) before
runtime/pipeline.py parked undecided results and drained at exit as it now does."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import flow
import flow.typing as tp
from tests.bounded_wait import within

ROOT = pathlib.Path(__file__).resolve().parent.parent
X = np.ones(4, np.float32)
seen: list = []


def show(value: tp.Numpy) -> None:
    seen.append(("watch", float(value[0])))


@flow.global_function()
def old_job(x: tp.Numpy.Placeholder((4,))):          # the old API: a future
    return x * 2.0


@flow.global_function()
def old_watched(x: tp.Numpy.Placeholder((4,))):
    y = x + 1.0
    flow.watch(y, show)
    return y


@flow.global_function()
def sync_watched(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
    y = x + 1.0
    flow.watch(y, show)
    return y


@flow.global_function()
def async_job(x: tp.Numpy.Placeholder((4,))) -> tp.Callback[tp.Numpy]:
    return x * 3.0


@flow.global_function()
def failing(x: tp.Numpy.Placeholder((4,)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)):
    return flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.reshape(x, (4, 1)) * 1.0)


@pytest.fixture(autouse=True)
def fresh():
    seen.clear()
    yield
    flow.sync_default_session()


def test_a_watched_call_does_not_wait_for_an_earlier_result_nobody_took():
    held = old_job(X)                       # its callback slot blocks the callback thread
    np.testing.assert_array_equal(within(lambda: sync_watched(X)), X + 1.0)
    np.testing.assert_array_equal(within(lambda: old_watched(X).get().numpy()), X + 1.0)
    assert seen == [("watch", 2.0), ("watch", 2.0)]
    np.testing.assert_array_equal(held.get().numpy(), X * 2.0)


def test_get_of_a_watched_old_api_call_inside_a_callback_returns():
    got: list = []
    async_job(X)(lambda v: got.append(old_watched(v).get().numpy()))
    within(flow.sync_default_session)
    np.testing.assert_array_equal(got[0], X * 3.0 + 1.0)
    assert seen == [("watch", 4.0)]          # its handler ran after that callback returned


def test_get_that_raises_an_earlier_error_keeps_its_own_result():
    def broken(value):
        time.sleep(0.3)         # still running when the later step is done: .get() waits for it
        raise ValueError("an earlier callback failed")
    async_job(X)(broken)
    future = old_job(X)
    with pytest.raises(ValueError, match="an earlier callback failed"):
        future.get()
    np.testing.assert_array_equal(future.get().numpy(), X * 2.0)     # not lost, and no "already called"


def test_get_that_raises_an_earlier_error_keeps_its_own_error():
    def broken(value):
        raise ValueError("an earlier callback failed")
    async_job(X)(broken)
    future = failing(X, np.full(4, 7, np.int32))          # a label out of range
    with pytest.raises(ValueError, match="an earlier callback failed"):
        future.get()
    with pytest.raises(flow.StepError, match="out of range"):
        future.get()


def test_a_sync_point_waits_for_the_calls_a_late_callback_makes():
    log: list = []

    def inner(value):
        time.sleep(0.2)
        log.append("inner")

    def late(value):
        time.sleep(0.2)
        async_job(X)(inner)
        log.append("late")
    future = old_job(X)
    within(flow.sync_default_session)        # passes over the undecided result
    future.async_get(late)
    within(flow.sync_default_session)
    assert log == ["late", "inner"]


def test_sync_inside_a_late_callback_is_refused_naming_its_job():
    errors: list = []

    def late(value):
        try:
            flow.sync_default_session()
        except RuntimeError as err:
            errors.append(str(err))
    future = old_job(X)
    within(flow.sync_default_session)
    future.async_get(late)
    within(flow.sync_default_session)
    assert "inside the callback of job 'old_job'" in errors[0]


@pytest.mark.parametrize("what, call", [
    ("flow.get_all_variables()", lambda: flow.get_all_variables()),
    ("loading variables", lambda: flow.load_variables({})),
])
def test_waiting_calls_inside_a_callback_name_themselves(what, call):
    errors: list = []

    def cb(value):
        try:
            call()
        except RuntimeError as err:
            errors.append(str(err))
    async_job(X)(cb)
    within(flow.sync_default_session)
    assert errors and errors[0].startswith(what)


def test_callbacks_registered_after_the_session_was_cleared_run_at_once():
    registrar, future = async_job(X), old_job(X)
    within(flow.clear_default_session)
    got: list = []
    registrar(lambda v: got.append(v))
    future.async_get(lambda blob: got.append(blob.numpy()))
    np.testing.assert_array_equal(got[0], X * 3.0)
    np.testing.assert_array_equal(got[1], X * 2.0)


def run(script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


PRELUDE = """
    import os, sys, threading, time, atexit
    import numpy as np
    import flow
    import flow.typing as tp

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Callback[tp.Numpy]:
        return x * 3.0

    @flow.global_function()
    def now(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x * 2.0
    X = np.ones(4, np.float32)
"""


@pytest.mark.slow
def test_exit_is_not_held_back_by_a_daemon_thread_that_keeps_calling():
    proc = run(PRELUDE + """
    def loop():
        while True:
            job(X)(lambda v: time.sleep(0.01))
    threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.5)
    print("main done", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "main done" in proc.stdout
    assert "the interpreter is exiting" in proc.stderr     # what the daemon thread's late call was told


@pytest.mark.slow
def test_an_exit_handler_registered_before_the_first_call_can_call_jobs():
    proc = run(PRELUDE + """
    atexit.register(lambda: print("final", now(X).tolist(), flush=True))
    job(X)(lambda v: print("callback", v.tolist(), flush=True))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["callback [3.0, 3.0, 3.0, 3.0]", "final [2.0, 2.0, 2.0, 2.0]"]


@pytest.mark.slow
def test_a_child_forked_inside_a_callback_syncs_its_own_calls():
    proc = run(PRELUDE + """
    def cb(value):
        pid = os.fork()
        if pid == 0:
            out = []
            job(X)(lambda v: out.append("child callback"))
            flow.sync_default_session()        # the child runs no callback: no refusal
            print(f"child: {out}", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    job(X)(cb)
    flow.sync_default_session()
    print("parent done", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "child: ['child callback']" in proc.stdout and "parent done" in proc.stdout


@pytest.mark.slow
def test_a_callback_registered_in_a_child_on_a_parents_call_is_refused():
    proc = run(PRELUDE + """
    registrar = job(X)
    pid = os.fork()
    if pid == 0:
        try:
            registrar(lambda v: print("ran in the child", flush=True))
        except RuntimeError as err:
            print(f"child refused: {err}", flush=True)     # one write: the parent prints meanwhile
        os._exit(0)
    registrar(lambda v: print("parent callback", flush=True))
    os.waitpid(pid, 0)
    flow.sync_default_session()
    """)
    assert proc.returncode == 0, proc.stderr
    assert "child refused: job 'job': this call was in flight when the process forked" in proc.stdout
    assert "ran in the child" not in proc.stdout and "parent callback" in proc.stdout
