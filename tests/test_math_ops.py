"""flow.math's functions of issue 14 (compiler/ops/math_rows.py, flow/math.py): compiled C++ and
CUDA (in the emulator) against the NumPy reference, gradients against finite differences, and
NaN/Inf/signed zeros as NumPy has them.

Every case is compiled into ONE graph (and one CUDA source), so the whole module builds a
handful of kernels' translation units, not one per case.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.pipeline import compile_graph
from flowc.runtime.executor import CpuLoadedStep
from flowc.runtime.session import Session
from tests.oracle import cotangents, finite_difference_check, trace_case
from tests.test_cuda_codegen import needs_gxx, needs_nvcc

m = flow.math


_seeds = iter(range(1000, 2000))


def rand(*shape, low=-1.0, high=1.0, dtype=np.float32, seed=None):
    rng = np.random.default_rng(seed if seed is not None else next(_seeds))
    return rng.uniform(low, high, shape).astype(dtype)


def with_zeros(a):
    a = a.copy()
    a.reshape(-1)[::3] = 0
    return a


_int_a = np.array([[7, -7, 7, -7, 0, 5], [-128, 3, -3, 9, -9, 1]], np.int32)
_int_b = np.array([[2, 2, -2, -2, 3, 0], [-1, -3, 3, 4, 4, 1]], np.int32)

CASES = {
    "abs": (lambda a: m.abs(a), [rand(3, 4, seed=1)]),
    "abs_int": (lambda a: m.abs(a), [_int_a]),
    "acos": (lambda a: m.acos(a), [rand(3, 4, low=-0.9, high=0.9)]),
    "asin": (lambda a: m.asin(a), [rand(3, 4, low=-0.9, high=0.9, seed=2)]),
    "atan": (lambda a: m.atan(a), [rand(3, 4, low=-3, high=3)]),
    "atanh": (lambda a: m.atanh(a), [rand(3, 4, low=-0.9, high=0.9, seed=3)]),
    "acosh": (lambda a: m.acosh(a), [rand(3, 4, low=1.1, high=3)]),
    "asinh": (lambda a: m.asinh(a), [rand(3, 4, low=-3, high=3, seed=4)]),
    "cos": (lambda a: m.cos(a), [rand(3, 4, low=-3, high=3, seed=5)]),
    "sin": (lambda a: m.sin(a), [rand(3, 4, low=-3, high=3, seed=6)]),
    "tan": (lambda a: m.tan(a), [rand(3, 4, low=-1.2, high=1.2)]),
    "cosh": (lambda a: m.cosh(a), [rand(3, 4, low=-3, high=3, seed=7)]),
    "sinh": (lambda a: m.sinh(a), [rand(3, 4, low=-3, high=3, seed=8)]),
    "erf": (lambda a: m.erf(a), [rand(3, 4, low=-2, high=2)]),
    "erfc": (lambda a: m.erfc(a), [rand(3, 4, low=-2, high=2, seed=9)]),
    "expm1": (lambda a: m.expm1(a), [rand(3, 4, low=-2, high=2, seed=10)]),
    "log1p": (lambda a: m.log1p(a), [rand(3, 4, low=-0.5, high=2)]),
    "lgamma": (lambda a: m.lgamma(a), [rand(3, 4, low=0.2, high=5)]),
    "lgamma_negative": (lambda a: m.lgamma(a), [rand(3, 4, low=-2.8, high=-2.2)]),
    "lgamma_f64": (lambda a: m.lgamma(a), [rand(2, 3, low=0.3, high=30, dtype=np.float64)]),
    "log_sigmoid": (lambda a: m.log_sigmoid(a), [rand(3, 4, low=-40, high=40)]),
    "softplus": (lambda a: m.softplus(a), [rand(3, 4, low=-40, high=40, seed=11)]),
    "reciprocal": (lambda a: m.reciprocal(a), [rand(3, 4, low=0.5, high=2)]),
    "reciprocal_no_nan": (lambda a: m.reciprocal_no_nan(a), [rand(3, 4, low=0.5, high=2, seed=12)]),
    "reciprocal_no_nan_zeros": (lambda a: m.reciprocal_no_nan(a), [with_zeros(rand(3, 4, low=0.5, high=2))]),
    "rsqrt": (lambda a: m.rsqrt(a), [rand(3, 4, low=0.5, high=3)]),
    "rounding": (lambda a: (m.ceil(a), m.floor(a), m.rint(a), m.round(a), m.sign(a)),
                 [np.array([[-2.5, -1.5, -0.5, -0.0, 0.0, 0.5], [1.5, 2.5, 1.49999, 1.500001, 2.7, -3.2]],
                           np.float32)]),
    "sign_int": (lambda a: m.sign(a), [_int_a]),
    "pow": (lambda a, b: m.pow(a, b), [rand(3, 4, low=0.5, high=2), rand(4, low=-2, high=2)]),
    "pow_scalar": (lambda a: m.pow(a, 3.0), [rand(3, 4, low=-2, high=2, seed=13)]),
    "atan2": (lambda a, b: m.atan2(a, b), [rand(3, 4, seed=14), rand(3, 1, low=0.2, high=1)]),
    "floordiv": (lambda a, b: m.floordiv(a, b), [rand(3, 4, low=-5, high=5), rand(4, low=0.5, high=2)]),
    "floordiv_int": (lambda a, b: m.floordiv(a, b), [_int_a, _int_b]),
    "mod": (lambda a, b: m.mod(a, b), [rand(3, 4, low=-5, high=5, seed=15), rand(4, low=0.7, high=2.1)]),
    "mod_negative_divisor": (lambda a, b: m.mod(a, b), [rand(3, 4, low=-5, high=5, seed=16),
                                                        rand(4, low=-2.1, high=-0.7)]),
    "mod_int": (lambda a, b: m.mod(a, b), [_int_a, _int_b]),
    "xdivy": (lambda a, b: m.xdivy(a, b), [rand(3, 4, low=0.5, high=2), rand(3, 4, low=0.5, high=2, seed=17)]),
    "xlogy": (lambda a, b: m.xlogy(a, b), [rand(3, 4, low=-2, high=2, seed=18), rand(4, low=0.5, high=2)]),
    "xdivy_xlogy_zeros": (lambda a, b: (m.xdivy(a, b), m.xlogy(a, b)),
                          [with_zeros(rand(3, 4, seed=19)), np.array([1.0, 0.0, 2.0, -1.0], np.float32)]),
    "compare": (lambda a, b: (m.equal(a, b), m.not_equal(a, b), m.less(a, b), m.less_equal(a, b),
                              m.greater(a, b), m.greater_equal(a, b), m.logical_and(a, b)),
                [np.array([[1, 2, 0, -1], [3, 0, 0, 2]], np.float32), np.array([1, 0, 0, 2], np.float32)]),
    "compare_int": (lambda a, b: (m.equal(a, b), m.less(a, b), m.logical_and(a, b)), [_int_a, _int_b]),
    "add_n": (lambda a, b, c: m.add_n([a, b, c]), [rand(3, 4, seed=20), rand(3, 4, seed=21), rand(3, 4, seed=22)]),
    "clip_by_value": (lambda a: (m.clip_by_value(a, -0.5, 0.5), m.clip_by_value(a, min_value=0.1),
                                 m.clip_by_value(a, max_value=0.2)), [rand(3, 4, seed=23)]),
    "squared_difference": (lambda a, b: m.squared_difference(a, b), [rand(3, 4, seed=24), rand(4, seed=25)]),
    "reduce_any_all": (lambda a: (m.reduce_any(a, axis=1), m.reduce_all(a, axis=1), m.reduce_any(a),
                                  m.reduce_all(a, axis=[0], keepdims=True)),
                       [np.array([[0, 0, 0], [0, 2, 0], [1, 1, -1]], np.float32)]),
    "reduce_euclidean_norm": (lambda a: (m.reduce_euclidean_norm(a, axis=1), m.reduce_euclidean_norm(a)),
                              [rand(3, 4, seed=26)]),
    "reduce_logsumexp": (lambda a: (m.reduce_logsumexp(a, axis=1), m.reduce_logsumexp(a, axis=0, keepdims=True),
                                    m.reduce_logsumexp(a * 100.0, axis=1)), [rand(3, 4, seed=27)]),
    "reduce_variance_std": (lambda a: (m.reduce_variance(a, axis=1), m.reduce_std(a, axis=0, keepdims=True),
                                       m.reduce_variance(a + 1000.0)), [rand(3, 4, seed=28)]),
    "l2_normalize": (lambda a: (m.l2_normalize(a, axis=1), m.l2_normalize(a * 0.0, axis=-1)), [rand(3, 4)]),
    "grad_functions": (lambda x, dy: (m.gelu_grad(x, dy), m.tanh_grad(m.tanh(x), dy)), [rand(3, 4), rand(3, 4)]),
    "broadcast_to_compatible_with": (lambda a, b, c: m.broadcast_to_compatible_with(a, [b, c]),
                                     [rand(1, 4), rand(3, 1), rand(2, 1, 1)]),
    "reduce_min_prod": (lambda a: (m.reduce_min(a, axis=1), m.reduce_prod(a, axis=0)),
                        [rand(3, 4, low=0.5, high=2, seed=29)]),
}

# Value-only cases: a gradient that is discontinuous at the inputs (zeros of reciprocal_no_nan,
# xdivy and xlogy) or integer / rounding outputs.
# The cases compiled together (the oracle's loss adds every output: one float dtype).
COMBINED = sorted(name for name in CASES if name != "lgamma_f64")
NOT_DIFFERENTIABLE = {"grad_functions", "abs_int", "rounding", "sign_int", "floordiv", "floordiv_int", "mod_int",
                      "reciprocal_no_nan_zeros", "xdivy_xlogy_zeros", "compare", "compare_int", "reduce_any_all"}


def combined(names: list[str]):
    """One function over every case's inputs (in order) returning every case's outputs, and the
    owner case of each value output (filled by tracing)."""
    inputs, spans = [], []
    for name in names:
        spans.append((name, len(inputs), len(CASES[name][1])))
        inputs += CASES[name][1]
    owners: list[str] = []

    def fn(*blobs):
        owners.clear()
        outs = []
        for name, start, count in spans:
            result = CASES[name][0](*blobs[start:start + count])
            result = list(result) if isinstance(result, (tuple, list)) else [result]
            owners.extend([name] * len(result))
            outs += result
        return outs
    return fn, inputs, owners


def traced(names: list[str]):
    """The combined cases traced with gradients: (graph, inputs, owner case of each output)."""
    fn, inputs, owners = combined(names)
    graph, _, grad_inputs = trace_case(fn, inputs, True)
    input_owner = [name for name in names for _ in CASES[name][1]]
    owners = owners + [input_owner[i] for i in grad_inputs]
    assert len(owners) == len(graph.outputs)
    return graph, inputs, owners


# Cases whose outputs (or gradients) are products of a long sum's last bits: with denormal inputs
# the sign of an underflowed zero there depends on the summation order (like ORDER_DEPENDENT_OPS
# in tests/test_special_values.py), so only their values are compared.
SUM_ORDER_ZEROS = {"reduce_euclidean_norm", "l2_normalize", "reduce_variance_std", "reduce_logsumexp"}


def compare_special(label: str, variant: str, graph, owners: list[str], got, want) -> None:
    from tests.test_special_values import assert_same_numbers, signed_zero_outputs
    for k, (g, w, signed) in enumerate(zip(got, want, signed_zero_outputs(graph))):
        rtol = 1e-5 if w.dtype == np.float32 else 1e-12
        assert_same_numbers(g, w, rtol, signed and owners[k] not in SUM_ORDER_ZEROS,
                            f"{label} [{variant}] output {k} of case {owners[k]}")


@pytest.fixture(scope="module")
def compiled():
    """Every case in one graph, compiled once for the CPU."""
    graph, inputs, owners = traced(COMBINED)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    step = CpuLoadedStep(compile_graph(graph), Session())
    return graph, feeds, step, owners


def test_compiled_equals_reference(compiled):
    from flowc.compiler.reference import run_reference
    graph, feeds, step, owners = compiled
    got = step.run(feeds)
    with np.errstate(all="ignore"):           # xlogy(x, -1) is NaN on purpose
        want, _ = run_reference(graph, feeds, {})
    compare_special("cpu", "plain", graph, owners, got, want)


def test_compiled_equals_reference_on_special_values(compiled):
    from tests.test_special_values import VARIANTS, plant, reference
    graph, feeds, step, owners = compiled
    for variant in VARIANTS:
        planted = plant(feeds, variant, 14)
        compare_special("cpu", variant, graph, owners, step.run(planted), reference(graph, planted))


@pytest.mark.parametrize("name", sorted(set(CASES) - NOT_DIFFERENTIABLE))
def test_gradient_matches_finite_differences(name):
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs)


def test_reference_values_numpy_and_oneflow_agree_on():
    """The reference's answers where NumPy (or OneFlow's documentation) gives one."""
    from flowc.compiler.reference import run_reference
    x = np.array([-2.5, -0.5, -0.0, 0.5, 1.5, 2.5, np.nan, -np.inf], np.float32)
    graph, _, _ = trace_case(lambda a: (m.round(a), m.sign(a), m.abs(a), m.softplus(a), m.log_sigmoid(a)), [x],
                             grads=False)
    with np.errstate(all="ignore"):
        (rnd, sgn, ab, sp, ls), _ = run_reference(graph, [x], {})
    np.testing.assert_array_equal(rnd, [-2.0, -0.0, -0.0, 0.0, 2.0, 2.0, np.nan, -np.inf])   # half to even
    np.testing.assert_array_equal(sgn, [-1, -1, 0, 1, 1, 1, np.nan, -1])
    assert not np.signbit(sgn[2]) and not np.signbit(ab[2])                               # as np.sign, np.abs
    np.testing.assert_allclose(sp[:6], np.log1p(np.exp(x[:6].astype(np.float64))), rtol=1e-6)
    assert sp[7] == 0 and np.isnan(sp[6]) and ls[7] == -np.inf


# --- the CUDA kernels: the emulator, and nvcc ----------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_case(tmp_path_factory):
    from tests.test_cuda_codegen import Emulator, lower, render
    graph, inputs, owners = traced(COMBINED)
    program = lower(graph)
    step = render(program, prefix="math_")
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    return program, step, feeds, owners, Emulator(tmp_path_factory.mktemp("cuda-math"))


@needs_gxx
def test_cuda_kernels_equal_the_reference_on_special_values_in_the_emulator(cuda_case):
    from tests.test_cuda_codegen import replay
    from tests.test_special_values import VARIANTS, plant, reference
    program, step, feeds, owners, emulator = cuda_case
    lib = emulator.build(step.source, [la.kernel for la in step.launches], "-O1")
    for variant in ("plain",) + VARIANTS:
        planted = feeds if variant == "plain" else plant(feeds, variant, 14)
        got, status = replay(emulator, lib, program, step, planted, {}, {})
        assert status == 0
        compare_special("cuda", variant, program.graph, owners, got, reference(program.graph, planted))


@pytest.mark.slow
@needs_nvcc
def test_the_cuda_source_compiles_with_nvcc(cuda_case, tmp_path):
    """Every <cmath> function and helper the rows call exists in device code."""
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_cubin
    _, step, _, _, _ = cuda_case
    res = build_cubin(step.source, "math", "sm_80", cache=KernelCache(tmp_path / "cache"))
    cubin = res.path.read_bytes()
    for launch in step.launches:
        assert launch.kernel.encode() in cubin


# --- the API -----------------------------------------------------------------------------------------

def test_comparisons_return_int8_through_a_job():
    @flow.global_function(type="predict")
    def math_compare_job(a: tp.Numpy.Placeholder((4,)), b: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return m.greater(a, b)

    out = math_compare_job(np.array([1, 2, 3, np.nan], np.float32), np.array([0, 2, 4, 0], np.float32))
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [1, 0, 0, 0])


def test_misuse_names_the_argument_and_the_users_line():
    def bad_add_n(a, b):
        return m.add_n([a, b])

    with pytest.raises(flow.TraceError, match=r"test_math_ops.py:\d+.*inputs\[1\]"):
        trace_case(bad_add_n, [rand(3, 4), rand(4, 3)], grads=False)
    with pytest.raises(flow.TraceError, match="min_value, max_value"):
        trace_case(lambda a: m.clip_by_value(a), [rand(3, 4)], grads=False)
    with pytest.raises(Exception, match="floating-point"):
        trace_case(lambda a, b: m.pow(a, b), [_int_a, _int_b], grads=False)


def test_blob_operators_for_mod_and_comparisons():
    a = np.array([[-3.5, 0.0, 2.0], [5.0, -1.0, 7.5]], np.float32)
    b = np.array([2.0, 0.5, -2.0], np.float32)
    graph, _, _ = trace_case(lambda x, y: (x % y, x < y, x <= 2.0, x > y, 1.0 >= x), [a, b], grads=False)
    got = CpuLoadedStep(compile_graph(graph), Session()).run([a, b])
    want = [np.mod(a, b), a < b, a <= 2, a > b, 1 >= a]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w.astype(g.dtype))
    assert [g.dtype for g in got[1:]] == [np.int8] * 4


def test_oneflow_aliases_of_clip_by_value():
    assert flow.clip is flow.clamp is flow.clip_by_scalar is flow.clip_by_value is m.clip_by_value


def test_every_row_of_math_rows_has_a_case():
    from flowc.compiler.ops import OPS, math_rows
    mine = {name for name, rule in OPS.items() if rule.reference.__module__ == math_rows.__name__
            or getattr(rule.infer, "__module__", "") == math_rows.__name__}
    seen = set()
    for fn, inputs in CASES.values():
        graph, _, _ = trace_case(fn, inputs)
        seen.update(n.op for n in graph.nodes)
    assert mine and not (mine - seen), sorted(mine - seen)
