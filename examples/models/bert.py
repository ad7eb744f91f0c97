"""BERT pretraining (masked LM + next sentence) on synthetic data, in OneFlow-Benchmark's style.

The model is written against `flow` the way OneFlow-Benchmark's LanguageModeling/BERT scripts write
theirs, so its variables carry the same names (`bert-embeddings-word_embeddings`,
`bert-encoder-layer_0-attention-self-query-weight`, `cls-predictions-output_bias`, ...) and a
checkpoint folder has OneFlow's layout:

* embeddings: word / token-type gathers, a position table sliced to the sequence, layer_norm, dropout;
* N encoder layers: query/key/value dense, scores = Q K^T / sqrt(d) as a batched matmul with
  `transpose_b`, plus the additive mask ((mask - 1) * 10000), softmax, dropout, context = P V,
  output dense, dropout, residual + layer_norm, then the gelu feed-forward with its residual + layer_norm;
* heads: the masked-LM head (gather the masked positions, dense + gelu + layer_norm, logits against the
  word embedding table, weighted cross-entropy) and the next-sentence head on the pooled first token;
* the train job: AdamW (or LAMB) with polynomial decay after a linear warmup, global-norm clipping at 1.

    python examples/models/bert.py --config tiny --steps 20
    python examples/models/bert.py --config small --steps 10 --optimizer lamb
"""
# (no `from __future__ import annotations`: the job functions' placeholder annotations are local names)

import math
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
class BertConfig:
    """The sizes of one BERT, and the batch its jobs are compiled for."""
    vocab_size: int
    seq_length: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    batch_size: int
    max_predictions_per_seq: int = 20
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    initializer_range: float = 0.02


CONFIGS = {
    "tiny": BertConfig(vocab_size=1024, seq_length=32, hidden_size=128, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=512, batch_size=4, max_predictions_per_seq=5,
                       max_position_embeddings=64),
    "small": BertConfig(vocab_size=30522, seq_length=128, hidden_size=256, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=1024, batch_size=8),
    "base": BertConfig(vocab_size=30522, seq_length=128, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, batch_size=8),
}


# --------------------------------------------------------------------------------------------- layers

def _init(config: BertConfig):
    return flow.truncated_normal(config.initializer_range)


def fully_connected(x, units: int, name: str, config: BertConfig):
    """x @ `<name>-weight` (in, units) + `<name>-bias`: OneFlow-Benchmark's dense, weight stored (in, out)."""
    weight = flow.get_variable(name + "-weight", shape=(x.shape[-1], units), dtype=x.dtype,
                               initializer=_init(config))
    bias = flow.get_variable(name + "-bias", shape=(units,), dtype=x.dtype,
                             initializer=flow.constant_initializer(0.0))
    return flow.nn.bias_add(flow.matmul(x, weight), bias)


def dropout(x, rate: float):
    return x if rate == 0.0 else flow.nn.dropout(x, rate=rate)


def layer_norm(x):
    return flow.layers.layer_norm(x, name="LayerNorm", begin_norm_axis=-1, begin_params_axis=-1)


def embeddings(input_ids, token_type_ids, config: BertConfig):
    """(B, S) ids -> (B, S, H) and the word embedding table (the MLM head's output weights)."""
    h, s = config.hidden_size, config.seq_length
    table = flow.get_variable("word_embeddings", shape=(config.vocab_size, h), dtype=flow.float,
                              initializer=_init(config))
    out = flow.gather(params=table, indices=input_ids, axis=0)
    type_table = flow.get_variable("token_type_embeddings", shape=(config.type_vocab_size, h),
                                   dtype=flow.float, initializer=_init(config))
    out = out + flow.gather(params=type_table, indices=token_type_ids, axis=0)
    position_table = flow.get_variable("position_embeddings", shape=(1, config.max_position_embeddings, h),
                                       dtype=flow.float, initializer=_init(config))
    if s != config.max_position_embeddings:
        position_table = flow.slice(position_table, begin=[None, 0, 0], size=[None, s, -1])
    out = layer_norm(out + position_table)
    return dropout(out, config.hidden_dropout_prob), table


def attention_bias(input_mask, config: BertConfig):
    """(B, S) 0/1 mask -> (B, 1, S, S) additive bias: 0 where attended, -10000 where masked."""
    s = config.seq_length
    mask = flow.reshape(flow.cast(input_mask, dtype=flow.float), (-1, 1, s))
    mask = flow.constant(0.0, dtype=flow.float, shape=(s, s)) + mask          # (B, S, S)
    mask = flow.reshape(mask, (-1, 1, s, s))
    return (mask - 1.0) * 10000.0


def self_attention(x, bias, config: BertConfig):
    """(B*S, H) -> (B*S, H): multi-head scaled dot-product attention with the additive mask `bias`."""
    heads, s = config.num_attention_heads, config.seq_length
    size = config.hidden_size // heads

    def split_heads(t):                                   # (B*S, H) -> (B, heads, S, size)
        return flow.transpose(flow.reshape(t, (-1, s, heads, size)), perm=[0, 2, 1, 3])

    query = split_heads(fully_connected(x, heads * size, "query", config))
    key = split_heads(fully_connected(x, heads * size, "key", config))
    value = split_heads(fully_connected(x, heads * size, "value", config))
    scores = flow.matmul(query, key, transpose_b=True) * (1.0 / math.sqrt(float(size)))
    probs = dropout(flow.nn.softmax(scores + bias), config.attention_probs_dropout_prob)
    context = flow.transpose(flow.matmul(probs, value), perm=[0, 2, 1, 3])       # (B, S, heads, size)
    return flow.reshape(context, (-1, heads * size))


def encoder(x, bias, config: BertConfig):
    """(B, S, H) -> (B, S, H) through `num_hidden_layers` transformer layers."""
    h = config.hidden_size
    out = flow.reshape(x, (-1, h))
    for i in range(config.num_hidden_layers):
        with flow.scope.namespace(f"layer_{i}"):
            layer_in = out
            with flow.scope.namespace("attention"):
                with flow.scope.namespace("self"):
                    attended = self_attention(layer_in, bias, config)
                with flow.scope.namespace("output"):
                    attended = fully_connected(attended, h, "dense", config)
                    attended = layer_norm(dropout(attended, config.hidden_dropout_prob) + layer_in)
            with flow.scope.namespace("intermediate"):
                inner = flow.math.gelu(fully_connected(attended, config.intermediate_size, "dense", config))
            with flow.scope.namespace("output"):
                out = fully_connected(inner, h, "dense", config)
                out = layer_norm(dropout(out, config.hidden_dropout_prob) + attended)
    return flow.reshape(out, (-1, config.seq_length, h))


def backbone(input_ids, input_mask, token_type_ids, config: BertConfig):
    """(sequence output (B, S, H), word embedding table)."""
    with flow.scope.namespace("bert"):
        with flow.scope.namespace("embeddings"):
            x, table = embeddings(input_ids, token_type_ids, config)
        with flow.scope.namespace("encoder"):
            sequence = encoder(x, attention_bias(input_mask, config), config)
    return sequence, table


def masked_lm_logits(sequence, table, positions, config: BertConfig):
    """The logits (B * P, vocab) of the masked positions."""
    h = config.hidden_size
    with flow.scope.namespace("cls-predictions"):
        picked = flow.reshape(flow.gather(sequence, positions, axis=1, batch_dims=1), (-1, h))
        with flow.scope.namespace("transform"):
            picked = layer_norm(flow.math.gelu(fully_connected(picked, h, "dense", config)))
        output_bias = flow.get_variable("output_bias", shape=(config.vocab_size,), dtype=flow.float,
                                        initializer=flow.constant_initializer(1.0))
        return flow.nn.bias_add(flow.matmul(picked, table, transpose_b=True), output_bias)


def next_sentence_logits(sequence, config: BertConfig):
    """The (B, 2) logits of the next-sentence head, from the pooled first token."""
    h = config.hidden_size
    with flow.scope.namespace("bert-pooler"):
        first = flow.reshape(flow.slice(sequence, [None, 0, 0], [None, 1, -1]), (-1, h))
        pooled = flow.math.tanh(fully_connected(first, h, "dense", config))
    with flow.scope.namespace("cls-seq_relationship"):
        weights = flow.get_variable("output_weights", shape=(2, h), dtype=flow.float, initializer=_init(config))
        bias = flow.get_variable("output_bias", shape=(2,), dtype=flow.float,
                                 initializer=flow.constant_initializer(0.0))
        return flow.nn.bias_add(flow.matmul(pooled, weights, transpose_b=True), bias)


def pretraining_loss(batch, config: BertConfig):
    """(total, masked-LM, next-sentence) losses, each a scalar of shape (1,)."""
    input_ids, input_mask, token_type_ids, positions, lm_ids, lm_weights, ns_labels = batch
    sequence, table = backbone(input_ids, input_mask, token_type_ids, config)
    logits = masked_lm_logits(sequence, table, positions, config)
    with flow.scope.namespace("cls-predictions"):
        per_position = flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels=flow.reshape(lm_ids, (-1,)), logits=logits)
        per_position = flow.reshape(per_position, (-1, config.max_predictions_per_seq))
        mean_weight = flow.math.reduce_mean(flow.math.reduce_sum(lm_weights, axis=[-1]))
        lm_loss = flow.math.reduce_sum(per_position * lm_weights, axis=[-1]) / (mean_weight + 1e-5)
    ns = flow.nn.sparse_softmax_cross_entropy_with_logits(labels=ns_labels,
                                                         logits=next_sentence_logits(sequence, config))
    with flow.scope.namespace("cls-loss"):
        lm_loss, ns_loss = flow.math.reduce_mean(lm_loss), flow.math.reduce_mean(ns)
        return lm_loss + ns_loss, lm_loss, ns_loss


def optimizer(name: str, total_steps: int, base_lr: float = 1e-3, warmup_steps: int | None = None):
    """AdamW (weight decay 0.01 except biases and layer norms) or LAMB, polynomial decay to 0 over
    `total_steps` after a linear warmup (default a tenth of the steps), global-norm clipping at 1."""
    warmup = max(1, total_steps // 10) if warmup_steps is None else warmup_steps
    lr = flow.optimizer.PolynomialScheduler(base_lr, steps=max(total_steps, 1), end_learning_rate=0.0, power=1.0,
                                            warmup=flow.optimizer.warmup.linear(warmup, 0.0) if warmup else None)
    clip = flow.optimizer.grad_clipping.by_global_norm(1.0)
    if name == "lamb":        # OneFlow 0.3.4's LAMB takes no weight decay
        return flow.optimizer.LAMB(lr, epsilon=1e-6, grad_clipping=clip)
    if name == "adamw":
        return flow.optimizer.AdamW(lr, epsilon=1e-6, do_bias_correction=True, weight_decay=0.01,
                                    weight_decay_excludes=["bias", "LayerNorm", "layer_norm"], grad_clipping=clip)
    raise ValueError(f"optimizer: expected 'adamw' or 'lamb', got {name!r}")


# --------------------------------------------------------------------------------------------- jobs

def make_jobs(config: BertConfig = CONFIGS["tiny"], optimizer_name: str = "adamw", total_steps: int = 100,
              base_lr: float = 1e-3, warmup_steps: int | None = None) -> Tuple[Callable, Callable]:
    """(train job, predict job) for `config`: the train job returns the total loss, the predict job
    (masked-LM logits (B * P, vocab), next-sentence logits (B, 2)).  Both take the seven batch arrays
    `synthetic_batch` makes.

    Example:
        train, predict = make_jobs(CONFIGS["tiny"], total_steps=10)
        loss = train(*synthetic_batch(CONFIGS["tiny"]))
    """
    b, s, p = config.batch_size, config.seq_length, config.max_predictions_per_seq
    ids = tp.Numpy.Placeholder((b, s), dtype=flow.int32)
    preds = tp.Numpy.Placeholder((b, p), dtype=flow.int32)
    weights = tp.Numpy.Placeholder((b, p), dtype=flow.float)
    labels = tp.Numpy.Placeholder((b,), dtype=flow.int32)

    def bert_train(input_ids: ids, input_mask: ids, token_type_ids: ids, masked_lm_positions: preds,
                   masked_lm_ids: preds, masked_lm_weights: weights, next_sentence_labels: labels) -> tp.Numpy:
        batch = (input_ids, input_mask, token_type_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights,
                 next_sentence_labels)
        total, _, _ = pretraining_loss(batch, config)
        optimizer(optimizer_name, total_steps, base_lr, warmup_steps).minimize(total)
        return total

    def bert_predict(input_ids: ids, input_mask: ids, token_type_ids: ids, masked_lm_positions: preds,
                     masked_lm_ids: preds, masked_lm_weights: weights,
                     next_sentence_labels: labels) -> Tuple[tp.Numpy, tp.Numpy]:
        sequence, table = backbone(input_ids, input_mask, token_type_ids, config)
        return masked_lm_logits(sequence, table, masked_lm_positions, config), next_sentence_logits(sequence, config)

    return flow.global_function(type="train")(bert_train), flow.global_function(type="predict")(bert_predict)


def synthetic_batch(config: BertConfig, seed: int = 0) -> list[np.ndarray]:
    """One batch of made-up pretraining data: the second half of each sequence masked out in some rows,
    masked positions distinct and inside the unmasked part, their labels the ids at those positions.

    Example:
        input_ids, input_mask, token_type_ids, positions, lm_ids, lm_weights, ns_labels = synthetic_batch(cfg)
    """
    rng = np.random.default_rng(seed)
    b, s, p = config.batch_size, config.seq_length, config.max_predictions_per_seq
    input_ids = rng.integers(0, config.vocab_size, (b, s), dtype=np.int32)
    lengths = np.where(rng.random(b) < 0.5, s, max(p, s // 2))
    input_mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    token_type_ids = (np.arange(s)[None, :] >= s // 2).astype(np.int32).repeat(b, 0)
    positions = np.stack([np.sort(rng.choice(n, p, replace=False)) for n in lengths]).astype(np.int32)
    lm_ids = np.take_along_axis(input_ids, positions, axis=1).astype(np.int32)
    lm_weights = np.ones((b, p), np.float32)
    lm_weights[:, p - p // 4:] = 0.0                      # the last quarter of the slots are padding
    ns_labels = rng.integers(0, 2, (b,), dtype=np.int32)
    return [input_ids, input_mask, token_type_ids, positions, lm_ids, lm_weights, ns_labels]


def main(argv=None) -> int:
    args = parse_args("BERT pretraining on synthetic data.", list(CONFIGS), "tiny", argv=argv,
                      more=lambda p: p.add_argument("--optimizer", choices=["adamw", "lamb"], default="adamw",
                                                    help="the optimizer (default: adamw)"))
    config = CONFIGS[args.config]
    if args.batch_size:
        config = replace(config, batch_size=args.batch_size)
    train, _ = make_jobs(config, args.optimizer, total_steps=args.steps)
    batches = [synthetic_batch(config, args.seed + i) for i in range(4)]
    return train_loop(train, batches, args, f"bert-{args.config}")


if __name__ == "__main__":
    sys.exit(main())
