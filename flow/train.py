"""`flow.train`: OneFlow's `CheckPoint` object (the v0.3 way of initializing, saving and loading).

Example:
    check_point = flow.train.CheckPoint()
    check_point.init()                      # or check_point.load("./lenet_models_1")
    for epoch in range(20): ...             # train
    check_point.save("./lenet_models_1")    # a new folder
"""
from __future__ import annotations

from flowc.runtime import checkpoint as _impl
from flowc.runtime.session import default_session
from flow.checkpoint_manager import SimpleCheckPointManager  # noqa: F401 - OneFlow has it under flow.train


class CheckPoint:
    """Initialize, save and load the variables of the default session.

    `init()`, `save()` and `load()` may come before the first job call, as in OneFlow programs: like
    OneFlow, each first traces every job function defined so far, so their variables exist.
    """

    def init(self) -> None:
        """Reset every declared variable to its initializer's values (in place) and the train step
        counters to zero; forget values loaded for variables not declared yet."""
        session = default_session()
        session.trace_jobs("CheckPoint.init()")
        _impl.init(session)

    def save(self, path) -> None:
        """Save every variable to the new folder `path` (it must not exist, or be empty)."""
        session = default_session()
        session.trace_jobs("CheckPoint.save()")
        _impl.save(session, path)

    def load(self, path) -> None:
        """Load the checkpoint folder `path`: every value is checked before any is written."""
        session = default_session()
        session.trace_jobs("CheckPoint.load()")
        _impl.load(session, path)
