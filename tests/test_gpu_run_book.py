"""The GPU run book's own checks (benchmarks/gpu_check.sh runs them by name): LeNet's train step at
batch 100 against the reference in float32 and float64, bit-for-bit repeatable losses, large
tensors (grid-stride loops, 64-bit indices), a session mixing GPU and CPU jobs, and device memory
that stays flat across sessions cleared on another thread.

Each needs a usable GPU: skipped with `gpu_status()`'s reason elsewhere (tests/gpu_requirement.py
turns that skip into a failure where nvidia-smi lists a GPU).
"""

import functools
import gc
import threading
import types

import numpy as np
import pytest

from flowc.runtime.devices import gpu_status

USABLE, WHY = gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not USABLE, reason=f"no usable GPU: {WHY}")]

import flow  # noqa: E402
import flow.typing as tp  # noqa: E402
from flowc.compiler.reference import run_reference  # noqa: E402
from flowc.runtime.datasets import load_mnist_sample  # noqa: E402
from flowc.runtime.session import default_session  # noqa: E402
from tests.test_mlp import load_example  # noqa: E402

BATCH = 100
SEED = load_example("seeds/synchronize_single_job")


def _lenet_train(dtype):
    name = {flow.float: "lenet32", flow.double: "lenet64"}[dtype]

    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=dtype),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"), flow.scope.namespace(name):
            logits = SEED.lenet(images, train=True)
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    train.__name__ = f"{name}_train"
    return train


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-4), (np.float64, 1e-10)], ids=["float32", "float64"])
def test_lenet_one_step_at_batch_100_equals_the_reference(dtype, rtol):
    flow.clear_default_session()
    job = _lenet_train(flow.float if dtype == np.float32 else flow.double)
    (images, labels), _ = load_mnist_sample(BATCH, BATCH)
    x, y = images[0].astype(dtype), labels[0]
    graph = job.graph
    session = default_session()
    before = {name: session.value(name).copy() for name in graph.variables}
    loss = job(x, y)
    assert job.compiled.device == "gpu"
    # the learning rate in the job's dtype, and dropout's mask of the first step
    scalars = {name: 0.1 if name.startswith("learning_rate") else 0 for name in graph.scalars}
    ref, updates = run_reference(graph, [x, y], before, scalars)
    np.testing.assert_allclose(loss, ref[0], rtol=rtol, atol=rtol * 1e-2)
    flow.sync_default_session()
    from flowc.runtime.devices import sync_to_host
    sync_to_host(session)
    for name, value in updates.items():
        np.testing.assert_allclose(session.value(name), value, rtol=rtol, atol=rtol * 1e-2, err_msg=name)


def test_two_runs_give_bitwise_equal_losses():
    (images, labels), _ = load_mnist_sample(BATCH, BATCH)
    runs = []
    for _ in range(2):
        flow.clear_default_session()          # the same seeded initial weights
        job = _lenet_train(flow.float)       # jobs are made in the test: a module-level one joins every session
        runs.append([job(x, y).copy() for x, y in zip(images[:5], labels[:5])])
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


@functools.cache
def jobs() -> types.SimpleNamespace:
    """The jobs of the tests below, made at first use: a job decorated at import would join the
    session of every test module collected with this one."""
    @flow.global_function(type="predict")
    def big_pointwise(x: tp.Numpy.Placeholder(((1 << 24) + 3,))) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            return flow.math.tanh(x) * 2.0 + 1.0

    @flow.global_function(type="predict")
    def many_rows(x: tp.Numpy.Placeholder((70_001, 3))) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            return flow.math.reduce_sum(x, axis=1)

    @flow.global_function(type="predict")
    def huge(x: tp.Numpy.Placeholder(((1 << 30) + 5,), dtype=flow.int8)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            return x + x
    return types.SimpleNamespace(big_pointwise=big_pointwise, many_rows=many_rows, huge=huge)


def test_large_a_pointwise_op_over_2_24_elements():
    x = np.random.default_rng(0).standard_normal((1 << 24) + 3).astype(np.float32)
    np.testing.assert_allclose(jobs().big_pointwise(x), np.tanh(x) * 2 + 1, rtol=1e-6, atol=1e-6)


def test_large_a_reduction_with_more_than_65535_outer_rows():
    x = np.random.default_rng(1).standard_normal((70_001, 3)).astype(np.float32)
    np.testing.assert_allclose(jobs().many_rows(x), x.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_large_one_tensor_of_2_30_elements():
    x = (np.arange((1 << 30) + 5, dtype=np.int64) % 61).astype(np.int8)
    out = jobs().huge(x)
    assert out.shape == x.shape
    for where in (slice(0, 1000), slice((1 << 30) - 500, None), slice((1 << 29), (1 << 29) + 777)):
        np.testing.assert_array_equal(out[where], x[where] * 2)


@functools.cache
def mixed_jobs() -> types.SimpleNamespace:
    @flow.global_function(type="train")
    def mixed_gpu_fit(x: tp.Numpy.Placeholder((16, 8))) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            w = flow.get_variable("run_book_w", shape=(8, 4), initializer=flow.constant_initializer(0.5))
            loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def mixed_cpu_predict(x: tp.Numpy.Placeholder((16, 8))) -> tp.Numpy:
        w = flow.get_variable("run_book_w", shape=(8, 4), initializer=flow.constant_initializer(0.5))
        return flow.matmul(x, w)
    return types.SimpleNamespace(gpu_fit=mixed_gpu_fit, cpu_predict=mixed_cpu_predict)


def test_mixed_session_a_cpu_predict_job_sees_the_gpu_trained_weights():
    flow.clear_default_session()
    job = mixed_jobs()
    x = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    w = np.full((8, 4), 0.5, np.float32)
    for _ in range(3):
        job.gpu_fit(x)
        w = w - 0.1 * (2.0 / (16 * 4)) * x.T @ (x @ w)       # d mean((xw)^2) / dw
    got = job.cpu_predict(x)
    assert job.gpu_fit.compiled.device == "gpu" and job.cpu_predict.compiled.device == "cpu"
    np.testing.assert_allclose(got, x @ w, rtol=1e-4, atol=1e-5)


def _device_free_bytes() -> int:
    import pycuda.driver as cuda

    from flowc.runtime.cuda_executor import _Device
    with _Device.get().current():
        return int(cuda.mem_get_info()[0])


def test_thread_leak_device_memory_stays_flat_across_sessions_first_called_on_worker_threads(capfd):
    x = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    fit = mixed_jobs().gpu_fit
    flow.clear_default_session()
    fit(x)                                 # the context, the module cache: what stays for the process
    flow.clear_default_session()
    gc.collect()
    start = _device_free_bytes()
    for _ in range(30):
        worker = threading.Thread(target=fit, args=(x,))
        worker.start()
        worker.join()
        flow.clear_default_session()        # on this thread, where the worker's context was never pushed
        gc.collect()
    assert abs(_device_free_bytes() - start) <= 4 << 20, (start, _device_free_bytes())
    assert "PyCUDA WARNING" not in capfd.readouterr().err
