"""Every value of a data-parallel job's rank graph has the share its layout makes.

Regression: a convolution's input gradient (`conv2d_grad_input`) and an average pool's gradient keep
the input's shape in an attribute.  The data-parallel pass did not shrink it, so each rank computed
the input gradient of the whole batch, reading past the end of its share of dy (the rows it used
were right, so the training runs still matched).  The ranks' graph now runs on simulated ranks
(tests/rank_simulator.py) and equals the logical job, and the pass checks each share's shape.
"""
import numpy as np

import flow
from flowc.compiler.passes.data_parallel import SPLIT
from tests.test_model_parallel_pass import B, INIT, check_equal, train_job_of


def two_convolutions(x):
    x = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, kernel_initializer=INIT,
                           name="conv1")
    x = flow.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")
    x = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, kernel_initializer=INIT,
                           name="conv2")
    x = flow.nn.max_pool2d(flow.layers.conv2d(x, 4, 1, name="conv3", kernel_initializer=INIT),
                           ksize=2, strides=2, padding="VALID")
    return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 10, kernel_initializer=INIT,
                             name="out")


def test_input_gradients_of_convolutions_and_pools_are_each_ranks_share():
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((B, 1, 4, 4)).astype(np.float32), rng.integers(0, 10, B).astype(np.int32)]
    local, distribution = check_equal(lambda: train_job_of(two_convolutions, "sgd"), inputs)
    grads = [n for n in local.nodes if n.op in ("conv2d_grad_input", "avg_pool2d_grad")]
    assert len(grads) >= 3
    assert all(n.type.shape[0] == B // 2 and distribution.layouts and n.attr("input_shape")[0] == B // 2 for n in grads)
    assert distribution.outputs == [SPLIT]


def plain_mlp(x):
    x = flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 12, activation=flow.nn.relu, kernel_initializer=INIT,
                          name="hidden")
    return flow.layers.dense(x, 10, kernel_initializer=INIT, name="out")


def test_adam_sums_each_gradient_once_for_both_of_its_moments():
    """Adam reads a gradient scaled (first moment) and squared (second): one all_reduce of the
    gradient serves both, where summing each use would send every gradient twice."""
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((B, 1, 4, 4)).astype(np.float32), rng.integers(0, 10, B).astype(np.int32)]
    local, _ = check_equal(lambda: train_job_of(plain_mlp, "adam"), inputs)
    sums = [n for n in local.nodes if n.op == "all_reduce"]
    assert sorted(n.type.shape for n in sums) == [(10,), (10, 12), (12,), (12, 16)]


def test_the_master_refuses_an_input_whose_rows_do_not_split_over_the_ranks():
    """The master slices each input into the ranks' rows; a batch that does not divide (7 rows on 2
    ranks) is an error naming the input, never a share that silently leaves a row out."""
    import types

    import pytest

    from flowc.compiler.errors import DistributedError
    from flowc.compiler.passes.batch_split import BatchSplit
    from flowc.runtime.distributed import DistributedStep
    from tests.test_model_parallel_pass import logical_and_ranks

    _, _, local, _ = logical_and_ranks(lambda: train_job_of(plain_mlp, "sgd"))
    step = DistributedStep.__new__(DistributedStep)        # the master's feed alone: no MPI here
    step.graph, step.job_name, step._pending = local, "train_job", {}
    step.cluster = types.SimpleNamespace(ranks=2)
    step.compiled = types.SimpleNamespace(generated=types.SimpleNamespace(label_checks=[]))
    fed = []
    step.inner = types.SimpleNamespace(feed=lambda slot, arrays, scalars: fed.append(arrays))
    step.whole_inputs = set()
    step.split = BatchSplit(2)
    images = np.zeros((B - 1, 1, 4, 4), np.float32)
    with pytest.raises(DistributedError, match=r"input .* of shape \[7, 1, 4, 4\] does not split along axis 0 over 2"):
        step.feed(object(), [images, np.zeros(B - 1, np.int32)])
    step.feed(object(), [np.zeros((B, 1, 4, 4), np.float32), np.zeros(B, np.int32)])    # 8 rows: 4 each
    assert [a.shape for a in fed[-1]] == [(B // 2, 1, 4, 4), (B // 2,)]
    step.whole_inputs = {1}          # batch_axis=None: every rank gets the whole input, whatever its rows
    labels = np.arange(B - 1, dtype=np.int32)
    slot = object()
    step.feed(slot, [np.zeros((B, 1, 4, 4), np.float32), labels])
    assert [a.shape for a in fed[-1]] == [(B // 2, 1, 4, 4), (B - 1,)]
    shares, _, bad_labels = step._pending[id(slot)]
    assert bad_labels is None
    np.testing.assert_array_equal(shares[1][1], labels)
    # a batch of 7 split as OneFlow's balanced splitter does: rows 0-3 on rank 0, 4-6 on rank 1
    step.split, step.whole_inputs = BatchSplit(2, B - 1), set()
    images = np.arange(B - 1, dtype=np.float32).reshape(-1, 1, 1, 1) * np.ones((1, 1, 4, 4), np.float32)
    slot = object()
    step.feed(slot, [images, labels])
    assert [a.shape for a in fed[-1]] == [(4, 1, 4, 4), (4,)]
    shares, _, _ = step._pending[id(slot)]
    np.testing.assert_array_equal(shares[1][0][:, 0, 0, 0], [4, 5, 6])
    np.testing.assert_array_equal(shares[1][1], labels[4:])
    with pytest.raises(DistributedError, match=r"does not split along axis 0 like the batch of 7 examples"):
        step.feed(object(), [np.zeros((B, 1, 4, 4), np.float32), np.zeros(B, np.int32)])
    assert not np.shares_memory(shares[1][1], labels)      # a copy: the caller may reuse its array


def dense_cross_entropy_job():
    import flow.typing as tp

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((B, 1, 4, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        logits = plain_mlp(images)
        smoothed = flow.one_hot(labels, depth=10, dtype=flow.float, on_value=0.91, off_value=0.01)
        loss = flow.math.reduce_mean(flow.nn.softmax_cross_entropy_with_logits(smoothed, logits))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return train_job


def test_a_mean_of_dense_cross_entropies_makes_each_ranks_share_of_its_gradient_seed():
    """Regression: the loss gradient's seed broadcast from (B, 1) to (B, classes) was not seen as a
    fill, and the job (ResNet's label-smoothed loss) was refused on several ranks."""
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((B, 1, 4, 4)).astype(np.float32), rng.integers(0, 10, B).astype(np.int32)]
    local, distribution = check_equal(dense_cross_entropy_job, inputs)
    seeds = [n for n in local.nodes if n.op == "broadcast_to" and n.type.shape == (B // 2, 10)]
    assert seeds, "the seed is made for each rank's rows"
