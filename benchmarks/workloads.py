"""What every framework runs: the seed models' steps, a ResNet-18-style block, the model zoo's
ResNet-18 train and ResNet-50 predict steps, a Wide & Deep train step and BERT small's train and
predict steps, their FLOP counts, and the batches they all use.

FLOPs count 2 per multiply-add of the GEMMs and convolutions only (the elementwise work, the loss
and the optimizer update are a few percent at most); that is the work a GEMM ceiling bounds, so
GFLOP/s against the measured sgemm ceiling is a fair roofline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

BATCH = 100
CLASSES = 10
LEARNING_RATE = 0.1         # both seeds: SGD, momentum 0, PiecewiseConstantScheduler([], [0.1])
DROPOUT_RATE = 0.5          # the LeNet train seed's dropout after dense1
INIT_STDDEV = 0.1           # flow.truncated_normal(0.1) in both seeds; biases start at 0
SGEMM_SIZE = 2048           # n of the n x n x n product that measures the machine's sgemm ceiling

# The seed LeNet: conv 5x5 SAME (1->32), pool 2, conv 5x5 SAME (32->64), pool 2, dense 3136->512, dense 512->10.
LENET_CONV = ((1, 32, 28), (32, 64, 14))    # (in channels, out channels, output height = width)
LENET_KERNEL = 5
LENET_FLAT = 64 * 7 * 7
MLP_IN, MLP_HIDDEN = 28 * 28, 512

# The ResNet-18-style block (issue 19, the bridge to the model zoo): a stem conv 3x3 (3->64) + batch
# norm + ReLU at 32x32, then a downsampling basic block: conv 3x3 stride 2 (64->128) + BN + ReLU,
# conv 3x3 stride 1 (128->128) + BN, shortcut conv 1x1 stride 2 (64->128) + BN, add, ReLU; global
# average pooling, dense 128->10, mean softmax cross entropy, SGD with momentum 0.9.  Convolutions
# have no bias (batch norm follows each), padding "SAME" (pad 1 for the 3x3, 0 for the 1x1; at
# stride 2 OneFlow's SAME puts the odd row on top, which is PyTorch's padding=1).
RESNET_BATCH = 32
RESNET_HW = 32
RESNET_IN = 3
# (name, in channels, out channels, kernel, stride, output height = width, needs the input gradient)
RESNET_CONVS = (("stem", RESNET_IN, 64, 3, 1, 32, False),
                ("conv1", 64, 128, 3, 2, 16, True),
                ("conv2", 128, 128, 3, 1, 16, True),
                ("shortcut", 64, 128, 1, 2, 16, True))
RESNET_FEATURES = 128
RESNET_LEARNING_RATE = 0.05
RESNET_MOMENTUM = 0.9       # SGD momentum (OneFlow's and PyTorch's updates agree for a constant rate)
BN_MOMENTUM = 0.9           # OneFlow's convention: moving = 0.9 * moving + 0.1 * batch (PyTorch: momentum=0.1)
BN_EPSILON = 1e-5

# Wide & Deep (issue 15): examples/models/wide_and_deep.py's "large" config.  A wide (vocab, 1) and a
# deep (vocab, 16) table of 10^6 rows each, gathered at 2 wide and 26 deep sparse fields per example;
# the deep rows flattened and concatenated with 13 dense fields feed a relu MLP 1024-1024-1024 with
# dropout 0.5 and a dense layer to one score; score = wide sum + deep score; mean sigmoid
# cross-entropy; LazyAdam (lr 1e-3; PyTorch: SparseAdam on the tables, Adam on the rest), whose
# embedding update touches only the batch's rows.  Ids are skewed (Zipf), as click logs are.
WDL_BATCH = 512
WDL_VOCAB = 1_000_000
WDL_DIM = 16
WDL_DENSE_FIELDS, WDL_WIDE_FIELDS, WDL_DEEP_FIELDS = 13, 2, 26
WDL_HIDDEN = (1024, 1024, 1024)
WDL_DROPOUT = 0.5
WDL_LEARNING_RATE = 1e-3


# The model zoo's ResNets (issue 15): examples/models/resnet.py's "resnet18" (32x32, batch 32, train)
# and "resnet50" (v1.5, 224x224, predict at batch 1) configs, stated here so that every framework
# builds the same network (benchmarks/peers/flowc_resnet_models.py checks the example agrees).  A
# 7x7 stride-2 stem + BN + ReLU, a 3x3 stride-2 max pool, four stages of basic (3x3, 3x3) or
# bottleneck (1x1, 3x3 with the stride, 1x1) blocks with a 1x1 projection shortcut where the stride
# or width changes, global average pooling, a dense classifier; convolutions without bias, "SAME"
# padding; He-normal weights, the last BN of each branch starting at gamma 0.  Training: softmax
# cross-entropy against labels smoothed by 0.1, L2 weight decay 1/32768 on every variable, momentum
# SGD with a linear warmup then cosine decay over RESNET_ZOO_STEPS.
@dataclass(frozen=True)
class ResNetShape:
    """The shape and training settings of one zoo ResNet; the field names are ResNetConfig's."""
    block: str                            # "basic" or "bottleneck"
    block_counts: tuple[int, ...]
    block_filters: tuple[int, ...]
    block_filters_inner: tuple[int, ...]  # bottleneck width (basic blocks: unused)
    stem_filters: int
    image_size: int
    batch_size: int
    num_classes: int
    label_smoothing: float = 0.1
    weight_decay: float = 1.0 / 32768
    learning_rate: float = 0.256
    momentum: float = 0.875


RESNET_ZOO: dict[str, ResNetShape] = {
    "resnet18": ResNetShape("basic", (2, 2, 2, 2), (64, 128, 256, 512), (64, 128, 256, 512), 64, 32, 32, 10,
                            learning_rate=0.1),
    "resnet50": ResNetShape("bottleneck", (3, 4, 6, 3), (256, 512, 1024, 2048), (64, 128, 256, 512), 64, 224, 1,
                            1000),
}
RESNET_ZOO_STEPS = 10_000          # the schedule's length; the warmup is its first tenth
RESNET_ZOO_IN = 3


def resnet_zoo_convs(shape: ResNetShape) -> list[tuple[int, int, int, int, int, bool]]:
    """Every convolution of `shape` in the order the network runs them, as (in channels, out
    channels, kernel, stride, output height = width, needs the input gradient); "SAME" padding
    makes each output ceil(input / stride).

    Example:
        resnet_zoo_convs(RESNET_ZOO["resnet18"])[0]  == (3, 64, 7, 2, 16, False)     # the stem
    """
    hw = math.ceil(shape.image_size / 2)
    convs = [(RESNET_ZOO_IN, shape.stem_filters, 7, 2, hw, False)]
    hw, c = math.ceil(hw / 2), shape.stem_filters             # the 3x3 stride-2 max pool
    for i, (count, filters, inner) in enumerate(zip(shape.block_counts, shape.block_filters,
                                                    shape.block_filters_inner)):
        for j in range(count):
            stride = 2 if i > 0 and j == 0 else 1
            out = math.ceil(hw / stride)
            if shape.block == "bottleneck":               # v1.5: the stride on the 3x3
                convs += [(c, inner, 1, 1, hw, True), (inner, inner, 3, stride, out, True),
                          (inner, filters, 1, 1, out, True)]
            else:
                convs += [(c, filters, 3, stride, out, True), (filters, filters, 3, 1, out, True)]
            if stride != 1 or c != filters:
                convs.append((c, filters, 1, stride, out, True))
            c, hw = filters, out
    return convs


def resnet_zoo_flops(shape: ResNetShape, mode: str) -> int:
    """The convolutions and the dense classifier of `shape` at its batch size (the stem's input is data)."""
    b = shape.batch_size
    total = sum(conv_flops(b, c_in, c_out, hw, kernel, mode, grad)
                for c_in, c_out, kernel, _, hw, grad in resnet_zoo_convs(shape))
    return total + dense_flops(b, shape.block_filters[-1], shape.num_classes, mode, needs_input_grad=True)


# BERT small (issue 15): examples/models/bert.py's "small" config, pretraining (masked LM + next
# sentence) on the example's synthetic batch (its `synthetic_batch`, seed 0).  Embeddings (word,
# token-type, position) + layer_norm + dropout 0.1; 4 encoder layers of 4 heads (Q/K/V dense, scores
# Q K^T / sqrt(d) + the additive mask, softmax, dropout, P V, output dense, residual + layer_norm, gelu
# FFN 256 -> 1024 -> 256, residual + layer_norm); the masked-LM head (20 positions per sequence, dense +
# gelu + layer_norm, logits against the word table (tied), weighted cross-entropy) and the next-sentence
# head.  Train: AdamW (lr 1e-3, epsilon 1e-6, weight decay 0.01 except biases and layer norms), the
# rate a linear warmup from 0 over the first tenth of BERT_STEPS then polynomial (power 1) decay to 0,
# global-norm clipping at 1.  Predict: both heads' logits to host (dropout off).
@dataclass(frozen=True)
class BertShape:
    """The sizes of one BERT; the field names are examples/models/bert.py's BertConfig's."""
    vocab_size: int
    seq_length: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    batch_size: int
    max_predictions_per_seq: int = 20
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1


BERT_ZOO: dict[str, BertShape] = {
    "bert_small": BertShape(vocab_size=30522, seq_length=128, hidden_size=256, num_hidden_layers=4,
                            num_attention_heads=4, intermediate_size=1024, batch_size=8),
}
BERT_STEPS = 10_000                # the schedule's length; the warmup is its first tenth
BERT_LEARNING_RATE = 1e-3
BERT_WEIGHT_DECAY = 0.01
BERT_EPSILON = 1e-6                # AdamW's
BERT_CLIP_NORM = 1.0


def bert_flops(shape: BertShape, mode: str) -> int:
    """The dense layers, the attention's two batched products and the heads of `shape` at its batch.
    In training every product also has both gradients: each layer's input descends from the trainable
    embeddings, and the masked-LM logits' right side is the (tied) word table.

    Example:
        bert_flops(BERT_ZOO["bert_small"], "predict") / 1e9      # about 9.5
    """
    b, s, h = shape.batch_size, shape.seq_length, shape.hidden_size
    rows, picked = b * s, b * shape.max_predictions_per_seq
    size = h // shape.num_attention_heads
    per_layer = (4 * dense_flops(rows, h, h, mode, needs_input_grad=True)           # Q, K, V, attention output
                 + dense_flops(rows, h, shape.intermediate_size, mode, needs_input_grad=True)
                 + dense_flops(rows, shape.intermediate_size, h, mode, needs_input_grad=True)
                 # scores (S x size x S) and context (S x S x size) per head, both sides trainable
                 + 2 * b * shape.num_attention_heads * dense_flops(s, size, s, mode, needs_input_grad=True))
    heads = (dense_flops(picked, h, h, mode, needs_input_grad=True)                # the MLM transform
             + dense_flops(picked, h, shape.vocab_size, mode, needs_input_grad=True)  # logits vs the word table
             + dense_flops(b, h, h, mode, needs_input_grad=True)                   # the pooler
             + dense_flops(b, h, 2, mode, needs_input_grad=True))                  # next sentence
    return shape.num_hidden_layers * per_layer + heads


@dataclass(frozen=True)
class Workload:
    name: str      # e.g. "mlp_train"; the key every framework module and the report use
    model: str     # "mlp", "lenet", "resnet_block", "wide_and_deep", a RESNET_ZOO or a BERT_ZOO key
    mode: str      # "train" (forward, backward, SGD update, loss to host) or "predict" (logits to host)
    gflop: float   # per step
    batch: int = BATCH

    @property
    def title(self) -> str:
        return f"{MODEL_TITLES.get(self.model, self.model)} {self.mode}"


MODEL_TITLES = {"mlp": "MLP", "lenet": "LeNet", "resnet_block": "ResNet block", "wide_and_deep": "Wide&Deep",
                "resnet18": "ResNet-18", "resnet50": "ResNet-50", "bert_small": "BERT small"}


def gemm_flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def dense_flops(batch: int, n_in: int, n_out: int, mode: str, needs_input_grad: bool) -> int:
    """Forward product; in training also the weight gradient and (unless the input is data) the input gradient."""
    one = gemm_flops(batch, n_out, n_in)
    if mode == "predict":
        return one
    return one * (3 if needs_input_grad else 2)


def conv_flops(batch: int, c_in: int, c_out: int, out_hw: int, kernel: int, mode: str, needs_input_grad: bool) -> int:
    one = 2 * batch * c_out * out_hw * out_hw * c_in * kernel * kernel
    if mode == "predict":
        return one
    return one * (3 if needs_input_grad else 2)


def mlp_flops(mode: str, batch: int = BATCH) -> int:
    return (dense_flops(batch, MLP_IN, MLP_HIDDEN, mode, needs_input_grad=False)
            + dense_flops(batch, MLP_HIDDEN, CLASSES, mode, needs_input_grad=True))


def lenet_flops(mode: str, batch: int = BATCH) -> int:
    total = 0
    for i, (c_in, c_out, hw) in enumerate(LENET_CONV):
        total += conv_flops(batch, c_in, c_out, hw, LENET_KERNEL, mode, needs_input_grad=i > 0)
    total += dense_flops(batch, LENET_FLAT, 512, mode, needs_input_grad=True)
    total += dense_flops(batch, 512, CLASSES, mode, needs_input_grad=True)
    return total


def resnet_block_flops(mode: str, batch: int = RESNET_BATCH) -> int:
    """The four convolutions and the dense layer; batch norm, pooling and the update are elementwise."""
    total = 0
    for _, c_in, c_out, kernel, _, out_hw, needs_input_grad in RESNET_CONVS:
        total += conv_flops(batch, c_in, c_out, out_hw, kernel, mode, needs_input_grad)
    return total + dense_flops(batch, RESNET_FEATURES, CLASSES, mode, needs_input_grad=True)


def wide_and_deep_flops(mode: str, batch: int = WDL_BATCH) -> int:
    """The MLP's dense layers; the gathers, the embedding gradient and its update are row copies."""
    widths = (WDL_DEEP_FIELDS * WDL_DIM + WDL_DENSE_FIELDS,) + WDL_HIDDEN + (1,)
    # the first layer's input gradient flows back to the deep embedding rows
    return sum(dense_flops(batch, n_in, n_out, mode, needs_input_grad=True)
               for n_in, n_out in zip(widths, widths[1:]))


_FLOPS = {"mlp": mlp_flops, "lenet": lenet_flops, "resnet_block": resnet_block_flops,
          "wide_and_deep": wide_and_deep_flops,
          **{name: (lambda mode, shape=shape: resnet_zoo_flops(shape, mode)) for name, shape in RESNET_ZOO.items()},
          **{name: (lambda mode, shape=shape: bert_flops(shape, mode)) for name, shape in BERT_ZOO.items()}}
_BATCHES = {"resnet_block": RESNET_BATCH, "wide_and_deep": WDL_BATCH,
            **{name: shape.batch_size for name, shape in RESNET_ZOO.items()},
            **{name: shape.batch_size for name, shape in BERT_ZOO.items()}}


def _workload(model: str, mode: str) -> Workload:
    return Workload(f"{model}_{mode}", model, mode, _FLOPS[model](mode) / 1e9, _BATCHES.get(model, BATCH))


STEP_WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    _workload("mlp", "train"), _workload("mlp", "predict"),
    _workload("lenet", "train"), _workload("lenet", "predict"),
    _workload("resnet_block", "train"), _workload("resnet_block", "predict"),
    _workload("wide_and_deep", "train"),
    _workload("resnet18", "train"), _workload("resnet50", "predict"),
    _workload("bert_small", "train"), _workload("bert_small", "predict"))}

# First-call latency is measured on the seeds' train jobs: the zoo's ResNets are left out (a cold
# torch.compile of ResNet-50 takes minutes on 2 cores; their compile times are the models' figures).
LATENCY_WORKLOADS = ("mlp_train", "lenet_train")
# Per-call overhead (call time minus the time inside the kernels): the MLP predict step is the shortest.
OVERHEAD_WORKLOADS = ("mlp_predict",)
# Async vs sync with host work: the MLP train step is short enough for the overlap to matter.
ASYNC_WORKLOADS = ("mlp_train",)


def sgemm_gflop(n: int = SGEMM_SIZE) -> float:
    return gemm_flops(n, n, n) / 1e9


@lru_cache(maxsize=1)
def batch() -> tuple[np.ndarray, np.ndarray]:
    """The first batch of the embedded MNIST sample: images float32 (100, 1, 28, 28) in [0, 1], labels int32.

    Every framework gets the same arrays; each step takes them as NumPy arrays and hands its
    results back as NumPy arrays, as a flowc job call does.
    """
    from flowc.runtime.datasets import load_mnist_sample     # NumPy only: safe in every framework's process
    (images, labels), _ = load_mnist_sample(BATCH)
    first_images = np.ascontiguousarray(images[0], dtype=np.float32)
    first_labels = np.ascontiguousarray(labels[0], dtype=np.int32)
    return first_images, first_labels


@lru_cache(maxsize=1)
def resnet_batch() -> tuple[np.ndarray, np.ndarray]:
    """The ResNet block's batch: float32 (32, 3, 32, 32) images (standard normal, like normalized
    CIFAR-10 pixels) and int32 labels in [0, 10), from a fixed seed."""
    rng = np.random.default_rng(19)
    images = rng.standard_normal((RESNET_BATCH, RESNET_IN, RESNET_HW, RESNET_HW), dtype=np.float32)
    labels = rng.integers(0, CLASSES, RESNET_BATCH).astype(np.int32)
    return images, labels


@lru_cache(maxsize=1)
def wide_and_deep_batch() -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """The Wide & Deep batch: ((dense float32 (512, 13), wide ids int32 (512, 2), deep ids int32
    (512, 26)), click labels float32 (512, 1)), from a fixed seed; ids Zipf-skewed in [0, 10^6)."""
    rng = np.random.default_rng(15)
    dense = rng.standard_normal((WDL_BATCH, WDL_DENSE_FIELDS)).astype(np.float32)
    wide = (rng.zipf(1.3, (WDL_BATCH, WDL_WIDE_FIELDS)) % WDL_VOCAB).astype(np.int32)
    deep = (rng.zipf(1.3, (WDL_BATCH, WDL_DEEP_FIELDS)) % WDL_VOCAB).astype(np.int32)
    labels = (np.sin(wide.sum(1) * 0.7) + np.cos(deep.sum(1) * 0.3) + dense[:, 0] > 0).astype(np.float32)
    return (dense, wide, deep), labels.reshape(WDL_BATCH, 1)


@lru_cache(maxsize=len(RESNET_ZOO))
def resnet_zoo_batch(model: str) -> tuple[np.ndarray, np.ndarray]:
    """The batch of zoo ResNet `model` ("resnet18", "resnet50"): standard-normal float32 NCHW images
    at its size and batch, int32 labels below its class count, from a fixed seed."""
    shape = RESNET_ZOO[model]
    rng = np.random.default_rng(15)
    s = shape.image_size
    images = rng.standard_normal((shape.batch_size, RESNET_ZOO_IN, s, s), dtype=np.float32)
    labels = rng.integers(0, shape.num_classes, shape.batch_size).astype(np.int32)
    return images, labels


@lru_cache(maxsize=len(BERT_ZOO))
def bert_batch(model: str) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The batch of BERT `model` ("bert_small"), made by examples/models/bert.py's own
    `synthetic_batch` (NumPy only) at the workload's sizes, seed 0: ((input_ids, input_mask,
    token_type_ids, masked_lm_positions) int32 (B, S) / (B, P), (masked_lm_ids int32 (B, P),
    masked_lm_weights float32 (B, P), next_sentence_labels int32 (B,))).

    Example:
        (ids, mask, types, positions), (lm_ids, lm_weights, ns_labels) = bert_batch("bert_small")
    """
    from benchmarks.peers.flowc_bert import example_module, shape_config    # imports flow, not its runtime
    arrays = example_module().synthetic_batch(shape_config(BERT_ZOO[model]), seed=0)
    return tuple(arrays[:4]), tuple(arrays[4:])


def batch_for(workload: str) -> tuple:
    """The (images, labels) every framework's step of `workload` takes; for Wide & Deep, the
    "images" are the (dense, wide ids, deep ids) features; for BERT, (the four input arrays, the
    three target arrays) (`bert_batch`)."""
    model = STEP_WORKLOADS[workload].model
    if model in BERT_ZOO:
        return bert_batch(model)
    if model == "wide_and_deep":
        return wide_and_deep_batch()
    if model in RESNET_ZOO:
        return resnet_zoo_batch(model)
    return resnet_batch() if model == "resnet_block" else batch()
