"""Sparse (indexed-slices) embedding updates on several ranks.

The update reads the batch's indices and the gather's gradient rows (compiler/indexed_slices.py).
On several ranks each holds a share of the batch, so the data-parallel pass all-gathers both, in
rank order, and every rank updates the rows the whole batch used: the one-process update, with no
(vocab, dim) gradient summed.  The ranks' graph runs on simulated ranks (tests/rank_simulator.py)
against the logical job; tests/test_distributed_training.py runs tests/distributed/sparse_embedding.py
on 2 MPI ranks.
"""
import re

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.reference import run_reference
from tests.rank_simulator import run_ranks
from tests.test_model_parallel_pass import logical_and_ranks, on_ranks, scalars_for

B, FIELDS, VOCAB, DIM = 8, 3, 50, 4


def embedding_job(index_dtype, optimizer: str):
    config = flow.function_config()
    if optimizer == "momentum":      # sparse for the tables named here, as in OneFlow
        config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["table"])))

    @flow.global_function(type="train", function_config=config)
    def train_job(ids: tp.Numpy.Placeholder((B, FIELDS), dtype=index_dtype),
                  clicks: tp.Numpy.Placeholder((B, 1), dtype=flow.float)) -> tp.Numpy:
        table = flow.get_variable("table", shape=(VOCAB, DIM), initializer=flow.random_normal_initializer(0.0, 0.1))
        logits = flow.layers.dense(flow.reshape(flow.gather(table, ids), [B, FIELDS * DIM]), 1, name="out",
                                   kernel_initializer=flow.truncated_normal(0.2))
        loss = flow.math.reduce_mean(flow.nn.sigmoid_cross_entropy_with_logits(clicks, logits))
        lr = flow.optimizer.PiecewiseConstantScheduler([], [0.05])
        chosen = flow.optimizer.LazyAdam(lr) if optimizer == "lazy_adam" else flow.optimizer.SGD(lr, momentum=0.9)
        chosen.minimize(loss)
        return loss
    return train_job


def batch(seed: int, dtype):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (B, FIELDS))
    ids[0, 0] = ids[-1, -1] = 7             # a row both ranks' shares use: its gradient rows add up
    return [ids.astype(dtype), rng.integers(0, 2, (B, 1)).astype(np.float32)]


def adam_tolerance(var: str, want_assigns: dict) -> tuple[float, np.ndarray | None]:
    """(atol, the elements to compare) for `var` after Adam's first step, whose update
    lr * m / (sqrt(v) + 1e-8) is sign(g) * lr for any gradient g well above 1e-8, and divides rounding
    by g's own size where g is near 1e-8: a gradient summed from larger terms of both signs (the
    ranks' halves) then differs in its last bits and the step by up to lr.  So the moments are
    compared to their own precision everywhere and the weights where |m| >= 1e-6 (a relative error of
    the moment below 1e-3, of the step below lr * 1e-3) or m is 0 (rows a lazy update left alone); the
    weights elsewhere follow from the moments."""
    if var.endswith("-m"):
        return 1e-9, None
    if var.endswith("-v"):
        return 1e-12, None
    moment = want_assigns.get(f"{var}-m")
    return (1e-4, (np.abs(moment) >= 1e-6) | (moment == 0)) if moment is not None else (1e-7, None)


def same_as_one_process(make_job, inputs, ranks=2, atol=1e-7, tolerance=None):
    """The ranks' graph of `make_job` on simulated ranks against the logical job's reference run:
    outputs and every updated variable (`tolerance(var, want_assigns)`: (atol, the elements to compare
    or None: all) instead of `atol`).  The ranks' graph."""
    logical, values, local, distribution = logical_and_ranks(make_job, ranks)
    # copies for each run: a sparse update's scatter_rows writes its table in place
    want, want_assigns = run_reference(logical, inputs, {k: v.copy() for k, v in values.items()},
                                       scalars_for(logical))
    got, got_assigns = run_ranks(local, distribution, ranks, inputs, {k: v.copy() for k, v in values.items()},
                                 scalars_for(local))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert got_assigns.keys() == want_assigns.keys()
    for var in want_assigns:
        var_atol, where = tolerance(var, want_assigns) if tolerance else (atol, None)
        got_var, want_var = (got_assigns[var], want_assigns[var]) if where is None else \
            (got_assigns[var][where], want_assigns[var][where])
        assert where is None or where.mean() > 0.9, f"{var}: most of it is compared"
        np.testing.assert_allclose(got_var, want_var, rtol=1e-5, atol=var_atol, err_msg=var)
    tables = [var for var in want_assigns if var.endswith(("table", "embedding"))]
    assert tables and all(not np.array_equal(want_assigns[var], values[var]) for var in tables)
    return local


@pytest.mark.parametrize("index_dtype", [flow.int64, flow.int32])
@pytest.mark.parametrize("optimizer", ["lazy_adam", "momentum"])
def test_a_sparse_update_on_ranks_uses_the_whole_batchs_rows(index_dtype, optimizer):
    dtype = np.int64 if index_dtype is flow.int64 else np.int32
    local = same_as_one_process(lambda: embedding_job(index_dtype, optimizer), batch(1, dtype))
    assert any(n.op == "scatter_rows" for n in local.nodes), "the update is sparse"
    gathered = sorted((n.type.dtype, n.type.shape) for n in local.nodes if n.op == "all_gather")
    # the batch's indices (once, for both of their readers) and the gather's gradient rows
    assert gathered == sorted([(np.dtype(dtype).name, (B, FIELDS)), ("float32", (B, FIELDS, DIM))])
    # no (vocab, dim) sum: the table's gradient never crosses the ranks densely
    assert all(n.type.shape != (VOCAB, DIM) for n in local.nodes if n.op == "all_reduce")


def test_four_ranks():
    same_as_one_process(lambda: embedding_job(flow.int64, "lazy_adam"), batch(2, np.int64), ranks=4)


def test_the_zoo_wide_and_deep_trains_on_ranks_as_one_process():
    """examples/models/wide_and_deep.py: LazyAdam on a wide and a deep table, both sparse."""
    from examples.models import wide_and_deep
    config = wide_and_deep.CONFIGS["tiny"]
    local = same_as_one_process(lambda: wide_and_deep.make_jobs(config)[0], wide_and_deep.synthetic_batch(config, 3),
                                tolerance=adam_tolerance)
    assert sum(n.op == "scatter_rows" for n in local.nodes) >= 2


def test_a_sparse_update_is_refused_in_the_mirrored_view_naming_its_line():
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def train_job(ids: tp.ListNumpy.Placeholder((B, FIELDS), dtype=flow.int64),
                  clicks: tp.ListNumpy.Placeholder((B, 1), dtype=flow.float)) -> tp.ListNumpy:
        table = flow.get_variable("table", shape=(VOCAB, DIM), initializer=flow.random_normal_initializer(0.0, 0.1))
        loss = flow.math.reduce_mean(flow.gather(table, ids))
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
        return loss
    on_ranks(2)
    with pytest.raises(flow.TraceError, match=r"test_sparse_updates_on_ranks.py:\d+: .*sparse \(indexed-slices\) "
                                              r"update, which flowc does not average over the ranks of the mirrored"):
        _ = train_job.graph


@pytest.mark.parametrize("index_dtype, code", [(flow.int64, "FLOWC_COMM_INT64"), (flow.int32, "FLOWC_COMM_INT32")])
def test_the_engines_move_the_indices_in_their_own_type(index_dtype, code):
    """Each exchange names its values' type and counts them (flowc_comm.h, flowc_cuda_comm.h): an int64
    index is one int64, not two float32 words."""
    from flowc.compiler.pipeline import lower
    from tests.test_cuda_codegen import render
    on_ranks(2)
    job = embedding_job(index_dtype, "lazy_adam")
    share = B // 2 * FIELDS
    source = job.compile().source()
    gathers = [line for line in source.splitlines() if "FLOWC_COMM_ALL_GATHER" in line and "comm->exchange" in line]
    calls = sorted(re.search(r"comm->exchange\(comm->ctx, FLOWC_COMM_ALL_GATHER, [^,]+, [^,]+, (\d+), (\w+)\)",
                             line).groups() for line in gathers)
    assert calls == sorted([(str(share), code), (str(share * DIM), "FLOWC_COMM_FLOAT32")])
    step = render(lower(job.graph))
    exchanges = sorted((call.sizes[1], call.dtype) for call in step.comm_calls if call.op == "exchange")
    assert exchanges == sorted([(share, index_dtype.ir_name), (share * DIM, "float32")])
