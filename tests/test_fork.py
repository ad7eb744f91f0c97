"""A process forked after training (multiprocessing's default on Linux) runs jobs without hanging.

Run in a subprocess with a timeout: before the fork hooks (runtime/fork.py) the child's first
synchronous step waited forever for OpenMP workers of the parent, and its first asynchronous call
for the parent's actors.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow        # a subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent('''
    import multiprocessing
    import sys
    import threading
    import numpy as np
    import flow
    import flow.typing as tp

    B, D, H = 64, 256, 256      # big enough that every step's GEMMs run an OpenMP team

    def model(x):
        hidden = flow.layers.dense(x, H, activation=flow.nn.relu,
                                   kernel_initializer=flow.truncated_normal(0.1, seed=1), name="fk-hidden")
        return flow.layers.dense(hidden, 10, kernel_initializer=flow.truncated_normal(0.1, seed=2), name="fk-out")

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((B, D)), y: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((B, D))) -> tp.Numpy:
        return model(x)

    @flow.global_function(type="predict")
    def predict_async(x: tp.Numpy.Placeholder((B, D))) -> tp.Callback[tp.Numpy]:
        return model(x)

    @flow.global_function(type="predict")
    def predict_old(x: tp.Numpy.Placeholder((B, D))):      # the old API: a future
        return model(x)

    rng = np.random.default_rng(0)
    X = rng.standard_normal((B, D)).astype(np.float32)
    Y = rng.integers(0, 10, B).astype(np.int32)

    def child(queue, pending):
        try:
            try:
                pending.get()
                queue.put(("error", "a call in flight in the parent returned in the child", None))
                return
            except RuntimeError as err:
                if "forked" not in str(err):
                    raise
            got = [predict(X)]                          # synchronous, on the thread that forked
            predict_async(X)(got.append)                # asynchronous: new actors
            flow.sync_default_session()
            loss = float(train(X, Y).mean())            # a train step in the child's own copy
            queue.put(("ok", got, loss))
        except BaseException as err:
            queue.put(("error", repr(err), None))

    if __name__ == "__main__":
        for _ in range(3):
            train(X, Y)                                 # OpenMP on the main thread (a step run at once)
        predict_async(X)(lambda out: None)              # the parent's actors exist
        flow.sync_default_session()
        expected = predict(X)
        gate = threading.Event()
        predict_async(X)(lambda out: gate.wait(60))    # holds the parent's callback actor
        pending = predict_old(X)                        # so this call is in flight at the fork
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue, pending))
        proc.start()
        try:
            status, got, loss = queue.get(timeout=60)
        except Exception:
            proc.kill()
            print("CHILD HUNG", flush=True)
            sys.exit(3)
        proc.join(30)
        gate.set()
        np.testing.assert_array_equal(pending.get().numpy(), expected)   # in the parent it completes
        assert status == "ok", got
        for out in got:
            np.testing.assert_array_equal(out, expected)
        assert np.isfinite(loss)
        assert train(X, Y).shape == (B,)                # the parent goes on too
        print("FORK OK", flush=True)
''')


def test_forked_child_runs_sync_and_async_jobs_after_the_parent_trained(tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the forking script did not finish in 180 s: {err.stdout!r} {err.stderr!r}")
    assert proc.returncode == 0 and "FORK OK" in proc.stdout, proc.stdout + proc.stderr
