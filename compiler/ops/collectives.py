"""`all_reduce`: a gradient summed over every rank of a data-parallel job, times `scale`.

compiler/passes/data_parallel.py puts one after each trainable variable's gradient when a job runs
on several ranks; `scale` is 1/ranks where the logical loss is a mean over the global batch (each
rank's gradient is then the mean over its shard) and 1 where it is a sum.  The generated step
starts the sums in buckets as soon as their gradients exist and waits for them before the
updates (compiler/codegen/collectives.py), at most `bucket_bytes` per bucket; the MPI or NCCL
engine does the work.

The NumPy reference executor runs one process and has no other ranks to sum with: it refuses the
op (tests compare a distributed run with the single-process run of the same global batch).
"""
from __future__ import annotations

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _infer(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    if x.dtype != "float32":
        raise ShapeError(f"all_reduce: flowc sums float32 gradients over ranks, got {x.dtype}")
    ranks = attrs["ranks"]
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ShapeError(f"all_reduce: ranks must be an int >= 2, got {ranks!r}")
    return TensorType(x.shape, x.dtype)


def _reference(x, ranks, scale, bucket_bytes):
    raise NotImplementedError("all_reduce sums a value over the ranks of a distributed job; the NumPy reference "
                              "executor runs one process: compare with the job's single-process run instead")


register(OpRule("all_reduce", "collective", _infer, _reference, differentiable=False))
