"""`device_copy`: a value moved between two devices (the host and an accelerator).

The placement pass (compiler/passes/placement.py) inserts one wherever a value computed on one
device is read by an op placed on the other, so `flowc show` and the IR dumps say where a job
crosses devices.  It is a view: on a backend that runs the whole step on one device (the CPU
fallback, or the CUDA backend, which runs every kernel of a step on the GPU) it shares its
input's buffer and costs nothing; a split runtime would copy at that point instead.
"""
from __future__ import annotations

from flowc.compiler.backends import device_names
from flowc.compiler.ir import TensorType
from flowc.compiler.ops import OpRule, ShapeError, register


def _infer(inputs: list, attrs: dict) -> TensorType:
    (x,) = inputs
    src, dst = attrs["src"], attrs["dst"]
    devices = device_names()
    if src not in devices or dst not in devices or src == dst:
        raise ShapeError(f"device_copy: copies between two of {devices}, got {src!r} -> {dst!r}")
    return TensorType(x.shape, x.dtype)


def _grad(e, node, dy):
    # The gradient goes back the way the value came.
    return [e.op("device_copy", dy, src=node.attr("dst"), dst=node.attr("src"))]


register(OpRule("device_copy", "view", _infer, lambda x, src, dst: x, _grad))
