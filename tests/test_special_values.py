"""NaN, infinities, signed zeros and denormals: every op's compiled C++ (and its CUDA, in the
emulator) against the NumPy reference, forward and backward.

Each case of tests/test_ops.py is compiled once and run on its inputs (and cotangents) with
special values planted in every floating array, one kind at a time and all together.  The
comparison is NaN-aware: NaN at the same places, the same infinities, the same sign of every
zero the reference defines, and the finite rest within the usual tolerance.

A whole training run shows why it matters: one NaN batch must make the loss NaN, as in the
reference, not leave it finite (it stayed at ~ln(classes) forever when relu turned NaN into 0).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import compile_graph
from flowc.compiler.reference import run_reference
from flowc.runtime.executor import CpuLoadedStep
from flowc.runtime.session import Session, default_session
from tests.oracle import cotangents, trace_case
from tests.test_cuda_codegen import needs_gxx
from tests.test_ops import CASES

VARIANTS = ("nan", "inf", "signed_zeros", "denormals", "mixed")

# Values computed from these ops have zeros whose sign depends on summation order or on the float64
# accumulation of the reference (GEMMs, convolutions, pooling windows), or on which of equal extrema
# is taken: only their value is compared.  Every other zero keeps the reference's sign.
ORDER_DEPENDENT_OPS = {"matmul", "conv2d", "conv2d_grad_input", "conv2d_grad_filter", "avg_pool2d",
                       "avg_pool2d_grad", "max_pool2d_grad", "max_pool2d", "reduce_max", "reduce_min",
                       "reduce_prod", "softmax", "sparse_softmax_cross_entropy",
                       "sparse_softmax_cross_entropy_grad", "gelu", "gelu_grad"}


def plant(arrays: list[np.ndarray], variant: str, seed: int) -> list[np.ndarray]:
    """Copies of `arrays` with special values of `variant` at random places of each float array."""
    rng = np.random.default_rng(seed)
    out = []
    for a in arrays:
        a = np.array(a, copy=True)
        if a.dtype.kind != "f" or a.size == 0:
            out.append(a)
            continue
        flat = a.reshape(-1)
        tiny = np.finfo(a.dtype).smallest_subnormal
        denormals = np.array([tiny, -tiny, tiny * 3, -tiny * 1000, np.finfo(a.dtype).tiny / 2], a.dtype)
        if variant in ("nan", "mixed"):
            flat[rng.integers(flat.size)] = np.nan
        if variant in ("inf", "mixed"):
            flat[rng.integers(flat.size)] = np.inf
            flat[rng.integers(flat.size)] = -np.inf
        if variant in ("signed_zeros", "mixed"):
            where = rng.random(flat.size) < 0.3
            flat[where] = rng.choice(np.array([-0.0, 0.0], a.dtype), size=int(where.sum()))
        if variant in ("denormals", "mixed"):
            where = rng.random(flat.size) < 0.3
            flat[where] = rng.choice(denormals, size=int(where.sum()))
        out.append(a)
    return out


def assert_same_numbers(got: np.ndarray, want: np.ndarray, rtol: float, signed_zeros: bool, what: str) -> None:
    """NaN-aware equality: NaN and infinities at the same places, signs of zero (if asked), the rest close."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_got, nan_want):
        where = np.argwhere(nan_got != nan_want)[:5].tolist()
        raise AssertionError(f"{what}: NaN at different places, e.g. {where}: "
                             f"compiled {got[tuple(np.array(where).T)]}, reference {want[tuple(np.array(where).T)]}")
    inf_got, inf_want = np.isinf(got), np.isinf(want)
    if not np.array_equal(inf_got, inf_want) or not np.array_equal(got[inf_want], want[inf_want]):
        where = np.argwhere((inf_got != inf_want) | (inf_want & (got != want)))[:5].tolist()
        raise AssertionError(f"{what}: infinities differ, e.g. at {where}: "
                             f"compiled {got[tuple(np.array(where).T)]}, reference {want[tuple(np.array(where).T)]}")
    finite = np.isfinite(want)
    scale = float(np.max(np.abs(want[finite]))) if finite.any() else 0.0
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol * max(scale, 1e-30), err_msg=what)
    if signed_zeros:
        zeros = (want == 0) & (got == 0)
        wrong = zeros & (np.signbit(got) != np.signbit(want))
        if wrong.any():
            where = np.argwhere(wrong)[:5].tolist()
            raise AssertionError(f"{what}: zeros of another sign at {where} (reference: "
                                 f"{'-0.0' if np.signbit(want[tuple(where[0])]) else '+0.0'})")


def signed_zero_outputs(graph) -> list[bool]:
    """For each output: does the reference define the sign of its zeros (no order-dependent op upstream)?"""
    defined: dict[int, bool] = {}
    for n in graph.nodes:          # in topological order
        defined[n.id] = n.op not in ORDER_DEPENDENT_OPS and all(defined[i] for i in n.inputs)
    return [defined[o] for o in graph.outputs]


def reference(graph, feeds):
    with np.errstate(all="ignore"):
        return run_reference(graph, feeds, {})[0]


def compare(name: str, variant: str, graph, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for k, (g, w, signed) in enumerate(zip(got, want, signed_zero_outputs(graph))):
        rtol = 1e-5 if w.dtype == np.float32 else 1e-12
        op = graph.node(graph.outputs[k]).op
        assert_same_numbers(g, w, rtol, signed, f"{name} [{variant}] output {k} ({op})")


def case_seed(name: str) -> int:
    return zlib.crc32(name.encode())


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equals_reference_on_special_values(name):
    fn, inputs = CASES[name]
    graph, _, _ = trace_case(fn, inputs, True)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    step = CpuLoadedStep(compile_graph(graph), Session())
    for variant in VARIANTS:
        planted = plant(feeds, variant, case_seed(name))
        compare(name, variant, graph, step.run(planted), reference(graph, planted))


# --- the semantics, spelled out ---------------------------------------------------------------------------

def run_compiled(fn, inputs):
    graph, _, _ = trace_case(fn, inputs, grads=False)
    return CpuLoadedStep(compile_graph(graph), Session()).run(list(inputs))


def test_extrema_propagate_nan_as_numpy_does():
    x = np.array([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    y = np.array([[np.nan, 2.0, 1.0], [0.0, -0.0, np.nan]], np.float32)
    relu, maximum, minimum, rmax, rmin, argmax = run_compiled(
        lambda a, b: (flow.nn.relu(a), flow.math.maximum(a, b), flow.math.minimum(a, b),
                      flow.math.reduce_max(a, axis=1), flow.math.reduce_min(b, axis=1), flow.math.argmax(b)), [x, y])
    np.testing.assert_array_equal(relu, [[1.0, np.nan, 3.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(maximum, np.maximum(x, y))
    np.testing.assert_array_equal(minimum, np.minimum(x, y))
    np.testing.assert_array_equal(rmax, [np.nan, -np.inf])          # a row of -inf is -inf, not -FLT_MAX
    np.testing.assert_array_equal(rmin, [np.nan, np.nan])
    np.testing.assert_array_equal(argmax, [0, 2])                   # np.argmax: the first NaN


def test_float_to_integer_casts_saturate_and_nan_becomes_zero():
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.9, -2.9, -0.0], np.float32)
    as_int32, as_uint8, as_int64 = run_compiled(
        lambda a: (flow.cast(a, flow.int32), flow.cast(a, flow.uint8), flow.cast(a, flow.int64)), [x])
    big = np.iinfo(np.int64)
    np.testing.assert_array_equal(as_int32, [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2, -2, 0])
    np.testing.assert_array_equal(as_uint8, [0, 255, 0, 255, 0, 2, 0, 0])
    np.testing.assert_array_equal(as_int64, [0, big.max, big.min, 3000000000, -3000000000, 2, -2, 0])


def test_integer_division_by_zero_is_zero_not_a_crash():
    a = np.array([7, -7, 7, -7, np.iinfo(np.int32).min, 0], np.int32)
    b = np.array([2, 2, 0, 0, -1, 0], np.int32)
    (q,) = run_compiled(lambda x, y: flow.math.divide(x, y), [a, b])
    np.testing.assert_array_equal(q, [3, -3, 0, 0, np.iinfo(np.int32).min, 0])


def test_no_fast_math_anywhere():
    """-ffast-math lets the compiler assume there is no NaN, which turns `x != x` into false."""
    from flowc.compiler import cuda_toolchain, toolchain
    flags = " ".join(toolchain.BASE_FLAGS + cuda_toolchain.BASE_FLAGS)
    for bad in ("fast-math", "fast_math", "-Ofast", "finite-math", "-ftz=true"):
        assert bad not in flags, bad


# --- a whole training run -----------------------------------------------------------------------------------

def test_one_nan_batch_makes_the_loss_nan_as_in_the_reference():
    """A NaN image reaches the loss (relu(NaN) is NaN) and the weights, as in the reference; the loss
    does not settle at ln(classes) with dead weights."""
    rng = np.random.default_rng(3)

    @flow.global_function(type="train")
    def nan_train(x: tp.Numpy.Placeholder((8, 12)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 16, activation=flow.nn.relu, name="nan_hidden")
        logits = flow.layers.dense(h, 4, name="nan_out")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    batches = [rng.standard_normal((8, 12)).astype(np.float32) for _ in range(3)]
    batches[1][2, 5] = np.nan
    labels = rng.integers(0, 4, 8).astype(np.int32)
    nan_train(batches[0], labels)                      # compiles; the session's variables exist now
    session = default_session()
    graph = nan_train.compiled.program.graph
    values = {name: session.value(name).copy() for name in graph.variables}
    for step, x in enumerate(batches[1:], start=1):
        loss = nan_train(x, labels)
        scalars = {name: 0.1 for name in graph.scalars if name.startswith("learning_rate")}
        if "train_step" in graph.scalars:
            scalars["train_step"] = step
        with np.errstate(all="ignore"):
            (want,), updates = run_reference(graph, [x, labels], values, scalars)
        values.update(updates)
        assert np.isnan(loss) and np.isnan(want), (step, loss, want)
    for name in graph.assigns:
        assert np.array_equal(np.isnan(session.value(name)), np.isnan(values[name])), name
    assert np.isnan(session.value("nan_hidden-weight")).any()


# --- the CUDA kernels, in the emulator (tests/cuda_emulator.h) --------------------------------------------

# Every CUDA template and every pointwise helper with a NaN rule, on small shapes.
EMULATED = ["maximum", "minimum", "relu", "leaky_relu", "cast_f32_i32", "divide_broadcast", "log", "sqrt",
            "reduce_max", "reduce_max_keep_first", "reduce_min", "reduce_sum_outer_inner", "reduce_prod",
            "softmax", "softmax_axis0", "xent_int32", "xent_f64", "argmax", "argmax_axis0", "max_pool_same",
            "max_pool_valid_overlap", "avg_pool_same", "matmul_nt", "conv_same", "conv_bias_relu_epilogue",
            "concat_axis1", "gelu"]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """Every EMULATED case lowered and rendered with its own kernel prefix, all built into one library."""
    from tests.test_cuda_codegen import Emulator, lower, render
    emulator = Emulator(tmp_path_factory.mktemp("cuda-special-values"))
    cases, sources = {}, []
    for i, name in enumerate(EMULATED):
        fn, inputs = CASES[name]
        graph, _, _ = trace_case(fn, inputs, True)
        program = lower(graph)
        step = render(program, prefix=f"special{i}_")
        cases[name] = (program, step, list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0)))
        sources.append(step.source)
    kernels = [la.kernel for _, step, _ in cases.values() for la in step.launches]
    return emulator, cases, emulator.build("\n".join(sources), kernels, "-O1")


@needs_gxx
@pytest.mark.parametrize("name", EMULATED)
def test_cuda_kernels_equal_reference_on_special_values_in_the_emulator(name, emulated):
    from tests.test_cuda_codegen import replay
    emulator, cases, lib = emulated
    program, step, feeds = cases[name]
    for variant in VARIANTS:
        planted = plant(feeds, variant, case_seed(name))
        got, status = replay(emulator, lib, program, step, planted, {}, {})
        assert status == 0
        compare(name, variant, program.graph, got, reference(program.graph, planted))
