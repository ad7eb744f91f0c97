"""function_config().enable_auto_mixed_precision(True): OneFlow's AMP rewrite (compiler/passes/mixed_precision.py)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.passes.mixed_precision import half_set

STEPS = 40


def mlp_job(amp: bool, name: str):
    config = flow.function_config()
    if amp:
        config.enable_auto_mixed_precision(True)

    def train(x: tp.Numpy.Placeholder((32, 20)), y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 16, activation=flow.nn.relu, name=f"{name}_hidden",
                              kernel_initializer=flow.glorot_uniform_initializer())
        logits = flow.layers.dense(h, 4, name=f"{name}_out", kernel_initializer=flow.glorot_uniform_initializer())
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        policy = flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=1024.0)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           loss_scale_policy=policy).minimize(loss)
        return loss
    train.__name__ = train.__qualname__ = f"train_{name}"     # its own loss-scale variables
    return flow.global_function(type="train", function_config=config)(train)


@pytest.fixture(scope="module")
def trained():
    """Losses of the same MLP (same initial weights, same data) trained with and without AMP."""
    flow.clear_default_session()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 20)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    jobs = {"fp32": mlp_job(False, "fp32"), "amp": mlp_job(True, "amp")}
    jobs["fp32"].lower()
    jobs["amp"].lower()
    first = {k: v.numpy() for k, v in flow.get_all_variables().items() if k.startswith("fp32_")}
    flow.load_variables({k.replace("fp32_", "amp_", 1): v for k, v in first.items()})
    losses = {label: [float(job(x, y).mean()) for _ in range(STEPS)] for label, job in jobs.items()}
    variables = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    yield jobs, losses, variables
    flow.clear_default_session()


def test_amp_trains_the_mlp_about_as_well_as_float32(trained):
    _, losses, _ = trained
    assert abs(losses["amp"][0] - losses["fp32"][0]) < 1e-2          # same start, up to float16 rounding
    assert losses["amp"][-1] < 0.5 * losses["amp"][0]
    assert abs(losses["amp"][-1] - losses["fp32"][-1]) < 0.05 * losses["fp32"][0]


def test_amp_graph_has_float16_matmuls_and_float32_variables(trained):
    jobs, _, variables = trained
    graph = jobs["amp"].graph
    matmuls = [n for n in graph.nodes if n.op == "matmul"]
    assert matmuls and all(n.type.dtype == "float16" for n in matmuls)          # forward and backward
    assert all(n.type.dtype == "float32" for n in graph.nodes if n.op == "variable" and n.type.dtype != "int64")
    assert all(graph.node(v).type.dtype in ("float32", "int64") for v in graph.assigns.values())
    assert all(v.dtype == np.float32 for k, v in variables.items() if k.startswith("amp_"))
    relus = [n for n in graph.nodes if n.op == "relu"]
    assert relus and all(n.type.dtype == "float16" for n in relus)     # between two matmuls: float16
    xent = [n for n in graph.nodes if n.op == "sparse_softmax_cross_entropy"]
    assert xent and all(n.type.dtype == "float32" for n in xent)       # black: float32
    assert all(n.type.dtype == "float32" for n in jobs["fp32"].graph.nodes if n.type.dtype.startswith("float"))


def test_an_amp_step_equals_the_reference(trained):
    """One compiled AMP train step (CPU) against the NumPy reference of the same graph: float16
    values within the float16 tolerance of tests/test_float16.py, the float32 master weights close."""
    from flowc.compiler.reference import run_reference
    jobs, _, _ = trained
    job, graph = jobs["amp"], jobs["amp"].graph
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 20)).astype(np.float32)
    y = rng.integers(0, 4, 32).astype(np.int32)
    before = {name: flow.get_all_variables()[name].numpy().copy() for name in graph.variables}
    (want_loss,), updates = run_reference(graph, [x, y], before, {"learning_rate:float32": 0.1})
    got_loss = job(x, y)
    np.testing.assert_allclose(got_loss, want_loss, rtol=2e-3, atol=1e-3)
    after = flow.get_all_variables()
    for name, want in updates.items():
        got = after[name].numpy()
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-4, err_msg=name)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
def test_an_amp_train_step_equals_the_reference_in_the_cuda_emulator(tmp_path):
    """The CUDA lowering of an AMP train step (float16 casts, __half storage) in the CPU emulator."""
    from flowc.compiler.pipeline import lower
    from flowc.compiler.reference import run_reference
    from flowc.runtime.session import Session
    from tests.test_cuda_codegen import Emulator, graph_of, render, replay
    session = Session()
    program = lower(graph_of(mlp_job(True, "emu"), session))
    graph = program.graph
    step = render(program, prefix="amp_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches], "-O1")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((32, 20)).astype(np.float32), rng.integers(0, 4, 32).astype(np.int32)]
    reference = {name: session.value(name).copy() for name in graph.variables}
    device = {name: value.copy() for name, value in reference.items()}
    scalars = {"learning_rate:float32": 0.1}
    for _ in range(2):
        got, status = replay(emulator, lib, program, step, inputs, device, scalars)
        want, updates = run_reference(graph, inputs, reference, scalars)
        reference.update(updates)
        assert status == 0
        np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=1e-3)
    for name in updates:
        np.testing.assert_allclose(device[name], reference[name], rtol=2e-3, atol=1e-4, err_msg=name)


def test_the_lists_follow_oneflow():
    """A gray op after a black one stays float32; gray ops only join between white ops."""
    flow.clear_default_session()
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(function_config=config)
    def job(a: tp.Numpy.Placeholder((4, 4)), b: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        m = flow.matmul(a, b)                   # white
        t = flow.math.tanh(m) * 2.0             # gray between two whites: float16
        e = flow.math.exp(flow.matmul(t, b))    # white, then black
        return flow.math.sigmoid(e) + 1.0       # gray after black: float32
    graph = job.graph
    by_op: dict[str, set[str]] = {}
    for n in graph.nodes:
        by_op.setdefault(n.op, set()).add(n.type.dtype)
    assert by_op["matmul"] == {"float16"} and by_op["tanh"] == {"float16"}
    assert by_op["exp"] == {"float32"} and by_op["sigmoid"] == {"float32"}
    assert graph.node(graph.outputs[0]).type.dtype == "float32"
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((4, 4)).astype(np.float32) * 0.3 for _ in range(2))
    want = 1 / (1 + np.exp(-np.exp(np.tanh(a @ b) * 2 @ b))) + 1
    np.testing.assert_allclose(job(a, b), want, rtol=5e-3)
    assert half_set(graph.nodes) == set()       # the rewritten graph has no float32 white op left
    flow.clear_default_session()


def test_amp_off_compiles_to_the_same_code():
    flow.clear_default_session()
    off = flow.function_config()
    off.enable_auto_mixed_precision(False)

    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.nn.relu(flow.matmul(x, x, transpose_b=True))
    plain = flow.global_function()(job)
    explicit = flow.global_function(function_config=off)(job)
    assert plain.lower().as_text() == explicit.lower().as_text()
    with pytest.raises(TypeError, match="enable_auto_mixed_precision"):
        off.enable_auto_mixed_precision("yes")
    flow.clear_default_session()
