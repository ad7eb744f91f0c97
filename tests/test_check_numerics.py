"""`function_config().check_numerics(True)`: a NaN or an infinity in any op's output fails the step
with a StepError naming the op and the user's line; off by default, and then the generated code is
exactly what it was without the option (tests/golden checks those sources byte for byte).

The step stops at the first non-finite value: a NaN that arises before the optimizer's update
kernels leaves every variable as it was.  On the GPU the runtime reads the status after each check
(here on the emulated device of tests/test_cuda_codegen.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import generate, lower
from flowc.runtime.session import Session, default_session
from tests.test_cuda_codegen import (Emulator, emulator, fake_pycuda, graph_of, needs_gxx, needs_nvcc,  # noqa: F401
                                     replay)

THIS_FILE = Path(__file__).name


def line_of(marker: str) -> int:
    """The line of this file that carries the comment `# <marker>`."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {marker}"))


def checked(flag: bool | None = True):
    config = flow.function_config()
    if flag is not None:
        config.check_numerics(flag)
    return config


def log_job(config):
    @flow.global_function(type="predict", function_config=config)
    def log_of(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.math.log(x)  # LOG
    return log_of


def divide_job(config):
    @flow.global_function(type="predict", function_config=config)
    def ratio(x: tp.Numpy.Placeholder((4,)), y: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        q = x / y  # DIVIDE
        return flow.math.reduce_sum(q)
    return ratio


NEGATIVE = np.array([[1, 2, 3], [4, -5, 6]], np.float32)


def test_nan_from_log_of_a_negative_names_the_op_and_the_line():
    job = log_job(checked())
    np.testing.assert_allclose(job(np.ones((2, 3), np.float32)), 0.0)     # a finite step passes
    with pytest.raises(flow.StepError) as err:
        job(NEGATIVE)
    message = str(err.value)
    assert message.startswith(f"{THIS_FILE}:{line_of('LOG')}: log produced NaN "), message
    assert "(1 of 6 values, the first at index (1, 1))" in message and "check_numerics" in message


def test_inf_from_a_division_by_zero_names_the_divide():
    job = divide_job(checked())
    with pytest.raises(flow.StepError, match=rf"^{THIS_FILE}:{line_of('DIVIDE')}: divide produced \+Inf "):
        job(np.ones(4, np.float32), np.array([1, 0, 2, 4], np.float32))


def test_off_by_default_the_same_job_returns_nan():
    for config in (checked(None), checked(False)):
        assert np.isnan(log_job(config)(NEGATIVE)[1, 1])
        assert np.isinf(divide_job(config)(np.ones(4, np.float32), np.array([1, 0, 2, 4], np.float32)))


def test_a_fused_kernel_names_every_op_the_bad_value_came_from():
    """Only a fused kernel's results are kept: the message names the ops (and lines) inside it."""
    @flow.global_function(type="predict", function_config=checked())
    def fused(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        y = flow.math.log(x)  # FUSED_LOG
        return y * 2.0  # FUSED_MUL

    program = fused.compile().step.program
    # (the constant 2.0 is a literal inside the kernel: compiler/passes/constants.py)
    assert any({program.graph.node(n).op for n in k.nodes()} - {"constant"} == {"log", "multiply"}
               for k in program.kernels)
    with pytest.raises(flow.StepError) as err:
        fused(NEGATIVE)
    message = str(err.value)
    assert f"{THIS_FILE}:{line_of('FUSED_MUL')}" in message and f"log @{THIS_FILE}:{line_of('FUSED_LOG')}" in message


def test_the_option_is_part_of_the_build_and_free_when_off():
    """Two builds, two sources (the cache is keyed by the source); off, no check is generated."""
    on, off = log_job(checked()).compile(), log_job(checked(False)).compile()
    assert "any_non_finite" in on.source() and "any_non_finite" not in off.source()
    assert on.library != off.library
    assert on.step.check_numerics and not off.step.check_numerics
    assert on.lowered().check_numerics                    # a build from the Compiled stage keeps it


def test_check_numerics_takes_a_bool():
    with pytest.raises(TypeError, match="check_numerics: expected True or False, got 1"):
        flow.function_config().check_numerics(1)


# -- train steps ---------------------------------------------------------------------------------------
def bits(session: Session) -> dict[str, bytes]:
    return {name: session.value(name).tobytes() for name in session.variables}


def train_job(config, lr: float = 0.1):
    @flow.global_function(type="train", function_config=config)
    def numerics_train(x: tp.Numpy.Placeholder((4, 3)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.math.sqrt(x)  # TRAIN_SQRT
        logits = flow.layers.dense(h, 2, name="numerics_out", kernel_initializer=flow.glorot_uniform_initializer())
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9).minimize(loss)
        return loss
    return numerics_train


X, Y = np.full((4, 3), 0.5, np.float32), np.array([0, 1, 0, 1], np.int32)


def test_a_nan_before_the_update_fails_the_train_step_and_changes_no_variable():
    job = train_job(checked())
    job(X, Y)                                   # momentum is non-zero from here on
    session = default_session()
    before, steps = bits(session), dict(session.train_steps)
    bad = X.copy()
    bad[2, 1] = -1.0
    with pytest.raises(flow.StepError, match=rf"^{THIS_FILE}:{line_of('TRAIN_SQRT')}: sqrt produced NaN"):
        job(bad, Y)
    assert bits(session) == before
    assert session.train_steps == steps          # not counted
    job(X, Y)                                   # and the next good step runs
    assert session.train_steps["numerics_train"] == steps["numerics_train"] + 1


def test_off_the_same_train_step_spreads_the_nan_into_the_weights():
    job = train_job(checked(False))
    bad = X.copy()
    bad[2, 1] = -1.0
    assert np.isnan(job(bad, Y))
    assert np.isnan(default_session().value("numerics_out-weight")).any()


def test_a_non_finite_update_is_caught_after_it_ran():
    """The update kernels are checked like any other: a learning rate that overflows the weights
    fails the step, naming the optimizer update (which has written that variable already)."""
    job = train_job(checked(), lr=1e38)
    with pytest.raises(flow.StepError, match=r"in the optimizer update produced .*Inf"):
        job(np.full((4, 3), 100.0, np.float32), Y)


# -- the GPU --------------------------------------------------------------------------------------------
@needs_gxx
def test_the_cuda_check_raises_the_status_of_the_first_bad_value_in_the_emulator(emulator):  # noqa: F811
    graph = graph_of(divide_job(checked()), Session())
    program = lower(graph)
    step = generate(program, "gpu", arch="sm_80", check_numerics=True)
    assert [la.kernel for la in step.launches if la.checks_status]     # a check after each kernel
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    ok, status = replay(emulator, lib, program, step, [np.ones(4), np.ones(4)], {}, {})
    assert status == 0 and ok[0] == 4.0
    _, status = replay(emulator, lib, program, step, [np.ones(4), np.array([1, 0, 2, 4])], {}, {})
    assert status in step.numerics_nodes and graph.node(step.numerics_nodes[status]).op == "divide"
    assert "check_numerics.cu.j2" in step.templates
    plain = generate(program, "gpu", arch="sm_80")
    assert not plain.numerics_nodes and "check_finite" not in plain.source


@pytest.mark.slow
@needs_nvcc
@needs_gxx
def test_a_gpu_step_stops_at_the_first_bad_value_on_an_emulated_device(fake_pycuda):  # noqa: F811
    from flowc.compiler.pipeline import build_lowered
    from flowc.runtime.devices import load_step, sync_to_host
    session = Session()
    graph = graph_of(train_job(checked()), session)
    program = lower(graph)
    compiled, _ = build_lowered(program, [], {}, "gpu", "sm_80", check_numerics=True)
    step = load_step(compiled, session)
    scalars = {name: 0.1 for name in graph.scalars if name.startswith("learning_rate")}
    step.run([X, Y], scalars)
    sync_to_host(session)
    before = bits(session)
    launches = fake_pycuda.launches
    bad = X.copy()
    bad[0, 0] = -1.0
    with pytest.raises(flow.StepError, match=r"sqrt produced NaN \(1 of 12 values, the first at index \(0, 0\)\)"):
        step.run([bad, Y], scalars)
    assert fake_pycuda.launches - launches == 2          # the sqrt kernel and its check, nothing after
    sync_to_host(session)
    assert bits(session) == before

