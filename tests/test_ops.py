"""Every op: generated C++ against the NumPy reference (values and gradients), and the
gradient rules against central finite differences in float64.

Each case is one small graph holding the op's values and d(sum(value * cotangent))/d(input)
for each floating input, so one compilation checks forward and backward C++ together.
"""
from __future__ import annotations

import numpy as np
import pytest

import flow
from flowc.compiler.ops import OPS
from flowc.compiler.trace import emit
from tests.oracle import compile_case, finite_difference_check, trace_case

rng = np.random.default_rng(1234)


def rand(*shape, low=-1.0, high=1.0, dtype=np.float32):
    return rng.uniform(low, high, size=shape).astype(dtype)


def labels(n, classes, dtype=np.int32):
    return rng.integers(0, classes, size=n).astype(dtype)



# name -> (function of blobs, inputs).  Several shapes per op, broadcasting included.
CASES = {
    "add_same": (lambda a, b: a + b, [rand(3, 4), rand(3, 4)]),
    "add_row_broadcast": (lambda a, b: flow.math.add(a, b), [rand(5, 7), rand(7)]),
    "add_outer_broadcast": (lambda a, b: a + b, [rand(2, 1, 4), rand(3, 1)]),
    "add_scalar": (lambda a: 2.5 + a, [rand(4, 3)]),
    "subtract_broadcast": (lambda a, b: flow.math.subtract(a, b), [rand(4, 1), rand(1, 6)]),
    "rsub_scalar": (lambda a: 1.0 - a, [rand(6)]),
    "multiply_broadcast": (lambda a, b: flow.math.multiply(a, b), [rand(2, 3, 4), rand(3, 1)]),
    "divide_broadcast": (lambda a, b: flow.math.divide(a, b), [rand(3, 5), rand(5, low=0.5, high=2.0)]),
    "rdiv_scalar": (lambda a: 1.0 / a, [rand(8, low=0.5, high=2.0)]),
    "negative": (lambda a: -a, [rand(3, 3)]),
    "maximum": (lambda a, b: flow.math.maximum(a, b), [rand(4, 5), rand(5)]),
    "minimum": (lambda a, b: flow.math.minimum(a, b), [rand(4, 5), rand(4, 1)]),
    "relu": (lambda a: flow.nn.relu(a), [rand(6, 7)]),
    "sigmoid": (lambda a: flow.math.sigmoid(a), [rand(5, 9, low=-4, high=4)]),
    "tanh": (lambda a: flow.math.tanh(a), [rand(5, 9, low=-3, high=3)]),
    "exp": (lambda a: flow.math.exp(a), [rand(4, 6)]),
    "log": (lambda a: flow.math.log(a), [rand(4, 6, low=0.2, high=3.0)]),
    "square": (lambda a: flow.math.square(a), [rand(3, 7)]),
    "sqrt": (lambda a: flow.math.sqrt(a), [rand(3, 7, low=0.2, high=3.0)]),
    "chain_long": (lambda a, b: flow.math.tanh(flow.math.exp(a) * b - flow.math.sigmoid(b) / 2.0),
                   [rand(64, 33), rand(33)]),
    "large_parallel_loop": (lambda a, b: flow.nn.relu(a * b + 1.0), [rand(256, 300), rand(300)]),
    "cast_f32_f64": (lambda a: flow.cast(a, flow.double), [rand(3, 4)]),
    "cast_f32_i32": (lambda a: flow.cast(a * 10.0, flow.int32), [rand(3, 4)]),
    "cast_i32_f32": (lambda a: flow.cast(a, flow.float), [labels(7, 10)]),
    "reshape": (lambda a: flow.reshape(a, [4, -1]) * 2.0, [rand(2, 3, 4)]),
    "flatten": (lambda a: flow.flatten(a, start_dim=1) + 1.0, [rand(2, 3, 4)]),
    "transpose_2d": (lambda a: flow.transpose(a, perm=[1, 0]) * 1.5, [rand(5, 3)]),
    "transpose_3d": (lambda a: flow.transpose(a, perm=[2, 0, 1]) + 0.5, [rand(2, 3, 4)]),
    "transpose_then_add": (lambda a, b: flow.transpose(a, perm=[1, 0]) + b, [rand(6, 4), rand(4, 6)]),
    "broadcast_to": (lambda a: emit("broadcast_to", [a], {"shape": (3, 4, 5)}), [rand(4, 1)]),
    "reduce_sum_all": (lambda a: flow.math.reduce_sum(a), [rand(5, 6)]),
    "reduce_sum_rows": (lambda a: flow.math.reduce_sum(a, axis=1), [rand(5, 6)]),
    "reduce_sum_cols_keep": (lambda a: flow.math.reduce_sum(a, axis=0, keepdims=True), [rand(70, 130)]),
    "reduce_sum_outer_inner": (lambda a: flow.math.reduce_sum(a, axis=[0, 2]), [rand(3, 4, 5)]),
    "reduce_sum_middle": (lambda a: flow.math.reduce_sum(a, axis=1, keepdims=True), [rand(3, 4, 5)]),
    "reduce_mean": (lambda a: flow.math.reduce_mean(a, axis=[1, 2]), [rand(3, 4, 5)]),
    "reduce_max": (lambda a: flow.math.reduce_max(a, axis=1), [rand(6, 9)]),
    "reduce_max_keep_first": (lambda a: flow.math.reduce_max(a, axis=0, keepdims=True), [rand(6, 9)]),
    "reduce_min": (lambda a: flow.math.reduce_min(a, axis=[0, 2]), [rand(3, 4, 5)]),
    "two_stage_reduce_max": (lambda a: flow.math.two_stage_reduce_max(a, axis=[1], keepdims=True), [rand(4, 7)]),
    "two_stage_reduce_min": (lambda a: flow.math.two_stage_reduce_min(a), [rand(3, 5)]),
    "reduce_prod": (lambda a: flow.math.reduce_prod(a, axis=-1), [rand(4, 5, low=0.5, high=1.5)]),
    "matmul_nn": (lambda a, b: flow.matmul(a, b), [rand(7, 5), rand(5, 6)]),
    "matmul_nt": (lambda a, b: flow.matmul(a, b, transpose_b=True), [rand(7, 5), rand(6, 5)]),
    "matmul_tn": (lambda a, b: flow.matmul(a, b, transpose_a=True), [rand(5, 7), rand(5, 6)]),
    "matmul_tt": (lambda a, b: flow.matmul(a, b, transpose_a=True, transpose_b=True), [rand(5, 7), rand(6, 5)]),
    "matmul_large_epilogue": (lambda a, b, c: flow.nn.relu(flow.nn.bias_add(flow.matmul(a, b), c)),
                              [rand(100, 120), rand(120, 70), rand(70)]),
    "matmul_batched": (lambda a, b: flow.matmul(a, b), [rand(3, 4, 5), rand(3, 5, 2)]),
    "matmul_f64": (lambda a, b: flow.matmul(a, b, transpose_b=True), [rand(9, 4, dtype=np.float64),
                                                                      rand(3, 4, dtype=np.float64)]),
    "matmul_transposed_input": (lambda a, b: flow.matmul(flow.transpose(a, perm=[1, 0]), b),
                                [rand(5, 7), rand(5, 3)]),
    "conv_same": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"), [rand(2, 3, 7, 6), rand(4, 3, 3, 3)]),
    # float64 runs the portable GEMM, which reads the implicit column matrix through the same offsets
    "conv_same_float64": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"),
                          [rand(2, 3, 7, 6, dtype=np.float64), rand(4, 3, 3, 3, dtype=np.float64)]),
    "conv_valid_stride2": (lambda x, w: flow.nn.conv2d(x, w, strides=2, padding="VALID"),
                           [rand(2, 2, 9, 8), rand(3, 2, 3, 2)]),
    "conv_explicit_dilated": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding=[[0, 0], [0, 0], [2, 1], [0, 2]],
                                                          dilations=2), [rand(1, 2, 7, 7), rand(2, 2, 3, 3)]),
    # the kernel wider and taller than the image: most taps of the implicit GEMM read the zero border
    "conv_same_kernel_wider_than_image": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"),
                                          [rand(2, 2, 3, 4), rand(3, 2, 5, 5)]),
    "conv_same_dilated": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2),
                          [rand(1, 2, 6, 7), rand(2, 2, 3, 3)]),
    # padding only below and to the right: the padded copy starts at the input's first row and column
    "conv_pads_bottom_right_only": (lambda x, w: flow.nn.conv2d(x, w, strides=1,
                                                                padding=[[0, 0], [0, 0], [0, 2], [0, 1]]),
                                    [rand(2, 2, 5, 6), rand(3, 2, 3, 2)]),
    "conv_uneven_pads_same_width": (lambda x, w: flow.nn.conv2d(x, w, strides=1,
                                                                padding=[[0, 0], [0, 0], [3, 0], [0, 2]]),
                                    [rand(2, 2, 5, 6), rand(2, 2, 3, 3)]),
    "conv_groups": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME", groups=2),
                    [rand(2, 4, 5, 5), rand(6, 2, 3, 3)]),
    "conv_nhwc": (lambda x, w: flow.nn.conv2d(x, w, strides=[1, 2], padding="SAME", data_format="NHWC"),
                  [rand(2, 6, 5, 3), rand(4, 3, 3, 3)]),
    "conv_1x1": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="VALID"), [rand(2, 5, 4, 4), rand(3, 5, 1, 1)]),
    "conv_bias_relu_epilogue": (lambda x, w, b: flow.nn.relu(flow.nn.bias_add(
        flow.nn.conv2d(x, w, strides=1, padding="SAME"), b)), [rand(3, 2, 6, 6), rand(5, 2, 3, 3), rand(5)]),
    "conv_f64": (lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"),
                 [rand(2, 2, 5, 5, dtype=np.float64), rand(3, 2, 3, 3, dtype=np.float64)]),
    "max_pool_same": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME"), [rand(2, 3, 7, 5)]),
    "max_pool_valid_overlap": (lambda x: flow.nn.max_pool2d(x, ksize=3, strides=1, padding="VALID"),
                               [rand(1, 2, 5, 6)]),
    "max_pool_nhwc": (lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID", data_format="NHWC"),
                      [rand(2, 4, 6, 3)]),
    "avg_pool_same": (lambda x: flow.nn.avg_pool2d(x, ksize=3, strides=2, padding="SAME"), [rand(2, 2, 7, 6)]),
    "avg_pool_explicit": (lambda x: flow.nn.avg_pool2d(x, ksize=2, strides=2, padding=[1, 1]),
                          [rand(1, 3, 5, 5)]),
    "gelu": (lambda a: flow.nn.gelu(a), [rand(5, 7, low=-3, high=3)]),
    "leaky_relu": (lambda a: flow.nn.leaky_relu(a, alpha=0.1), [rand(5, 7)]),
    "concat_axis1": (lambda a, b, c: flow.concat([a, b, c], axis=1) * 2.0,
                     [rand(2, 3, 4), rand(2, 1, 4), rand(2, 2, 4)]),
    "concat_last": (lambda a, b: flow.concat([a, b], axis=-1), [rand(3, 2), rand(3, 5)]),
    "softmax": (lambda a: flow.nn.softmax(a), [rand(6, 10, low=-3, high=3)]),
    "softmax_axis0": (lambda a: flow.nn.softmax(a, axis=0), [rand(6, 4, low=-3, high=3)]),
    "xent_int32": (lambda y, x: flow.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                   [labels(8, 10), rand(8, 10, low=-3, high=3)]),
    "xent_int64": (lambda y, x: flow.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                   [labels(5, 4, np.int64), rand(5, 4, low=-3, high=3)]),
    "xent_f64": (lambda y, x: flow.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                 [labels(5, 6), rand(5, 6, low=-3, high=3, dtype=np.float64)]),
    "argmax": (lambda a: flow.math.argmax(a), [rand(7, 10)]),
    "argmax_axis0": (lambda a: flow.math.argmax(a, axis=0), [rand(7, 3, 2)]),
}


def assert_close(actual, expected, rtol):
    expected = np.asarray(expected)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(scale, 1e-30))


def assert_outputs_match(got, want) -> None:
    """A step's outputs against the reference's: same shapes and dtypes; floats within 1e-5 (float32)
    or 1e-12 (float64) of the largest value, integers exactly."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            assert_close(g, w, 1e-5 if w.dtype == np.float32 else 1e-12)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_equals_reference(name):
    fn, inputs = CASES[name]
    case = compile_case(fn, inputs)
    assert_outputs_match(case.compiled, case.reference)


DIFFERENTIABLE = [n for n in sorted(CASES) if n not in ("argmax", "argmax_axis0", "cast_f32_i32", "cast_i32_f32")]


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradient_matches_finite_differences(name):
    fn, inputs = CASES[name]
    finite_difference_check(fn, inputs)


def test_every_op_is_covered():
    """A new op row without a case here fails this test."""
    from tests.test_math_ops import CASES as MATH_CASES    # issue 14's flow.math rows
    seen = set()
    for fn, inputs in list(CASES.values()) + list(MATH_CASES.values()):
        graph, _, _ = trace_case(fn, inputs)
        seen.update(n.op for n in graph.nodes)
    from tests.test_indexing_ops import covered_ops     # the indexing ops' cases live in their own module
    seen |= covered_ops()
    from tests.test_sparse_embedding_update import covered_ops as indexed_slices_ops   # issue 15's sparse update
    seen |= indexed_slices_ops()
    from tests.test_fused_bert_kernels import covered_ops as fused_ops   # layer_norm, scaled masked softmax
    seen |= fused_ops()
    from tests.test_batch_norm_op import covered_ops as batch_norm_ops   # batch normalisation of train jobs
    seen |= batch_norm_ops()
    # gradient ops appear in the cases' backward graphs; dropout_mask is tested in tests/test_lenet.py,
    # device_copy (inserted by the placement pass only) in tests/test_cuda_codegen.py, select_nonzero (emitted by
    # the optimizer update only) in tests/test_optimizers_oneflow.py, snapshot (inserted by the snapshot_outputs
    # pass only) in tests/test_train_semantics.py, random_uniform (flow.random.*) in tests/test_scope_and_random.py,
    # all_reduce and the random draws' shards (the data-parallel pass only) in tests/test_data_parallel_pass.py
    # and tests/test_distributed_training.py, the other collectives (the model-parallel pass only) on simulated
    # ranks in tests/test_model_parallel_pass.py and on MPI in tests/test_model_parallel_training.py
    missing = sorted(set(OPS) - seen - {"variable", "scalar", "dropout_mask", "device_copy", "select_nonzero",
                                        "snapshot", "random_uniform", "all_reduce", "dropout_mask_shard",
                                        "random_uniform_shard", "all_gather", "reduce_scatter", "all_to_all"})
    assert not missing, f"ops without a test case: {missing}"


def test_out_of_range_label_is_a_clear_error():
    x = rand(4, 3)
    with pytest.raises(flow.StepError, match="out of range"):
        compile_case(lambda y, a: flow.nn.sparse_softmax_cross_entropy_with_logits(y, a),
                     [np.array([0, 1, 5, 2], np.int32), x], grads=False)
