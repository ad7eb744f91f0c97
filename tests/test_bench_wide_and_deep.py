"""The Wide & Deep benchmark workload (issue 15): its FLOP count and batch, flowc's job is the model
zoo's example at the stated sizes, and PyTorch's peer trains with sparse embedding updates (skipped
where PyTorch is not installed)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from benchmarks.workloads import (STEP_WORKLOADS, WDL_BATCH, WDL_DEEP_FIELDS, WDL_DENSE_FIELDS, WDL_VOCAB,
                                  WDL_WIDE_FIELDS, batch_for, wide_and_deep_flops)

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")


def test_flops_count_the_mlp_and_the_batch_is_skewed_ids_in_range():
    b = WDL_BATCH
    forward = [2 * b * 429 * 1024, 2 * b * 1024 * 1024, 2 * b * 1024 * 1024, 2 * b * 1024 * 1]
    assert wide_and_deep_flops("predict") == sum(forward)
    assert wide_and_deep_flops("train") == 3 * sum(forward)      # the first layer's input gradient too
    workload = STEP_WORKLOADS["wide_and_deep_train"]
    assert workload.batch == WDL_BATCH and workload.title == "Wide&Deep train"
    (dense, wide, deep), labels = batch_for("wide_and_deep_train")
    assert dense.shape == (b, WDL_DENSE_FIELDS) and dense.dtype == np.float32
    assert wide.shape == (b, WDL_WIDE_FIELDS) and deep.shape == (b, WDL_DEEP_FIELDS) and deep.dtype == np.int32
    assert 0 <= deep.min() and deep.max() < WDL_VOCAB and 0 <= wide.min() and wide.max() < WDL_VOCAB
    assert labels.shape == (b, 1) and set(np.unique(labels)) == {0.0, 1.0}
    assert len(np.unique(deep)) < deep.size // 2          # Zipf ids repeat: the sparse update sums rows


def test_flowc_job_is_the_examples_large_model():
    from benchmarks.peers.flowc_jobs import arguments
    from benchmarks.peers.flowc_wide_and_deep import wide_and_deep_config
    config = wide_and_deep_config()
    assert config.batch_size == WDL_BATCH and config.deep_vocab_size == WDL_VOCAB
    features, labels = batch_for("wide_and_deep_train")
    args = arguments(STEP_WORKLOADS["wide_and_deep_train"], features, labels)
    assert [a.shape for a in args] == [(WDL_BATCH, 1), (WDL_BATCH, 13), (WDL_BATCH, 2), (WDL_BATCH, 26)]


@pytest.mark.slow
def test_flowc_trains_the_benchmark_model_a_few_steps():
    import flow
    from benchmarks.peers.flowc_wide_and_deep import train_job
    flow.clear_default_session()
    (dense, wide, deep), labels = batch_for("wide_and_deep_train")
    train = train_job()
    losses = [float(np.mean(train(labels, dense, wide, deep))) for _ in range(4)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    flow.clear_default_session()


@needs_torch
def test_pytorch_peer_updates_only_the_batchs_rows():
    from benchmarks.peers.torch_wide_and_deep import WideAndDeep, build_train
    import torch
    features, labels = batch_for("wide_and_deep_train")
    torch.manual_seed(0)
    before = WideAndDeep().deep.weight.detach().clone()        # build_train seeds the same way
    step = build_train(features, labels, compiled=False)
    losses = [float(step()) for _ in range(2)]
    assert all(np.isfinite(losses))
    # the step's model is inside the closure; its deep table is the one SparseAdam holds
    cells = [c.cell_contents for c in step.__closure__ or ()]
    sparse_adam = next(c for c in cells if isinstance(c, torch.optim.SparseAdam))
    table = sparse_adam.param_groups[0]["params"][1].detach()
    used = np.unique(features[2])
    untouched = np.setdiff1d(np.arange(50), used)
    assert torch.equal(table[untouched], before[untouched])
    assert not torch.equal(table[used[:5]], before[used[:5]])
