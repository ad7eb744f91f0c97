"""The data-parallel pass (compiler/passes/data_parallel.py) and the bucket plan, without MPI.

A session told it runs on 2 ranks traces each job as one rank's share: these tests read the
graphs, layouts, buckets and generated code.  tests/test_distributed_training.py runs the jobs on
2 MPI processes and compares them with one process.
"""
# no `from __future__ import annotations`: the placeholders read `batch` from the enclosing function

import re
from typing import Tuple

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.codegen.collectives import plan_buckets
from flowc.compiler.passes.data_parallel import distribute
from flowc.runtime.session import default_session

B = 8


def on_ranks(ranks: int, bucket_bytes: int = 16 << 20) -> None:
    session = default_session()
    session.joined, session.ranks, session.bucket_bytes = True, ranks, bucket_bytes


def mlp(x):
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")
    return flow.layers.dense(x, 10, name="output")


def train_job_of(net=mlp, batch=B):
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch, 1, 4, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, net(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss
    return train_job


def all_reduces(graph):
    return [n for n in graph.nodes if n.op == "all_reduce"]


def test_a_train_job_on_two_ranks_sums_each_gradient_once_and_holds_half_the_batch():
    on_ranks(2)
    job = train_job_of()
    traced = job.graph
    inputs = [traced.node(p).type.shape for p in traced.placeholders]
    assert inputs == [(B // 2, 1, 4, 4), (B // 2,)]
    sums = all_reduces(traced)
    # one per trainable variable (weights and biases of both layers), each read by its update only
    assert sorted(n.type.shape for n in sums) == sorted([(16, 16), (16,), (10, 16), (10,)])
    assert all(n.attr("ranks") == 2 and n.attr("scale") == 1.0 and n.attr("bucket_bytes") == 16 << 20 for n in sums)
    users = traced.consumers()
    assert all({traced.node(c).role for c in users[n.id]} == {"update"} for n in sums)
    assert job._traced.distribution.outputs == ["split"]          # the per-example loss
    # the variables stay whole: every rank updates all of them
    assert {v: t.shape for v, t in traced.variables.items()}["hidden-weight"] == (16, 16)


def test_one_process_is_unchanged():
    job = train_job_of()
    assert all_reduces(job.graph) == [] and job._traced.distribution is None


def test_a_mean_over_the_batch_is_a_partial_sum_and_per_example_results_are_split():
    on_ranks(2)

    @flow.global_function(type="predict")
    def eval_job(images: tp.Numpy.Placeholder((B, 1, 4, 4), dtype=flow.float),
                 labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        logits = mlp(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        return logits, flow.math.reduce_mean(loss), flow.math.reduce_sum(flow.math.square(logits), axis=1)

    graph = eval_job.graph
    assert eval_job._traced.distribution.outputs == ["split", "partial_sum", "split"]
    assert all_reduces(graph) == []         # nothing to sum inside a predict step: the master adds up the parts
    # the mean divides by the global batch on every rank, so the two halves add up to the mean
    (divisor,) = [n for n in graph.nodes if n.op == "constant" and n.type.shape == ()
                  and abs(n.attr("value") - 1 / B) < 1e-12]
    assert divisor is not None


def test_a_nonlinear_use_of_a_batch_statistic_is_summed_inside_the_forward_pass():
    on_ranks(2)

    @flow.global_function(type="predict")
    def centred(x: tp.Numpy.Placeholder((B, 3), dtype=flow.float)) -> tp.Numpy:
        mean = flow.math.reduce_mean(x, axis=0)
        return flow.math.sqrt(flow.math.square(mean) + 1.0)      # not linear in the mean: needs the whole sum

    sums = all_reduces(centred.graph)
    assert len(sums) == 1 and sums[0].type.shape == (3,) and sums[0].role == "forward"
    assert centred._traced.distribution.outputs == ["broadcast"]


def test_buckets_close_at_the_threshold_and_start_after_their_last_gradient():
    on_ranks(2, bucket_bytes=0)          # every gradient its own bucket
    lowered = train_job_of().lower()
    program = lowered.program
    kernels = program.require_kernels()
    plan = plan_buckets(program.graph, kernels)
    assert len(plan) == 4 and [b.index for b in plan] == [0, 1, 2, 3]
    owner = {n: i for i, k in enumerate(kernels) for n in k.nodes()}
    users = program.graph.consumers()
    backward = [i for i, k in enumerate(kernels) if k.kind != "collective" and
                all(program.graph.node(n).role == "backward" for n in k.nodes())]
    for b in plan:
        assert b.start_after < b.wait_at
        assert kernels[b.wait_at].kind == "collective"
        # awaited after every backward kernel: the sums overlap the rest of the backward pass
        assert b.wait_at > max(backward)
        # and before every kernel that reads a sum
        assert all(owner[c] > b.wait_at for m in b.members for c in users[m])
    text = lowered.kernels_text()
    assert "all-reduce buckets (4):" in text and "awaited before" in text


def test_gradients_share_a_bucket_under_the_threshold():
    on_ranks(2)
    graph = train_job_of().graph
    assert {n.attr("bucket_bytes") for n in all_reduces(graph)} == {16 << 20}
    lowered = train_job_of().lower()
    assert len(plan_buckets(lowered.program.graph, lowered.program.require_kernels())) == 1


def test_the_generated_step_starts_polls_and_waits_in_that_order():
    on_ranks(2, bucket_bytes=0)
    source = train_job_of().compile().source()
    step = source[source.index('extern "C" int flowc_step'):]
    start, poll, wait = (step.index(s) for s in ("comm->start(", "comm->progress(", "comm->wait("))
    assert start < poll < wait
    assert step.count("comm->start(") == step.count("comm->wait(") == 4
    assert "#include \"flowc_comm.h\"" in source


def test_the_updates_read_the_sums_in_their_buckets_unless_they_are_scaled():
    on_ranks(2)
    step = train_job_of().compile().source()
    step = step[step.index('extern "C" int flowc_step'):]
    assert "flowc::comm_unpack<" not in step and step.count("comm->data(comm->ctx, 0)") >= 4
    flow.clear_default_session()
    on_ranks(2)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def mirrored_job(images: tp.ListNumpy.Placeholder((B, 1, 4, 4), dtype=flow.float),
                     labels: tp.ListNumpy.Placeholder((B,), dtype=flow.int32)) -> tp.ListNumpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    step = mirrored_job.compile().source()
    assert step.count("flowc::comm_unpack<float>(") == 4       # averaged: scaled by 1/2 into the arena


def test_an_op_that_needs_the_whole_batch_is_refused_with_its_line():
    on_ranks(2)

    @flow.global_function(type="predict")
    def peak(x: tp.Numpy.Placeholder((B, 3), dtype=flow.float)) -> tp.Numpy:
        return flow.math.reduce_max(x, axis=0)

    with pytest.raises(flow.TraceError, match=r"test_data_parallel_pass.py:\d+: reduce_max in a data-parallel job: "
                                              r"it computes a maximum over the batch axis"):
        _ = peak.graph


def test_a_maximum_minimum_or_product_along_the_other_axes_stays_on_each_ranks_rows():
    """Only a reduction over the batch axis needs the whole batch; reduce_max and its kin along the
    other axes (a stable softmax, logsumexp) are computed by each rank on its rows, gradients included
    (tests/distributed/row_reductions.py trains such a job on 2 ranks)."""
    on_ranks(2)

    @flow.global_function(type="train")
    def rows(x: tp.Numpy.Placeholder((B, 3), dtype=flow.float)) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        w = flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())
        y = x * w
        loss = flow.math.reduce_logsumexp(y, axis=[1])            # a reduce_max with keepdims inside
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss, flow.math.reduce_min(y, axis=[1]), flow.math.reduce_prod(y, axis=[1], keepdims=True)

    graph = rows.graph
    assert rows._traced.distribution.outputs == ["split", "split", "split"]
    assert {n.type.shape for n in graph.nodes if n.op in ("reduce_max", "reduce_min")} == {(B // 2, 1), (B // 2,)}
    assert [n.type.shape for n in all_reduces(graph)] == [(3,)]          # the weight's gradient alone


def test_a_mirrored_job_keeps_each_ranks_batch_and_averages_the_gradients():
    on_ranks(2)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def mirrored(x: tp.ListNumpy.Placeholder((B, 3), dtype=flow.float),
                 y: tp.ListNumpy.Placeholder((B,), dtype=flow.int32)) -> tp.ListNumpy:
        logits = flow.layers.dense(x, 4, name="dense")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        peak = flow.math.reduce_max(flow.math.reduce_mean(logits, axis=0))   # per device: no sum, no refusal
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss + peak)
        return loss

    graph = mirrored.graph
    assert [graph.node(p).type.shape for p in graph.placeholders] == [(B, 3), (B,)]   # each device's own batch
    sums = all_reduces(graph)
    assert len(sums) == 2 and all(n.attr("scale") == 0.5 for n in sums)            # weight and bias: the mean
    assert all(n.role == "update" for n in sums)
    assert mirrored._traced.distribution.mirrored


def test_distribute_needs_two_ranks_at_least():
    job = train_job_of()
    with pytest.raises(ValueError, match="ranks must be >= 2"):
        distribute(job.graph, 1, 0)


def test_the_reference_executor_refuses_a_sum_over_ranks():
    on_ranks(2)
    from flowc.compiler.reference import run_reference
    job = train_job_of()
    graph = job.graph
    session = default_session()
    values = {name: session.value(name) for name in graph.variables}
    x = np.zeros((B // 2, 1, 4, 4), np.float32)
    y = np.zeros(B // 2, np.int32)
    with pytest.raises(NotImplementedError, match="compare with the job's single-process run"):
        run_reference(graph, [x, y], values, {"learning_rate:float32": 0.1, "train_step": 0})


def test_the_engine_error_codes_match_the_header():
    from flowc.compiler.codegen.collectives import COMM_FAILED, COMM_TIMEOUT
    from flowc.compiler.toolchain import include_dir
    for name in ("flowc_comm.h", "flowc_comm_mpi.c"):
        text = (include_dir() / name).read_text()
        assert f"#define FLOWC_COMM_ERROR_FAILED {COMM_FAILED}" in text, name
        assert f"#define FLOWC_COMM_ERROR_TIMEOUT {COMM_TIMEOUT}" in text, name


def test_flowc_show_prints_one_ranks_share_with_its_buckets(capsys):
    from flowc.cli import main
    assert main(["show", "examples/mlp_train_demo.py:train_job", "--kernels", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "all-reduce buckets (1):" in out and "bucket 0: 4 gradients, 1628200 B; starts after" in out
    assert main(["show", "examples/mlp_train_demo.py:train_job", "--ir", "--after", "simplify", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "float32[50x1x28x28] = input()" in out and out.count("= all_reduce(") == 4
    assert main(["show", "examples/mlp_train_demo.py:train_job", "--kernels", "--ranks", "0"]) != 0


def test_a_script_that_configures_two_devices_but_runs_alone_is_told_how_to_launch(monkeypatch):
    from flowc.runtime import environment
    from flowc.runtime.world import WorldError
    monkeypatch.setitem(environment.config_values, "cpu_device_num", 2)
    job = train_job_of()
    x, y = np.zeros((B, 1, 4, 4), np.float32), np.zeros(B, np.int32)
    for _ in range(2):         # refused at every call, not only the first
        with pytest.raises(WorldError, match=r"flow.config.cpu_device_num\(2\).*runs alone.*flowc launch -n 2"):
            job(x, y)
    monkeypatch.setitem(environment.config_values, "cpu_device_num", 1)
    assert job(x, y).shape == (B,)


def test_the_bucket_size_comes_from_nccl_fusion_threshold_mb(monkeypatch):
    from flowc.runtime import environment
    from flowc.runtime.distributed import trace_as_ranks
    monkeypatch.setitem(environment.config_values, "collective_boxing.nccl_fusion_threshold_mb", 16)
    flow.config.collective_boxing.nccl_fusion_threshold_mb(0)          # one gradient per bucket
    trace_as_ranks(default_session(), 2)
    program = train_job_of().lower().program
    assert len(plan_buckets(program.graph, program.require_kernels())) == 4


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_random_draws_share_is_its_slice_of_the_whole_draw(rank):
    from flowc.compiler.ops import OPS
    whole = OPS["dropout_mask"].reference(np.int64(5), shape=(6, 4), dtype="float32", seed=11, threshold=1 << 31,
                                          scale=2.0, rate=0.5)
    share = OPS["dropout_mask_shard"].reference(np.int64(5), np.int64(rank), shape=(2, 4), dtype="float32", seed=11,
                                                threshold=1 << 31, scale=2.0, rate=0.5, share=8, first=0)
    np.testing.assert_array_equal(share, whole[2 * rank:2 * rank + 2])
    whole = OPS["random_uniform"].reference(np.int64(3), shape=(6, 4), dtype="float64", seed=7)
    share = OPS["random_uniform_shard"].reference(np.int64(3), np.int64(rank), shape=(2, 4), dtype="float64", seed=7,
                                                  share=8, first=0)
    np.testing.assert_array_equal(share, whole[2 * rank:2 * rank + 2])


def test_a_split_dropout_draws_this_ranks_share_and_the_compiled_draw_is_the_references():
    on_ranks(2)

    def net(x):
        x = flow.reshape(x, [x.shape[0], -1])
        return flow.layers.dense(flow.nn.dropout(flow.layers.dense(x, 16, name="hidden"), rate=0.5), 10, name="out")

    job = train_job_of(net)
    graph = job.graph
    (mask,) = [n for n in graph.nodes if n.op.startswith("dropout_mask")]
    assert mask.op == "dropout_mask_shard" and mask.attr("share") == (B // 2) * 16 and mask.type.shape == (B // 2, 16)
    rank = graph.node(mask.inputs[1])
    assert rank.op == "scalar" and rank.attr("name") == "data_parallel_rank" and graph.scalars["data_parallel_rank"]
    # the compiled kernel hashes the same indices as the reference, on rank 1
    from flowc.compiler.ir import Graph, GraphBuilder
    builder = GraphBuilder()
    step = builder.add("scalar", [], {"name": "train_step", "shape": (), "dtype": "int64"})
    r = builder.add("scalar", [], {"name": "data_parallel_rank", "shape": (), "dtype": "int64"})
    out = builder.add("dropout_mask_shard", [step, r], {**mask.attr_dict})
    small = Graph("mask", builder.nodes, [out], {}, {}, {"train_step": "int64", "data_parallel_rank": "int64"}, [])
    from flowc.compiler.pipeline import compile_graph
    from flowc.runtime.devices import load_step
    loaded = load_step(compile_graph(small), default_session())
    (got,) = loaded.run([], {"train_step": 4, "data_parallel_rank": 1})
    from flowc.compiler.ops import OPS
    np.testing.assert_array_equal(got, OPS["dropout_mask_shard"].reference(np.int64(4), np.int64(1), **mask.attr_dict))
    assert 0 < np.count_nonzero(got) < got.size


def test_a_variable_split_along_axis_1_is_refused_on_several_ranks_and_fine_in_one_process():
    def net(x):
        x = flow.reshape(x, [x.shape[0], -1])
        w = flow.get_variable("w", shape=(16, 10), initializer=flow.truncated_normal(0.1),
                              distribute=flow.distribute.split(1))
        return flow.matmul(x, w)

    assert train_job_of(net).graph is not None           # one process: one device holds it all
    flow.clear_default_session()
    on_ranks(2)
    with pytest.raises(flow.UnsupportedError, match=r"test_data_parallel_pass.py:\d+: variable 'w' is declared split "
                                                     r"along axis 1 over the devices: flowc splits variables along "
                                                     r"axis 0 on 2 ranks"):
        _ = train_job_of(net).graph


def test_a_distribute_hint_is_checked():
    def net(x):
        return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 10, name="out", model_distribute="split")

    with pytest.raises(flow.TraceError, match="expected flow.distribute.split"):
        _ = train_job_of(net).graph


def test_a_placement_on_one_particular_device_is_said_to_run_as_data_parallelism():
    def net(x):
        x = flow.reshape(x, [x.shape[0], -1])
        with flow.scope.placement("cpu", "0:0"):
            x = flow.layers.dense(x, 16, name="hidden")
        with flow.scope.placement("cpu", "0:1"):
            return flow.layers.dense(x, 10, name="out")

    on_ranks(2)
    with pytest.warns(UserWarning, match=r"test_data_parallel_pass.py:\d+: flow.scope.placement\(\.\.\., '0:1'\) .* "
                                         r"every rank runs them on its share of the batch"):
        _ = train_job_of(net).graph


def refused(build, match: str) -> None:
    with pytest.raises((flow.TraceError, flow.UnsupportedError), match=match):
        _ = build().graph


def predict_of(body, shape=(B, 3), dtype=flow.float):
    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder(shape, dtype=dtype)) -> tp.Numpy:
        return body(x)
    return job


@pytest.mark.parametrize("body, match", [
    (lambda x: flow.nn.softmax(flow.reshape(x, [B * 3])), "softmax in a data-parallel job: its rows are the batch"),
    (lambda x: flow.math.top_k(flow.reshape(x, [B * 3]), k=2), "top_k in a data-parallel job: its rows are the batch"),
    (lambda x: flow.layers.layer_norm(x, begin_norm_axis=0, begin_params_axis=-1, center=False, scale=False),
     "layer_norm in a data-parallel job: it normalises over the batch axis"),
    (lambda x: flow.gather(flow.constant(1.0, dtype=flow.float, shape=(2, 5)),
                           flow.cast(flow.math.reduce_sum(x, axis=1), flow.int32), axis=1),
     "gather in a data-parallel job: it gathers from a broadcast value with split indices"),
    (lambda x: flow.math.square(flow.math.reduce_sum(flow.cast(x, flow.int8), axis=0)),
     r"square in a data-parallel job: it reads a sum over the ranks that flowc cannot make \(all_reduce: "
     r"flowc sums float32 or float64 or int32 or int64 values between ranks, got int8\)"),
])
def test_ops_that_read_across_the_batch_are_refused_not_split(body, match):
    on_ranks(2)
    refused(lambda: predict_of(body), match)


def test_a_sum_is_made_before_a_cast_to_integers():
    on_ranks(2)
    graph = predict_of(lambda x: flow.cast(flow.math.reduce_sum(x, axis=0), flow.int32)).graph
    (cast,) = [n for n in graph.nodes if n.op == "cast"]
    assert graph.node(cast.inputs[0]).op == "all_reduce"


def test_a_fill_made_split_by_a_later_reader_gets_its_own_statistics_summed():
    on_ranks(2)

    def body(x):
        c = flow.constant(1.0, dtype=flow.float, shape=(B, 3))
        return x + c * flow.math.reduce_sum(c, axis=0, keepdims=True)     # c: a fill each rank makes its share of

    graph = predict_of(body).graph
    (total,) = all_reduces(graph)          # the column sums of c over the whole batch, not of one share
    assert graph.node(total.inputs[0]).op == "reduce_sum" and total.type.shape == (1, 3)


def test_check_numerics_and_mirrored_sparse_updates_are_refused_on_several_ranks():
    on_ranks(2)
    config = flow.function_config()
    config.check_numerics(True)

    @flow.global_function(type="predict", function_config=config)
    def checked(x: tp.Numpy.Placeholder((B, 3), dtype=flow.float)) -> tp.Numpy:
        return flow.math.relu(x)

    refused(lambda: checked, r"check_numerics on 2 ranks is not supported yet")

    mirrored = flow.function_config()
    mirrored.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=mirrored)
    def sparse(ids: tp.ListNumpy.Placeholder((B,), dtype=flow.int32)) -> tp.ListNumpy:
        table = flow.get_variable("emb", shape=(10, 4), initializer=flow.random_uniform_initializer(-1, 1, seed=1))
        loss = flow.math.reduce_mean(flow.math.square(flow.gather(table, ids)), axis=1)
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    refused(lambda: sparse, r"unique_indices in a data-parallel job: it computes a sparse \(indexed-slices\) update")


def test_a_placeholder_without_a_batch_axis_is_whole_on_every_rank_and_another_axis_is_refused():
    """OneFlow's consistent view splits an input along its batch axis and gives one declared with
    batch_axis=None whole to every device (tests/distributed/whole_inputs.py trains such a job)."""
    on_ranks(2)

    @flow.global_function()
    def scaled(x: tp.Numpy.Placeholder((B, 6), dtype=flow.float),
               scale: tp.Numpy.Placeholder((6,), dtype=flow.float, batch_axis=None),
               table: tp.Numpy.Placeholder((2, 6), dtype=flow.float, batch_axis=None)) -> Tuple[tp.Numpy, tp.Numpy]:
        return x * scale + flow.math.reduce_sum(table, axis=[0]), flow.math.reduce_sum(table)

    traced = scaled.graph
    assert [traced.node(p).type.shape for p in traced.placeholders] == [(B // 2, 6), (6,), (2, 6)]
    distribution = scaled._traced.distribution
    assert distribution.inputs == ("split", "broadcast", "broadcast")
    assert distribution.outputs == ["split", "broadcast"]

    @flow.global_function()
    def columns(x: tp.Numpy.Placeholder((4, B), dtype=flow.float, batch_axis=1)) -> tp.Numpy:
        return flow.math.reduce_sum(x, axis=[0])

    with pytest.raises(flow.TraceError, match=r"placeholder 'x' of shape \[4, 8\] has batch_axis=1: .*axis 0 only"):
        assert columns.graph is None


def test_a_numpy_placeholder_in_the_mirrored_view_on_several_ranks_is_refused_naming_it():
    """Each rank of a mirrored-view job runs its own batch, given as one tp.ListNumpy array per device;
    a tp.Numpy placeholder (a global batch) there was split by the runtime into a share the rank's graph
    did not expect, a NumPy broadcasting error at the call."""
    on_ranks(2)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def summed(x: tp.Numpy.Placeholder((B, 3), dtype=flow.float)) -> tp.ListNumpy:
        return flow.math.reduce_sum(x, axis=[1])

    with pytest.raises(flow.TraceError, match=r"job function 'summed' \(test_data_parallel_pass.py:\d+\): placeholder "
                                              r"'x' is a tp.Numpy.Placeholder in the mirrored view on 2 ranks.*"
                                              r"tp.ListNumpy.Placeholder"):
        assert summed.graph is None


def mixed_types_job():
    """A float64 layer under a float32 one, its loss weighted by an int32 count over the batch."""
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((B, 5), dtype=flow.double),
                  y: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 7, activation=flow.math.tanh, name="wide")
        logits = flow.layers.dense(flow.cast(hidden, flow.float), 3, name="narrow")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        weight = flow.cast(flow.math.reduce_sum(y), flow.float)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss * weight)
        return loss
    return train_job


def test_sums_of_other_types_fill_buckets_of_their_own_type_counted_in_bytes():
    on_ranks(2, bucket_bytes=300)
    lowered = mixed_types_job().lower()
    graph = lowered.program.graph
    plan = plan_buckets(graph, lowered.program.require_kernels())
    for b in plan:
        assert {graph.node(m).type.dtype for m in b.members} == {b.dtype}
        assert b.nbytes == b.itemsize * sum(b.sizes) and (b.nbytes <= 300 or len(b.members) == 1)
    assert {b.dtype for b in plan} == {"float32", "float64", "int32"}
    # wide's 5x7 float64 weight is 280 bytes: with its 56-byte bias it would pass 300 (at 4 bytes an
    # element both would fit)
    wide = [b for b in plan if b.dtype == "float64"]
    assert sorted(b.sizes for b in wide) == [(7,), (35,)]
    assert "float64 gradients, 280 B" in lowered.kernels_text()
    assert "1 int32 values, 4 B" in lowered.kernels_text()


def test_the_generated_step_sums_each_bucket_in_its_own_type():
    on_ranks(2)
    source = mixed_types_job().compile().source()
    step = source[source.index('extern "C" int flowc_step'):]
    types = re.findall(r"comm->start\(comm->ctx, \d+, \d+, g, n, (FLOWC_COMM_\w+)\)", step)
    assert sorted(types) == ["FLOWC_COMM_FLOAT32", "FLOWC_COMM_FLOAT64", "FLOWC_COMM_INT32"]
    assert "static_cast<double*>(const_cast<void*>(comm->data(" in step


@pytest.mark.parametrize("op, dtype, attrs, match", [
    ("all_reduce", "int32", {"scale": 0.5}, "an int32 sum cannot be scaled by 0.5"),
    ("all_reduce", "uint8", {"scale": 1.0},
     "sums float32 or float64 or int32 or int64 values between ranks, got uint8"),
    ("reduce_scatter", "int8", {}, "sums float32 or float64 or int32 or int64 values between ranks, got int8"),
    ("all_gather", "uint8", {}, "moves float32 or float64 or int32 or int64 values between ranks, got uint8"),
])
def test_a_sum_of_a_type_the_engines_cannot_add_is_refused(op, dtype, attrs, match):
    from flowc.compiler.ir import TensorType
    from flowc.compiler.ops import OPS, ShapeError
    with pytest.raises(ShapeError, match=match):
        OPS[op].infer([TensorType((4, 3), dtype)], {"ranks": 2, **attrs})


def wide_net(x):
    """A float64 hidden layer under a float32 output layer, the logits scaled by an int32 count over the
    whole batch (the share of positive pixels): sums of three types in one step."""
    x = flow.reshape(x, [x.shape[0], -1])
    init = flow.truncated_normal(0.3)
    hidden = flow.layers.dense(flow.cast(x, flow.double), 12, activation=flow.math.tanh, kernel_initializer=init,
                               name="hidden")
    logits = flow.layers.dense(flow.cast(hidden, flow.float), 8, kernel_initializer=init, name="out")
    positive = flow.math.reduce_sum(flow.cast(flow.math.greater(x, 0.0), flow.int32))
    return logits * (flow.cast(positive, flow.float) / float(x.shape[0] * x.shape[1]))


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_float64_and_integer_sums_train_on_simulated_ranks_as_the_logical_job(optimizer):
    from tests.test_model_parallel_pass import batch, check_equal, train_job_of as hybrid_train_job_of
    local, _ = check_equal(lambda: hybrid_train_job_of(wide_net, optimizer), batch(2))
    assert {n.type.dtype for n in all_reduces(local)} == {"float32", "float64", "int32"}


def test_a_float16_models_gradients_are_summed_in_float32():
    """float16 values are computed in float32 (compiler/passes/float16.py): their sums over the ranks
    too, cast around the all_reduce, and the step trains as the logical job to float16 precision."""
    from tests.rank_simulator import run_ranks
    from tests.test_model_parallel_pass import logical_and_ranks, scalars_for
    from flowc.compiler.reference import run_reference

    def make_job():
        @flow.global_function(type="train")
        def half_job(x: tp.Numpy.Placeholder((B, 6), dtype=flow.float16)) -> tp.Numpy:
            h = flow.layers.dense(x, 4, activation=flow.math.tanh, name="h",
                                  kernel_initializer=flow.random_normal_initializer(stddev=0.5))
            loss = flow.math.reduce_mean(flow.cast(flow.math.square(h), flow.float))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0.9).minimize(loss)
            return loss
        return half_job
    logical, values, local, distribution = logical_and_ranks(make_job)
    sums = all_reduces(local)
    assert sums and all(n.type.dtype == "float32" and local.node(n.inputs[0]).op == "cast" for n in sums)
    x = np.random.default_rng(0).standard_normal((B, 6)).astype(np.float16)
    want, want_assigns = run_reference(logical, [x], values, scalars_for(logical))
    got, got_assigns = run_ranks(local, distribution, 2, [x], values, scalars_for(local))
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3)
    for var in want_assigns:
        assert got_assigns[var].dtype == np.float16
        np.testing.assert_allclose(got_assigns[var], want_assigns[var], rtol=2e-3, atol=2e-3, err_msg=var)
        assert not np.array_equal(want_assigns[var], values[var]), var
    on_ranks(2)
    assert "comm->start(" in make_job().compile().source()       # the rank's step compiles


@pytest.mark.parametrize("net", ["sparse", "model_parallel"])
def test_a_float16_models_exchanges_move_float32_values(net):
    """A float16 table's sparse update gathers its rows, and a float16 model-parallel layer exchanges
    its activations, in float32 (cast around each exchange); both train as the logical job to float16
    precision on simulated ranks."""
    from tests.rank_simulator import run_ranks
    from tests.test_model_parallel_pass import logical_and_ranks, scalars_for
    from flowc.compiler.reference import run_reference

    def make_job():
        config = flow.function_config()
        config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["table"])))

        @flow.global_function(type="train", function_config=config)
        def half_job(ids: tp.Numpy.Placeholder((B, 2), dtype=flow.int32),
                     x: tp.Numpy.Placeholder((B, 6), dtype=flow.float16)) -> tp.Numpy:
            init = flow.random_normal_initializer(stddev=0.5)
            if net == "sparse":
                table = flow.get_variable("table", shape=(20, 3), dtype=flow.float16, initializer=init)
                features = flow.reshape(flow.gather(table, ids), [B, 6]) + x
            else:
                features = flow.layers.dense(x, 6, activation=flow.math.tanh, kernel_initializer=init, name="split",
                                             model_distribute=flow.distribute.split(0))
            h = flow.layers.dense(features, 4, activation=flow.math.tanh, kernel_initializer=init, name="h")
            loss = flow.math.reduce_mean(flow.cast(flow.math.square(h), flow.float))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0.9).minimize(loss)
            return loss
        return half_job
    logical, values, local, distribution = logical_and_ranks(make_job)
    exchanges = [n for n in local.nodes if n.op in ("all_gather", "all_to_all", "reduce_scatter")]
    assert exchanges and all(n.type.dtype in ("float32", "int32") for n in exchanges)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 20, (B, 2)).astype(np.int32), rng.standard_normal((B, 6)).astype(np.float16)]
    want, want_assigns = run_reference(logical, inputs, {k: v.copy() for k, v in values.items()}, scalars_for(logical))
    got, got_assigns = run_ranks(local, distribution, 2, inputs, {k: v.copy() for k, v in values.items()},
                                 scalars_for(local))
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3)
    for var in want_assigns:
        np.testing.assert_allclose(got_assigns[var], want_assigns[var], rtol=2e-3, atol=2e-3, err_msg=var)
