"""The BERT small benchmark workloads (issue 15): bert_small_train and bert_small_predict.

Their FLOP counts are checked by hand and against the products of flowc's traced graphs; flowc's
jobs are examples/models/bert.py's at the stated sizes; PyTorch's network (examples/models/
torch_models.py's Bert) computes the same function as flowc's (predict logits and the train job's
first loss on the same weights, small shapes without dropout), its schedule is the example's, and
both frameworks' benchmark steps run and give finite losses.  PyTorch tests are skipped where it
is not installed.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

import flow
from benchmarks.workloads import BERT_STEPS, BERT_ZOO, STEP_WORKLOADS, BertShape, batch_for, bert_flops
from flowc.runtime.session import default_session

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")

# Every layer kind, few units: 2 layers of 2 heads, no dropout (so that one step is a function of the weights).
TINY = BertShape(vocab_size=50, seq_length=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, batch_size=2, max_predictions_per_seq=3, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)


def test_flops_of_a_tiny_bert_by_hand():
    b, s, h, i, v, p, heads, d = 2, 8, 16, 32, 50, 3, 2, 8
    per_layer = (4 * 2 * b * s * h * h + 2 * b * s * h * i + 2 * b * s * i * h    # Q K V out, FFN in and out
                 + 2 * b * heads * 2 * s * s * d)                                # scores and context
    heads_fwd = 2 * b * p * h * h + 2 * b * p * h * v + 2 * b * h * h + 2 * b * h * 2
    assert bert_flops(TINY, "predict") == 2 * per_layer + heads_fwd
    assert bert_flops(TINY, "train") == 3 * bert_flops(TINY, "predict")     # every product has both gradients


def _matmul_flops(graph) -> int:
    """2 m n k summed over every matmul node of a traced flowc graph (batch dimensions multiplied in)."""
    total = 0
    for n in graph.nodes:
        if n.op != "matmul":
            continue
        a = graph.node(n.inputs[0]).type.shape
        k = a[-2] if dict(n.attrs).get("transpose_a") else a[-1]
        total += 2 * int(np.prod(n.type.shape)) * k
    return total


def test_the_flop_count_is_the_products_of_flowcs_graphs():
    from benchmarks.peers.flowc_bert import jobs_of, shape_config
    flow.clear_default_session()
    train, predict = jobs_of(shape_config(TINY))
    assert _matmul_flops(predict.graph) == bert_flops(TINY, "predict")
    assert _matmul_flops(train.graph) == bert_flops(TINY, "train")        # forward and backward, traced
    flow.clear_default_session()


def test_workloads_are_registered_at_the_issues_sizes():
    train, predict = STEP_WORKLOADS["bert_small_train"], STEP_WORKLOADS["bert_small_predict"]
    shape = BERT_ZOO["bert_small"]
    assert (shape.batch_size, shape.seq_length, shape.hidden_size, shape.num_hidden_layers) == (8, 128, 256, 4)
    assert (train.batch, train.mode, train.title) == (8, "train", "BERT small train")
    assert (predict.batch, predict.mode, predict.title) == (8, "predict", "BERT small predict")
    assert train.gflop * 1e9 == bert_flops(shape, "train") and predict.gflop * 1e9 == bert_flops(shape, "predict")
    features, targets = batch_for("bert_small_train")
    ids, mask, types, positions = features
    lm_ids, lm_weights, ns_labels = targets
    assert ids.shape == mask.shape == types.shape == (8, 128) and ids.dtype == np.int32
    assert 0 <= ids.min() and ids.max() < shape.vocab_size and set(np.unique(mask)) == {0, 1}
    assert positions.shape == lm_ids.shape == lm_weights.shape == (8, 20) and lm_weights.dtype == np.float32
    assert np.array_equal(np.take_along_axis(ids, positions, 1), lm_ids) and ns_labels.shape == (8,)
    assert batch_for("bert_small_predict") is batch_for("bert_small_train")       # one batch for both


def test_flowc_jobs_are_the_examples_small_config():
    from benchmarks.peers.flowc_bert import bert_config, example_module
    from benchmarks.peers.flowc_jobs import arguments, job
    assert bert_config("bert_small") == example_module().CONFIGS["small"]
    features, targets = batch_for("bert_small_train")
    assert len(arguments(STEP_WORKLOADS["bert_small_train"], features, targets)) == 7
    assert job("bert_small_train").__name__ == "bert_train" and job("bert_small_predict").__name__ == "bert_predict"


def test_a_config_that_drifted_from_the_workload_is_refused(monkeypatch):
    from benchmarks.peers import flowc_bert
    drifted = dataclasses.replace(BERT_ZOO["bert_small"], num_hidden_layers=2)
    monkeypatch.setitem(BERT_ZOO, "bert_small", drifted)
    with pytest.raises(AssertionError, match="not the benchmark's"):
        flowc_bert.bert_config("bert_small")


def _torch_state(values: dict[str, np.ndarray], layers: int) -> dict[str, np.ndarray]:
    """flowc's variables (examples/models/bert.py's names) as the PyTorch Bert's state dict: dense
    weights are stored (in, out) by OneFlow-Benchmark, (out, in) by nn.Linear."""
    state = {"word.weight": values["bert-embeddings-word_embeddings"],
             "token_type.weight": values["bert-embeddings-token_type_embeddings"],
             "position": values["bert-embeddings-position_embeddings"],
             "output_bias": values["cls-predictions-output_bias"],
             "seq_relationship.weight": values["cls-seq_relationship-output_weights"],     # (2, H) in both
             "seq_relationship.bias": values["cls-seq_relationship-output_bias"]}
    dense = {"transform": "cls-predictions-transform-dense", "pooler": "bert-pooler-dense"}
    norms = {"emb_norm": "bert-embeddings-LayerNorm", "transform_norm": "cls-predictions-transform-LayerNorm"}
    for i in range(layers):
        ours = f"bert-encoder-layer_{i}-"
        dense |= {f"layers.{i}.{t}": ours + f for t, f in (
            ("query", "attention-self-query"), ("key", "attention-self-key"), ("value", "attention-self-value"),
            ("attn_out", "attention-output-dense"), ("inter", "intermediate-dense"), ("out", "output-dense"))}
        norms |= {f"layers.{i}.attn_norm": ours + "attention-output-LayerNorm",
                  f"layers.{i}.out_norm": ours + "output-LayerNorm"}
    for theirs, ours in dense.items():
        state |= {f"{theirs}.weight": values[ours + "-weight"].T, f"{theirs}.bias": values[ours + "-bias"]}
    for theirs, ours in norms.items():
        state |= {f"{theirs}.weight": values[ours + "-gamma"], f"{theirs}.bias": values[ours + "-beta"]}
    return state


def _tiny_batch(seed: int = 3):
    from benchmarks.peers.flowc_bert import example_module, shape_config
    arrays = example_module().synthetic_batch(shape_config(TINY), seed=seed)
    return tuple(arrays[:4]), tuple(arrays[4:])


@needs_torch
def test_pytorch_computes_flowcs_function_and_both_steps_run():
    import torch

    from benchmarks.peers.flowc_bert import jobs_of, shape_config
    from benchmarks.peers.torch_bert import build_predict, build_train, make_model
    flow.clear_default_session()
    train, predict = jobs_of(shape_config(TINY))
    features, targets = _tiny_batch()
    rng = np.random.default_rng(1)
    # random values everywhere, layer norms and biases included (their initial 1 / 0 would hide them)
    names = [n for n in train.graph.variables if not n.endswith(("-m", "-v"))]
    flow.load_variables({n: (0.3 * rng.standard_normal(train.graph.variables[n].shape)
                             + (1.0 if n.endswith("-gamma") else 0.0)).astype(np.float32) for n in names})
    values = {n: default_session().value(n).copy() for n in names}
    net = make_model(TINY)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in _torch_state(values, 2).items()}
    assert set(state) == set(net.state_dict())
    net.load_state_dict(state)
    mlm, ns = predict(*features, *targets)
    expected_mlm, expected_ns = build_predict(TINY, features, compiled=False, model=net)()
    assert mlm.shape == (TINY.batch_size * TINY.max_predictions_per_seq, TINY.vocab_size)
    np.testing.assert_allclose(mlm, expected_mlm, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ns, expected_ns, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        loss = net.train()(*[torch.from_numpy(a) for a in (*features, *targets)])
    flowc_losses = [train(*features, *targets).item() for _ in range(3)]
    np.testing.assert_allclose(flowc_losses[0], float(loss), rtol=1e-4)        # the loss before the first update
    torch_losses = [float(build_train(TINY, features, targets, compiled=False, model=net)()) for _ in range(3)]
    assert np.isfinite(flowc_losses).all() and np.isfinite(torch_losses).all()
    np.testing.assert_allclose(torch_losses[0], flowc_losses[0], rtol=1e-4)    # the warmup's rate 0: same weights
    flow.clear_default_session()


@needs_torch
def test_pytorch_schedule_is_the_examples():
    from benchmarks.peers.torch_bert import learning_rate
    scheduler = flow.optimizer.PolynomialScheduler(1e-3, steps=1000, end_learning_rate=0.0, power=1.0,
                                                   warmup=flow.optimizer.warmup.linear(100, 0.0))
    for step in (0, 1, 50, 99, 100, 101, 500, 999, 1000, 1500):
        assert learning_rate(step, total_steps=1000, base_lr=1e-3) == pytest.approx(scheduler.learning_rate(step),
                                                                                   abs=1e-12)
    assert learning_rate(0) == 0.0 and learning_rate(BERT_STEPS // 10) == pytest.approx(1e-3 * 0.9)


@needs_torch
def test_pytorch_decays_what_the_example_decays():
    from benchmarks.peers.torch_bert import _decays, make_model
    names = [n for n, _ in make_model(TINY).named_parameters()]
    kept = sorted(n for n in names if not _decays(n))
    assert all(n.endswith("bias") or "norm" in n for n in kept)
    assert {"word.weight", "position", "layers.0.query.weight", "seq_relationship.weight"} <= {
        n for n in names if _decays(n)}
