"""The Wide & Deep train step in PyTorch: benchmarks/workloads.py's model with sparse embedding updates.

The tables are nn.Embedding(sparse=True), so their gradient is a sparse tensor of the batch's rows,
and torch.optim.SparseAdam updates only those rows, m and v included (LazyAdam's rule, as flowc
applies it); the dense layers train with torch.optim.Adam.  Same initialisation ranges as the
example (uniform(-0.05, 0.05) tables, Glorot-uniform weights, zero biases), relu, dropout 0.5 after
each hidden layer, mean sigmoid cross-entropy.  torch_compile compiles the forward pass and loss
(and through AOTAutograd their backward); the optimizer steps stay eager, as for the other models.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.peers import Step
from benchmarks.workloads import (WDL_DEEP_FIELDS, WDL_DENSE_FIELDS, WDL_DIM, WDL_DROPOUT, WDL_HIDDEN,
                                  WDL_LEARNING_RATE, WDL_VOCAB)


class WideAndDeep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Embedding(WDL_VOCAB, 1, sparse=True)
        self.deep = nn.Embedding(WDL_VOCAB, WDL_DIM, sparse=True)
        widths = (WDL_DEEP_FIELDS * WDL_DIM + WDL_DENSE_FIELDS,) + WDL_HIDDEN
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.score = nn.Linear(widths[-1], 1)
        for table in (self.wide, self.deep):
            nn.init.uniform_(table.weight, -0.05, 0.05)
        for layer in [*self.hidden, self.score]:
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, dense: torch.Tensor, wide: torch.Tensor, deep: torch.Tensor) -> torch.Tensor:
        wide_scores = self.wide(wide).sum(dim=1)                           # (B, 1)
        x = torch.cat([self.deep(deep).flatten(1), dense], dim=1)
        for layer in self.hidden:
            x = F.dropout(F.relu(layer(x)), p=WDL_DROPOUT, training=self.training)
        return wide_scores + self.score(x)


def build_train(features: tuple[np.ndarray, np.ndarray, np.ndarray], labels: np.ndarray, compiled: bool) -> Step:
    torch.manual_seed(0)
    model = WideAndDeep()
    model.train()
    tables = [model.wide.weight, model.deep.weight]
    sparse = torch.optim.SparseAdam(tables, lr=WDL_LEARNING_RATE)
    dense = torch.optim.Adam([p for p in model.parameters() if all(p is not t for t in tables)],
                             lr=WDL_LEARNING_RATE)

    def loss_of(d: torch.Tensor, w: torch.Tensor, e: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(model(d, w, e), y)       # mean over the batch
    loss_fn: Callable[..., torch.Tensor] = torch.compile(loss_of) if compiled else loss_of
    dense_fields, wide_ids, deep_ids = features

    def step() -> np.ndarray:
        # nn.Embedding wants int64 ids: the conversion is part of the step, as flowc takes int32
        d, y = torch.from_numpy(dense_fields), torch.from_numpy(labels)
        w, e = torch.from_numpy(wide_ids).long(), torch.from_numpy(deep_ids).long()
        sparse.zero_grad(set_to_none=True)
        dense.zero_grad(set_to_none=True)
        loss = loss_fn(d, w, e, y)
        loss.backward()
        sparse.step()
        dense.step()
        return loss.detach().numpy()
    return step
