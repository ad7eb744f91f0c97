"""Model parallelism (compiler/passes/model_parallel.py): a variable split along axis 0 over the ranks.

Each job is traced twice: as the logical job (one process) and as one of 2 or 4 ranks.  The ranks'
graph runs on simulated ranks in lock-step (tests/rank_simulator.py) and must give the logical
job's reference results: its outputs and every variable's new value, the split ones put back
together.  tests/test_model_parallel_training.py runs the same on MPI processes.
"""
# no `from __future__ import annotations`: the placeholders read `batch` from the enclosing function

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from flowc.runtime.session import default_session
from tests.rank_simulator import run_ranks

B = 8
SPLIT = flow.distribute.split(0)
INIT = flow.truncated_normal(0.3)


def on_ranks(ranks: int) -> None:
    session = default_session()
    session.joined, session.ranks = True, ranks


def hybrid_mlp(x):
    """OneFlow's hybrid-parallel MLP: a data-parallel hidden layer, a model-parallel output layer."""
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 12, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden")
    return flow.layers.dense(x, 8, kernel_initializer=INIT, bias_initializer=flow.ones_initializer(),
                             name="out", model_distribute=SPLIT)


def double_hybrid_mlp(x):
    """The hybrid-parallel MLP in float64: its exchanges move and sum float64 values."""
    x = flow.cast(flow.reshape(x, [x.shape[0], -1]), flow.double)
    x = flow.layers.dense(x, 12, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden")
    x = flow.layers.dense(x, 8, kernel_initializer=INIT, bias_initializer=flow.ones_initializer(), name="out",
                          model_distribute=SPLIT)
    return flow.cast(x, flow.float)


def mixed_lenet(x):
    """Data-parallel convolution, a model-parallel hidden layer (relu, dropout), a data-parallel output."""
    x = flow.layers.conv2d(x, 4, 3, padding="SAME", activation=flow.nn.relu, kernel_initializer=INIT,
                           name="conv")
    x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 16, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden",
                          model_distribute=SPLIT)
    x = flow.nn.dropout(x, rate=0.5)
    return flow.layers.dense(x, 10, kernel_initializer=INIT, name="out")


def split_variables_mlp(x):
    """OneFlow's mixed-parallel MLP: the output layer's weight and bias from flow.get_variable(distribute=)."""
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 12, activation=flow.math.tanh, kernel_initializer=INIT, name="hidden")
    w = flow.get_variable("out-w", shape=(4, 12), initializer=INIT, distribute=SPLIT)
    b = flow.get_variable("out-b", shape=(4,), initializer=flow.ones_initializer(), distribute=SPLIT)
    return flow.nn.bias_add(flow.matmul(x, w, transpose_b=True), b)


OPTIMIZERS = {
    "sgd": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0),
    "momentum": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9),
    "adam": lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])),
}


def train_job_of(net, optimizer="momentum", batch=B):
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch, 1, 4, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, net(images))
        OPTIMIZERS[optimizer]().minimize(loss)
        return loss
    return train_job


def predict_job_of(net, batch=B):
    @flow.global_function(type="predict")
    def predict_job(images: tp.Numpy.Placeholder((batch, 1, 4, 4), dtype=flow.float)) -> tp.Numpy:
        return net(images)
    return predict_job


def logical_and_ranks(make_job, ranks=2):
    """(logical graph, its variables' values, the ranks' graph, its distribution)."""
    job = make_job()
    logical = job.graph
    session = default_session()
    values = {name: session.value(name).copy() for name in logical.variables}
    flow.clear_default_session()
    on_ranks(ranks)
    job = make_job()
    return logical, values, job.graph, job._traced.distribution


def scalars_for(graph):
    return {name: (0.1 if name.startswith("learning_rate") else 3) for name in graph.scalars}


def check_equal(make_job, inputs, ranks=2):
    logical, values, local, distribution = logical_and_ranks(make_job, ranks)
    scalars = scalars_for(logical)
    want, want_assigns = run_reference(logical, inputs, values, scalars)
    got, got_assigns = run_ranks(local, distribution, ranks, inputs, values, scalars_for(local))
    assert_same_step(got, got_assigns, want, want_assigns, values)
    return local, distribution


def assert_same_step(got, got_assigns, want, want_assigns, values):
    """The ranks' outputs and new variables are the logical job's, and every variable moved."""
    for w, g in zip(want, got):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert got_assigns.keys() == want_assigns.keys()
    for var in want_assigns:
        np.testing.assert_allclose(got_assigns[var], want_assigns[var], rtol=1e-5, atol=1e-6, err_msg=var)
        assert not np.array_equal(want_assigns[var], values[var]) or var.endswith("_step"), f"{var} did not change"


def batch(seed=0, classes=8):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, 1, 4, 4)).astype(np.float32), rng.integers(0, classes, B).astype(np.int32)]


def ops(graph):
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_model_parallel_output_layer_trains_as_the_logical_job(optimizer):
    local, distribution = check_equal(lambda: train_job_of(hybrid_mlp, optimizer), batch())
    present = ops(local)
    # the boxing the issue names: the batch gathered before the split layer, its gradients scattered
    assert "all_gather" in present and "reduce_scatter" in present and "all_to_all" in present
    state = {"sgd": [], "momentum": ["momentum"], "adam": ["m", "v"]}[optimizer]
    assert set(distribution.sharded) == {f"out-{v}" + (f"-{s}" if s else "") for v in ("weight", "bias")
                                         for s in [""] + state}
    assert local.variables["out-weight"].shape == (4, 12) and local.variables["hidden-weight"].shape == (12, 16)
    # the data-parallel hidden layer still sums its whole gradients (bucketed all_reduce)
    sums = [n for n in local.nodes if n.op == "all_reduce"]
    assert {n.type.shape for n in sums} == {(12,), (12, 16)}


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_a_float64_model_parallel_layer_exchanges_float64_values(optimizer):
    local, _ = check_equal(lambda: train_job_of(double_hybrid_mlp, optimizer), batch(4))
    exchanged = {(n.op, n.type.dtype) for n in local.nodes if n.op in ("all_gather", "all_to_all", "reduce_scatter")}
    # (the logits' columns go back to rows after the cast to float32)
    assert exchanged >= {("all_gather", "float64"), ("all_to_all", "float64"), ("reduce_scatter", "float64")}


def test_a_model_parallel_hidden_layer_between_convolutions_and_a_dense_layer_with_dropout():
    local, _ = check_equal(lambda: train_job_of(mixed_lenet, "sgd"), batch(1, classes=10))
    assert "dropout_mask_shard" in ops(local)


def test_variables_split_with_get_variable_distribute_train_on_four_ranks():
    check_equal(lambda: train_job_of(split_variables_mlp, "adam"), batch(2, classes=4), ranks=4)


def wide_hidden_mlp(x):
    """A model-parallel hidden layer wide enough that its weight (32, 16) outweighs the batch's
    activations (8 x 32 and 8 x 16): its gradient is computed from columns, not scattered."""
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 32, activation=flow.nn.relu, kernel_initializer=INIT, name="hidden",
                          model_distribute=SPLIT)
    return flow.layers.dense(x, 8, kernel_initializer=INIT, name="out")


@pytest.mark.parametrize("optimizer,ranks", [(name, 2) for name in sorted(OPTIMIZERS)] + [("adam", 4)])
def test_a_wide_split_layers_weight_gradient_comes_from_columns_of_the_batch(optimizer, ranks):
    local, _ = check_equal(lambda: train_job_of(wide_hidden_mlp, optimizer), batch(5), ranks=ranks)
    # dW = dyᵀ · x from dy split by column and the forward's gathered x: no reduce_scatter of dW
    assert not [n for n in local.nodes if n.op == "reduce_scatter" and len(n.type.shape) == 2]
    product = [n for n in local.nodes
               if n.op == "matmul" and n.attr("transpose_a") and n.type.shape == (32 // ranks, 16)]
    assert len(product) == 1 and [local.node(i).op for i in product[0].inputs] == ["reshape", "all_gather"]
    assert ops(local).count("all_gather") == 1          # the backward reads the forward's gathered batch


def row_parallel(x):
    """A weight (inputs, units) split along its inputs, read as x · W: partial sums of whole rows."""
    x = flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 12, activation=flow.nn.relu, kernel_initializer=INIT,
                          name="hidden")
    w = flow.get_variable("w", shape=(12, 6), initializer=INIT, distribute=SPLIT)
    return flow.nn.bias_add(flow.matmul(x, w), flow.get_variable("b", shape=(6,), initializer=INIT))


def test_a_weight_split_along_its_inputs_keeps_each_ranks_rows_of_the_partial_sums():
    local, distribution = check_equal(lambda: train_job_of(row_parallel, "momentum"), batch(4, classes=6))
    assert set(distribution.sharded) == {"w", "w-momentum"}
    # x split by column to meet W's rows, its product scattered back to the batch's rows before the bias
    scattered = [n for n in local.nodes if n.op == "reduce_scatter" and n.type.shape == (B // 2, 6)]
    assert len(scattered) == 1 and local.node(scattered[0].inputs[0]).op == "matmul"


def penalised_job(optimizer):
    """An explicit L2 penalty on a split weight, added to the loss: its gradient's seed is broadcast
    to the weight's whole shape, next to the split weight."""
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((B, 1, 4, 4), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((B,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(8, 16), initializer=INIT, distribute=SPLIT)
        hidden = flow.nn.relu(flow.matmul(flow.reshape(images, [B, -1]), w, transpose_b=True))
        logits = flow.layers.dense(hidden, 8, kernel_initializer=INIT, name="out")
        loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        OPTIMIZERS[optimizer]().minimize(loss + 0.1 * flow.math.reduce_sum(flow.math.square(w)))
        return loss
    return train_job


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_penalty_on_a_split_weight_fills_each_ranks_slice_of_its_gradient(optimizer):
    """Regression: the penalty's whole (8, 16) gradient seed was refused next to the split weight."""
    local, _ = check_equal(lambda: penalised_job(optimizer), batch(2))
    assert any(n.op == "broadcast_to" and n.type.shape == (4, 16) for n in local.nodes)


def test_a_predict_job_returns_the_logits_split_by_column_put_together():
    logical, values, local, distribution = logical_and_ranks(lambda: predict_job_of(hybrid_mlp))
    assert distribution.outputs == ["column_split"]
    assert [n.op for n in local.nodes if n.op in ("all_gather", "all_to_all", "reduce_scatter")] == ["all_gather"]
    x = batch(3)[:1]
    (want,), _ = run_reference(logical, x, values, {})
    (got,), _ = run_ranks(local, distribution, 2, x, values, {})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_flowc_show_prints_the_exchanges_of_a_model_parallel_layer(tmp_path, capsys):
    from flowc.cli import main
    script = tmp_path / "hybrid.py"
    script.write_text(
        "import flow\nimport flow.typing as tp\n\n\n"
        "@flow.global_function(type='train')\n"
        "def train_job(x: tp.Numpy.Placeholder((8, 16)),\n"
        "              y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:\n"
        "    logits = flow.layers.dense(x, 6, name='out', kernel_initializer=flow.truncated_normal(0.1),\n"
        "                               model_distribute=flow.distribute.split(0))\n"
        "    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)\n"
        "    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)\n"
        "    return loss\n")
    assert main(["show", f"{script}:train_job", "--ir", "--after", "simplify", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "float32[3x16] = variable(" in out          # each rank's 3 of the 6 units
    assert "= all_to_all(" in out and out.count("= reduce_scatter(") == 2 and "all_reduce(" not in out


def check_refused(net, match, ranks=2):
    on_ranks(ranks)
    with pytest.raises((flow.TraceError, flow.UnsupportedError), match=match):
        _ = train_job_of(net).graph


def test_a_split_that_does_not_divide_is_named():
    def net(x):
        return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 5, name="out", model_distribute=SPLIT)
    check_refused(net, r"test_model_parallel_pass.py:\d+: variable 'out-weight' of shape \[5, 16\] is split along "
                       r"axis 0 over 2 ranks")


def test_a_split_along_another_axis_is_refused_with_its_line():
    def net(x):
        w = flow.get_variable("w", shape=(16, 10), initializer=flow.truncated_normal(0.1),
                              distribute=flow.distribute.split(1))
        return flow.matmul(flow.reshape(x, [x.shape[0], -1]), w)
    check_refused(net, r"test_model_parallel_pass.py:\d+: variable 'w' is declared split along axis 1")


def test_a_split_convolution_filter_is_refused_naming_the_op():
    def net(x):
        x = flow.layers.conv2d(x, 4, 3, name="conv", kernel_initializer=flow.truncated_normal(0.1),
                               model_distribute=SPLIT) if _conv_takes_model_distribute() else \
            flow.nn.conv2d(x, flow.get_variable("f", shape=(4, 1, 3, 3), initializer=flow.truncated_normal(0.1),
                                                distribute=SPLIT), 1, "SAME")
        return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 10, name="out")
    check_refused(net, r"conv2d in a data-parallel job: it reads a variable split over the ranks")


def _conv_takes_model_distribute() -> bool:
    import inspect
    return "model_distribute" in inspect.signature(flow.layers.conv2d).parameters


def test_a_split_variable_is_refused_in_the_mirrored_view():
    def make():
        config = flow.function_config()
        config.default_logical_view(flow.scope.mirrored_view())

        @flow.global_function(type="train", function_config=config)
        def train_job(images: tp.ListNumpy.Placeholder((B, 1, 4, 4), dtype=flow.float),
                      labels: tp.ListNumpy.Placeholder((B,), dtype=flow.int32)) -> tp.ListNumpy:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, hybrid_mlp(images))
            OPTIMIZERS["sgd"]().minimize(loss)
            return loss
        return train_job
    on_ranks(2)
    with pytest.raises(flow.TraceError, match=r"variable 'out-weight' is split over the devices \(model parallelism\) "
                                              r"in a job of the mirrored view"):
        _ = make().graph


def test_the_generated_step_calls_each_exchange_where_the_schedule_puts_it():
    on_ranks(2)
    source = train_job_of(hybrid_mlp, "sgd").compile().source()
    step = source[source.index('extern "C" int flowc_step'):]
    gather = step.index("comm->exchange(comm->ctx, FLOWC_COMM_ALL_GATHER,")
    to_rows = step.index("comm->exchange(comm->ctx, FLOWC_COMM_ALL_TO_ALL,")
    scatter = step.index("comm->exchange(comm->ctx, FLOWC_COMM_REDUCE_SCATTER,")
    assert gather < to_rows < scatter          # forward: gather the batch, columns to rows; backward: scatter
    assert step.count("comm->start(") == 1     # the hidden layer's two gradients, summed in one bucket


def test_the_exchange_kinds_match_the_header():
    from flowc.compiler.codegen.collectives import EXCHANGES
    from flowc.compiler.toolchain import include_dir
    for name in ("flowc_comm.h", "flowc_comm_mpi.c"):
        text = (include_dir() / name).read_text()
        for constant, number, _ in EXCHANGES.values():
            assert f"#define {constant} {number}" in text, (name, constant)
