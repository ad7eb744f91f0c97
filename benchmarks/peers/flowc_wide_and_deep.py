"""flowc's Wide & Deep train job for the benchmark: examples/models/wide_and_deep.py's "large" model,
whose sizes benchmarks/workloads.py states for every framework (`wide_and_deep_config` checks
that the two agree, so the peers cannot drift apart)."""
from __future__ import annotations

import types
from dataclasses import replace
from typing import Any

from benchmarks.peers.flowc_jobs import load_example
from benchmarks.workloads import (WDL_BATCH, WDL_DEEP_FIELDS, WDL_DENSE_FIELDS, WDL_DIM, WDL_DROPOUT, WDL_HIDDEN,
                                  WDL_LEARNING_RATE, WDL_VOCAB, WDL_WIDE_FIELDS)


def _module() -> types.ModuleType:
    return load_example("models/wide_and_deep")


def wide_and_deep_config(batch: int = WDL_BATCH) -> Any:
    """The example's "large" config at `batch`, after checking it is the workload's model."""
    config = _module().CONFIGS["large"]
    stated = dict(wide_vocab_size=WDL_VOCAB, deep_vocab_size=WDL_VOCAB, hidden_units=WDL_HIDDEN,
                  batch_size=WDL_BATCH, deep_embedding_vec_size=WDL_DIM, num_dense_fields=WDL_DENSE_FIELDS,
                  num_wide_sparse_fields=WDL_WIDE_FIELDS, num_deep_sparse_fields=WDL_DEEP_FIELDS,
                  deep_dropout_rate=WDL_DROPOUT, learning_rate=WDL_LEARNING_RATE)
    differ = {k: (getattr(config, k), v) for k, v in stated.items() if getattr(config, k) != v}
    assert not differ, f"examples/models/wide_and_deep.py's large config is not the benchmark's: {differ}"
    return replace(config, batch_size=batch)


def train_job(batch: int = WDL_BATCH) -> Any:
    """The train job, called as train(labels, dense, wide ids, deep ids) -> loss."""
    train, _ = _module().make_jobs(wide_and_deep_config(batch))
    return train
