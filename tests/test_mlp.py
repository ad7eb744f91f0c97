"""The seed MLP (784-512-10, batch 100) end to end: generated C++ against the reference, and training."""
from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

from flowc.compiler.reference import run_reference
from flowc.runtime.datasets import load_mnist_sample
from flowc.runtime.session import default_session

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    """Import examples/<name>.py (without running its __main__ part)."""
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = load_example("mlp_train_demo")


def reference_steps(steps: int):
    """Run `steps` compiled train steps and the same steps on the reference executor."""
    (images, labels), _ = load_mnist_sample(100, 100)
    graph = demo.train_job.graph
    session = default_session()
    values = {name: session.value(name).copy() for name in graph.variables}
    for i in range(steps):
        x, y = images[i % len(images)], labels[i % len(labels)]
        loss = demo.train_job(x, y)
        ref_outputs, updates = run_reference(graph, [x, y], values, {"learning_rate:float32": 0.1})
        values.update(updates)
    return loss, ref_outputs[0], values, session


def assert_relative(actual, expected, tol, what):
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = float(np.max(np.abs(actual - expected))) / scale
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def test_one_train_step_equals_reference():
    loss, ref_loss, values, session = reference_steps(1)
    assert_relative(loss, ref_loss, 1e-5, "loss")
    for name, value in values.items():
        assert_relative(session.value(name), value, 1e-5, name)


def test_hundred_train_steps_stay_close_to_reference():
    loss, ref_loss, values, session = reference_steps(100)
    assert_relative(loss, ref_loss, 1e-4, "loss after 100 steps")
    for name, value in values.items():
        assert_relative(session.value(name), value, 1e-4, name)


def test_the_fusions_the_mlp_relies_on():
    """Bias + relu in the GEMM, weight updates in the gradient kernels, softmax-xent in one pass."""
    kernels = demo.train_job.compiled.program.kernels
    names = [k.name for k in kernels]
    assert any(k.kind == "xent_fused" for k in kernels), names
    assert any(k.kind == "matmul" and "relu" in k.name for k in kernels), names
    updates_in_gemm = [k for k in kernels if k.kind == "matmul" and "subtract" in k.name]
    assert len(updates_in_gemm) == 2, names
    assert len(kernels) <= 10, names


def test_predict_job_sees_trained_weights():
    (images, labels), _ = load_mnist_sample(100, 100)
    before_labels, before = demo.eval_job(images[0], labels[0])
    demo.train_job(images[0], labels[0])
    _, after = demo.eval_job(images[0], labels[0])
    np.testing.assert_array_equal(before_labels, labels[0])
    assert not np.allclose(before, after)


def test_training_reaches_88_percent_on_held_out_digits():
    accuracy = demo.train_and_evaluate(epochs=5, verbose=False)
    assert accuracy >= 0.88, f"held-out accuracy {accuracy:.3f}"
