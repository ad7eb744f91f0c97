"""One rank's share of a random draw: `dropout_mask_shard` and `random_uniform_shard`.

`dropout_mask` and `random_uniform` hash (seed, step, element index).  When the data-parallel pass
(compiler/passes/data_parallel.py) splits such a value over the ranks, each rank must draw the
elements of its own share of the logical value, not the first ones again: these ops take the rank
(the runtime scalar `data_parallel_rank`, which each rank feeds with its own) and hash the index
`i + rank * share + first`.  So a data-parallel job draws the very masks of the job on one process.
An even split gives every rank the same `share` and `first` = 0 (one graph for all ranks); a
batch that does not divide over the ranks gives each rank its own graph, with `share` = 0 and
`first` its share's first element.
"""
from __future__ import annotations

import numpy as np

from flowc.compiler.ir import TensorType, numpy_dtype
from flowc.compiler.ops import OPS, OpRule, ShapeError, register
from flowc.compiler.ops.pointwise import dropout_keep, random_units

RANK_SCALAR = "data_parallel_rank"


def _infer(base: str):
    def infer(inputs: list, attrs: dict) -> TensorType:
        step, rank = inputs
        if rank.shape != () or rank.dtype != "int64":
            raise ShapeError(f"{base}_shard: its second input is the int64 rank scalar, got {rank}")
        for key in ("share", "first"):
            if attrs[key] < 0:
                raise ShapeError(f"{base}_shard: {key} must be >= 0, got {attrs[key]}")
        return OPS[base].infer([step], {k: v for k, v in attrs.items() if k not in ("share", "first")})
    return infer


def _dropout_reference(step, rank, shape, dtype, seed, threshold, scale, rate, share, first):
    size = int(np.prod(shape, dtype=np.int64))
    keep = dropout_keep(seed, int(step), size, threshold, int(rank) * share + first).reshape(shape)
    return np.where(keep, scale, 0.0).astype(numpy_dtype(dtype))


def _uniform_reference(step, rank, shape, dtype, seed, share, first):
    size = int(np.prod(shape, dtype=np.int64))
    return random_units(seed, int(step), size, int(rank) * share + first).reshape(shape).astype(numpy_dtype(dtype))


register(OpRule("dropout_mask_shard", "pointwise", _infer("dropout_mask"), _dropout_reference, None,
                c_expr="(flowc::dropout_keep({seed}ULL, (uint64_t){0}, (uint64_t)i + (uint64_t){1} * "
                       "(uint64_t){share} + (uint64_t){first}ULL, {threshold}u) ? ({T}){scale} : ({T})0)",
                differentiable=False))
register(OpRule("random_uniform_shard", "pointwise", _infer("random_uniform"), _uniform_reference, None,
                c_expr="(({T})flowc::random_unit({seed}ULL, (uint64_t){0}, (uint64_t)i + (uint64_t){1} * "
                       "(uint64_t){share} + (uint64_t){first}ULL))", differentiable=False))
