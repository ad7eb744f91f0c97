"""Which process am I, how many are there, and does that match what the script configured?

The same script runs in every process of an MPI job (OneFlow's "distributed training": machine 0, the
master, builds and reports; the others compute).  This module answers the two questions every process
asks first, without starting MPI:

* `detect_world()` reads the launcher's environment (MPICH/Hydra, Open MPI, PMIx) into a `World`;
* `check_configuration()` compares it with what the script configured through `flow.config`
  (`gpu_device_num`, `cpu_device_num`, `machine_num`) and `flow.env` (`machine`, `world_size`): one
  process per device, so the launched world must hold machines x devices-per-machine processes.

It must not import mpi4py: importing mpi4py initialises MPI, which only the distributed runtime does
(and only once it knows the world is larger than one process).

Example:
    world = detect_world()                     # World(rank=0, size=1, ...) when not under mpiexec
    per_machine = check_configuration(world, flow.config.values, flow.env.values)
"""
from __future__ import annotations

import multiprocessing
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from flowc.compiler import settings
from flowc.compiler.backends import HOST_DEVICE, get_backend

# Set by `flowc launch` (flowc/cli/launch_command.py): the processes it started on each machine.
DEVICES_PER_MACHINE_ENV = "FLOWC_DEVICES_PER_MACHINE"


class WorldError(RuntimeError):
    """The launcher's environment is malformed, or the launched world does not match the script's settings."""


@dataclass(frozen=True)
class World:
    """This process's place among the launched processes (one per device).

    Example:
        World(rank=1, size=2, local_rank=1, local_size=2).is_master    # False
    """
    rank: int
    size: int
    local_rank: int
    local_size: int

    @property
    def is_master(self) -> bool:
        """Rank 0: the process that builds the job graph, prints, returns results and saves checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """More than one process was launched."""
        return self.size > 1


SINGLE_PROCESS = World(rank=0, size=1, local_rank=0, local_size=1)


@dataclass(frozen=True)
class Launcher:
    """The variables one kind of launcher sets.  `rank` is the one whose presence says "this launcher";
    the size may come from one of several variables (the first set wins); a launcher that does not say
    which processes share a machine (a missing local variable) is taken as one machine."""
    name: str
    rank: str
    sizes: tuple[str, ...]
    local_rank: str | None
    local_size: str | None


# Checked in order: Open MPI's own variables before the PMIx ones it also sets, MPICH's before PMIx's
# (Slurm with --mpi=pmi2 sets PMI_*).  PMIx exports no variable with the job's size (a PMIx client asks
# its server); under Slurm it is SLURM_STEP_NUM_TASKS / SLURM_NTASKS, elsewhere the rank alone is an error.
LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("Open MPI", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    Launcher("MPICH (Hydra)", "PMI_RANK", ("PMI_SIZE",), "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    Launcher("PMIx", "PMIX_RANK", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_LOCALID", None),
)


def _int_var(variables: Mapping[str, str], name: str, launcher: str, minimum: int) -> int:
    text = variables[name]
    try:
        value = int(text.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise WorldError(f"the environment variable {name}={text!r} (set by {launcher}) is not an int >= "
                         f"{minimum}")
    return value


def detect_world(variables: Mapping[str, str] | None = None) -> World:
    """This process's `World`, from the variables its launcher set (this process's environment, read
    through flowc.compiler.settings, by default; a mapping of them in tests).

    No launcher variables: a single process, `World(0, 1, 0, 1)`.  A variable that is not a number, a
    rank outside its size, or a rank without its size is a `WorldError` naming the variable.

    Example:
        detect_world({"PMI_RANK": "1", "PMI_SIZE": "2"})   # World(rank=1, size=2, local_rank=1, local_size=2)
    """
    if variables is None and multiprocessing.parent_process() is not None:
        # a multiprocessing child inherits its parent's launcher variables, but the launcher started the
        # parent only: the child is no rank of the run and runs its jobs alone
        return SINGLE_PROCESS
    env = settings.mpi_launcher_variables() if variables is None else variables
    for launcher in LAUNCHERS:
        if launcher.rank in env:
            return _world_of(launcher, env)
    return SINGLE_PROCESS


def _world_of(launcher: Launcher, env: Mapping[str, str]) -> World:
    rank = _int_var(env, launcher.rank, launcher.name, 0)
    size_var = next((name for name in launcher.sizes if name in env), None)
    if size_var is None:
        raise WorldError(f"{launcher.rank}={env[launcher.rank]!r} is set (by {launcher.name}) but not the number "
                         f"of processes: none of {', '.join(launcher.sizes)}")
    size = _int_var(env, size_var, launcher.name, 1)
    if rank >= size:
        raise WorldError(f"{launcher.rank}={rank} is not below {size_var}={size} (set by {launcher.name})")
    local_rank, local_size = rank, size          # no local variables: every process on this machine
    if launcher.local_rank is not None and launcher.local_rank in env:
        local_rank = _int_var(env, launcher.local_rank, launcher.name, 0)
    if launcher.local_size is not None and launcher.local_size in env:
        local_size = _int_var(env, launcher.local_size, launcher.name, 1)
        if local_size > size:
            raise WorldError(f"{launcher.local_size}={local_size} is above {size_var}={size} (set by "
                             f"{launcher.name})")
    if local_rank >= local_size:
        named = launcher.local_rank if launcher.local_rank in env else launcher.rank
        raise WorldError(f"{named}={local_rank} is not below the processes on this machine ({local_size}, set "
                         f"by {launcher.name})")
    return World(rank, size, local_rank, local_size)


# -- the script's configuration against the launched world ----------------------------------------------
# Is the job's device the host? -> the flow.config settings that give its devices per machine, its own
# first: OneFlow's documentation programs say gpu_device_num(n) and run here on the CPU meaning the same.
DEVICE_SETTINGS: dict[bool, tuple[str, ...]] = {
    True: ("cpu_device_num", "gpu_device_num"),
    False: ("gpu_device_num", "cpu_device_num"),
}


@dataclass(frozen=True)
class Configured:
    """What the script said: devices per machine and machines, each with the call that said it (None:
    the script did not say)."""
    devices: int | None
    devices_call: str
    machines: int | None
    machines_call: str
    world_size: int | None
    addresses: tuple[str, ...]


def _configured(config_values: Mapping[str, Any], env_values: Mapping[str, Any], device: str) -> Configured:
    devices, devices_call = None, "no flow.config.gpu_device_num / cpu_device_num call"
    for name in DEVICE_SETTINGS[get_backend(device).is_host]:          # an unknown device fails naming it
        count = config_values.get(name)
        if count:                                # 0 devices of a kind: "none of these", OneFlow's CPU-only
            devices, devices_call = count, f"flow.config.{name}({count})"
            break
    listed = tuple(_address(m) for m in env_values.get("machine", ()))
    machine_num = config_values.get("machine_num")
    if listed and machine_num and machine_num != len(listed):
        raise WorldError(f"flow.config.machine_num({machine_num}) disagrees with flow.env.machine, which lists "
                         f"{len(listed)} machine{'s' * (len(listed) != 1)} ({', '.join(listed)})")
    if listed:
        machines: int | None = len(listed)
        machines_call = f"flow.env.machine([{', '.join(repr(a) for a in listed)}])"
    elif machine_num:
        machines, machines_call = machine_num, f"flow.config.machine_num({machine_num})"
    else:
        machines, machines_call = None, "no flow.env.machine call"
    return Configured(devices, devices_call, machines, machines_call, env_values.get("world_size"), listed)


def configured_devices(config_values: Mapping[str, Any], env_values: Mapping[str, Any],
                       device: str = HOST_DEVICE) -> tuple[int | None, int | None, str]:
    """(devices per machine, machines, the call that set the devices) as the script configured them;
    None where it did not say."""
    configured = _configured(config_values, env_values, device)
    return configured.devices, configured.machines, configured.devices_call


def _address(machine: Any) -> str:
    return machine["addr"] if isinstance(machine, Mapping) else str(machine)


def _launched(world: World, by_flowc_launch: bool) -> str:
    if world.is_distributed:
        return f"{world.size} processes were launched"
    return "1 process was launched" if by_flowc_launch else "this process runs alone (not under mpiexec)"


def _launch_command(processes: int, machines: int, addresses: Sequence[str], script: str) -> str:
    named = list(addresses) or [f"HOST{i + 1}" for i in range(machines)]     # machines the script did not name
    hosts = ["--hosts", ",".join(named)] if machines > 1 else []
    return shlex.join(["flowc", "launch", "-n", str(processes), *hosts, script])


def _devices_per_machine_env(variables: Mapping[str, str] | None) -> int | None:
    if variables is None:
        text = settings.devices_per_machine()
        variables = {} if text is None else {DEVICES_PER_MACHINE_ENV: text}
    if DEVICES_PER_MACHINE_ENV not in variables:
        return None
    return _int_var(variables, DEVICES_PER_MACHINE_ENV, "flowc launch", 1)


def check_configuration(world: World, config_values: Mapping[str, Any], env_values: Mapping[str, Any], *,
                        device: str = HOST_DEVICE, variables: Mapping[str, str] | None = None,
                        script: str | None = None) -> int:
    """The devices per machine, after checking that `world` is what the script configured.

    `config_values` is `flow.config.values` (gpu_device_num, cpu_device_num, machine_num), `env_values`
    is `flow.env.values` (machine: the recorded list, world_size); `device` is the job's device (a
    registered backend's name), whose own setting counts first.  One process runs per device, so the
    world must hold machines x devices-per-machine processes; a script that configures nothing runs on
    any world (each process one device).  `FLOWC_DEVICES_PER_MACHINE`, which `flowc launch` sets, is
    what the launch put on each machine (read through flowc.compiler.settings unless `variables` gives
    it).  A mismatch is a `WorldError` naming the calls, the launched world and the `flowc launch`
    command that would match (`script` defaults to sys.argv[0]).

    Example:
        check_configuration(World(0, 2, 0, 2), {"gpu_device_num": 2}, {})     # 2
        check_configuration(World(0, 1, 0, 1), {"gpu_device_num": 2}, {})     # WorldError: ... flowc launch -n 2 ...
    """
    script_name = script if script is not None else Path(sys.argv[0] or "script.py").name
    configured = _configured(config_values, env_values, device)
    launched_per_machine = _devices_per_machine_env(variables)

    def refuse(problem: str, processes: int, machines: int) -> WorldError:
        command = _launch_command(processes, machines, configured.addresses, script_name)
        return WorldError(f"{problem}, but {_launched(world, launched_per_machine is not None)}; run `{command}`")

    if configured.world_size is not None and configured.world_size != world.size:
        raise refuse(f"the script sets flow.env.world_size({configured.world_size})", configured.world_size,
                     configured.machines or 1)
    machines, machines_call = configured.machines, configured.machines_call
    if (machines is None and launched_per_machine is not None and world.size % launched_per_machine == 0
            and world.size > launched_per_machine):
        machines = world.size // launched_per_machine       # flowc launch --hosts: one machine per host
        machines_call = f"the {machines} hosts given to flowc launch"
    elif machines is None:
        machines = 1
    if configured.devices is not None:
        wanted = machines * configured.devices
        if wanted != world.size:
            raise refuse(f"the script configures {configured.devices} device{'s' * (configured.devices != 1)} per "
                         f"machine ({configured.devices_call}) on {machines} machine{'s' * (machines != 1)} "
                         f"({machines_call}): {wanted} process{'es' * (wanted != 1)}, one per device", wanted, machines)
        devices = configured.devices
    elif world.size % machines:
        raise refuse(f"the script configures {machines} machines ({machines_call}), which cannot share "
                     f"{world.size} process{'es' * (world.size != 1)} evenly", machines, machines)
    else:
        devices = world.size // machines
    if launched_per_machine is not None and launched_per_machine != devices:
        raise WorldError(f"flowc launch started {launched_per_machine} process"
                         f"{'es' * (launched_per_machine != 1)} per machine ({DEVICES_PER_MACHINE_ENV}="
                         f"{launched_per_machine}), but the script runs {devices} per machine "
                         f"({configured.devices_call}; {machines_call}); run "
                         f"`{_launch_command(machines * devices, machines, configured.addresses, script_name)}`")
    return devices
