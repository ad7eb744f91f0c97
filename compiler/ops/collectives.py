"""The collectives of a distributed job: sums and exchanges of values between its ranks.

compiler/passes/data_parallel.py inserts them where a value's layout over the ranks must change
(OneFlow's "boxing"):

* `all_reduce` (partial sum -> whole): a gradient summed over every rank, times `scale` (1/ranks
  in the mirrored view, where each rank's loss is the mean over its own batch).  The generated
  step starts the sums in buckets as soon as their gradients exist and waits for them before the
  updates (compiler/codegen/collectives.py), at most `bucket_bytes` per bucket.
* `all_gather` (split along axis 0 -> whole): every rank's share, in rank order.
* `reduce_scatter` (partial sum -> split along axis 0): each rank gets its share of the sum.
* `all_to_all`: axis 0 holds `ranks` equal blocks; block r goes to rank r, and block s of the
  result came from rank s.  With reshapes and transposes around it, it turns a value split by
  rows into one split by columns and back (a model-parallel layer's activations).

Every collective takes float32, float64, int32 or int64 values and moves or sums them in their own
type (a float64 model's gradients and model-parallel layers; an integer count over the batch that
the step reads on; a sparse update's int64 indices, compiler/passes/data_parallel.py), as OneFlow
does; an integer sum is never scaled.  The MPI or NCCL
engine does the work.  The NumPy reference
executor runs one process and has no other ranks: it refuses them (tests compare a distributed run
with the single-process run of the same global batch, or run the ranks' graphs in lock-step:
tests/rank_simulator.py).
"""
from __future__ import annotations

from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


# The dtypes the engines move and sum (compiler/codegen/collectives.py COMM_TYPES names their codes).
COMM_DTYPES = ("float32", "float64", "int32", "int64")
_MOVES = ("all_gather", "all_to_all")


def _checked(op: str, x: TensorType, attrs: dict) -> int:
    if x.dtype not in COMM_DTYPES:
        what = "moves" if op in _MOVES else "sums"
        raise ShapeError(f"{op}: flowc {what} {' or '.join(COMM_DTYPES)} values between ranks, got {x.dtype}")
    ranks = attrs["ranks"]
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ShapeError(f"{op}: ranks must be an int >= 2, got {ranks!r}")
    return ranks


def _infer_all_reduce(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    _checked("all_reduce", x, attrs)
    if x.dtype.startswith("int") and attrs.get("scale", 1.0) != 1.0:
        raise ShapeError(f"all_reduce: an {x.dtype} sum cannot be scaled by {attrs['scale']} (a mean of integers)")
    return TensorType(x.shape, x.dtype)


def _infer_all_gather(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    ranks = _checked("all_gather", x, attrs)
    if not x.shape:
        raise ShapeError("all_gather: a scalar has no axis 0 to gather along")
    return TensorType((x.shape[0] * ranks,) + x.shape[1:], x.dtype)


def _infer_reduce_scatter(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    ranks = _checked("reduce_scatter", x, attrs)
    if not x.shape or x.shape[0] % ranks:
        raise ShapeError(f"reduce_scatter: axis 0 of {list(x.shape)} does not divide over {ranks} ranks")
    return TensorType((x.shape[0] // ranks,) + x.shape[1:], x.dtype)


def _infer_all_to_all(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    ranks = _checked("all_to_all", x, attrs)
    if not x.shape or x.shape[0] != ranks:
        raise ShapeError(f"all_to_all: axis 0 of {list(x.shape)} must hold one block per rank ({ranks})")
    return TensorType(x.shape, x.dtype)


def _no_reference(op: str):
    def reference(x, **attrs):
        raise NotImplementedError(f"{op} moves values between the ranks of a distributed job; the NumPy reference "
                                  "executor runs one process: compare with the job's single-process run instead")
    return reference


for _name, _infer in (("all_reduce", _infer_all_reduce), ("all_gather", _infer_all_gather),
                      ("reduce_scatter", _infer_reduce_scatter), ("all_to_all", _infer_all_to_all)):
    register(OpRule(_name, "collective", _infer, _no_reference(_name), differentiable=False))
