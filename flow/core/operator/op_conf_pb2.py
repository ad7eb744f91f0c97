"""`flow.core.operator.op_conf_pb2`: the activation names of OneFlow's op_conf.proto.

OneFlow-Benchmark's VGG and InsightFace's MobileFaceNet import this module to name a layer's
activation (`activation=op_conf_util.kRelu`) and compare it.  flowc has no operator protobufs (its
graph is its own IR), so only the `ActivationType` values are here, with OneFlow's numbers; any other
name fails naming this.

Example:
    import flow.core.operator.op_conf_pb2 as op_conf_util
    if activation == op_conf_util.kRelu:
        output = flow.math.relu(output)
"""
from __future__ import annotations

from typing import NoReturn

kNone = 0      # noqa: N816 - OneFlow's (protobuf's) names
kTanH = 1      # noqa: N816
kSigmoid = 2   # noqa: N816
kRelu = 3      # noqa: N816


def __getattr__(name: str) -> NoReturn:
    raise AttributeError(f"flow.core.operator.op_conf_pb2 has only OneFlow's ActivationType values (kNone, kTanH, "
                         f"kSigmoid, kRelu): flowc builds no operator protobufs, so it has no {name!r}")
