"""`flow.watch` / `flow.watch_diff` (issue 14): values and gradients of any Blob, handed to handlers.

* values of intermediate Blobs (one fused into a matmul epilogue, one whose arena buffer the memory
  plan would reuse), placeholders and variables, converted by the handler's annotation;
* diffs as OneFlow's watcher sees them: seeded with ones, not divided by the loss's instance count;
* handlers run on the callback thread, in call order, before the job's callback, for synchronous,
  `tp.Callback` and old-API calls; their exceptions surface like a callback's;
* `watch_diff` in a predict job or on a Blob without a gradient: never called, with a warning;
* a watched job differs from the unwatched one only by the watched results.
"""
from __future__ import annotations

import re
import threading
import warnings

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.build import build_job_graph
from flowc.compiler.pipeline import lower
from flowc.runtime.session import Session

LR = 0.1
X = (np.arange(12, dtype=np.float32).reshape(4, 3) - 4) / 3
W1 = np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)
W2 = np.linspace(1, -0.5, 10, dtype=np.float32).reshape(5, 2)


class Recorder:
    """Handlers that record (name, value, thread) in the order they are called."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object, str]] = []

    def numpy(self, name: str):
        def handler(value: tp.Numpy) -> None:
            self.seen.append((name, np.array(value, copy=True), threading.current_thread().name))
        return handler

    def list_numpy(self, name: str):
        def handler(value: tp.ListNumpy) -> None:
            self.seen.append((name, [np.array(v, copy=True) for v in value], threading.current_thread().name))
        return handler

    def plain(self, name: str):
        def handler(value) -> None:
            self.seen.append((name, value, threading.current_thread().name))
        return handler

    def names(self) -> list[str]:
        return [s[0] for s in self.seen]

    def value(self, name: str):
        return next(v for n, v, _ in self.seen if n == name)


def _forward(x, w1, w2):
    h = x @ w1
    r = np.maximum(h, 0)
    y = r @ w2
    return h, r, y


def make_train_job(rec: Recorder, name: str = "watched_train", result=tp.Numpy):
    def job(x: tp.Numpy.Placeholder((4, 3))):
        w1 = flow.get_variable("w1", shape=(3, 5), initializer=flow.constant_initializer(0.0))
        w2 = flow.get_variable("w2", shape=(5, 2), initializer=flow.constant_initializer(0.0))
        h = flow.matmul(x, w1)                    # fused with relu: stored only because it is watched
        r = flow.nn.relu(h)
        y = flow.matmul(r, w2)
        loss = y * y
        flow.watch(h, rec.numpy("h"))
        flow.watch_diff(h, rec.numpy("dh"))
        flow.watch(w1, rec.plain("w1"))           # unannotated: a LocalBlob, as in OneFlow
        flow.watch_diff(w1, rec.list_numpy("dw1"))
        flow.watch(x, rec.numpy("x"))
        flow.watch_diff(loss, rec.numpy("dloss"))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss
    job.__name__ = name
    job.__annotations__["return"] = result
    return flow.global_function(type="train")(job)


def _set_weights():
    from flowc.runtime.session import default_session
    default_session().value("w1")[...] = W1
    default_session().value("w2")[...] = W2


def _expected(w1, w2):
    """Watched values and diffs of one step, and the weights after it (float64)."""
    x = X.astype(np.float64)
    h, r, y = _forward(x, w1, w2)
    dloss = np.ones_like(y)
    dy = 2 * y * dloss
    dr = dy @ w2.T
    dh = dr * (h > 0)
    dw1 = x.T @ dh
    dw2 = r.T @ dy
    n = y.size
    return {"h": h, "dh": dh, "w1": w1, "dw1": dw1, "x": x, "dloss": dloss}, w1 - LR * dw1 / n, w2 - LR * dw2 / n


def test_sync_train_calls_hand_values_and_diffs_to_the_handlers_on_the_callback_thread():
    rec = Recorder()
    job = make_train_job(rec)
    job(X)
    _set_weights()
    rec.seen.clear()
    w1, w2 = W1.astype(np.float64), W2.astype(np.float64)
    for step in range(2):
        job(X)
        # the handlers have run when a synchronous call returns
        assert rec.names() == ["h", "dh", "w1", "dw1", "x", "dloss"] * (step + 1)
        want, w1, w2 = _expected(w1, w2)
        latest = rec.seen[-6:]
        for name, value, thread in latest:
            assert thread != threading.main_thread().name and "callbacks" in thread, thread
            if name == "w1":
                assert isinstance(value, flow_local_blob())
                value = value.numpy()
            if name == "dw1":
                assert isinstance(value, list) and len(value) == 1
                value = value[0]
            np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step}")
    flow.sync_default_session()
    from flowc.runtime.session import default_session
    np.testing.assert_allclose(default_session().value("w1"), w1, rtol=1e-5, atol=1e-6)


def flow_local_blob():
    from flowc.runtime.futures import LocalBlob
    return LocalBlob


def test_async_calls_run_handlers_in_call_order_before_the_job_callback():
    rec = Recorder()
    job = make_train_job(rec, "watched_async", tp.Callback[tp.Numpy])
    order: list[str] = []
    job(X)(lambda loss: order.append("warmup"))
    flow.sync_default_session()
    rec.seen.clear()

    def record_loss(i):
        def cb(loss: np.ndarray) -> None:
            order.append(f"callback {i}")
            rec.seen.append((f"callback {i}", loss, threading.current_thread().name))
        return cb
    for i in range(3):
        job(X)(record_loss(i))
    flow.sync_default_session()
    names = rec.names()
    assert names == sum([["h", "dh", "w1", "dw1", "x", "dloss", f"callback {i}"] for i in range(3)], [])
    assert len({thread for _, _, thread in rec.seen}) == 1


def test_old_api_get_waits_for_the_handlers():
    rec = Recorder()

    @flow.global_function()
    def old_api(x: tp.Numpy.Placeholder((4, 3))):
        y = flow.nn.relu(x) * 2.0
        flow.watch(y, rec.plain("y"))
        return y
    result = old_api(X).get()
    assert rec.names() == ["y"]
    np.testing.assert_allclose(rec.value("y").numpy(), result.numpy())


def test_predict_jobs_watch_values_and_skip_diffs_with_a_warning():
    rec = Recorder()

    def predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w_predict_watch", shape=(3, 2), initializer=flow.ones_initializer())
        y = flow.matmul(x, w)
        flow.watch(w, rec.numpy("w"))
        flow.watch(x, rec.numpy("x"))
        flow.watch_diff(y, rec.numpy("dy"))
        t = y * 2.0                               # inside the fused loop (and the matmul's epilogue)
        flow.watch(t, rec.numpy("t"))
        s = flow.math.reduce_sum(t, axis=[1])     # a reduction whose result feeds a pointwise op
        flow.watch(s, rec.numpy("s"))
        return flow.nn.relu(t + 1.0) + flow.reshape(s, (4, 1))
    job = flow.global_function(type="predict")(predict)
    with pytest.warns(UserWarning, match=r"test_watch.py:\d+: flow.watch_diff: job 'predict' is a predict job"):
        out = job(X)
    assert rec.names() == ["w", "x", "t", "s"]
    y = X.astype(np.float64) @ np.ones((3, 2))
    np.testing.assert_allclose(rec.value("t"), 2 * y, rtol=1e-6)
    np.testing.assert_allclose(rec.value("s"), (2 * y).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(out, np.maximum(2 * y + 1, 0) + (2 * y).sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(rec.value("w"), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(rec.value("x"), X)


def test_watch_diff_on_a_blob_without_a_gradient_warns_and_is_never_called():
    rec = Recorder()

    @flow.global_function(type="train")
    def no_grad(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w_nograd", shape=(4, 3), initializer=flow.ones_initializer())
        flow.watch_diff(x, rec.numpy("dx"))       # a placeholder: no diff in OneFlow either
        loss = x * w
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss
    with pytest.warns(UserWarning, match="does not depend on it through a trainable variable"):
        no_grad(X)
    assert rec.seen == []


def test_a_handler_error_is_raised_by_the_sync_call_and_async_errors_by_the_next_sync_point():
    def broken(value: tp.Numpy) -> None:
        raise ValueError("handler broke")

    @flow.global_function()
    def sync_job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        flow.watch(x * 2.0, broken)
        return x
    with pytest.raises(ValueError, match="handler broke"):
        sync_job(X)
    flow.sync_default_session()                    # raised once: nothing left pending

    @flow.global_function()
    def async_job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Callback[tp.Numpy]:
        flow.watch(x * 2.0, broken)
        return x
    got = []
    async_job(X)(got.append)
    with pytest.raises(ValueError, match="handler broke"):
        flow.sync_default_session()
    assert len(got) == 1                           # the job's callback still ran


def test_a_prompt_prints_the_value(capsys):
    @flow.global_function()
    def printed(x: tp.Numpy.Placeholder((2,))) -> None:
        flow.watch(x + 1.0, "x plus one:")
    printed(np.array([1, 2], np.float32))
    out = capsys.readouterr().out
    assert "x plus one:" in out and "[2. 3.]" in out


@pytest.mark.parametrize("handler, message", [
    (lambda a, b: None, "the handler must take exactly one argument"),
    (42, "handler_or_prompt must be a function"),
    (lambda value: None, None),
    (print, None),
])
def test_handlers_are_checked_where_the_job_watches(handler, message):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x, handler)
        return x
    if message is None:
        np.testing.assert_array_equal(job(np.zeros(2, np.float32)), np.zeros(2, np.float32))
        return
    with pytest.raises(flow.TraceError, match=rf"test_watch.py:\d+: flow.watch: {message}"):
        job(np.zeros(2, np.float32))


def test_an_unsupported_annotation_is_refused():
    def bad(value: tp.Callback[tp.Numpy]) -> None: ...

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x, bad)
        return x
    with pytest.raises(flow.TraceError, match="tp.Numpy, tp.ListNumpy or no annotation"):
        job(np.zeros(2, np.float32))


def test_watch_outside_a_job_is_a_clear_error():
    with pytest.raises(flow.TraceError, match="flow.watch can only be used inside"):
        flow.watch(None, print)


def test_a_watched_job_differs_from_the_unwatched_one_only_by_the_watched_results():
    """Without its watched results the watched job's step is the unwatched job's, byte for byte; with
    them, fusion is unchanged (the watched matmul keeps its relu epilogue, which now stores it too)."""
    from flowc.compiler.ir import Graph
    from flowc.compiler.pipeline import generate
    rec = Recorder()
    watched = make_train_job(rec, "compare")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph_w = build_job_graph("compare", "train", watched.fn, watched.placeholders, watched.result_spec,
                                  Session(), watched.config).graph

    def plain(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w1 = flow.get_variable("w1", shape=(3, 5), initializer=flow.constant_initializer(0.0))
        w2 = flow.get_variable("w2", shape=(5, 2), initializer=flow.constant_initializer(0.0))
        y = flow.matmul(flow.nn.relu(flow.matmul(x, w1)), w2)
        loss = y * y
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss
    unwatched = flow.global_function(type="train")(plain)
    graph_u = build_job_graph("compare", "train", plain, unwatched.placeholders, unwatched.result_spec,
                              Session(), unwatched.config).graph
    assert len(graph_w.outputs) == len(graph_u.outputs) + 6
    stripped = Graph(graph_w.name, list(graph_w.nodes), graph_w.outputs[:len(graph_u.outputs)],
                     dict(graph_w.assigns), dict(graph_w.variables), dict(graph_w.scalars),
                     list(graph_w.placeholders))
    def source(graph) -> str:               # the two jobs are written on different lines
        return re.sub(r"test_watch\.py:\d+", "test_watch.py", generate(lower(graph)).source)
    assert source(stripped) == source(graph_u)

    pu, pw = lower(graph_u), lower(graph_w)
    h = next(n.id for n in pw.graph.nodes if n.op == "matmul" and n.role == "forward"
             and pw.graph.node(n.inputs[0]).op == "input")
    kernel = next(k for k in pw.kernels if h in k.nodes())
    assert kernel.kind == "matmul" and [pw.graph.node(m).op for m in kernel.members] == ["relu"]
    assert pw.memory.storage[h].kind == "arena" and pw.memory.storage[h].last == len(pw.kernels)
    ops_u = sorted(n.op for n in pu.graph.nodes)
    ops_w = sorted(n.op for n in pw.graph.nodes)
    for op in set(ops_u) | set(ops_w):          # extra: the diffs' rescaling and w1's snapshot
        extra = ops_w.count(op) - ops_u.count(op)
        assert extra == 0 or op in ("multiply", "constant", "snapshot"), (op, extra)


def test_a_watched_sync_call_inside_a_callback_runs_its_handlers_there():
    rec = Recorder()

    @flow.global_function()
    def inner(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x * 3.0, rec.numpy("inner"))
        return x

    @flow.global_function()
    def outer(x: tp.Numpy.Placeholder((2,))) -> tp.Callback[tp.Numpy]:
        return x + 1.0
    seen_after_call = []

    def callback(value: np.ndarray) -> None:
        inner(value)
        seen_after_call.append(list(rec.names()))
    outer(np.array([1, 2], np.float32))(callback)
    flow.sync_default_session()
    assert seen_after_call == [["inner"]]
    np.testing.assert_array_equal(rec.value("inner"), [6, 9])
    assert rec.seen[0][2] != threading.main_thread().name


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_watched_diffs_carry_the_loss_scale_as_in_oneflow(policy):
    """OneFlow seeds the backward pass with the loss scale, so a watcher sees the scaled diff; the
    update itself is unscaled (the same variables as without a scale)."""
    seen = []

    def grad(value: tp.Numpy) -> None:
        seen.append(np.array(value, copy=True))

    scale = {"static": flow.optimizer.loss_scale.static_loss_scale(8.0),
             "dynamic": flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=8.0)}[policy]

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("w_scaled", shape=(3,), initializer=flow.ones_initializer())
        y = x * w
        loss = flow.math.reduce_sum(y * y, axis=1)
        flow.watch_diff(y, grad)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0,
                           loss_scale_policy=scale).minimize(loss)
        return loss

    job(X)
    flow.sync_default_session()
    # d(sum of the 4 losses)/dy = 2y, times the loss scale
    np.testing.assert_allclose(seen[0], 8.0 * 2 * X, rtol=1e-5)
    want_w = 1.0 - 0.01 * (2 * X * X).sum(0) / 4
    np.testing.assert_allclose(flow.get_all_variables()["w_scaled"].numpy(), want_w, rtol=1e-5)
