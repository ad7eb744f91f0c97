"""A consistent-view batch that does not divide over the ranks: OneFlow's balanced split.

5 examples over 2 ranks are 3 + 2 (the first `batch % ranks` ranks take one more), and every value
split along the batch axis follows (a (5·T, H) value: 3·T + 2·T rows).  Each rank then runs a graph
of its own shapes (compiler/passes/batch_split.py); the graphs run on simulated ranks
(tests/rank_simulator.py) against the logical job's reference run: outputs and every updated
variable, dropout's draws and batch norm's whole-batch statistics included.
tests/test_distributed_training.py trains the same on MPI processes.
"""
# no `from __future__ import annotations`: the placeholders read `batch` from the enclosing function

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.errors import TraceError
from flowc.compiler.ops import ShapeError
from flowc.compiler.passes.balanced_boxing import BALANCED_BOXING
from flowc.compiler.passes.batch_split import BatchSplit
from flowc.compiler.passes.data_parallel import DEFAULT_BUCKET_BYTES, distribute
from flowc.compiler.passes.layouts import BROADCAST, COLS, SPLIT
from flowc.compiler.reference import run_reference
from tests.rank_simulator import run_ranks
from tests.test_model_parallel_pass import (INIT, OPTIMIZERS, assert_same_step, hybrid_mlp, logical_and_ranks,
                                            mixed_lenet, scalars_for, split_variables_mlp)
from tests.test_synced_batch_norm import bn_net


def mlp(x):
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 12, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden")
    return flow.layers.dense(x, 8, kernel_initializer=INIT, name="out")


def lenet_with_dropout(x):
    x = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, kernel_initializer=INIT, name="conv")
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.nn.dropout(flow.layers.dense(x, 16, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden"),
                        rate=0.5)
    return flow.layers.dense(x, 8, kernel_initializer=INIT, name="out")


def per_token(x):
    """A (B·T, H) value split like the batch: T rows per example."""
    tokens = flow.reshape(x, [x.shape[0] * 4, 4])
    hidden = flow.layers.dense(tokens, 6, activation=flow.math.tanh, kernel_initializer=INIT, name="token")
    return flow.layers.dense(flow.reshape(hidden, [x.shape[0], 24]), 8, kernel_initializer=INIT, name="out")


def train_job_of(net, optimizer, batch):
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch, 1, 4, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = net(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        OPTIMIZERS[optimizer]().minimize(loss)
        return loss
    return train_job


def inputs_of(batch, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 1, 4, 4)).astype(np.float32), rng.integers(0, 8, batch).astype(np.int32)]


def rank_graphs(distribution, ranks):
    """Every rank's graph of the job (the traced one is rank 0's), its split variables split alike."""
    split_variables = {var: "(traced)" for var in distribution.sharded}
    return [distribute(distribution.logical, ranks, DEFAULT_BUCKET_BYTES, split_variables=split_variables, rank=r)[0]
            for r in range(ranks)]


def check_equal(make_job, inputs, ranks):
    logical, values, _, distribution = logical_and_ranks(make_job, ranks)
    graphs = rank_graphs(distribution, ranks)
    want, want_assigns = run_reference(logical, inputs, values, scalars_for(logical))
    got, got_assigns = run_ranks(graphs, distribution, ranks, inputs, values, scalars_for(graphs[0]))
    assert_same_step(got, got_assigns, want, want_assigns, values)
    return graphs, distribution


def test_the_balanced_split_gives_the_first_ranks_one_example_more():
    split = BatchSplit(ranks=3, batch=7)
    assert [split.examples(r) for r in range(3)] == [3, 2, 2]
    assert [split.rows(14, r) for r in range(3)] == [6, 4, 4]
    assert [split.first_row(14, r) for r in range(3)] == [0, 6, 10]
    assert split.divides(21) and not split.divides(9) and not split.even
    assert "3 + 2 + 2 over 3 ranks" in split.describe()
    even = BatchSplit(ranks=2)
    assert even.even and [even.rows(8, r) for r in range(2)] == [4, 4] and even.first_row(8, 1) == 4


@pytest.mark.parametrize("ranks, batch", [(2, 5), (3, 7), (4, 5)])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_an_mlp_trains_on_an_uneven_batch_as_the_logical_job(ranks, batch, optimizer):
    graphs, distribution = check_equal(lambda: train_job_of(mlp, optimizer, batch), inputs_of(batch), ranks)
    split = BatchSplit(ranks, batch)
    assert distribution.split == split
    shapes = [g.node(g.placeholders[0]).type.shape[0] for g in graphs]
    assert shapes == [split.examples(r) for r in range(ranks)] and sum(shapes) == batch


def test_dropout_draws_the_logical_jobs_mask_on_an_uneven_batch():
    graphs, _ = check_equal(lambda: train_job_of(lenet_with_dropout, "momentum", 5), inputs_of(5, seed=1), 2)
    draws = [[n for n in g.nodes if n.op.endswith("_shard")] for g in graphs]
    assert draws[0] and [n.attr("first") for n in draws[1]] == [3 * 16]     # rank 1 starts at example 3


def test_rows_per_example_follow_the_batch():
    graphs, _ = check_equal(lambda: train_job_of(per_token, "sgd", 5), inputs_of(5, seed=2), 2)
    tokens = [[n.type.shape for n in g.nodes if n.op == "reshape"][0] for g in graphs]
    assert tokens == [(12, 4), (8, 4)]


def test_batch_norm_weighs_each_ranks_statistics_by_its_examples():
    """3 and 2 examples: the whole batch's mean is 3/5 of rank 0's plus 2/5 of rank 1's, not their
    average."""
    images, labels = inputs_of(5, seed=3)
    images[:3] += 2.0
    check_equal(lambda: train_job_of(bn_net, "momentum", 5), [images, labels], 2)


def test_a_predict_jobs_outputs_come_back_whole():
    def predict_job_of():
        @flow.global_function(type="predict")
        def predict_job(images: tp.Numpy.Placeholder((5, 1, 4, 4), dtype=flow.float)) -> tp.Numpy:
            return mlp(images)
        return predict_job
    logical, values, _, distribution = logical_and_ranks(predict_job_of, 2)
    graphs = rank_graphs(distribution, 2)
    (images, _) = inputs_of(5, seed=4)
    (want,), _ = run_reference(logical, [images], values, {})
    (got,), _ = run_ranks(graphs, distribution, 2, [images], values, {})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [distribution.output_shape(0, r) for r in range(2)] == [(3, 8), (2, 8)]


def test_a_batch_with_fewer_examples_than_ranks_is_refused():
    with pytest.raises(TraceError, match=r"a batch of 1 leaves some of the 2 ranks without an example"):
        logical_and_ranks(lambda: train_job_of(mlp, "sgd", 1), 2)


def test_an_uneven_batch_among_several_batch_sizes_is_refused_naming_the_placeholder():
    def make_job():
        @flow.global_function(type="predict")
        def two_batches(a: tp.Numpy.Placeholder((5, 3)), b: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            return flow.math.reduce_sum(a) + flow.math.reduce_sum(b)
        return two_batches
    with pytest.raises(TraceError, match=r"test_uneven_batches.py:\d+: placeholder .* does not divide over the 2 ranks"
                                         r".*several batch sizes \(4, 5\)"):
        logical_and_ranks(make_job, 2)


@pytest.mark.parametrize("ranks, batch", [(2, 5), (4, 9), (4, 10)])
@pytest.mark.parametrize("net", [hybrid_mlp, split_variables_mlp, mixed_lenet], ids=lambda net: net.__name__)
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_model_parallel_layer_trains_on_an_uneven_batch_as_the_logical_job(ranks, batch, net, optimizer):
    """The batch gathered before the split layer, its columns turned to rows and back, and dx's partial
    sums scattered, each in padded blocks of one shape on every rank (compiler/passes/balanced_boxing.py)."""
    images, labels = inputs_of(batch)
    graphs, _ = check_equal(lambda: train_job_of(net, optimizer, batch), [images, labels % 4], ranks)
    exchanges = [[(n.op, g.node(n.inputs[0]).type) for n in g.nodes if n.op in ("all_gather", "all_to_all",
                                                                                 "reduce_scatter")] for g in graphs]
    assert {op for op, _ in exchanges[0]} == {"all_gather", "all_to_all", "reduce_scatter"}
    assert all(e == exchanges[0] for e in exchanges), "the ranks exchange blocks of different shapes"


def sparse_job_of(batch, optimizer, index_dtype):
    def make_job():
        config = flow.function_config()
        config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["table"])))

        @flow.global_function(type="train", function_config=config)
        def train_job(ids: tp.Numpy.Placeholder((batch, 2), dtype=index_dtype),
                      clicks: tp.Numpy.Placeholder((batch, 1), dtype=flow.float)) -> tp.Numpy:
            table = flow.get_variable("table", shape=(20, 4), initializer=flow.random_normal_initializer(0.0, 0.1))
            logits = flow.layers.dense(flow.reshape(flow.gather(table, ids), [batch, 8]), 1, name="out",
                                       kernel_initializer=INIT)
            loss = flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(clicks, logits))
            if optimizer == "lazy_adam":
                flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
            else:
                flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9).minimize(loss)
            return loss
        return train_job
    return make_job


@pytest.mark.parametrize("ranks, batch", [(2, 5), (3, 7), (4, 9)])
@pytest.mark.parametrize("optimizer, index_dtype", [("momentum", flow.int32), ("lazy_adam", flow.int64)])
def test_a_sparse_update_on_an_uneven_batch_gathers_every_ranks_rows(ranks, batch, optimizer, index_dtype):
    """Each rank pads its share of the indices and gradient rows to one block, the blocks are gathered,
    and every rank cuts the ranks' rows out in rank order: the one-process batch."""
    rng = np.random.default_rng(ranks)
    ids = rng.integers(0, 20, (batch, 2))
    ids[0, 0] = ids[-1, -1] = 7             # a row the first and the last rank's shares both use
    inputs = [ids.astype(index_dtype.numpy_dtype), rng.integers(0, 2, (batch, 1)).astype(np.float32)]
    graphs, _ = check_equal(sparse_job_of(batch, optimizer, index_dtype), inputs, ranks)
    block = -(-batch // ranks) + 1         # the largest share, and one example more: every rank pads
    blocks = [[g.node(n.inputs[0]).type for n in g.nodes if n.op == "all_gather"] for g in graphs]
    # the indices (once for both readers) and the gradient rows, in blocks of one shape on every rank
    assert len(blocks[0]) == 2 and all(b == blocks[0] for b in blocks)
    assert sorted(t.shape[0] for t in blocks[0]) == [block, block]


def test_a_value_whose_rows_do_not_follow_the_examples_is_refused_naming_its_line():
    def make_job():
        @flow.global_function(type="predict")
        def regrouped(x: tp.Numpy.Placeholder((5, 4))) -> tp.Numpy:
            return flow.math.tanh(flow.reshape(x, [4, 5]))
        return regrouped
    with pytest.raises(TraceError, match=r"test_uneven_batches.py:\d+: .*like the batch of 5 examples \(3 \+ 2 over 2 "
                                         r"ranks\): a multiple of 5"):
        logical_and_ranks(make_job, 2)


@pytest.mark.parametrize("change, shape, match", [
    ((SPLIT, BROADCAST), (7, 3), r"7 rows do not split like the batch of 5 examples \(3 \+ 2 over 2 ranks\)"),
    ((COLS, SPLIT), (5, 3), r"a value of shape \[5, 3\] is not \(rows, units\) with units dividing over 2 ranks"),
])
def test_an_exchange_in_padded_blocks_of_a_value_that_does_not_split_like_the_batch_is_a_shape_error(
        change, shape, match):
    with pytest.raises(ShapeError, match=match):
        BALANCED_BOXING[change](lambda op, inputs, attrs: 0, 0, BatchSplit(2, batch=5), shape, "float32", 0)
