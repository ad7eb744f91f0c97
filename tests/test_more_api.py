"""More of OneFlow 0.3's names, composed of existing ops (flow/nn.py activations and losses,
flow/math.py tril/in_top_k/polyval/segment sums, flow/more_ops.py sort/argsort/range/smooth_l1_loss,
flow.linalg, flow.sbp, the deprecated scope names): values against NumPy, gradients against finite
differences, and the compiled C++ against the reference, every case in ONE graph.
"""
from __future__ import annotations

import warnings
from typing import Tuple

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from flowc.compiler.pipeline import compile_graph
from flowc.compiler.reference import run_reference
from flowc.runtime.executor import CpuLoadedStep
from flowc.runtime.session import Session
from tests.oracle import cotangents, finite_difference_check, trace_case
from tests.test_cuda_codegen import needs_gxx

nn, m = flow.nn, flow.math
_seeds = iter(range(5000, 6000))


def rand(*shape, low=-1.0, high=1.0, dtype=np.float32, seed=None):
    rng = np.random.default_rng(seed if seed is not None else next(_seeds))
    return rng.uniform(low, high, shape).astype(dtype)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _reduce(v, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda a: a}[reduction](v)


def _logsoftmax(x, axis=-1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def _seg_sum(data, ids, n, axis=0):
    ids_flat = ids.reshape(-1)
    pre, k = data.shape[:axis], ids.ndim
    moved = data.reshape(pre + (ids_flat.size,) + data.shape[axis + k:])
    out = np.zeros(pre + (n,) + data.shape[axis + k:], np.float64)
    for i, s in enumerate(ids_flat):
        if 0 <= s < n:
            out[(slice(None),) * axis + (s,)] += moved[(slice(None),) * axis + (i,)]
    return out


def _in_top_k(labels, x, k):
    """TensorFlow's rule: fewer than k values strictly larger than the target's."""
    picked = x[np.arange(len(labels)), labels][:, None]
    return ((x > picked).sum(axis=1) < k).astype(np.int8)


def _triplet(a, p, n, margin=1.0, pn=2.0, eps=1e-6, swap=False):
    def d(x, y):
        return (np.abs(x - y + eps) ** pn).sum(-1) ** (1 / pn)
    dn = d(a, n)
    if swap:
        dn = np.minimum(dn, d(p, n))
    return np.maximum(d(a, p) - dn + margin, 0)


# Away from the kinks: |x| never within 0.05 of the activations' corners (finite differences).
_x = np.array([[-4.0, -3.2, -2.9, -1.3, -0.6, -0.2], [0.3, 0.7, 1.4, 2.6, 3.3, 6.5]], np.float32)
_prob = rand(3, 4, low=0.1, high=0.9)
_target = rand(3, 4, low=0.0, high=1.0)
_ids = np.array([2, 0, 2, 1, 5, 0], np.int32)           # 5: outside [0, 4), dropped
_bids = np.array([[0, 2, 2, 1, 0], [1, 1, 0, -1, 2]], np.int32)
_labels = np.array([3, 3, 0], np.int32)           # row 0: a tie with index 2

# name -> (function of the inputs, inputs, NumPy's answer for each output)
CASES = {
    "elu": (lambda x: (nn.elu(x), nn.elu(x * 30.0, alpha=0.5)), [_x],
            lambda x: (np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
                       np.where(x > 0, 30 * x, 0.5 * np.expm1(np.minimum(30 * x, 0))))),
    "hard": (lambda x: (nn.hardsigmoid(x), nn.hardswish(x), nn.hardtanh(x), nn.hardtanh(x, -2.0, 3.0),
                        nn.relu6(x)), [_x],
             lambda x: (np.clip(x / 6 + 0.5, 0, 1), x * np.clip(x + 3, 0, 6) / 6, np.clip(x, -1, 1),
                        np.clip(x, -2, 3), np.clip(x, 0, 6))),
    "mish_swish": (lambda x: (nn.mish(x), nn.swish(x), nn.swish(x, beta=2.0)), [_x],
                   lambda x: (x * np.tanh(_softplus(x)), x * _sigmoid(x), x * _sigmoid(2 * x))),
    "logsoftmax": (lambda x: (nn.logsoftmax(x), nn.logsoftmax(x * 100.0, axis=0)), [rand(3, 5)],
                   lambda x: (_logsoftmax(x), _logsoftmax(100 * x, 0))),
    "softmax_grad": (lambda x, dy: nn.softmax_grad(nn.softmax(x), dy), [rand(3, 5), rand(3, 5)],
                     lambda x, dy: (lambda y: y * (dy - (dy * y).sum(-1, keepdims=True)))(
                         np.exp(_logsoftmax(x)))),
    "sigmoid_grad": (lambda x, dy: m.sigmoid_grad(m.sigmoid(x), dy), [rand(3, 4), rand(3, 4)],
                     lambda x, dy: dy * _sigmoid(x) * (1 - _sigmoid(x))),
    "l1_mse": (lambda a, b: (nn.L1Loss(a, b), nn.L1Loss(a, b, reduction="sum"), nn.MSELoss(a, b, "none"),
                             nn.MSELoss(a, b)), [rand(3, 4), rand(3, 4)],
               lambda a, b: (np.abs(b - a).mean(), np.abs(b - a).sum(), (a - b) ** 2, ((a - b) ** 2).mean())),
    "bce": (lambda p, t, w: (nn.BCELoss(p, t), nn.BCELoss(p, t, weight=w, reduction="none")),
            [_prob, _target, rand(3, 4, low=0.5, high=2)],
            lambda p, t, w: (np.mean(-(t * np.log(p) + (1 - t) * np.log(1 - p))),
                             -w * (t * np.log(p) + (1 - t) * np.log(1 - p)))),
    "bce_logits": (lambda x, t, w, pw: (nn.BCEWithLogitsLoss(x, t), nn.BCEWithLogitsLoss(x * 50.0, t, reduction="sum"),
                                        nn.BCEWithLogitsLoss(x, t, weight=w, pos_weight=pw, reduction="none")),
                   [rand(3, 4, low=-3, high=3), _target, rand(3, 4, low=0.5, high=2), rand(4, low=0.5, high=3)],
                   lambda x, t, w, pw: (
                       np.mean(-(t * np.log(_sigmoid(x)) + (1 - t) * np.log(1 - _sigmoid(x)))),
                       np.sum((1 - t) * 50 * x + _softplus(-50 * x)),
                       -w * (pw * t * np.log(_sigmoid(x)) + (1 - t) * np.log(1 - _sigmoid(x))))),
    "kl_div": (lambda x, t: (nn.KLDivLoss(x, t), nn.KLDivLoss(x, t, reduction="none"),
                             nn.KLDivLoss(x, m.log(t + 0.5), log_target=True, reduction="sum")),
               [_logsoftmax(rand(3, 4)).astype(np.float32),
                np.array([[0.2, 0.0, 0.5, 0.3], [0.1, 0.4, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25]], np.float32)],
               lambda x, t: (lambda lt: (
                   np.mean(np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - x), 0)),
                   np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - x), 0),
                   np.sum(np.exp(lt) * (lt - x))))(np.log(t + 0.5))),
    "margin_ranking": (lambda a, b, y: (nn.MarginRankingLoss(a, b, y), nn.MarginRankingLoss(a, b, y, margin=0.3,
                                                                                              reduction="none")),
                       [rand(6), rand(6), np.array([1, -1, 1, -1, 1, 1], np.float32)],
                       lambda a, b, y: (np.maximum(-y * (a - b), 0).mean(), np.maximum(-y * (a - b) + 0.3, 0))),
    "triplet": (lambda a, p, n: (nn.TripletMarginLoss(a, p, n), nn.TripletMarginLoss(a, p, n, margin=0.5, p=3.0,
                                                                                   swap=True, reduction="none"),
                                 nn.TripletMarginLoss(a, p, n, p=1.0, reduction="sum")),
                [rand(4, 3), rand(4, 3), rand(4, 3)],
                lambda a, p, n: (_triplet(a, p, n).mean(), _triplet(a, p, n, 0.5, 3.0, swap=True),
                                 _triplet(a, p, n, pn=1.0).sum())),
    "smooth_l1": (lambda a, b: (flow.smooth_l1_loss(a, b), flow.smooth_l1_loss(a, b, beta=0.5)),
                  [rand(3, 4, low=-2, high=2), rand(3, 4, low=-2, high=2)],
                  lambda a, b: tuple(np.where(np.abs(a - b) < beta, 0.5 * (a - b) ** 2 / beta,
                                              np.abs(a - b) - 0.5 * beta) for beta in (1.0, 0.5))),
    "tril": (lambda x: (m.tril(x), nn.tril(x, diagonal=1, fill_value=-7.0), m.tril(x, diagonal=-2)),
             [rand(2, 3, 5)],
             lambda x: (np.tril(x), np.where(np.tril(np.ones((3, 5)), 1) > 0, x, -7.0), np.tril(x, -2))),
    "polyval": (lambda x: (m.polyval([2.0, -1.0, 0.5], x), m.polyval([3.0], x)), [rand(3, 4)],
                lambda x: (np.polyval([2.0, -1.0, 0.5], x), np.full_like(x, 3.0))),
    "linalg_matmul": (lambda a, b: flow.linalg.matmul(a, b, transpose_b=True), [rand(3, 4), rand(5, 4)],
                      lambda a, b: a @ b.T),
    "segment_sum": (lambda d, ids: (m.unsorted_segment_sum(d, ids, 4),
                                    flow.unsorted_segment_sum(m.square(d), ids, num_segments=3)),
                    [rand(6, 3), _ids],
                    lambda d, ids: (_seg_sum(d, ids, 4), _seg_sum(d ** 2, ids, 3))),
    "segment_sum_axis": (lambda d, ids, like: (m.unsorted_segment_sum(d, ids, 4, axis=1),
                                               flow.unsorted_segment_sum_like(d, ids, like, axis=1)),
                         [rand(2, 6, 3), _ids, np.zeros((2, 7, 3), np.float32)],
                         lambda d, ids, like: (_seg_sum(d, ids, 4, 1), _seg_sum(d, ids, 7, 1))),
    "batch_segment_sum": (lambda d, ids: flow.unsorted_batch_segment_sum(d, ids, 3), [rand(2, 5, 4), _bids],
                          lambda d, ids: np.stack([_seg_sum(d[b], ids[b], 3) for b in range(2)])),
    "sort": (lambda x: (flow.sort(x), flow.sort(x, axis=0, direction="DESCENDING")),
             [np.array([[3.0, -1.0, 2.0, 2.5], [0.5, 4.0, -2.0, 1.0], [1.5, 0.25, 5.0, -3.0]], np.float32)],
             lambda x: (np.sort(x), -np.sort(-x, axis=0))),
    "argsort_in_top_k": (lambda x, lab: (flow.argsort(x), flow.argsort(x, axis=0, direction="DESCENDING"),
                                         m.in_top_k(lab, x, 2), flow.in_top_k(lab, x, k=1)),
                         [np.array([[3.0, -1.0, 2.0, 2.0], [0.5, 4.0, -2.0, 1.0], [1.5, 0.25, 5.0, -3.0]],
                                   np.float32), _labels],
                         lambda x, lab: (np.argsort(x, kind="stable"), np.argsort(-x, axis=0, kind="stable"),
                                         _in_top_k(lab, x, 2), _in_top_k(lab, x, 1))),
    "range": (lambda x: (flow.range(5) + flow.cast(x, flow.int64), flow.range(1.0, 2.0, 0.25, dtype=flow.float),
                         flow.range(10, 0, -3, dtype=flow.int32)),
              [np.arange(5, dtype=np.int32)],
              lambda x: (np.arange(5) + x, np.arange(1.0, 2.0, 0.25), np.arange(10, 0, -3))),
}

NOT_DIFFERENTIABLE = {"argsort_in_top_k", "range"}
# t * log(t) has no derivative at t = 0: KLDivLoss's gradients are checked at positive targets.
FD_INPUTS = {"kl_div": [CASES["kl_div"][1][0], rand(3, 4, low=0.1, high=0.9)]}


def combined(names):
    inputs, spans = [], []
    for name in names:
        spans.append((name, len(inputs), len(CASES[name][1])))
        inputs += CASES[name][1]
    owners: list[tuple[str, int]] = []

    def fn(*blobs):
        owners.clear()
        outs = []
        for name, start, count in spans:
            result = CASES[name][0](*blobs[start:start + count])
            result = list(result) if isinstance(result, (tuple, list)) else [result]
            owners.extend((name, k) for k in range(len(result)))
            outs += result
        return outs
    return fn, inputs, owners


@pytest.fixture(scope="module")
def compiled():
    """Every case in one graph, compiled once for the CPU, and its reference results."""
    fn, inputs, owners = combined(sorted(CASES))
    graph, n_values, _ = trace_case(fn, inputs, True)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    got = CpuLoadedStep(compile_graph(graph), Session()).run(feeds)
    with np.errstate(over="ignore"):       # the reference's sigmoid of -50 * x, a gradient of softplus
        want, _ = run_reference(graph, feeds, {})
    return graph, feeds, got, want, n_values, list(owners)


def test_compiled_equals_reference(compiled):
    _, _, got, want, _, _ = compiled
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        assert np.all(np.isfinite(g)), f"output {k} (values, then gradients) is not finite"
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


def test_reference_equals_numpy(compiled):
    _, _, _, want, _, owners = compiled
    answers: dict[str, list] = {}
    for name, (_, inputs, numpy_fn) in CASES.items():
        expected = numpy_fn(*[a.astype(np.float64) if a.dtype == np.float32 else a for a in inputs])
        answers[name] = list(expected) if isinstance(expected, tuple) else [expected]
    wrong = []
    for (name, k), w in zip(owners, want):
        expected = np.atleast_1d(answers[name][k])      # OneFlow has no 0-d blobs: a full reduction is (1,)
        if w.shape != expected.shape or not np.allclose(w, expected, rtol=2e-5, atol=2e-6):
            wrong.append(f"{name} output {k}: {w} != {expected}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", sorted(set(CASES) - NOT_DIFFERENTIABLE))
def test_gradient_matches_finite_differences(name):
    fn, inputs, _ = CASES[name]
    finite_difference_check(fn, FD_INPUTS.get(name, inputs))


@needs_gxx
def test_cuda_kernels_equal_the_reference_in_the_emulator(compiled, tmp_path):
    """The CUDA source of the same graph (its fused kernels are new compositions of lowered ops)."""
    from tests.test_cuda_codegen import Emulator, lower, render, replay
    graph, feeds, _, want, _, _ = compiled
    program = lower(graph)
    step = render(program, prefix="more_api_")
    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches], "-O1")
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    assert status == 0
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


def test_losses_check_their_arguments():
    def build(fn):
        return trace_case(fn, [rand(3, 4), rand(3, 4)], grads=False)
    with pytest.raises(TraceError, match=r"reduction must be .* got 'avg'"):
        build(lambda a, b: nn.MSELoss(a, b, reduction="avg"))
    with pytest.raises(TraceError, match=r"test_more_api.py.*input \[3, 4\] and target \[4\]"):
        build(lambda a, b: nn.L1Loss(a, flow.math.reduce_sum(b, axis=0)))
    with pytest.raises(TraceError, match="direction must be"):
        build(lambda a, b: flow.sort(a, direction="UP"))
    with pytest.raises(TraceError, match="min_val"):
        build(lambda a, b: nn.hardtanh(a, 1.0, -1.0))
    with pytest.raises(TraceError, match="data must be float32 or float64"):
        trace_case(lambda d, i: m.unsorted_segment_sum(d, i, 3), [np.ones((4, 2), np.int32), _ids[:4]], grads=False)
    graph, _, _ = trace_case(lambda x: m.polyval([1.0, 2.0], x), [np.array(3.0, np.float32)], grads=False)
    assert run_reference(graph, [np.array(3.0, np.float32)], {})[0][0] == 5.0      # a scalar x


def test_names_exist_where_oneflow_has_them():
    for path in ("nn.elu", "nn.hardsigmoid", "nn.hardswish", "nn.hardtanh", "nn.relu6", "nn.mish", "nn.swish",
                 "nn.logsoftmax", "nn.L1Loss", "nn.MSELoss", "nn.BCELoss", "nn.BCEWithLogitsLoss", "nn.KLDivLoss",
                 "nn.MarginRankingLoss", "nn.TripletMarginLoss", "nn.softmax_grad", "nn.tril", "smooth_l1_loss",
                 "linalg.matmul", "math.in_top_k", "in_top_k", "math.tril", "math.polyval", "math.sigmoid_grad",
                 "math.unsorted_segment_sum", "math.unsorted_segment_sum_like", "math.unsorted_batch_segment_sum",
                 "unsorted_segment_sum", "unsorted_segment_sum_like", "unsorted_batch_segment_sum", "sort",
                 "argsort", "range", "name_scope", "deprecated.variable_scope", "device_prior_placement",
                 "sbp.split", "sbp.broadcast", "sbp.auto", "sbp.assert_is_valid_sbp", "dtypes"):
        obj = flow
        for part in path.split("."):
            obj = getattr(obj, part)
        assert callable(obj) and obj.__doc__ and "Example" in obj.__doc__, path
    assert flow.float16 in flow.dtypes() and flow.int64 in flow.dtypes()
    assert flow.sbp.split(1) == flow.distribute.split(1)
    flow.sbp.assert_is_valid_sbp(flow.sbp.broadcast())


def test_deprecated_scopes_through_a_job():
    """name_scope and variable_scope prefix variable names like flow.scope.namespace, with a warning;
    device_prior_placement places like flow.scope.placement."""
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def more_api_scopes(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        with flow.name_scope("outer"):
            with flow.deprecated.variable_scope("inner"):
                w = flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())
        with flow.device_prior_placement("cpu", "0:0"):
            return x * w + flow.smooth_l1_loss(x, w)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = more_api_scopes(np.array([1.0, 3.0], np.float32))
    np.testing.assert_allclose(out, [1.0 + 0.0, 3.0 + 1.5])
    assert "outer-inner-w" in flow.get_all_variables()
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, DeprecationWarning))
    for old in ("name_scope", "variable_scope", "device_prior_placement"):
        assert old in messages
    flow.clear_default_session()


def test_layers_prelu_trains_its_alpha():
    """<name>-alpha, shared axes, the forward value and one SGD step of alpha against NumPy."""
    flow.clear_default_session()
    x = np.array([[[1.0, -2.0], [-0.5, 3.0]], [[-1.0, 0.5], [-4.0, -2.0]]], np.float32)     # (2, 2, 2)

    @flow.global_function(type="train")
    def more_api_prelu(v: tp.Numpy.Placeholder((2, 2, 2))) -> tp.Numpy:
        with flow.scope.namespace("block"):
            y = flow.layers.prelu(v, alpha_initializer=flow.constant_initializer(0.25), shared_axes=[2], name="act")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(
            flow.math.reduce_sum(y))
        return y

    out = more_api_prelu(x)
    np.testing.assert_allclose(out, np.where(x > 0, x, 0.25 * x))
    alpha = flow.get_all_variables()["block-act-alpha"]
    alpha = alpha.numpy() if hasattr(alpha, "numpy") else np.asarray(alpha)
    assert alpha.shape == (2, 1)
    # d(sum y)/d alpha[c] = sum of the negative x of channel c over batch and the shared axis
    grad = np.where(x < 0, x, 0).sum(axis=(0, 2)).reshape(2, 1)
    np.testing.assert_allclose(alpha, 0.25 - 0.1 * grad, rtol=1e-6)
    flow.clear_default_session()


def test_view_enabled_reads_the_jobs_logical_view():
    flow.clear_default_session()
    seen = {}
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=config)
    def more_api_mirrored(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["mirrored"] = (flow.scope.mirrored_view_enabled(), flow.scope.consistent_view_enabled())
        return x

    @flow.global_function(type="predict")
    def more_api_consistent(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["consistent"] = (flow.scope.mirrored_view_enabled(), flow.scope.consistent_view_enabled())
        with pytest.warns(DeprecationWarning, match="consistent_strategy_enabled"):
            seen["deprecated"] = (flow.distribute.consistent_strategy_enabled(),)
        return x

    more_api_mirrored(np.zeros(2, np.float32))
    more_api_consistent(np.zeros(2, np.float32))
    assert seen == {"mirrored": (True, False), "consistent": (False, True), "deprecated": (True,)}
    assert flow.scope.consistent_view_enabled() and not flow.scope.mirrored_view_enabled()
    with pytest.warns(DeprecationWarning, match="mirrored_strategy_enabled"):
        assert not flow.distribute.mirrored_strategy_enabled()
    flow.clear_default_session()


def test_order_checks_and_copy():
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((5,), dtype=flow.float)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return flow.math.is_non_decreasing(x), flow.math.is_strictly_increasing(x), flow.copy(x) * 2.0

    for values in ([1, 2, 2, 3, 4], [1, 2, 3, 4, 5], [2, 1, 3, 4, 5]):
        x = np.array(values, np.float32)
        non_decreasing, increasing, doubled = job(x)
        assert non_decreasing.shape == increasing.shape == (1,)       # as OneFlow's ops
        assert non_decreasing[0] == int(np.all(np.diff(x) >= 0))
        assert increasing[0] == int(np.all(np.diff(x) > 0))
        np.testing.assert_array_equal(doubled, x * 2)
