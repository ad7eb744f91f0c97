"""flowc's jobs of the model zoo's ResNets for the benchmark: examples/models/resnet.py's "resnet18"
train job and "resnet50" predict job, at the sizes benchmarks/workloads.py states for every framework
(`zoo_config` checks that the two agree, so the peers cannot drift apart).

    train = zoo_jobs("resnet18")[0]          # train(images, labels) -> loss
    predict = zoo_jobs("resnet50")[1]        # predict(images, labels) -> softmax (1, 1000)
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any

from benchmarks.peers.flowc_jobs import load_example
from benchmarks.workloads import RESNET_ZOO, RESNET_ZOO_STEPS, ResNetShape


def _module() -> types.ModuleType:
    return load_example("models/resnet")


def zoo_config(model: str, shape: ResNetShape | None = None) -> Any:
    """The example's config `model` ("resnet18", "resnet50") at `shape`'s batch, after checking that
    everything else agrees with `shape` (default: the workload's, RESNET_ZOO[model])."""
    shape = shape or RESNET_ZOO[model]
    config = _module().CONFIGS[model]
    differ = {f.name: (getattr(config, f.name), getattr(shape, f.name)) for f in dataclasses.fields(shape)
              if f.name != "batch_size" and getattr(config, f.name) != getattr(shape, f.name)}
    assert not differ, f"examples/models/resnet.py's {model} config is not the benchmark's: {differ}"
    assert config.data_format == "NCHW", f"the benchmark runs NCHW, {model} is {config.data_format}"
    return dataclasses.replace(config, batch_size=shape.batch_size)


def shape_config(shape: ResNetShape) -> Any:
    """An example ResNetConfig with exactly `shape`'s fields (the tests' small networks)."""
    return _module().ResNetConfig(**dataclasses.asdict(shape))


def zoo_jobs(model: str) -> tuple[Any, Any]:
    """(train job, predict job) of zoo ResNet `model` at the workload's size; both take (images, labels)."""
    return _module().make_jobs(zoo_config(model), total_steps=RESNET_ZOO_STEPS)


def jobs_of(shape: ResNetShape) -> tuple[Any, Any]:
    """(train job, predict job) of any `shape` (the tests build small ones)."""
    return _module().make_jobs(shape_config(shape), total_steps=RESNET_ZOO_STEPS)
