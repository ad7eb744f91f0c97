"""`flow.checkpoint`: save and read checkpoints in OneFlow's folder format (see runtime/checkpoint.py).

Example:
    flow.checkpoint.save("./models/step_1000")          # a new folder; fails if it exists and is not empty
    values = flow.checkpoint.get("./models/step_1000")  # name -> value read on .numpy()
    flow.load_variables(values)
"""
from __future__ import annotations

from typing import Any

from flowc.runtime import checkpoint as _impl
from flowc.runtime.checkpoint import CheckpointError, SavedVariable, VariableValue  # noqa: F401
from flowc.runtime.session import default_session


def save(path, var_dict: dict[str, Any] | None = None) -> None:
    """Save every variable of the session (optimizer state and train step counters included) to a
    new folder `path`, atomically: `path` appears complete or not at all.  Given `var_dict` (name ->
    NumPy array or object with `.numpy()`, e.g. from `flow.get_all_variables()`), save exactly its
    entries instead, as OneFlow does.

    Example:
        flow.checkpoint.save("./lenet_models_1")
        flow.checkpoint.save("./dense1_only", {"dense1-weight": flow.get_all_variables()["dense1-weight"]})
    """
    session = default_session()
    session.trace_jobs("flow.checkpoint.save()")
    _impl.save(session, path, var_dict)


def get(path) -> dict[str, SavedVariable]:
    """The variables of the checkpoint at `path`: name -> value whose `.numpy()` reads the file then.

    Example:
        w = flow.checkpoint.get("./lenet_models_1")["dense1-weight"].numpy()
    """
    return _impl.read_checkpoint(path)


def load_variables(value_dict: dict[str, Any], ignore_mismatch: bool = True) -> None:
    """Set variables by name from NumPy arrays or objects with `.numpy()` (e.g. `flow.checkpoint.get`).

    Every value is checked (shape, dtype) before any is written.  Every job function defined so far is
    traced first (as OneFlow initializes its session here), so their variables are known; a name no job
    declares is kept and becomes that variable's value when a later job declares it; with
    `ignore_mismatch=False` such a name is an error instead.

    Example:
        flow.load_variables({"w": np.zeros((10, 784), np.float32)})
    """
    session = default_session()
    session.trace_jobs("flow.load_variables()")
    _impl.load_values(session, value_dict, "flow.load_variables", ignore_unknown=ignore_mismatch)


def get_all_variables() -> dict[str, VariableValue]:
    """Every variable of the session's jobs: name -> object whose `.numpy()` returns a copy of its current
    value.  As in OneFlow, the first call (like a checkpoint operation or the first job call) traces
    every job function defined so far, so their variables are listed, initialized, before any job ran.

    Example:
        weights = {name: v.numpy() for name, v in flow.get_all_variables().items()}
    """
    session = default_session()
    session.trace_jobs("flow.get_all_variables()")
    return _impl.all_variables(session)
