"""Jobs called from several threads: first calls, step counters, clearing the session, callbacks that
wait for the pipeline, back-pressure on slow callbacks, and checkpoint saves while another thread trains.

Every test is bounded in time: threads are joined with timeouts, and a test whose threads are stuck
drops the stuck session (`_bounded`) so that the fixture's clear_default_session cannot hang the suite.
"""
from __future__ import annotations

import atexit
import threading
import time

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.runtime import session as session_module
from flowc.runtime.session import default_session

TIMEOUT = 60.0
N, D = 8, 16


def _drop_stuck_session() -> None:
    """Forget the default session without draining it: its threads are stuck, and draining (at the
    fixture's clear or at exit) would wait for them forever."""
    stuck, session_module._default = session_module._default, None
    pipeline = getattr(stuck, "_pipeline", None)
    if pipeline is not None:
        atexit.unregister(pipeline._atexit)


def _bounded(workers: list[threading.Thread], timeout: float = TIMEOUT) -> None:
    """Start `workers` (daemon threads) and join them; fail, leaving nothing that can hang, if one is
    still running after `timeout` seconds."""
    for w in workers:
        w.daemon = True
        w.start()
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    stuck = [w.name for w in workers if w.is_alive()]
    if stuck:
        _drop_stuck_session()
        pytest.fail(f"threads still running after {timeout:.0f} s (deadlocked?): {stuck}")


def _thread(target, errors: list, name: str) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException as err:        # reported by the test, not lost on the thread
            errors.append(err)
    return threading.Thread(target=run, name=name)


@flow.global_function(type="predict")
def shifted(x: tp.Numpy.Placeholder((N, D))) -> tp.Numpy:
    offset = flow.get_variable("thr-offset", shape=(D,), initializer=flow.constant_initializer(1.0))
    return x * 2.0 + offset


@flow.global_function(type="predict")
def shifted_async(x: tp.Numpy.Placeholder((N, D))) -> tp.Callback[tp.Numpy]:
    offset = flow.get_variable("thr-offset", shape=(D,), initializer=flow.constant_initializer(1.0))
    return x * 2.0 + offset


def _input(k: int) -> np.ndarray:
    return np.full((N, D), float(k), dtype=np.float32) + np.arange(D, dtype=np.float32)


def _expected(k: int) -> np.ndarray:
    return _input(k) * 2.0 + 1.0


# ---------------------------------------------------------------------------------------------
# First calls at once
# ---------------------------------------------------------------------------------------------
def _first_calls_at_once(threads: int) -> None:
    start = threading.Barrier(threads)
    errors: list = []
    wrong: list = []

    def caller(k: int) -> None:
        start.wait(TIMEOUT)
        for _ in range(20):
            got = shifted(_input(k))
            if not np.array_equal(got, _expected(k)):
                wrong.append((k, float(got[0, 0])))
    _bounded([_thread(lambda k=k: caller(k), errors, f"caller-{k}") for k in range(threads)])
    assert not errors, errors
    assert not wrong, f"threads got other threads' results (thread, first value): {wrong[:5]}"


def test_threads_making_their_first_calls_at_once_get_their_own_results():
    for _round in range(3):             # a fresh session each round: every call below is a first call
        flow.clear_default_session()
        _first_calls_at_once(8)
    assert len([job for job in default_session().jobs if job is shifted]) == 1


# ---------------------------------------------------------------------------------------------
# The step counter
# ---------------------------------------------------------------------------------------------
def _adam_train(x):
    w = flow.get_variable("thr-w", shape=(D,), initializer=flow.constant_initializer(0.5))
    loss = flow.math.reduce_sum((x * w - 1.0) * (x * w - 1.0))
    # The learning rate changes at steps 7 and 20, and bias correction uses every step number:
    # a lost or repeated count changes the weights.
    flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([7, 20], [0.01, 0.005, 0.002]),
                        do_bias_correction=True).minimize(loss)
    return loss


@flow.global_function(type="train")
def adam_train(x: tp.Numpy.Placeholder((N, D))) -> tp.Numpy:
    return _adam_train(x)


NARROW = flow.function_config()
NARROW.concurrency_width(2)       # callers wait for room, with the step counter read or not


@flow.global_function(type="train", function_config=NARROW)
def adam_train_async(x: tp.Numpy.Placeholder((N, D))) -> tp.Callback[tp.Numpy]:
    return _adam_train(x)


def _adam_state() -> dict[str, np.ndarray]:
    s = default_session()
    return {name: s.value(name).copy() for name in ("thr-w", "thr-w-m", "thr-w-v")}


@pytest.mark.parametrize("job", [adam_train, adam_train_async], ids=["sync", "async"])
def test_step_counter_and_adam_state_are_exact_under_threads(job):
    x = np.linspace(0.1, 1.0, N * D, dtype=np.float32).reshape(N, D)
    threads, calls = 6, 15

    def call() -> None:
        result = job(x)
        if job is adam_train_async:
            result(lambda loss: None)
    for _ in range(1 + threads * calls):
        call()
    flow.sync_default_session()
    serial = _adam_state()
    flow.clear_default_session()
    call()              # ready before the threads start: what they race on is the counter only

    start = threading.Barrier(threads)
    errors: list = []

    def trainer() -> None:
        start.wait(TIMEOUT)
        for _ in range(calls):
            call()
    _bounded([_thread(trainer, errors, f"trainer-{k}") for k in range(threads)])
    assert not errors, errors
    flow.sync_default_session()
    assert default_session().train_steps[job.__name__] == 1 + threads * calls
    # Every call fed the same batch, so only the step numbers can tell the runs apart.
    for name, value in _adam_state().items():
        np.testing.assert_array_equal(value, serial[name], err_msg=name)


# ---------------------------------------------------------------------------------------------
# Clearing the session while other threads call
# ---------------------------------------------------------------------------------------------
def test_clear_default_session_while_threads_call_jobs():
    """Calls made before a clear finish in the old session (callbacks included); calls after it
    run in the new one; nothing fails and nothing hangs."""
    stop = threading.Event()
    errors: list = []
    wrong: list = []
    made = [0, 0]
    delivered = [0]
    lock = threading.Lock()

    def sync_caller() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            got = shifted(_input(k))
            if not np.array_equal(got, _expected(k)):
                wrong.append(k)
            with lock:
                made[0] += 1

    def async_caller() -> None:
        k = 0
        while not stop.is_set():
            k += 1

            def check(got, k=k) -> None:
                if not np.array_equal(got, _expected(k)):
                    wrong.append(-k)
                with lock:
                    delivered[0] += 1
            shifted_async(_input(k))(check)
            with lock:
                made[1] += 1

    callers = [_thread(sync_caller, errors, "sync-caller"), _thread(async_caller, errors, "async-caller")]
    clearer_errors: list = []

    def clearer() -> None:
        for _ in range(15):
            time.sleep(0.02)
            flow.clear_default_session()
        stop.set()
    _bounded(callers + [_thread(clearer, clearer_errors, "clearer")])
    assert not errors and not clearer_errors, errors + clearer_errors
    assert not wrong, wrong[:10]
    flow.sync_default_session()
    flow.clear_default_session()
    assert made[0] > 0 and made[1] > 0
    assert delivered[0] == made[1], "every callback of a call made before a clear runs"


def test_a_job_called_again_after_clear_runs_in_the_new_session():
    assert np.array_equal(shifted(_input(1)), _expected(1))
    old = default_session()
    flow.clear_default_session()
    assert np.array_equal(shifted(_input(2)), _expected(2))
    assert shifted._ready.session is default_session() is not old
    assert old.jobs == []


# ---------------------------------------------------------------------------------------------
# Callbacks that wait for the pipeline
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inside", ["sync_default_session", "clear_default_session", "checkpoint.save"])
def test_a_callback_that_waits_for_the_pipeline_raises_instead_of_deadlocking(inside, tmp_path):
    waits = {"sync_default_session": flow.sync_default_session,
             "clear_default_session": flow.clear_default_session,
             "checkpoint.save": lambda: flow.checkpoint.save(tmp_path / "ckpt")}[inside]
    raised: list = []
    errors: list = []

    def callback(result) -> None:
        waits()

    def main() -> None:
        shifted_async(_input(1))(callback)
        try:
            flow.sync_default_session()
        except RuntimeError as err:
            raised.append(err)
    _bounded([_thread(main, errors, "main")], timeout=20)
    assert not errors, errors
    assert len(raised) == 1
    message = str(raised[0])
    assert f"{inside.split('.')[0]}" in message and "inside the callback of job 'shifted_async'" in message
    # The session goes on.
    got: list = []
    shifted_async(_input(3))(got.append)
    flow.sync_default_session()
    assert np.array_equal(got[0], _expected(3))


def test_a_callback_may_call_jobs_even_at_width_one():
    config = flow.function_config()
    config.concurrency_width(1)

    def narrow(x: tp.Numpy.Placeholder((N, D))) -> tp.Callback[tp.Numpy]:
        offset = flow.get_variable("thr-offset", shape=(D,), initializer=flow.constant_initializer(1.0))
        return x * 2.0 + offset
    narrow_job = flow.global_function(type="predict", function_config=config)(narrow)
    inner: list = []
    errors: list = []

    def callback(result) -> None:
        inner.append(("sync", shifted(result)))                   # a synchronous job inside a callback
        narrow_job(_input(5))(lambda r: inner.append(("async", r)))  # and the same job, asynchronously

    def main() -> None:
        for _ in range(3):
            narrow_job(_input(4))(callback)
        flow.sync_default_session()
    _bounded([_thread(main, errors, "main")], timeout=30)
    assert not errors, errors
    assert sorted(kind for kind, _ in inner) == ["async"] * 3 + ["sync"] * 3
    for kind, value in inner:
        np.testing.assert_array_equal(value, _expected(4) * 2.0 + 1.0 if kind == "sync" else _expected(5))


# ---------------------------------------------------------------------------------------------
# Back-pressure: concurrency_width bounds the results waiting for their callbacks
# ---------------------------------------------------------------------------------------------
def test_concurrency_width_bounds_results_waiting_for_a_slow_callback():
    width = 3
    config = flow.function_config()
    config.concurrency_width(width)

    def predict(x: tp.Numpy.Placeholder((N, D))) -> tp.Callback[tp.Numpy]:
        return x + 1.0
    job = flow.global_function(type="predict", function_config=config)(predict)
    finished = [0]
    most_outstanding = [0]
    errors: list = []

    def slow(result) -> None:
        time.sleep(0.01)
        finished[0] += 1                  # before the pipeline lets the call go

    def main() -> None:
        for made in range(1, 41):
            job(_input(made))(slow)
            most_outstanding[0] = max(most_outstanding[0], made - finished[0])
        flow.sync_default_session()
    _bounded([_thread(main, errors, "main")])
    assert not errors, errors
    assert finished[0] == 40
    assert most_outstanding[0] <= width, f"{most_outstanding[0]} results waited for callbacks"


def test_undecided_results_do_not_block_later_calls():
    """Futures and registrars the caller holds without deciding do not take the room it waits for."""
    config = flow.function_config()
    config.concurrency_width(2)

    def old_style(x: tp.Numpy.Placeholder((N, D))):          # no return annotation: the old API
        return x + 1.0

    def registrar_style(x: tp.Numpy.Placeholder((N, D))) -> tp.Callback[tp.Numpy]:
        return x + 1.0
    old_job = flow.global_function(type="predict", function_config=config)(old_style)
    callback_job = flow.global_function(type="predict", function_config=config)(registrar_style)
    errors: list = []
    values: list = []
    delivered: list = []

    def main() -> None:
        futures = [old_job(_input(k)) for k in range(6)]             # none decided yet
        values.extend(f.get().numpy() for f in futures)
        registrars = [callback_job(_input(k)) for k in range(6)]     # no callback registered yet
        for k, register in enumerate(registrars):
            register(lambda out, k=k: delivered.append((k, out)))
        flow.sync_default_session()
    _bounded([_thread(main, errors, "main")], timeout=30)
    assert not errors, errors
    for k, v in enumerate(values):
        np.testing.assert_array_equal(v, _input(k) + 1.0)
    assert [k for k, _ in delivered] == list(range(6))
    for k, v in delivered:
        np.testing.assert_array_equal(v, _input(k) + 1.0)


# ---------------------------------------------------------------------------------------------
# Checkpoint saves while another thread trains
# ---------------------------------------------------------------------------------------------
TWIN = 1 << 18       # 1 MB per variable: a save takes long enough to overlap many steps


@flow.global_function(type="train")
def twin_step(x: tp.Numpy.Placeholder((TWIN,))) -> tp.Numpy:
    # Both variables take the same gradient (x) every step: a consistent cut has a == b == -steps.
    a = flow.get_variable("twin-a", shape=(TWIN,), initializer=flow.zeros_initializer())
    b = flow.get_variable("twin-b", shape=(TWIN,), initializer=flow.zeros_initializer())
    loss = flow.math.reduce_sum(a * x) + flow.math.reduce_sum(b * x)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
    return loss


def test_checkpoint_saved_while_another_thread_trains_is_one_consistent_cut(tmp_path):
    ones = np.ones(TWIN, dtype=np.float32)
    twin_step(ones)
    stop = threading.Event()
    errors: list = []

    def trainer() -> None:
        while not stop.is_set():
            twin_step(ones)

    def saver() -> None:
        try:
            for i in range(6):
                flow.checkpoint.save(tmp_path / f"cut-{i}")
        finally:
            stop.set()
    _bounded([_thread(trainer, errors, "trainer"), _thread(saver, errors, "saver")])
    assert not errors, errors
    for i in range(6):
        saved = flow.checkpoint.get(tmp_path / f"cut-{i}")
        steps = int(saved["System-Train-TrainStep-twin_step"].numpy())
        a, b = saved["twin-a"].numpy(), saved["twin-b"].numpy()
        assert a.min() == a.max() == b.min() == b.max() == -steps, \
            f"snapshot {i}: a in [{a.min()}, {a.max()}], b in [{b.min()}, {b.max()}], step counter {steps}"


def test_variables_loaded_while_another_thread_trains_are_one_consistent_cut():
    """A load writes every variable and the step counter while no step runs: a step never sees
    one twin loaded and the other not, so after any interleaving a == b == -(steps counted)."""
    ones = np.ones(TWIN, dtype=np.float32)
    twin_step(ones)
    stop = threading.Event()
    errors: list = []
    fresh = {"twin-a": np.zeros(TWIN, np.float32), "twin-b": np.zeros(TWIN, np.float32),
             "System-Train-TrainStep-twin_step": np.array(0, np.int64)}

    def trainer() -> None:
        while not stop.is_set():
            twin_step(ones)

    def loader() -> None:
        try:
            for _ in range(30):
                flow.load_variables(fresh)
        finally:
            stop.set()
    _bounded([_thread(trainer, errors, "trainer"), _thread(loader, errors, "loader")])
    assert not errors, errors
    flow.sync_default_session()
    values = flow.get_all_variables()
    a, b = values["twin-a"].numpy(), values["twin-b"].numpy()
    steps = default_session().train_steps["twin_step"]
    assert a.min() == a.max() == b.min() == b.max() == -steps, \
        f"a in [{a.min()}, {a.max()}], b in [{b.min()}, {b.max()}], step counter {steps}"
