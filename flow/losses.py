"""`flow.losses.add_loss`: the old way to name a train job's loss (with `config.train.*`)."""
from __future__ import annotations

from flowc.compiler.errors import TraceError
from flowc.compiler.optimizers import check_loss
from flowc.compiler.trace import Blob, current, user_location


def add_loss(loss: Blob) -> None:
    """Mark `loss` as the train job's loss; the update rule comes from `config.train.model_update_conf`.

    Example:
        flow.losses.add_loss(loss)
    """
    ctx = current("flow.losses.add_loss")
    if not isinstance(loss, Blob):
        raise TraceError(f"{user_location()}: flow.losses.add_loss: expected a Blob, got {type(loss).__name__}")
    check_loss(loss, "flow.losses.add_loss", user_location())
    ctx.losses.append(loss)
