"""The model zoo's models in PyTorch (eager), layer for layer, for `memory.py`'s side-by-side figures.

Same sizes as the flowc models (they take the same config objects) and the same optimizers:

* BERT (`bert.py`): embeddings + layer norm + dropout, encoder layers with the additive mask, gelu
  feed-forward, the masked-LM head tied to the word table and the next-sentence head; AdamW (weight
  decay 0.01 except biases and layer norms) with global-norm clipping at 1;
* Wide & Deep (`wide_and_deep.py`): wide (vocab, 1) and deep (vocab, dim) tables, relu MLP with
  dropout, sigmoid cross-entropy; Adam (PyTorch's dense Adam: its nearest to LazyAdam that takes the
  tables' dense gradients, as flowc's does today);
* DCGAN (`dcgan.py`): the same generator and discriminator; one discriminator and one generator Adam
  step per train step;
* ResNet-18 / ResNet-50 v1.5 (`resnet.py`, NCHW): benchmarks/peers/torch_resnet.py's network and train
  step (momentum SGD with the cosine schedule, label smoothing), imported from there, not copied.

`compiled=True` wraps the networks (forward and loss; their backward through AOTAutograd) in
`torch.compile`, the optimizer steps staying eager, as the benchmark's torch.compile peers do.

    step = train_step("bert", bert.CONFIGS["small"])
    step()          # one train step on synthetic data
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------------------------- BERT

class BertLayer(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        h = c.hidden_size
        self.query, self.key, self.value, self.attn_out = (nn.Linear(h, h) for _ in range(4))
        self.attn_norm, self.out_norm = nn.LayerNorm(h, eps=1e-5), nn.LayerNorm(h, eps=1e-5)
        self.inter, self.out = nn.Linear(h, c.intermediate_size), nn.Linear(c.intermediate_size, h)
        self.heads, self.size = c.num_attention_heads, h // c.num_attention_heads
        self.drop_h, self.drop_a = nn.Dropout(c.hidden_dropout_prob), nn.Dropout(c.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape

        def split(t):
            return t.view(b, s, self.heads, self.size).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        probs = self.drop_a(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.size) + bias, dim=-1))
        context = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = self.attn_norm(self.drop_h(self.attn_out(context)) + x)
        return self.out_norm(self.drop_h(self.out(F.gelu(self.inter(x)))) + x)


class Bert(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        h = c.hidden_size
        self.c = c
        self.word = nn.Embedding(c.vocab_size, h)
        self.token_type = nn.Embedding(c.type_vocab_size, h)
        self.position = nn.Parameter(torch.randn(1, c.max_position_embeddings, h) * c.initializer_range)
        self.emb_norm, self.emb_drop = nn.LayerNorm(h, eps=1e-5), nn.Dropout(c.hidden_dropout_prob)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))
        self.transform, self.transform_norm = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-5)
        self.output_bias = nn.Parameter(torch.ones(c.vocab_size))
        self.pooler, self.seq_relationship = nn.Linear(h, h), nn.Linear(h, 2)
        for m in self.modules():             # bert.py's initializers: N(0, 0.02) (truncated there), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight, std=c.initializer_range, a=-2 * c.initializer_range,
                                      b=2 * c.initializer_range)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def logits(self, ids, mask, types, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked-LM logits (B * P, vocab), next-sentence logits (B, 2)): what bert.py's predict job returns."""
        s = self.c.seq_length
        x = self.word(ids) + self.token_type(types) + self.position[:, :s]
        x = self.emb_drop(self.emb_norm(x))
        bias = ((mask[:, None, None, :].float() - 1.0) * 10000.0)
        for layer in self.layers:
            x = layer(x, bias)
        picked = torch.gather(x, 1, positions.long()[:, :, None].expand(-1, -1, x.shape[-1]))
        picked = self.transform_norm(F.gelu(self.transform(picked.reshape(-1, x.shape[-1]))))
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return picked @ self.word.weight.t() + self.output_bias, self.seq_relationship(pooled)

    def forward(self, ids, mask, types, positions, lm_ids, lm_weights, ns_labels) -> torch.Tensor:
        logits, ns_logits = self.logits(ids, mask, types, positions)
        per_position = F.cross_entropy(logits, lm_ids.long().reshape(-1), reduction="none")
        per_position = per_position.view(-1, self.c.max_predictions_per_seq)
        lm_loss = (per_position * lm_weights).sum(-1) / (lm_weights.sum(-1).mean() + 1e-5)
        ns_loss = F.cross_entropy(ns_logits, ns_labels.long())
        return lm_loss.mean() + ns_loss


def _compiled(module: nn.Module, compiled: bool) -> Callable:
    """`module` itself, or torch.compile's wrapper of it (which shares its parameters)."""
    return torch.compile(module) if compiled else module


def _bert_step(config, compiled: bool) -> Callable[[], float]:
    import bert
    model = Bert(config).train()
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "norm" in n)]
    keep = [p for n, p in model.named_parameters() if "bias" in n or "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": keep, "weight_decay": 0.0}],
                            lr=1e-4, eps=1e-6)
    batch = [torch.from_numpy(a) for a in bert.synthetic_batch(config)]
    return _step(model, _compiled(model, compiled), opt, batch, clip=1.0)


# ---------------------------------------------------------------------------------------- Wide & Deep

class WideDeep(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        self.wide = nn.Embedding(c.wide_vocab_size, 1)
        self.deep = nn.Embedding(c.deep_vocab_size, c.deep_embedding_vec_size)
        sizes = [c.num_deep_sparse_fields * c.deep_embedding_vec_size + c.num_dense_fields, *c.hidden_units]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.out, self.drop = nn.Linear(sizes[-1], 1), nn.Dropout(c.deep_dropout_rate)

    def forward(self, labels, dense, wide, deep) -> torch.Tensor:
        x = torch.cat([self.deep(deep.long()).flatten(1), dense], dim=1)
        for layer in self.hidden:
            x = self.drop(F.relu(layer(x)))
        logits = self.wide(wide.long()).flatten(1).sum(1, keepdim=True) + self.out(x)
        return F.binary_cross_entropy_with_logits(logits, labels)


def _wide_and_deep_step(config, compiled: bool) -> Callable[[], float]:
    import wide_and_deep
    model = WideDeep(config).train()
    opt = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    batch = [torch.from_numpy(a) for a in wide_and_deep.synthetic_batch(config)]
    return _step(model, _compiled(model, compiled), opt, batch)


# --------------------------------------------------------------------------------------------- DCGAN

class Generator(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        c0, c1, c2 = c.generator_channels
        self.s, self.c0 = c.image_size // 4, c0
        self.fc = nn.Linear(c.z_dim, c0 * self.s * self.s, bias=False)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(c0 * self.s * self.s), nn.BatchNorm2d(c1), nn.BatchNorm2d(c2)
        # "SAME" transposed convolutions with a 5x5 kernel: padding 2, and one extra row/column at stride 2
        self.deconv1 = nn.ConvTranspose2d(c0, c1, 5, 1, padding=2, bias=False)
        self.deconv2 = nn.ConvTranspose2d(c1, c2, 5, 2, padding=2, output_padding=1, bias=False)
        self.deconv3 = nn.ConvTranspose2d(c2, c.channels, 5, 2, padding=2, output_padding=1, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.fc(z))).view(-1, self.c0, self.s, self.s)
        h = F.relu(self.bn2(self.deconv1(h)))
        h = F.relu(self.bn3(self.deconv2(h)))
        return torch.tanh(self.deconv3(h))


class Discriminator(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        d1, d2 = c.discriminator_channels
        self.conv1 = nn.Conv2d(c.channels, d1, 5, 2, padding=2)
        self.conv2 = nn.Conv2d(d1, d2, 5, 2, padding=2)
        self.fc = nn.Linear(d2 * (c.image_size // 4) ** 2, 1)
        self.alpha, self.drop = c.leaky_alpha, nn.Dropout(c.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(F.leaky_relu(self.conv1(x), self.alpha))
        x = self.drop(F.leaky_relu(self.conv2(x), self.alpha))
        return self.fc(x.flatten(1))


def _dcgan_step(config, compiled: bool) -> Callable[[], float]:
    import dcgan
    g_module, d_module = Generator(config).train(), Discriminator(config).train()
    g, d = _compiled(g_module, compiled), _compiled(d_module, compiled)
    g_opt = torch.optim.Adam(g_module.parameters(), lr=config.learning_rate, betas=(config.beta1, 0.999))
    d_opt = torch.optim.Adam(d_module.parameters(), lr=config.learning_rate, betas=(config.beta1, 0.999))
    z, images = (torch.from_numpy(a) for a in dcgan.synthetic_batch(config))

    def step() -> float:
        with torch.no_grad():                   # the D job's generator is not trained (OneFlow: trainable=False)
            g_module.eval()
            fakes = g(z)
        g_module.train()
        fake_logits, real_logits = d(fakes), d(images)
        d_loss = (F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))
                  + F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits)))
        d_opt.zero_grad(set_to_none=True)
        d_loss.backward()
        d_opt.step()
        logits = d(g(z))
        g_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        g_opt.zero_grad(set_to_none=True)
        g_loss.backward()                       # D's parameters get gradients here but are not stepped
        g_opt.step()
        return d_loss.item() + g_loss.item()
    return step


# -------------------------------------------------------------------------------------------- ResNet

def _resnet_step(config, compiled: bool) -> Callable[[], float]:
    """benchmarks/peers/torch_resnet.py's train step at the sizes of resnet.py's `config` (NCHW)."""
    import resnet
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if repo not in sys.path:          # run as a script from examples/models/: the benchmarks package's root
        sys.path.insert(0, repo)
    from benchmarks.peers.torch_resnet import build_train
    from benchmarks.workloads import ResNetShape
    if resnet.channels_last(config):
        raise ValueError(f"config.data_format: the PyTorch ResNet is NCHW only, got {config.data_format!r}")
    # resnet.py's ResNetConfig has every field of ResNetShape under the same name (and data_format)
    shape = ResNetShape(**{f.name: getattr(config, f.name) for f in dataclasses.fields(ResNetShape)})
    images, labels = resnet.synthetic_batch(config)
    step = build_train(shape, images, labels, compiled=compiled)
    return lambda: float(step())


# --------------------------------------------------------------------------------------------- shared

def _step(model: nn.Module, forward: Callable, opt: torch.optim.Optimizer, batch: list,
          clip: float | None = None) -> Callable[[], float]:
    def step() -> float:
        loss = forward(*batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss.item()
    return step


STEPS = {"bert": _bert_step, "wide_and_deep": _wide_and_deep_step, "dcgan": _dcgan_step, "resnet": _resnet_step}


def train_step(model: str, config, compiled: bool = False) -> Callable[[], float]:
    """A no-argument train step of `model` ("bert", "wide_and_deep", "dcgan", "resnet") at `config`'s
    sizes, on one synthetic batch made by the flowc model's `synthetic_batch`; `compiled`: the networks
    run under torch.compile (the first step compiles them).

    Example:
        step = train_step("dcgan", dcgan.CONFIGS["tiny"]); loss = step()
    """
    if model not in STEPS:
        raise ValueError(f"model: expected one of {sorted(STEPS)}, got {model!r}")
    torch.manual_seed(0)
    np.random.seed(0)
    return STEPS[model](config, compiled)
