"""The CUDA backend on a real GPU: every op against the NumPy reference, gradients, TF32, training to
the CPU's accuracy, and the runtime (pipelined slots, callbacks, checkpoints) under "gpu" placement.

Skipped, with `runtime.devices.gpu_status()`'s reason, where no GPU is usable (no PyCUDA, no
driver, no device, no nvcc).  The job-API tests expect `runtime/job.py` to run "gpu"-placed jobs
through `runtime.devices.load_step` and checkpoints to call `runtime.devices.sync_to_host`.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

from flowc.runtime.devices import gpu_status

USABLE, WHY = gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not USABLE, reason=f"no usable GPU: {WHY}")]

import flow  # noqa: E402
import flow.typing as tp  # noqa: E402
from flowc.compiler.pipeline import compile_graph  # noqa: E402
from flowc.compiler.reference import run_reference  # noqa: E402
from flowc.runtime.datasets import load_mnist_sample  # noqa: E402
from flowc.runtime.session import Session, default_session  # noqa: E402
from tests.oracle import cotangents, trace_case  # noqa: E402
from tests.test_ops import CASES, assert_close, assert_outputs_match  # noqa: E402

GEMM_CASES = sorted(n for n in CASES if n.startswith(("matmul", "conv")))


def run_on_gpu(name: str, session: Session | None = None):
    """The case's values and gradients from the GPU step, and from the reference."""
    from flowc.runtime.devices import load_step
    fn, inputs = CASES[name]
    graph, _, _ = trace_case(fn, inputs, True)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    compiled = compile_graph(graph, device="gpu")
    got = load_step(compiled, session or Session()).run(feeds)
    want, _ = run_reference(graph, feeds, {})
    return compiled, got, want


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_and_its_gradient_on_the_gpu_equals_the_reference(name):
    compiled, got, want = run_on_gpu(name)
    assert compiled.device == "gpu" and not compiled.generated.tensor_cores
    assert_outputs_match(got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_on_the_gpu_equals_the_reference_on_special_values(name):
    """NaN, infinities, signed zeros and denormals (tests/test_special_values.py) on the real device,
    whose math library and flush-to-zero settings the emulator does not have."""
    from flowc.runtime.devices import load_step
    from tests.test_special_values import VARIANTS, case_seed, compare, plant, reference
    fn, inputs = CASES[name]
    graph, _, _ = trace_case(fn, inputs, True)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    step = load_step(compile_graph(graph, device="gpu"), Session())
    for variant in VARIANTS:
        planted = plant(feeds, variant, case_seed(name))
        compare(name, variant, graph, step.run(planted), reference(graph, planted))


@pytest.mark.parametrize("name", GEMM_CASES)
def test_tf32_tensor_cores_stay_within_a_percent(name, monkeypatch):
    monkeypatch.setenv("FLOWC_TF32", "1")
    compiled, got, want = run_on_gpu(name)
    from flowc.compiler.cuda_toolchain import arch_number
    if arch_number(compiled.arch) >= 80 and any(g.dtype == np.float32 for g in got):
        assert compiled.generated.tensor_cores
    for g, w in zip(got, want):
        assert_close(g, w, 1e-2 if w.dtype == np.float32 else 1e-12)


def test_an_out_of_range_label_is_a_clear_error_on_the_gpu():
    from flowc.runtime.devices import load_step
    graph, _, _ = trace_case(lambda y, a: flow.nn.sparse_softmax_cross_entropy_with_logits(y, a),
                             [np.array([0, 1, 5, 2], np.int32), np.zeros((4, 3), np.float32)], grads=False)
    step = load_step(compile_graph(graph, device="gpu"), Session())
    with pytest.raises(flow.StepError, match="out of range"):
        step.run([np.array([0, 1, 5, 2], np.int32), np.zeros((4, 3), np.float32)])
    np.testing.assert_array_equal(step.run([np.array([0, 1, 2, 2], np.int32), np.zeros((4, 3), np.float32)])[0],
                                  np.full(4, np.log(3), np.float32))      # the status is reset every step


def test_the_arch_comes_from_the_device_and_a_second_compile_hits_the_cache():
    from flowc.compiler.cuda_toolchain import device_arch
    graph, _, _ = trace_case(lambda a, b: flow.matmul(a, b), [np.ones((4, 3), np.float32),
                                                              np.ones((3, 2), np.float32)], grads=False)
    first = compile_graph(graph, device="gpu")
    assert first.arch == device_arch()
    assert not compile_graph(graph, device="gpu").compiled


def test_slots_pipeline_and_variables_stay_on_the_device():
    """Three slots fed ahead of their steps (uploads overlap compute); updates persist on the device."""
    from flowc.runtime.devices import load_step, sync_to_device, sync_to_host
    from tests.test_cuda_codegen import graph_of, seed_jobs
    session = Session()
    graph = graph_of(seed_jobs()["mlp_train"], session)
    step = load_step(compile_graph(graph, device="gpu"), session, depth=3)
    (images, labels), _ = load_mnist_sample(100, 100)
    values = {name: session.value(name).copy() for name in graph.variables}
    host = {name: session.value(name) for name in graph.variables}
    for k, slot in enumerate(step.slots):
        step.feed(slot, [images[k], labels[k]], {"learning_rate:float32": 0.1})
    for k, slot in enumerate(step.slots):
        (loss,) = step.compute(slot)
        ref, updates = run_reference(graph, [images[k], labels[k]], values, {"learning_rate:float32": 0.1})
        values.update(updates)
        np.testing.assert_allclose(loss, ref[0], rtol=1e-4, atol=1e-5)
    sync_to_host(session)
    for name, value in values.items():
        assert session.value(name) is host[name]
        scale = max(float(np.max(np.abs(value))), 1e-30)
        assert float(np.max(np.abs(session.value(name) - value))) / scale < 1e-4, name
    session.value("output-bias")[...] = 0.0
    sync_to_device(session)
    sync_to_host(session, ["output-bias"])
    assert not session.value("output-bias").any()


def test_profile_times_every_kernel(monkeypatch):
    from flowc.runtime.devices import load_step
    monkeypatch.setenv("FLOWC_PROFILE", "1")
    graph, _, _ = trace_case(lambda a, b: flow.nn.relu(flow.matmul(a, b)), [np.ones((64, 32), np.float32),
                                                                            np.ones((32, 16), np.float32)])
    compiled = compile_graph(graph, device="gpu")
    step = load_step(compiled, Session())
    feeds = [np.ones((64, 32), np.float32), np.ones((32, 16), np.float32), np.ones((64, 16), np.float32)]
    step.run(feeds)
    step.run(feeds)
    rows = dict(step.profile())
    assert set(rows) == {la.kernel for la in compiled.generated.launches} and all(s > 0 for s in rows.values())


# --- jobs under "gpu" placement, through the job API ---------------------------------------------------

def mlp(images):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer, name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output")


@flow.global_function(type="train")
def gpu_train(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images), name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="train")
def gpu_train_async(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float),
                    labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
    with flow.scope.placement("gpu", "0:0"):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images), name="softmax_loss")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def gpu_eval(images: tp.Numpy.Placeholder((100, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
    with flow.scope.placement("gpu", "0:0"):
        logits = mlp(images)
    return labels, logits


def accuracy(eval_job, images, labels) -> float:
    correct = total = 0
    for x, y in zip(images, labels):
        out_labels, logits = eval_job(x, y)
        correct += int(np.sum(np.argmax(logits, 1) == out_labels))
        total += len(out_labels)
    return correct / total


def test_gpu_jobs_run_on_the_gpu():
    assert gpu_train.compiled.device == "gpu" and gpu_eval.compiled.device == "gpu"


def test_one_gpu_train_step_equals_the_reference():
    from flowc.runtime.devices import sync_to_host
    (images, labels), _ = load_mnist_sample(100, 100)
    graph = gpu_train.graph
    session = default_session()
    before = {name: session.value(name).copy() for name in graph.variables}
    loss = gpu_train(images[0], labels[0])
    ref, updates = run_reference(graph, [images[0], labels[0]], before, {"learning_rate:float32": 0.1})
    np.testing.assert_allclose(loss, ref[0], rtol=1e-5, atol=1e-6)
    flow.sync_default_session()
    sync_to_host(session)
    for name, value in updates.items():
        np.testing.assert_allclose(session.value(name), value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_mlp_trains_on_the_gpu_to_the_cpu_accuracy():
    (train_images, train_labels), (test_images, test_labels) = load_mnist_sample(100, 100)
    for _ in range(5):
        for x, y in zip(train_images, train_labels):
            gpu_train(x, y)
    assert accuracy(gpu_eval, test_images, test_labels) >= 0.88      # tests/test_mlp.py's bar on the CPU


def test_callbacks_under_gpu_placement_arrive_in_order_and_match_sync_calls():
    (images, labels), _ = load_mnist_sample(100, 100)
    seen: list[np.ndarray] = []
    for x, y in zip(images[:6], labels[:6]):
        gpu_train_async(x, y)(seen.append)
    flow.sync_default_session()
    assert len(seen) == 6 and all(s.shape == (100,) for s in seen)
    first_async = seen[0].copy()
    flow.clear_default_session()
    np.testing.assert_allclose(gpu_train(images[0], labels[0]), first_async, rtol=1e-5)   # same seeded init


def test_a_predict_call_after_a_train_call_sees_the_new_weights_on_the_gpu():
    (images, labels), _ = load_mnist_sample(100, 100)
    _, before = gpu_eval(images[0], labels[0])
    gpu_train(images[0], labels[0])
    _, after = gpu_eval(images[0], labels[0])
    assert not np.allclose(before, after)


def test_checkpoints_copy_gpu_variables_out_and_back(tmp_path):
    (images, labels), _ = load_mnist_sample(100, 100)
    for x, y in zip(images[:5], labels[:5]):
        gpu_train(x, y)
    _, trained = gpu_eval(images[0], labels[0])
    flow.train.CheckPoint().save(str(tmp_path / "m"))
    flow.clear_default_session()
    flow.train.CheckPoint().load(str(tmp_path / "m"))
    _, restored = gpu_eval(images[0], labels[0])
    np.testing.assert_allclose(restored, trained, rtol=1e-6)


def test_the_lenet_seed_trains_on_the_gpu_to_the_cpu_accuracy():
    from tests.test_lenet import seed_eval, seed_train
    assert seed_train.train_job.compiled.device == "gpu"
    (train_images, train_labels), (test_images, test_labels) = load_mnist_sample(100, 100)
    for _ in range(3):
        for x, y in zip(train_images, train_labels):
            seed_train.train_job(x, y)
    assert accuracy(seed_eval.eval_job, test_images, test_labels) >= 0.94    # tests/test_lenet.py's bar


def test_a_mixed_cpu_gpu_job_equals_the_reference_on_the_gpu():
    from tests.test_cuda_codegen import mixed_train
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 20)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32)
    graph = mixed_train.graph
    session = default_session()
    before = {name: session.value(name).copy() for name in graph.variables}
    loss = mixed_train(x, y)
    assert mixed_train.compiled.device == "gpu"
    assert any(n.op == "device_copy" for n in mixed_train.compiled.program.graph.nodes)
    ref, _ = run_reference(graph, [x, y], before, {"learning_rate:float32": 0.1})
    np.testing.assert_allclose(loss, ref[0], rtol=1e-5, atol=1e-6)
