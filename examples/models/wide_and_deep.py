"""Wide & Deep click-through-rate model on synthetic data, in OneFlow-Benchmark's style.

The model follows OneFlow-Benchmark's ClickThroughRate/WideDeepLearning script, so its variables carry
the same names (`wide_embedding`, `deep_embedding`, `fc1-weight`, ...):

* wide part: a (vocab, 1) table gathered at the wide sparse fields, summed per example;
* deep part: a (vocab, dim) table gathered at the deep sparse fields, flattened, concatenated with the
  dense fields, then a relu MLP with dropout and a dense layer to one score;
* score = wide + deep; sigmoid cross-entropy with the 0/1 click label; LazyAdam (OneFlow's choice
  for these tables).

    python examples/models/wide_and_deep.py --config tiny --steps 50
    python examples/models/wide_and_deep.py --config large --steps 20     # 10^6-row tables, batch 512
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)
import os
import sys
from dataclasses import dataclass, replace
from typing import Callable, Tuple

import numpy as np

import flow
import flow.typing as tp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from progress import parse_args, train_loop  # noqa: E402


@dataclass(frozen=True)
class WideDeepConfig:
    """The sizes of one Wide & Deep model, and the batch its jobs are compiled for."""
    wide_vocab_size: int
    deep_vocab_size: int
    hidden_units: Tuple[int, ...]
    batch_size: int
    deep_embedding_vec_size: int = 16
    num_dense_fields: int = 13
    num_wide_sparse_fields: int = 2
    num_deep_sparse_fields: int = 26
    deep_dropout_rate: float = 0.5
    learning_rate: float = 1e-3


CONFIGS = {
    "tiny": WideDeepConfig(wide_vocab_size=2000, deep_vocab_size=2000, hidden_units=(64, 64), batch_size=32,
                           deep_embedding_vec_size=8, num_deep_sparse_fields=8, deep_dropout_rate=0.0,
                           learning_rate=1e-2),
    "small": WideDeepConfig(wide_vocab_size=100_000, deep_vocab_size=100_000, hidden_units=(256, 256, 256),
                            batch_size=512),
    "large": WideDeepConfig(wide_vocab_size=1_000_000, deep_vocab_size=1_000_000,
                            hidden_units=(1024, 1024, 1024), batch_size=512),
}


def wide_and_deep(dense_fields, wide_sparse_fields, deep_sparse_fields, config: WideDeepConfig, train: bool):
    """The (B, 1) click logits."""
    wide_table = flow.get_variable("wide_embedding", shape=(config.wide_vocab_size, 1),
                                   initializer=flow.random_uniform_initializer(minval=-0.05, maxval=0.05))
    wide = flow.gather(params=wide_table, indices=wide_sparse_fields)                 # (B, wide fields, 1)
    wide = flow.reshape(wide, (-1, wide.shape[-1] * wide.shape[-2]))
    wide_scores = flow.math.reduce_sum(wide, axis=[1], keepdims=True)

    deep_table = flow.get_variable("deep_embedding", shape=(config.deep_vocab_size, config.deep_embedding_vec_size),
                                   initializer=flow.random_uniform_initializer(minval=-0.05, maxval=0.05))
    deep = flow.gather(params=deep_table, indices=deep_sparse_fields)                 # (B, deep fields, dim)
    deep = flow.reshape(deep, (-1, deep.shape[-1] * deep.shape[-2]))
    features = flow.concat([deep, dense_fields], axis=1)
    for i, units in enumerate(config.hidden_units):
        features = flow.layers.dense(features, units=units, activation=flow.math.relu,
                                     kernel_initializer=flow.glorot_uniform_initializer(),
                                     bias_initializer=flow.constant_initializer(0.0), name=f"fc{i + 1}")
        if train and config.deep_dropout_rate:
            features = flow.nn.dropout(features, rate=config.deep_dropout_rate)
    deep_scores = flow.layers.dense(features, units=1, kernel_initializer=flow.glorot_uniform_initializer(),
                                    bias_initializer=flow.constant_initializer(0.0),
                                    name=f"fc{len(config.hidden_units) + 1}")
    return wide_scores + deep_scores


def make_jobs(config: WideDeepConfig = CONFIGS["tiny"]) -> Tuple[Callable, Callable]:
    """(train job, predict job) for `config`: both take (labels, dense, wide sparse, deep sparse) as
    `synthetic_batch` makes them; the train job returns the per-example loss (B, 1), the predict job
    (loss, click probability), both (B, 1).

    Example:
        train, predict = make_jobs(CONFIGS["tiny"])
        loss = train(*synthetic_batch(CONFIGS["tiny"]))
    """
    b = config.batch_size
    labels_t = tp.Numpy.Placeholder((b, 1), dtype=flow.float)
    dense_t = tp.Numpy.Placeholder((b, config.num_dense_fields), dtype=flow.float)
    wide_t = tp.Numpy.Placeholder((b, config.num_wide_sparse_fields), dtype=flow.int32)
    deep_t = tp.Numpy.Placeholder((b, config.num_deep_sparse_fields), dtype=flow.int32)

    def wdl_train(labels: labels_t, dense_fields: dense_t, wide_sparse_fields: wide_t,
                  deep_sparse_fields: deep_t) -> tp.Numpy:
        logits = wide_and_deep(dense_fields, wide_sparse_fields, deep_sparse_fields, config, train=True)
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        lr = flow.optimizer.PiecewiseConstantScheduler([], [config.learning_rate])
        flow.optimizer.LazyAdam(lr).minimize(loss)
        return loss

    def wdl_predict(labels: labels_t, dense_fields: dense_t, wide_sparse_fields: wide_t,
                    deep_sparse_fields: deep_t) -> Tuple[tp.Numpy, tp.Numpy]:
        logits = wide_and_deep(dense_fields, wide_sparse_fields, deep_sparse_fields, config, train=False)
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        return loss, flow.math.sigmoid(logits)

    return flow.global_function(type="train")(wdl_train), flow.global_function(type="predict")(wdl_predict)


def synthetic_batch(config: WideDeepConfig, seed: int = 0) -> list:
    """(labels, dense fields, wide sparse ids, deep sparse ids) with a learnable signal: the label is 1
    where a hidden score of the ids and dense fields is positive.  Ids are skewed (a few frequent ones),
    as click logs are.

    Example:
        labels, dense, wide, deep = synthetic_batch(CONFIGS["tiny"], seed=1)
    """
    rng = np.random.default_rng(seed)
    b = config.batch_size
    dense = rng.standard_normal((b, config.num_dense_fields)).astype(np.float32)
    wide = (rng.zipf(1.3, (b, config.num_wide_sparse_fields)) % config.wide_vocab_size).astype(np.int32)
    deep = (rng.zipf(1.3, (b, config.num_deep_sparse_fields)) % config.deep_vocab_size).astype(np.int32)
    hidden = np.sin(wide.sum(1) * 0.7) + np.cos(deep.sum(1) * 0.3) + dense[:, 0]
    labels = (hidden > 0).astype(np.float32).reshape(b, 1)
    return [labels, dense, wide, deep]


def main(argv=None) -> int:
    args = parse_args("Wide & Deep click-through training on synthetic data.", list(CONFIGS), "tiny",
                      default_steps=50, argv=argv)
    config = CONFIGS[args.config]
    if args.batch_size:
        config = replace(config, batch_size=args.batch_size)
    train, _ = make_jobs(config)
    batches = [synthetic_batch(config, args.seed + i) for i in range(8)]
    return train_loop(train, batches, args, f"wide_and_deep-{args.config}")


if __name__ == "__main__":
    sys.exit(main())
