"""`flow.env`: OneFlow 0.3's environment of machines, ports and logs.

The same script runs in every process of a job launched by `flowc launch -n N` or `mpiexec -n N`
(see docs/distributed.md).  The machines (`machine`), the process count (`world_size`) and the ports
are recorded in `values`, as `flow.config` records its settings in `flow.config.values`; the runtime
checks the machines and the world size against the launched MPI world
(`flowc.runtime.world.check_configuration`), and a mismatch fails naming the calls.  MPI's launcher
chooses its own ports, so `ctrl_port` and `data_port` are recorded and checked, and change nothing;
the glog settings configure what flowc does not have.

Example:
    flow.env.ctrl_port(9988)                                                 # recorded
    flow.env.machine([{"addr": "192.168.1.12"}, {"addr": "192.168.1.11"}])  # two machines
    flow.env.values["machine"]      # [{'addr': '192.168.1.12'}, {'addr': '192.168.1.11'}]
"""
from __future__ import annotations

from typing import Any

from flowc.compiler.errors import UnsupportedError
from flowc.compiler.trace import user_location
from flowc.runtime import environment as _environment
from flowc.runtime import session as _session
from flow.unsupported import accepted

_NO_GLOG = "flowc has no control plane, RPC or glog to configure: MPI's launcher starts and connects the processes"
_MPI_PORTS = "recorded in flow.env.values; MPI's launcher chooses the ports its processes connect on"

__all__ = ["ctrl_port", "data_port", "grpc_use_no_signal", "init", "log_dir", "logbuflevel", "logtostderr",
           "machine", "master_host", "master_port", "world_size", "init_bootstrap_confs", "values"]

# What the settings were last set to (process-wide, as flow.config.values): "machine" (a list of
# {"addr": ...} dicts), "ctrl_port", "data_port", "world_size".  The runtime reads them there.
values: dict[str, Any] = _environment.env_values


def _port(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"flow.env.{name}: expected a port number in 1..65535, got {value!r}")
    return value


@accepted(_MPI_PORTS)
def ctrl_port(val: int) -> None:
    """Records the control port of a multi-machine session (`values["ctrl_port"]`); MPI picks its own.

    Example:
        flow.env.ctrl_port(9988)
    """
    values["ctrl_port"] = _port("ctrl_port", val)


@accepted(_MPI_PORTS)
def data_port(val: int) -> None:
    """Records the data port of a multi-machine session (`values["data_port"]`); MPI picks its own.

    Example:
        flow.env.data_port(9989)
    """
    values["data_port"] = _port("data_port", val)


@accepted(_NO_GLOG)
def master_port(val: int) -> None:
    """Accepted: the bootstrap port of a multi-machine session; MPI's launcher bootstraps flowc's processes."""
    _port("master_port", val)


@accepted(_NO_GLOG)
def master_host(val: str) -> None:
    """Accepted: the bootstrap host of a multi-machine session; MPI's launcher bootstraps flowc's processes."""
    if not isinstance(val, str):
        raise TypeError(f"flow.env.master_host: expected a str, got {type(val).__name__}")


def world_size(val: int) -> None:
    """Records the number of processes the job runs in (`values["world_size"]`); the runtime checks it
    against the launched world (`flowc launch -n N`).

    Example:
        flow.env.world_size(2)
    """
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        raise ValueError(f"flow.env.world_size: expected an int >= 1, got {val!r}")
    if values.get("world_size") != val:
        _session.warn_if_started(f"flow.env.world_size({val!r})")
    values["world_size"] = val


def init_bootstrap_confs(*args: Any, **kwargs: Any) -> None:
    """Not supported: bootstraps a multi-machine session, which MPI's launcher does for flowc."""
    raise UnsupportedError(f"{user_location()}: flow.env.init_bootstrap_confs is not supported by flowc: MPI's "
                           "launcher starts and connects the processes (flowc launch -n N, or mpiexec -n N)")


_MACHINE_KEYS = ("addr", "ctrl_port_agent", "data_port_agent")
# An address becomes an item of `flowc launch --hosts a,b` and of mpiexec's host list.
_ADDRESS_REFUSED = set(" \t\n\r,")


def _machine_entry(index: int, entry: Any) -> dict[str, Any]:
    """One machine as a dict: an address string, or a dict with a str "addr" (and, as in OneFlow, optional
    int "ctrl_port_agent" / "data_port_agent")."""
    where = f"{user_location()}: flow.env.machine: machine {index} ({entry!r})"
    if isinstance(entry, str):
        entry = {"addr": entry}
    if not isinstance(entry, dict):
        raise TypeError(f"{where}: expected a dict with an \"addr\" or an address string")
    unknown = sorted(set(entry) - set(_MACHINE_KEYS), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; a machine has {', '.join(_MACHINE_KEYS)}")
    if not isinstance(entry.get("addr"), str) or not entry["addr"]:
        raise ValueError(f"{where}: expected a non-empty str \"addr\"")
    if _ADDRESS_REFUSED & set(entry["addr"]) or entry["addr"].startswith("-"):
        raise ValueError(f"{where}: an address has no spaces or commas and does not start with '-'")
    for key in ("ctrl_port_agent", "data_port_agent"):
        if key in entry:
            _port(f"machine: machine {index}'s {key}", entry[key])
    return dict(entry)


def machine(*val: Any) -> None:
    """Records the machines the job runs on (`values["machine"]`), machine 0 first (the master).

    Each machine is a dict with an "addr" (OneFlow's form) or an address string; a list or the
    machines as arguments.  The runtime checks their number against the launched world, so the script
    runs under `flowc launch -n MACHINES*DEVICES --hosts ADDR,ADDR script.py`.

    Example:
        flow.env.machine([{"addr": "192.168.1.12"}, {"addr": "192.168.1.11"}])
        flow.env.machine("192.168.1.12", "192.168.1.11")
    """
    machines = val[0] if len(val) == 1 and isinstance(val[0], (list, tuple)) else val
    if not machines:
        raise ValueError(f"{user_location()}: flow.env.machine: expected at least one machine")
    entries = [_machine_entry(i, m) for i, m in enumerate(machines)]
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry["addr"] in seen:
            raise ValueError(f"{user_location()}: flow.env.machine: machine {i} has the address {entry['addr']!r} "
                             f"of machine {seen[entry['addr']]}; each machine is listed once")
        seen[entry["addr"]] = i
    if values.get("machine") != entries:
        _session.warn_if_started("flow.env.machine(...)")
    values["machine"] = entries


@accepted(_NO_GLOG)
def grpc_use_no_signal(val: bool = True) -> None:
    """Deprecated in OneFlow and does nothing there either."""


@accepted(_NO_GLOG)
def log_dir(val: str) -> None:
    """Accepted: OneFlow's glog folder; flowc logs nothing there (errors are raised, warnings warned)."""
    if not isinstance(val, str):
        raise TypeError(f"flow.env.log_dir: expected a str, got {type(val).__name__}")


@accepted(_NO_GLOG)
def logtostderr(val: int) -> None:
    """Accepted: OneFlow's glog switch; flowc has no glog."""


@accepted(_NO_GLOG)
def logbuflevel(val: int) -> None:
    """Accepted: OneFlow's glog buffering level; flowc has no glog."""


@accepted(_NO_GLOG)
def init() -> bool:
    """Accepted: OneFlow starts its environment here; flowc's starts with the first job call.  Returns True."""
    return True
