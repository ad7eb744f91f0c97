"""`flow.env`: OneFlow 0.3's environment of machines, ports and logs.

flowc runs in this one process on this one machine: the settings of a single machine are checked and
accepted (they configure what flowc does not have: a control plane, RPC ports, glog files), and a
description of several machines fails, naming the feature.

Example:
    flow.env.ctrl_port(9988)            # accepted: one machine needs no control port
    flow.env.machine([{"addr": "192.168.1.12"}, {"addr": "192.168.1.11"}])   # UnsupportedError
"""
from __future__ import annotations

from typing import Any

from flowc.compiler.errors import UnsupportedError
from flowc.compiler.trace import user_location
from flow.unsupported import accepted

_ONE_MACHINE = "flowc runs in one process on one machine: there is no control plane, RPC or glog to configure"

__all__ = ["ctrl_port", "data_port", "grpc_use_no_signal", "init", "log_dir", "logbuflevel", "logtostderr",
           "machine", "master_host", "master_port", "world_size", "init_bootstrap_confs"]


def _port(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"flow.env.{name}: expected a port number in 1..65535, got {value!r}")


@accepted(_ONE_MACHINE)
def ctrl_port(val: int) -> None:
    """Accepted: the control port of a multi-machine session, unused on one machine."""
    _port("ctrl_port", val)


@accepted(_ONE_MACHINE)
def data_port(val: int) -> None:
    """Accepted: the data port of a multi-machine session, unused on one machine."""
    _port("data_port", val)


@accepted(_ONE_MACHINE)
def master_port(val: int) -> None:
    """Accepted: the bootstrap port of a multi-machine session, unused on one machine."""
    _port("master_port", val)


@accepted(_ONE_MACHINE)
def master_host(val: str) -> None:
    """Accepted: the bootstrap host of a multi-machine session, unused on one machine."""
    if not isinstance(val, str):
        raise TypeError(f"flow.env.master_host: expected a str, got {type(val).__name__}")


@accepted(_ONE_MACHINE)
def world_size(val: int) -> None:
    """Accepted for 1 (this process); more processes fail: flowc runs on one machine."""
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        raise ValueError(f"flow.env.world_size: expected an int >= 1, got {val!r}")
    if val > 1:
        raise UnsupportedError(f"{user_location()}: flow.env.world_size({val}) is not supported by flowc: it runs a "
                               "job in one process on one machine (several machines: a later issue)")


def init_bootstrap_confs(*args: Any, **kwargs: Any) -> None:
    """Not supported: bootstraps a multi-machine session."""
    raise UnsupportedError(f"{user_location()}: flow.env.init_bootstrap_confs is not supported by flowc: it runs "
                           "a job in one process on one machine")


@accepted(_ONE_MACHINE)
def machine(val) -> None:
    """Accepted for one machine (a list of one `{"addr": ...}` or one address); several fail.

    Example:
        flow.env.machine([{"addr": "127.0.0.1"}])
    """
    nodes = list(val) if isinstance(val, (list, tuple)) else [val]
    if len(nodes) > 1:
        raise UnsupportedError(f"{user_location()}: flow.env.machine with {len(nodes)} machines is not supported by "
                               "flowc: it runs a job on one machine (several machines: a later issue)")


@accepted(_ONE_MACHINE)
def grpc_use_no_signal(val: bool = True) -> None:
    """Deprecated in OneFlow and does nothing there either."""


@accepted(_ONE_MACHINE)
def log_dir(val: str) -> None:
    """Accepted: OneFlow's glog folder; flowc logs nothing there (errors are raised, warnings warned)."""
    if not isinstance(val, str):
        raise TypeError(f"flow.env.log_dir: expected a str, got {type(val).__name__}")


@accepted(_ONE_MACHINE)
def logtostderr(val: int) -> None:
    """Accepted: OneFlow's glog switch; flowc has no glog."""


@accepted(_ONE_MACHINE)
def logbuflevel(val: int) -> None:
    """Accepted: OneFlow's glog buffering level; flowc has no glog."""


@accepted(_ONE_MACHINE)
def init() -> bool:
    """Accepted: OneFlow starts its environment here; flowc's starts with the first job call.  Returns True."""
    return True
