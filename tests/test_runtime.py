"""The actor runtime: asynchronous calls, ordering, back-pressure, errors, shutdown, the old API."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Tuple

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.runtime.session import default_session
from tests.bounded_wait import within

ROOT = pathlib.Path(__file__).resolve().parent.parent
N, IN, OUT = 16, 32, 4


def model(x):
    hidden = flow.layers.dense(x, 64, activation=flow.nn.relu,
                               kernel_initializer=flow.truncated_normal(0.1, seed=1), name="rt-hidden")
    return flow.layers.dense(hidden, OUT, kernel_initializer=flow.truncated_normal(0.1, seed=2), name="rt-out")


def make_train(name: str, result_annotation, depth: int = 3):
    config = flow.function_config()
    config.concurrency_width(depth)

    def train(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N,), dtype=flow.int32)):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss
    train.__name__ = name
    train.__annotations__["return"] = result_annotation
    return flow.global_function(type="train", function_config=config)(train)


sync_train = make_train("sync_train", tp.Numpy)
async_train = make_train("async_train", tp.Callback[tp.Numpy])
deep_train = make_train("deep_train", tp.Callback[tp.Numpy], depth=2)


def _old_train(x: tp.Numpy.Placeholder((N, IN)), y: tp.Numpy.Placeholder((N,), dtype=flow.int32)):
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss


old_train = flow.global_function(type="train")(_old_train)     # no return annotation: the old API


@flow.global_function(type="predict")
def sync_predict(x: tp.Numpy.Placeholder((N, IN))) -> tp.Numpy:
    return model(x)


@flow.global_function(type="predict")
def async_predict(x: tp.Numpy.Placeholder((N, IN))) -> tp.Callback[tp.Numpy]:
    return model(x)


@flow.global_function(type="predict")
def async_pair(x: tp.Numpy.Placeholder((N, IN)),
               y: tp.Numpy.Placeholder((N,), dtype=flow.int32)) -> tp.Callback[Tuple[tp.Numpy, tp.Numpy]]:
    return y, model(x)


rng = np.random.default_rng(7)
BATCHES = [(rng.standard_normal((N, IN)).astype(np.float32), rng.integers(0, OUT, N).astype(np.int32))
           for _ in range(10)]


def weights():
    s = default_session()
    return {k: s.value(k).copy() for k in ("rt-hidden-weight", "rt-hidden-bias", "rt-out-weight", "rt-out-bias")}


def test_async_training_is_bit_identical_to_sync():
    for i in range(200):
        sync_train(*BATCHES[i % 10])
    sync_weights = weights()
    flow.clear_default_session()
    losses = []
    for i in range(200):
        async_train(*BATCHES[i % 10])(losses.append)
    flow.sync_default_session()
    assert len(losses) == 200
    for name, value in weights().items():
        np.testing.assert_array_equal(value, sync_weights[name], err_msg=name)


def test_thousand_interleaved_calls_keep_call_order():
    seen, predictions, expected_calls = [], [], []
    for i in range(1000):
        x, y = BATCHES[i % 10]
        if i % 3 == 0:
            async_predict(x)(lambda out, i=i: (seen.append(i), predictions.append((i, out))))
        else:
            async_train(x, y)(lambda loss, i=i: seen.append(i))
        expected_calls.append(i)
    flow.sync_default_session()
    assert seen == expected_calls
    # A synchronous replay from the same initial weights gives the same predictions.
    flow.clear_default_session()
    replay = {}
    for i in range(1000):
        x, y = BATCHES[i % 10]
        if i % 3 == 0:
            replay[i] = sync_predict(x)
        else:
            sync_train(x, y)
    for i, out in predictions:
        np.testing.assert_array_equal(out, replay[i])


def test_pipeline_never_holds_more_than_its_depth():
    def slow(loss):
        time.sleep(0.002)
    for i in range(60):
        deep_train(*BATCHES[i % 10])(slow)
        assert deep_train.register.in_flight <= 2
    flow.sync_default_session()
    assert deep_train.register.max_in_flight <= 2
    assert deep_train.register.capacity == 2


def test_calls_block_when_the_pipeline_is_full():
    """With the compute actor held up, the (depth+1)-th call waits for a free slot."""
    first = threading.Event()
    release = threading.Event()

    def hold(loss):
        first.set()
        release.wait(5)
    deep_train(*BATCHES[0])(hold)
    first.wait(5)
    done = []

    def caller():
        for i in range(3):        # depth 2: one of these must wait (the callback actor holds nothing)
            deep_train(*BATCHES[i])(lambda loss: None)
        done.append(True)
    t = threading.Thread(target=caller)
    t.start()
    t.join(2)
    release.set()
    t.join(5)
    flow.sync_default_session()
    assert done == [True]
    assert deep_train.register.max_in_flight <= 2


def test_inputs_are_copied_at_call_time():
    x, _ = BATCHES[0]
    expected = sync_predict(x)
    buffer = x.copy()
    results = []
    async_predict(buffer)(results.append)
    buffer[...] = 1e6                     # the caller reuses its array at once
    flow.sync_default_session()
    np.testing.assert_array_equal(results[0], expected)


def test_tuple_result_through_a_callback():
    x, y = BATCHES[1]
    got = []
    async_pair(x, y)(lambda pair: got.append(pair))
    flow.sync_default_session()
    labels, logits = got[0]
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_array_equal(logits, sync_predict(x))


def test_error_in_a_step_is_raised_at_the_next_sync_point_and_the_session_goes_on():
    x, y = BATCHES[0]
    bad = y.copy()
    bad[3] = 99
    async_train(x, bad)(lambda loss: None)
    with pytest.raises(flow.StepError, match="out of range") as info:
        flow.sync_default_session()
    assert any("compute" in str(frame.name) or "executor" in frame.filename
               for frame in __import__("traceback").extract_tb(info.value.__traceback__))
    flow.sync_default_session()           # reported once
    out = []
    async_train(x, y)(out.append)
    flow.sync_default_session()
    assert len(out) == 1 and np.isfinite(out[0]).all()


def test_error_in_a_callback_is_raised_by_the_next_sync_call():
    x, y = BATCHES[0]

    def broken(loss):
        raise ValueError("callback went wrong")
    async_train(x, y)(broken)
    default_session().pipeline.wait_idle()
    with pytest.raises(ValueError, match="callback went wrong") as info:
        sync_train(x, y)
    assert info.value.__traceback__ is not None
    assert "broken" in "".join(__import__("traceback").format_tb(info.value.__traceback__))
    loss = sync_train(x, y)                # the session keeps working
    assert loss.shape == (N,)


def test_bad_callbacks_are_rejected_at_registration():
    x, y = BATCHES[0]
    with pytest.raises(TypeError, match="exactly one argument"):
        async_train(x, y)(lambda a, b: None)
    with pytest.raises(TypeError, match="expected a function"):
        async_train(x, y)(42)
    with pytest.raises(TypeError, match="exactly one argument"):
        async_train(x, y)(lambda: None)
    flow.sync_default_session()


def test_dropped_registrar_does_not_stall_later_callbacks():
    x, y = BATCHES[0]
    async_train(x, y)                      # result ignored
    got = []
    async_train(x, y)(got.append)
    flow.sync_default_session()
    assert len(got) == 1


def test_old_api_get_and_async_get():
    x, y = BATCHES[0]
    result = old_train(x, y).get()
    assert isinstance(result.numpy(), np.ndarray) and result.numpy().shape == (N,)
    assert np.isclose(result.mean(), result.numpy().mean())
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(result.ndarray(), result.numpy())
    got = []
    old_train(x, y).async_get(lambda r: got.append(r.numpy()))
    flow.sync_default_session()
    assert got[0].shape == (N,)
    future = old_train(x, y)
    future.get()
    with pytest.raises(RuntimeError, match="either .get"):
        future.async_get(lambda r: None)
    futures = [old_train(x, y) for _ in range(8)]    # more than the depth, collected afterwards
    assert all(f.get().numpy().shape == (N,) for f in futures)


def test_a_sync_point_does_not_wait_for_an_old_api_result_nobody_took_yet():
    x, y = BATCHES[0]
    held = old_train(x, y)              # neither .get() nor .async_get() yet
    later = []
    async_train(x, y)(later.append)     # its callback waits behind the held result
    within(flow.sync_default_session)
    assert len(later) == 1
    assert held.get().numpy().shape == (N,)     # the result is still there
    late = old_train(x, y)
    within(flow.sync_default_session)
    got = []
    late.async_get(lambda r: got.append(r.numpy()))    # registered after the sync point passed it
    within(flow.sync_default_session)
    assert len(got) == 1 and got[0].shape == (N,)
    registrar = async_train(x, y)       # the same for a callback registered late
    within(flow.sync_default_session)
    registrar(got.append)
    within(flow.sync_default_session)
    assert len(got) == 2


def test_clear_default_session_does_not_wait_for_an_old_api_result_nobody_took():
    x, y = BATCHES[0]
    held = old_train(x, y)
    within(flow.clear_default_session)
    assert held.get().numpy().shape == (N,)


def test_fixed_tensor_def_default_argument():
    with pytest.warns(DeprecationWarning):
        placeholder = flow.FixedTensorDef((3,), dtype=flow.float)

    @flow.global_function()
    def old_style(x=placeholder):
        return x + 1.0
    np.testing.assert_array_equal(old_style(np.zeros(3, np.float32)).get().numpy(), [1.0, 1.0, 1.0])


def test_list_numpy_and_bundle():
    @flow.global_function(type="predict")
    def mirrored(x: tp.ListNumpy.Placeholder((N, IN))) -> tp.ListNumpy:
        return model(x)

    @flow.global_function(type="predict")
    def bundled(x: tp.Numpy.Placeholder((N, IN))) -> tp.Bundle[tp.Numpy]:
        logits = model(x)
        return {"logits": logits, "pair": (logits, logits * 2.0)}

    x, _ = BATCHES[2]
    expected = sync_predict(x)
    out = mirrored([x])
    assert isinstance(out, list) and len(out) == 1
    np.testing.assert_array_equal(out[0], expected)
    with pytest.raises(TypeError, match="list with one"):
        mirrored(x)
    b = bundled(x)
    np.testing.assert_array_equal(b["logits"], expected)
    np.testing.assert_allclose(b["pair"][1], expected * 2.0, rtol=1e-6)


def runtime_threads():
    return [t for t in threading.enumerate() if t.name.startswith("flowc")]


def test_clear_default_session_stops_the_runtime_threads():
    x, y = BATCHES[0]
    for _ in range(5):
        async_train(x, y)(lambda loss: time.sleep(0.001))
    assert runtime_threads()
    flow.clear_default_session()
    assert runtime_threads() == []


EXIT_SCRIPT = """
import sys, time, numpy as np
sys.path.insert(0, "tests")
import test_runtime as t
done = []
def cb(loss):
    time.sleep(0.01)
    done.append(1)
    print("callback", len(done), flush=True)
x, y = t.BATCHES[0]
for _ in range(20):
    t.async_train(x, y)(cb)
print("submitted", flush=True)
"""


def run_script(script: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow
def test_process_exiting_with_work_in_flight_finishes_its_callbacks():
    proc = run_script(EXIT_SCRIPT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert "submitted" in lines
    assert lines[-1] == "callback 20"


CHAIN_SCRIPT = """
import sys, numpy as np
sys.path.insert(0, "tests")
import test_runtime as t
x, y = t.BATCHES[0]
done = []
def cb(loss):
    done.append(1)
    if len(done) < 6:
        t.async_train(x, y)(cb)     # still running when the script's last line has run
    else:
        print("chain", len(done), flush=True)
t.async_train(x, y)(cb)
print("submitted", flush=True)
"""


def test_calls_that_callbacks_make_while_the_process_exits_run():
    proc = run_script(CHAIN_SCRIPT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "chain 6", err
    assert "failed" not in err, err


INTERRUPT_SCRIPT = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1)   # the test asks for every thread's stack when the exit hangs
# A program started from a terminal takes Ctrl-C; one started by a shell in the background inherits
# SIGINT ignored (POSIX), which would make this test hang when the suite runs as a background job.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, "tests")
import test_runtime as t
x, y = t.BATCHES[0]
print("ready", flush=True)
while True:
    t.async_train(x, y)(lambda loss: time.sleep(0.05))
"""


@pytest.mark.slow
def test_ctrl_c_does_not_hang():
    proc = run_script(INTERRUPT_SCRIPT)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        proc.kill()
        _, err = proc.communicate(timeout=20)
        pytest.fail(f"the process did not end within 20 s of Ctrl-C; its threads:\n{err[-6000:]}")
    assert proc.returncode is not None


@flow.global_function(type="predict")
def reshaped_input(x: tp.Numpy.Placeholder((4, 6))) -> Tuple[tp.Numpy, tp.Numpy]:
    return flow.reshape(x, [24]), x * 2.0


def test_synchronous_calls_read_the_callers_arrays_without_changing_or_returning_them():
    # An idle pipeline runs a synchronous call on the caller's thread, reading its arrays in place;
    # a result that is a view of a placeholder must still be a fresh copy, never the caller's array.
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    before = x.copy()
    flat, doubled = reshaped_input(x)
    np.testing.assert_array_equal(flat, before.ravel())
    np.testing.assert_array_equal(doubled, before * 2)
    assert not np.shares_memory(flat, x) and not np.shares_memory(doubled, x)
    np.testing.assert_array_equal(x, before)
    flat[:] = -1                                        # the results are the caller's to change
    np.testing.assert_array_equal(reshaped_input(x)[0], before.ravel())
    # non-contiguous and float64 inputs take the copying path and give the same values
    wide = np.zeros((4, 12), np.float64)
    wide[:, ::2] = before
    np.testing.assert_array_equal(reshaped_input(wide[:, ::2])[1], before * 2)
