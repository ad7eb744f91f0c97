"""flow.scope views as OneFlow 0.3.4 uses them, op names under flow.scope.namespace, flow.assign on a
variable the optimizer trains, and flow.random.*."""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.trace import TraceError


def test_views_are_with_blocks_and_function_config_values():
    """OneFlow 0.3.4's scope.mirrored_view / consistent_view are strategy objects: usable in `with`
    (the *_view_enabled() queries answer for the innermost block) and as default_logical_view."""
    flow.clear_default_session()
    seen = {}
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())
    assert config.logical_view == "mirrored"

    @flow.global_function(function_config=config)
    def views_in_blocks(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["job"] = flow.scope.mirrored_view_enabled()
        with flow.scope.consistent_view():
            seen["consistent_block"] = (flow.scope.consistent_view_enabled(), flow.scope.mirrored_view_enabled())
            with flow.scope.mirrored_view() as view:
                seen["nested"] = flow.scope.mirrored_view_enabled()
                seen["view"] = view
        seen["after"] = flow.scope.mirrored_view_enabled()
        return x + 1.0
    np.testing.assert_array_equal(views_in_blocks(np.zeros(2, np.float32)), [1.0, 1.0])
    assert seen["job"] is True
    assert seen["consistent_block"] == (True, False)
    assert seen["nested"] is True and seen["view"].is_mirrored
    assert seen["after"] is True
    with flow.scope.mirrored_view():
        assert flow.scope.mirrored_view_enabled()
    assert flow.scope.consistent_view_enabled()
    assert flow.scope.mirrored_view() == "mirrored" and not flow.scope.consistent_view().is_mirrored
    flow.clear_default_session()


def test_op_names_under_a_namespace_get_its_prefix():
    """OneFlow's user_op_builder prefixes every op name with the open namespaces, like variables."""
    flow.clear_default_session()
    names = {}

    @flow.global_function(type="predict")
    def namespaced_ops(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        with flow.scope.namespace("enc"):
            a = flow.math.relu(x, name="act")
            unnamed = flow.math.sigmoid(a)
            with flow.scope.namespace("inner"):
                h = flow.layers.dense(a, 4, name="fc")
        b = flow.math.relu(h + flow.math.reduce_sum(unnamed), name="outside")
        names.update(act=a.op_name, fc=h.op_name, outside=b.op_name, unnamed=unnamed.op_name)
        return b
    namespaced_ops.lower()
    assert names.pop("unnamed").startswith("enc-sigmoid_")         # generated names get the prefix too
    assert names == {"act": "enc-act", "fc": "enc-inner-fc", "outside": "outside"}
    assert "enc-inner-fc-weight" in flow.get_all_variables()
    flow.clear_default_session()


def test_assigning_a_variable_the_optimizer_trains_names_the_variable_and_line():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def assign_and_train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("assigned_w", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.assign(w, w * 2.0)                       # ASSIGN_LINE
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    line = next(i for i, text in enumerate(open(__file__), 1) if "# ASSIGN_LINE" in text and "flow.assign" in text)
    with pytest.raises(TraceError, match=rf"test_scope_and_random.py:{line}: flow.assign: variable 'assigned_w'"):
        assign_and_train.lower()
    flow.clear_default_session()

    @flow.global_function(type="train")
    def assign_untrained(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("trained_w", shape=(3,), initializer=flow.ones_initializer())
        c = flow.get_variable("counter", shape=(1,), initializer=flow.zeros_initializer(), trainable=False)
        loss = flow.math.reduce_sum(x * w)
        flow.assign(c, c + 1.0)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss
    assign_untrained(np.ones((2, 3), np.float32))
    assign_untrained(np.ones((2, 3), np.float32))
    assert flow.get_all_variables()["counter"].numpy()[0] == 2.0
    flow.clear_default_session()


# --- flow.random ----------------------------------------------------------------------------------

def _random_case(p, x):
    return (flow.random.bernoulli(p, seed=11), flow.random.shuffle(x, seed=12),
            flow.random.coin_flip(batch_size=9, seed=13, probability=0.25),
            flow.random.generate_random_batch_permutation_indices(x, seed=14),
            flow.random.bernoulli(p, seed=15, dtype=flow.int32))


RANDOM_INPUTS = [np.linspace(-0.2, 1.2, 60, dtype=np.float32).reshape(6, 10),
                 np.arange(14, dtype=np.float64).reshape(7, 2)]


def test_random_ops_equal_the_reference_on_the_cpu_and_in_the_cuda_emulator(tmp_path):
    """The compiled draws are the NumPy reference's bits (same hash), per step, on both backends."""
    import shutil

    from flowc.compiler.pipeline import compile_graph, lower
    from flowc.compiler.reference import run_reference
    from flowc.runtime.executor import CpuLoadedStep
    from flowc.runtime.session import Session
    from tests.oracle import trace_case
    graph, _, _ = trace_case(_random_case, RANDOM_INPUTS, grads=False)
    assert "random_uniform" in {n.op for n in graph.nodes}
    graph.scalars["train_step"] = "int64"     # as compiler/build.py records a job's runtime scalars
    step = CpuLoadedStep(compile_graph(graph), Session())
    for counter in (0, 5):
        want, _ = run_reference(graph, RANDOM_INPUTS, {}, {"train_step": counter})
        got = step.run(RANDOM_INPUTS, {"train_step": counter})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    p = RANDOM_INPUTS[0]
    assert not want[0][p <= 0].any() and want[0][p >= 1].all()        # probabilities outside (0, 1)
    assert sorted(want[1][:, 0]) == list(RANDOM_INPUTS[1][:, 0])      # a permutation of the rows
    assert sorted(want[3]) == list(range(7)) and want[3].dtype == np.int32
    assert want[2].dtype == np.int8 and want[4].dtype == np.int32
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    from tests.test_cuda_codegen import Emulator, render, replay
    program = lower(graph)
    cuda = render(program, prefix="rnd_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(cuda.source, [la.kernel for la in cuda.launches])
    got, status = replay(emulator, lib, program, cuda, RANDOM_INPUTS, {}, {"train_step": 5})
    assert status == 0
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_random_draws_are_new_each_call_reproducible_and_fair():
    from flowc.compiler.ops.pointwise import random_units
    flow.clear_default_session()

    def draw_job():
        @flow.global_function(type="predict")
        def random_draws(p: tp.Numpy.Placeholder((200, 500))) -> tp.Numpy:
            return flow.random.bernoulli(p, seed=3)
        return random_draws
    p = np.full((200, 500), 0.3, np.float32)
    job = draw_job()
    first, second = job(p), job(p)
    assert not np.array_equal(first, second)                    # each call draws anew
    for call, got in enumerate((first, second)):               # ... the reference's bits for that call
        np.testing.assert_array_equal(got, (random_units(3, call, p.size).reshape(p.shape) < p).astype(np.float32))
    assert abs(first.mean() - 0.3) < 0.01 and abs(second.mean() - 0.3) < 0.01
    flow.clear_default_session()
    np.testing.assert_array_equal(draw_job()(p), first)         # a new session starts the sequence again
    flow.clear_default_session()


def test_random_draws_follow_the_train_step():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def random_train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("random_w", shape=(3,), initializer=flow.ones_initializer())
        keep = flow.random.bernoulli(flow.constant_like(x, 0.5), seed=21)
        loss = flow.math.reduce_sum(x * w * keep)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return keep
    from flowc.compiler.ops.pointwise import random_units
    x = np.ones((4, 3), np.float32)
    for step in range(3):
        np.testing.assert_array_equal(random_train(x), (random_units(21, step, 12) < 0.5).reshape(4, 3))
    flow.clear_default_session()


def test_gen_seed_and_argument_errors():
    assert flow.random.gen_seed(42) == (42, True)
    seed, has_seed = flow.random.gen_seed()
    assert has_seed and isinstance(seed, int)
    with flow.scope.mirrored_view():
        assert flow.random.gen_seed() == (-1, False)
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def bad_coin(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return flow.random.coin_flip(batch_size=2, probability=1.5)
    with pytest.raises(TraceError, match="probability must be in"):
        bad_coin.lower()

    @flow.global_function(type="predict")
    def bad_bernoulli(x: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        return flow.random.bernoulli(x)
    with pytest.raises(TraceError, match="x must be float32 or float64"):
        bad_bernoulli.lower()
    flow.clear_default_session()
