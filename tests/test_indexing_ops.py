"""Sources, views and indexing ops (flow/indexing.py, compiler/ops/indexing.py): shapes, the NumPy
reference, gradients against finite differences, the generated C++ against the reference, the CUDA
kernels in the CPU emulator of tests/test_cuda_codegen.py, and whole jobs (assign, errors).

The cases share compiled code: each group below is one graph (several ops, one compile).
"""
from __future__ import annotations

import os
import typing
import shutil

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from tests.oracle import compile_case, cotangents, finite_difference_check, ops_of_cases, trace_case

# The CUDA templates these tests render (test_cuda_codegen's coverage check leaves them to us).
INDEXING_CUDA_TEMPLATES = {f"{op}.cu.j2" for op in ("gather", "gather_grad", "strided_slice", "slice_update",
                                                     "one_hot", "top_k")}

rng = np.random.default_rng(14)
F = rng.standard_normal((4, 5, 3)).astype(np.float32)
IDX = np.array([[3, 0], [4, 4], [1, 2]], np.int32)          # repeats: the scatter-add sums them
COND = (rng.standard_normal((4, 1, 3)) > 0).astype(np.int32)
Y = rng.standard_normal((5, 3)).astype(np.float32)
E = rng.standard_normal((6, 4)).astype(np.float32)           # an embedding table
WORDS = np.array([[5, 0, 5], [2, 2, 1]], np.int64)


def views_and_sources(x, c, y):
    return (flow.squeeze(flow.expand_dims(x, 1), axis=[1]) * 2.0,
            flow.broadcast_like(y, like=x, broadcast_axes=(0,)),
            flow.identity(x) + flow.zeros_like(x) + flow.ones_like(x) + flow.constant_like(x, 0.5),
            flow.stack([x, x * 3.0], axis=1),
            flow.concat([x, x * 2.0, flow.math.exp(x)], axis=1),
            flow.where(c, x, y),
            flow.masked_fill(x, c, -7.0))


def slices(x, c, y):
    return (flow.slice_v2(x, [(None, None, None), (0, 5, 2), (2, None, -1)]),
            flow.slice(x, begin=[None, 1, 0], size=[None, 3, -1]),
            flow.reverse(x, axis=[0, 2]),
            flow.slice_update(x, flow.slice_v2(x, [(0, 4, 2), (1, 5, 3)]) * 10.0, [(1, 4, 2), (4, 0, -3)]),
            flow.pad(x, paddings=((1, 0), (0, 2), (1, 1)), constant_value=1.5))


def gathers(x, idx, emb, words):
    return (flow.gather(x, idx, axis=1),                       # (4, 3, 2, 3)
            flow.gather(emb, words),                           # the embedding lookup: (2, 3, 4)
            flow.gather(x, flow.slice_v2(idx, [(2, 3, 1)]), axis=2) * 1.0,
            flow.gather(x, flow.constant(1, flow.int32, (4, 2)), axis=1, batch_dims=1))


def labels(idx, x):
    return (flow.one_hot(idx, depth=5),
            flow.one_hot(idx, depth=4, on_value=3, off_value=-1, axis=0, dtype=flow.int32),
            flow.math.top_k(x, k=2),
            flow.math.top_k(x, k=9),
            flow.math.argmax(x, axis=1), flow.math.argmax(x, axis=0))


GROUPS = {
    "views_and_sources": (views_and_sources, [F, COND, Y]),
    "slices": (slices, [F, COND, Y]),
    "gathers": (gathers, [F, IDX, E, WORDS]),
    "labels": (labels, [np.array([[0, 4, 7], [2, -1, 3]], np.int32), F]),
}


def covered_ops() -> set[str]:
    """Every op the cases above use, gradients included (tests/test_ops.py checks each op has a case)."""
    return ops_of_cases(GROUPS.values())


def assert_match(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def cases():
    return {name: compile_case(fn, inputs) for name, (fn, inputs) in GROUPS.items()}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_compiled_cpu_equals_the_reference(name, cases):
    case = cases[name]
    assert_match(case.compiled, case.reference)


def test_reference_values_against_numpy(cases):
    views = cases["views_and_sources"].reference
    np.testing.assert_array_equal(views[0], F * 2)
    np.testing.assert_array_equal(views[1], np.broadcast_to(Y, F.shape))
    np.testing.assert_allclose(views[2], F + 1.5)
    np.testing.assert_array_equal(views[3], np.stack([F, F * 3], axis=1))
    np.testing.assert_array_equal(views[4], np.concatenate([F, F * 2, np.exp(F)], axis=1))
    np.testing.assert_array_equal(views[5], np.where(COND != 0, F, Y))
    np.testing.assert_array_equal(views[6], np.where(COND != 0, np.float32(-7), F))
    s = cases["slices"].reference
    np.testing.assert_array_equal(s[0], F[:, 0:5:2, 2::-1])
    np.testing.assert_array_equal(s[1], F[:, 1:4, :])
    np.testing.assert_array_equal(s[2], F[::-1, :, ::-1])
    want = F.copy()
    want[1:4:2, 4:0:-3] = F[0:4:2, 1:5:3] * 10
    np.testing.assert_array_equal(s[3], want)
    np.testing.assert_array_equal(s[4], np.pad(F, ((1, 0), (0, 2), (1, 1)), constant_values=1.5))
    g = cases["gathers"].reference
    np.testing.assert_array_equal(g[0], np.take(F, IDX, axis=1))
    np.testing.assert_array_equal(g[1], E[WORDS])
    np.testing.assert_array_equal(g[3], F[:, [1, 1], :])
    lab = cases["labels"].reference
    ix = np.array([[0, 4, 7], [2, -1, 3]])
    np.testing.assert_array_equal(lab[0], (ix[..., None] == np.arange(5)).astype(np.float32))
    np.testing.assert_array_equal(lab[1], np.where(np.arange(4)[:, None, None] == ix[None], 3, -1))
    np.testing.assert_array_equal(lab[2], np.argsort(-F, axis=-1, kind="stable")[..., :2])
    assert lab[3].shape == (4, 5, 3)                       # k clamped to the axis, as OneFlow
    np.testing.assert_array_equal(lab[4], np.argmax(F, axis=1))
    np.testing.assert_array_equal(lab[5], np.argmax(F, axis=0))


def test_gather_gradient_is_the_scatter_add(cases):
    case = cases["gathers"]
    x_grad, emb_grad = case.reference[case.n_values:]
    # the embedding rows picked twice get both cotangents (row 5 twice, row 2 twice, rows 3 and 4 never)
    graph = case.graph
    cot = [a for a in cotangents(graph, 4, np.random.default_rng(0))]
    want = np.zeros_like(E)
    np.add.at(want, WORDS.reshape(-1), cot[1].reshape(-1, 4))
    np.testing.assert_allclose(emb_grad, want, rtol=1e-6)
    assert not emb_grad[3].any() and not emb_grad[4].any()


@pytest.mark.parametrize("name", ["views_and_sources", "slices", "gathers"])
def test_gradients_against_finite_differences(name):
    fn, inputs = GROUPS[name]
    finite_difference_check(fn, inputs, samples=24)


def test_top_k_ties_and_nan_like_argmax():
    x = np.array([[1, 3, 3, np.nan, 3, -np.inf], [2, 2, 2, 2, 2, 2]], np.float32)
    case = compile_case(lambda v: flow.math.top_k(v, k=4), [x], grads=False)
    np.testing.assert_array_equal(case.reference[0], [[3, 1, 2, 4], [0, 1, 2, 3]])
    np.testing.assert_array_equal(case.compiled[0], case.reference[0])


def test_shapes_and_argument_errors():
    @flow.global_function(type="predict")
    def shapes(x: tp.Numpy.Placeholder((4, 1, 3)), i: tp.Numpy.Placeholder((2, 5), dtype=flow.int32)) -> tp.Numpy:
        assert flow.squeeze(x).shape == (4, 3)
        assert flow.expand_dims(x, -1).shape == (4, 1, 3, 1)
        assert flow.gather(x, i, axis=2).shape == (4, 1, 2, 5, 3)[:2] + (2, 5)
        assert flow.one_hot(i, 7).dtype == flow.float32 and flow.one_hot(i, 7).shape == (2, 5, 7)
        assert flow.constant(2, dtype=flow.int64, shape=(3,)).dtype == flow.int64
        assert flow.pad(x, [(0, 0), (1, 2), (0, 0)]).shape == (4, 4, 3)
        assert flow.slice_v2(x, [(None, None, -1)]).shape == (4, 1, 3)
        for bad, message in [(lambda: flow.squeeze(x, axis=[0]), "axis 0"),
                             (lambda: flow.gather(x, x), "int32 or int64"),
                             (lambda: flow.where(x), "argwhere"),
                             (lambda: flow.slice_v2(x, [(0, 2, 0)]), "step cannot be 0"),
                             (lambda: flow.pad(x, [(1, 1)]), "paddings"),
                             (lambda: flow.assign(x, x), "variable")]:
            with pytest.raises(flow.TraceError, match=message) as info:
                bad()
            assert "test_indexing_ops.py:" in str(info.value)
        return x
    shapes(np.zeros((4, 1, 3), np.float32), np.zeros((2, 5), np.int32))


def test_an_out_of_range_gather_index_fails_the_step_and_changes_nothing():
    @flow.global_function(type="train")
    def embed(words: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("h14_table", shape=(5, 2), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(flow.gather(table, words))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
        return loss
    assert embed(np.array([0, 4, 4], np.int32)) == 6.0
    table = flow.get_all_variables()["h14_table"].numpy().copy()
    np.testing.assert_allclose(table[:, 0], [0.5, 1, 1, 1, 0])
    out_of_range = r"test_indexing_ops.py:\d+: flow.gather: an index is out of range \[0, 5\)"
    with pytest.raises(flow.StepError, match=out_of_range):
        embed(np.array([0, 5, 1], np.int32))
    np.testing.assert_array_equal(flow.get_all_variables()["h14_table"].numpy(), table)


def test_gather_with_batch_dims_at_its_axis_is_oneflows_batch_gather():
    # BERT's pretraining (OneFlow-Benchmark) picks the masked positions' hidden states with axis=2,
    # batch_dims=2 on (B, S, H) and (B, P): OneFlow's batch_gather, whose batch is indices' leading axes
    @flow.global_function(type="predict")
    def pick(seq: tp.Numpy.Placeholder((2, 6, 4)),
             pos: tp.Numpy.Placeholder((2, 3), dtype=flow.int32)) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return (flow.gather(params=seq, indices=pos, axis=2, batch_dims=2),
                flow.gather(seq, pos, axis=1, batch_dims=1))
    seq = rng.standard_normal((2, 6, 4)).astype(np.float32)
    pos = np.array([[5, 0, 2], [1, 1, 4]], np.int32)
    want = np.take_along_axis(seq, pos[:, :, None], axis=1)
    for got in pick(seq, pos):
        np.testing.assert_array_equal(got, want)


def test_assign_writes_the_variable_after_the_step():
    @flow.global_function(type="predict")
    def count(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        total = flow.get_variable("h14_counter", shape=(2,), initializer=flow.zeros_initializer())
        flow.assign(total, total + x)
        return total * 2.0                    # from the value the step read
    assert count(np.ones(2, np.float32)).tolist() == [0, 0]
    assert count(np.full(2, 2, np.float32)).tolist() == [2, 2]
    np.testing.assert_array_equal(flow.get_all_variables()["h14_counter"].numpy(), [3, 3])


# --- CUDA: in the emulator, and through nvcc ----------------------------------------------------

@pytest.fixture(scope="module")
def cuda_steps():
    """name -> (lowered program, CUDA step, feeds) for every group, kernel names prefixed apart."""
    from tests.test_cuda_codegen import render
    built = {}
    for i, (name, (fn, inputs)) in enumerate(sorted(GROUPS.items())):
        graph, _, _ = trace_case(fn, inputs, True)
        program = lower(graph)
        feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(i))
        built[name] = (program, render(program, prefix=f"ix{i}_"), feeds)
    return built


def test_cuda_kernels_equal_the_reference_in_the_emulator(cuda_steps, tmp_path):
    from tests.test_cuda_codegen import Emulator, render, replay
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    assert INDEXING_CUDA_TEMPLATES <= {t for _, step, _ in cuda_steps.values() for t in step.templates}
    emulator = Emulator(tmp_path)
    lib = emulator.build("\n".join(step.source for _, step, _ in cuda_steps.values()),
                         [la.kernel for _, step, _ in cuda_steps.values() for la in step.launches])
    for name, (program, step, feeds) in cuda_steps.items():
        got, status = replay(emulator, lib, program, step, feeds, {}, {})
        want, _ = run_reference(program.graph, feeds, {})
        assert status == 0, name
        assert_match(got, want)
    # an index out of range raises the step's status (and names the gather)
    bad = [E, np.array([1, 6], np.int32)]
    graph, _, _ = trace_case(lambda e, w: flow.gather(e, w), bad, grads=False)
    program = lower(graph)
    step = render(program, prefix="ixbad_")
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    _, status = replay(emulator, lib, program, step, bad, {}, {})
    assert status in step.error_nodes and program.graph.node(step.error_nodes[status]).op == "gather"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.isfile("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc is not installed")
def test_the_cuda_kernels_compile_with_nvcc(cuda_steps, tmp_path):
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_cubin
    source = "\n".join(step.source for _, step, _ in cuda_steps.values())
    result = build_cubin(source, "indexing", "sm_90", cache=KernelCache(tmp_path / "cache"))
    cubin = result.path.read_bytes()
    for _, step, _ in cuda_steps.values():
        for launch in step.launches:
            assert launch.kernel.encode() in cubin, launch.kernel
