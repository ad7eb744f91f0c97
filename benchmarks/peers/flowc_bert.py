"""flowc's BERT jobs for the benchmark: examples/models/bert.py's "small" pretraining train job
(AdamW) and predict job, at the sizes benchmarks/workloads.py states for every framework
(`shape_config` checks that the two agree, so the peers cannot drift apart).

    train, predict = bert_jobs("bert_small")
    loss = train(*features, *targets)           # features, targets = bert_batch("bert_small")
    mlm_logits, ns_logits = predict(*features, *targets)
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any

from benchmarks.peers.flowc_jobs import load_example
from benchmarks.workloads import BERT_LEARNING_RATE, BERT_STEPS, BERT_ZOO, BertShape


def example_module() -> types.ModuleType:
    """examples/models/bert.py, imported once (its __main__ part not run)."""
    return load_example("models/bert")


def shape_config(shape: BertShape) -> Any:
    """The example's BertConfig with exactly `shape`'s fields (the tests build small ones)."""
    return example_module().BertConfig(**dataclasses.asdict(shape))


def bert_config(model: str) -> Any:
    """The example's config of `model` ("bert_small" is bert.py's "small") after checking that every
    field the workload states agrees with it."""
    shape = BERT_ZOO[model]
    config = example_module().CONFIGS[model.removeprefix("bert_")]
    differ = {f.name: (getattr(config, f.name), getattr(shape, f.name)) for f in dataclasses.fields(shape)
              if getattr(config, f.name) != getattr(shape, f.name)}
    assert not differ, f"examples/models/bert.py's {model} config is not the benchmark's: {differ}"
    return config


def jobs_of(config: Any) -> tuple[Any, Any]:
    """(train job, predict job) of the example at `config`, with the workload's AdamW and schedule."""
    return example_module().make_jobs(config, "adamw", total_steps=BERT_STEPS, base_lr=BERT_LEARNING_RATE)


def bert_jobs(model: str) -> tuple[Any, Any]:
    """(train job, predict job) of BERT `model` at the workload's size; both take the seven batch arrays."""
    return jobs_of(bert_config(model))
