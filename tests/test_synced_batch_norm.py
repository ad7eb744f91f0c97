"""Batch normalisation of a train job on several ranks normalises with the whole batch's statistics.

Each rank holds a share of the batch; the data-parallel pass gathers the ranks' per-channel means
and variances and combines them (compiler/passes/batch_statistics.py), and the input gradient
divides by the logical batch's count (`batch_norm_grad`'s `count`).  The ranks' graph runs on
simulated ranks (tests/rank_simulator.py) against the logical job's reference run: outputs, every
updated variable, the moving averages included.  tests/test_distributed_training.py trains the
same on MPI processes.
"""
import numpy as np
import pytest

import flow
from flowc.compiler.errors import TraceError
from flowc.compiler.passes.data_parallel import BROADCAST
from flowc.compiler.reference import run_reference
from tests.rank_simulator import run_ranks
from tests.test_model_parallel_pass import INIT, batch, check_equal, logical_and_ranks, ops, scalars_for, train_job_of


def bn_net(x):
    x = flow.layers.conv2d(x, 4, 3, padding="SAME", kernel_initializer=INIT, name="conv", use_bias=False)
    x = flow.nn.relu(flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn1"))
    x = flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 6, kernel_initializer=INIT, name="hidden",
                          use_bias=False)      # a bias before batch norm has no gradient but rounding noise
    x = flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn2")    # (N, C): no relu folded
    return flow.layers.dense(x, 8, kernel_initializer=INIT, name="out")


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_batch_norm_trains_on_ranks_as_on_the_whole_batch(ranks, optimizer):
    local, distribution = check_equal(lambda: train_job_of(bn_net, optimizer), batch(3), ranks)
    stats = [n for n in local.nodes if n.op == "batch_norm_stats"]
    assert len(stats) == 2 and ops(local).count("all_gather") == 2
    grads = [n for n in local.nodes if n.op == "batch_norm_grad"]
    # each rank's x holds a 1/ranks share; the sums it divides are over the whole batch's elements
    assert sorted(n.attr("count") for n in grads) == [8, 8 * 4 * 4]
    assert all(n.type.shape[0] == 8 // ranks for n in grads)


def normalised_first(x):
    x = flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn")
    return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 8, kernel_initializer=INIT, name="out")


def test_a_large_mean_costs_the_synced_variance_no_accuracy():
    """The variance adds each rank's spread around the global mean: no E[x^2] - E[x]^2, whose
    cancellation would lose a variance of 0.0025 under a mean of 100 in float32 (100^2's float32
    spacing is 0.001)."""
    images, labels = batch(4)
    check_equal(lambda: train_job_of(normalised_first, "momentum"), [images * 0.05 + 100.0, labels])


def test_the_ranks_means_differ_and_the_batch_statistics_still_match():
    """Each rank's rows come from a different distribution: per-rank statistics (unsynchronised batch
    norm) would normalise each half to mean 0; the logical job does not."""
    images, labels = batch(5)
    images[: len(images) // 2] += 3.0
    check_equal(lambda: train_job_of(bn_net, "momentum"), [images, labels])


def test_the_statistics_are_whole_on_every_rank():
    _, _, local, distribution = logical_and_ranks(lambda: train_job_of(bn_net, "momentum"))
    logical = train_job_of(bn_net, "momentum").graph
    stats = [n.id for n in logical.nodes if n.op == "batch_norm_stats"]
    assert stats and all(distribution.layouts[i] == BROADCAST for i in stats)


def channels_on_batch_axis(x):
    x = flow.reshape(x, [x.shape[0], -1])
    return flow.layers.dense(flow.layers.batch_normalization(x, axis=0, name="bn"), 8, kernel_initializer=INIT,
                             name="out")


def test_batch_norm_whose_channels_are_the_batch_axis_is_refused_naming_its_line():
    with pytest.raises(TraceError, match=r"test_synced_batch_norm.py:\d+: .*its channels are the batch axis"):
        logical_and_ranks(lambda: train_job_of(channels_on_batch_axis, "sgd"))


def test_the_zoo_resnet_trains_on_ranks_as_one_process():
    """examples/models/resnet.py (tiny: bottleneck blocks, batch norm after every convolution, label
    smoothing, L2 weight decay, momentum with a warmup-cosine schedule), whole on 2 simulated ranks."""
    from examples.models import resnet
    config = resnet.CONFIGS["tiny"]
    logical, values, local, distribution = logical_and_ranks(
        lambda: resnet.make_jobs(config, total_steps=10, warmup_steps=0)[0])
    inputs = resnet.synthetic_batch(config, seed=2)
    want, want_assigns = run_reference(logical, inputs, values, scalars_for(logical))
    got, got_assigns = run_ranks(local, distribution, 2, inputs, values, scalars_for(local))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert got_assigns.keys() == want_assigns.keys()
    for var in want_assigns:     # some do not move in a first step: each block's last gamma starts at 0
        np.testing.assert_allclose(got_assigns[var], want_assigns[var], rtol=1e-5, atol=1e-6, err_msg=var)
    assert sum(not np.array_equal(want_assigns[v], values[v]) for v in want_assigns) > len(want_assigns) // 2
    assert ops(local).count("all_gather") == sum(n.op == "batch_norm_stats" for n in logical.nodes) > 10
