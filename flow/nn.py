"""`flow.nn`: activations, bias, softmax and the cross-entropy loss."""
from __future__ import annotations

from compiler.errors import TraceError
from compiler.trace import Blob, emit, user_location
from flow._ops import along_last_axis, check_blob
from flow.math import relu as _relu


def relu(x, name: str | None = None) -> Blob:
    """`flow.nn.relu(x)`: max(x, 0).

    Example:
        hidden = flow.nn.relu(flow.matmul(x, w, transpose_b=True))
    """
    return _relu(x, name)


def bias_add(value, bias, data_format: str | None = None, name: str | None = None) -> Blob:
    """`flow.nn.bias_add(value, bias, data_format=None)`: add a 1-D bias along the channel axis
    (axis 1, or the last axis for "NHWC"/"channels_last").

    Example:
        y = flow.nn.bias_add(flow.matmul(x, w, transpose_b=True), b)
    """
    api = "flow.nn.bias_add"
    x, b = check_blob(value, api, "value"), check_blob(bias, api, "bias")
    rank = len(x.shape)
    if data_format in (None, "NCHW", "channels_first", "NCW", "NCDHW"):
        axis = 1
    elif data_format in ("NHWC", "channels_last", "NWC", "NDHWC"):
        axis = rank - 1
    else:
        raise TraceError(f"{user_location()}: {api}: unknown data_format {data_format!r}")
    if rank < 2 or len(b.shape) != 1 or b.shape[0] != x.shape[axis]:
        raise TraceError(f"{user_location()}: {api}: bias of shape {list(b.shape)} does not match axis {axis} "
                         f"of value {list(x.shape)}")
    shape = [1] * rank
    shape[axis] = b.shape[0]
    b = emit("reshape", [b], {"shape": tuple(shape)}, api=api)
    return emit("add", [x, b], name=name or "", api=api)


def softmax(logits, axis: int | None = None, name: str | None = None) -> Blob:
    """`flow.nn.softmax(logits, axis=-1)`.

    Example:
        probs = flow.nn.softmax(logits)
    """
    x = check_blob(logits, "flow.nn.softmax", "logits")
    return along_last_axis(x, -1 if axis is None else axis, "flow.nn.softmax",
                           lambda v: emit("softmax", [v], name=name or "", api="flow.nn.softmax"))


def sparse_softmax_cross_entropy_with_logits(labels, logits, name: str | None = None) -> Blob:
    """`flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)`: per-sample loss, shape (N,).

    Example:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    """
    api = "flow.nn.sparse_softmax_cross_entropy_with_logits"
    lab, lg = check_blob(labels, api, "labels"), check_blob(logits, api, "logits")
    return emit("sparse_softmax_cross_entropy", [lg, lab], name=name or "", api=api)
