"""runtime/world.py: the launched world from each launcher's environment, and the script's device and
machine settings (flow.config, flow.env) checked against it; flow.env's recorded machines."""
from __future__ import annotations

import re
import sys

import pytest

import flow
import flow.config as config_module
import flow.env as env_module
from flowc.compiler import settings
from flowc.runtime.world import LAUNCHERS, SINGLE_PROCESS, World, WorldError, check_configuration, detect_world


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch):
    """Each test starts with nothing configured (the settings are process-wide)."""
    monkeypatch.setattr(config_module, "values", {})
    monkeypatch.setattr(env_module, "values", {})


# -- detect_world ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("environ, world", [
    ({}, World(0, 1, 0, 1)),
    ({"PATH": "/usr/bin", "HOME": "/root"}, World(0, 1, 0, 1)),
    # MPICH's Hydra, as `mpiexec -n 2` sets it on this machine
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "9"},
     World(1, 2, 1, 2)),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, World(3, 4, 1, 2)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, World(1, 2, 1, 2)),           # no local variables: one machine
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_RANK": "2"}, World(2, 4, 0, 2)),
    ({"PMIX_RANK": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, World(5, 8, 1, 8)),
    ({"PMIX_RANK": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "8"}, World(0, 2, 0, 2)),
    ({"PMI_RANK": " 0 ", "PMI_SIZE": "1"}, World(0, 1, 0, 1)),
])
def test_detect_world_reads_each_launcher(environ, world):
    assert detect_world(environ) == world


@pytest.mark.parametrize("environ, message", [
    ({"PMI_RANK": "one", "PMI_SIZE": "2"}, "PMI_RANK='one' (set by MPICH (Hydra)) is not an int >= 0"),
    ({"PMI_RANK": "-1", "PMI_SIZE": "2"}, "PMI_RANK='-1' (set by MPICH (Hydra)) is not an int >= 0"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE='0' (set by MPICH (Hydra)) is not an int >= 1"),
    ({"PMI_RANK": "0"}, "PMI_RANK='0' is set (by MPICH (Hydra)) but not the number of processes: none of PMI_SIZE"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK=2 is not below PMI_SIZE=2"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "x"},
     "OMPI_COMM_WORLD_LOCAL_SIZE='x' (set by Open MPI) is not an int >= 1"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
     "OMPI_COMM_WORLD_LOCAL_SIZE=3 is above OMPI_COMM_WORLD_SIZE=2"),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "2"},
     "MPI_LOCALRANKID=2 is not below the processes on this machine"),
    ({"PMIX_RANK": "1"}, "PMIX_RANK='1' is set (by PMIx) but not the number of processes: none of "
                         "SLURM_STEP_NUM_TASKS, SLURM_NTASKS"),
    ({"PMIX_RANK": "1", "SLURM_NTASKS": "2.0"}, "SLURM_NTASKS='2.0' (set by PMIx) is not an int >= 1"),
])
def test_detect_world_names_a_malformed_variable(environ, message):
    with pytest.raises(WorldError, match=re.escape(message)):
        detect_world(environ)


def test_the_launchers_variables_are_the_ones_settings_reads():
    named = [name for launcher in LAUNCHERS for name in (launcher.rank, *launcher.sizes, launcher.local_rank,
                                                           launcher.local_size) if name is not None]
    assert sorted(named) == sorted(settings.MPI_LAUNCHER_VARIABLES)


def test_detect_world_reads_this_processs_environment(monkeypatch):
    for name in settings.MPI_LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert detect_world() == SINGLE_PROCESS
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "3")
    assert detect_world() == World(1, 3, 1, 3)
    monkeypatch.setenv("FLOWC_DEVICES_PER_MACHINE", "3")
    assert check_configuration(detect_world(), {"cpu_device_num": 3}, {}) == 3
    monkeypatch.setenv("FLOWC_DEVICES_PER_MACHINE", "three")
    with pytest.raises(WorldError, match="FLOWC_DEVICES_PER_MACHINE='three' .set by flowc launch. is not an int"):
        check_configuration(detect_world(), {}, {})


def test_world_properties():
    assert SINGLE_PROCESS.is_master and not SINGLE_PROCESS.is_distributed
    worker = World(rank=1, size=2, local_rank=1, local_size=2)
    assert not worker.is_master and worker.is_distributed
    with pytest.raises(AttributeError):
        worker.rank = 0          # type: ignore[misc]   # frozen: a process's place does not change


# -- check_configuration ---------------------------------------------------------------------------------
def world(size: int) -> World:
    return World(0, size, 0, size)


ONE_MACHINE_TWO = {"gpu_device_num": 2}
TWO_MACHINES = {"machine": [{"addr": "10.0.0.1"}, {"addr": "10.0.0.2"}]}


# (world size, flow.config.values, flow.env.values, device, FLOWC_DEVICES_PER_MACHINE, devices per machine)
ACCEPTED = [
    (1, {}, {}, "cpu", None, 1),                                      # nothing configured: any world
    (3, {}, {}, "cpu", None, 3),
    (2, ONE_MACHINE_TWO, {}, "cpu", None, 2),                          # gpu_device_num counts on the CPU too
    (2, {"cpu_device_num": 2, "gpu_device_num": 1}, {}, "cpu", None, 2),   # the device's own first
    (1, {"cpu_device_num": 2, "gpu_device_num": 1}, {}, "gpu", None, 1),
    (2, {"gpu_device_num": 0, "cpu_device_num": 2}, {}, "gpu", None, 2),   # 0 GPUs: OneFlow's CPU-only
    (1, {"gpu_device_num": 1}, {}, "cpu", None, 1),
    (4, ONE_MACHINE_TWO, TWO_MACHINES, "cpu", "2", 2),
    (4, {}, TWO_MACHINES, "cpu", None, 2),                             # machines alone: devices = size / machines
    (4, {"machine_num": 2, "gpu_device_num": 2}, {}, "cpu", None, 2),
    (4, {"machine_num": 2}, TWO_MACHINES, "cpu", None, 2),
    (2, {}, {"world_size": 2}, "cpu", None, 2),
    (4, ONE_MACHINE_TWO, {}, "cpu", "2", 2),                           # flowc launch -n 4 --hosts a,b
    (2, {}, {}, "cpu", "2", 2),
    (4, {}, {}, "cpu", "2", 2),                                        # its hosts are the machines
]


@pytest.mark.parametrize("size, config, env, device, per_machine_env, devices", ACCEPTED)
def test_check_configuration_accepts(size, config, env, device, per_machine_env, devices):
    environ = {} if per_machine_env is None else {"FLOWC_DEVICES_PER_MACHINE": per_machine_env}
    assert check_configuration(world(size), config, env, device=device, variables=environ,
                               script="train.py") == devices


REFUSED = [
    (1, ONE_MACHINE_TWO, {}, None,
     "the script configures 2 devices per machine (flow.config.gpu_device_num(2)) on 1 machine (no flow.env.machine "
     "call): 2 processes, one per device, but this process runs alone (not under mpiexec); run "
     "`flowc launch -n 2 train.py`"),
    (1, ONE_MACHINE_TWO, {}, "1", "but 1 process was launched; run `flowc launch -n 2 train.py`"),
    (3, ONE_MACHINE_TWO, {}, None, "2 processes, one per device, but 3 processes were launched; run "
                                   "`flowc launch -n 2 train.py`"),
    (2, {"gpu_device_num": 1}, {}, None, "flow.config.gpu_device_num(1)) on 1 machine"),
    (2, ONE_MACHINE_TWO, TWO_MACHINES, None,
     "on 2 machines (flow.env.machine(['10.0.0.1', '10.0.0.2'])): 4 processes, one per device, but 2 processes "
     "were launched; run `flowc launch -n 4 --hosts 10.0.0.1,10.0.0.2 train.py`"),
    (4, {"machine_num": 2, "gpu_device_num": 1}, {}, None, "on 2 machines (flow.config.machine_num(2)): 2 processes"),
    (3, {}, TWO_MACHINES, None, "2 machines (flow.env.machine(['10.0.0.1', '10.0.0.2'])), which cannot share 3 "
                                "processes evenly, but 3 processes were launched; run `flowc launch -n 2 --hosts"),
    (1, {}, {"world_size": 2}, None, "the script sets flow.env.world_size(2), but this process runs alone"),
    (2, {}, {"world_size": 3}, None, "world_size(3), but 2 processes were launched; run `flowc launch -n 3"),
    (4, {"machine_num": 3}, TWO_MACHINES, None, "flow.config.machine_num(3) disagrees with flow.env.machine, which "
                                                "lists 2 machines (10.0.0.1, 10.0.0.2)"),
    (4, {"gpu_device_num": 4}, {}, "2", "the script configures 4 devices per machine (flow.config.gpu_device_num(4)) "
                                        "on 2 machines (the 2 hosts given to flowc launch): 8 processes, one per "
                                        "device, but 4 processes were launched; run "
                                        "`flowc launch -n 8 --hosts HOST1,HOST2 train.py`"),
    (4, ONE_MACHINE_TWO, TWO_MACHINES, "4", "flowc launch started 4 processes per machine (FLOWC_DEVICES_PER_MACHINE"
                                            "=4), but the script runs 2 per machine (flow.config.gpu_device_num(2); "
                                            "flow.env.machine(['10.0.0.1', '10.0.0.2'])); run `flowc launch -n 4 "
                                            "--hosts 10.0.0.1,10.0.0.2 train.py`"),
    (2, {"machine_num": 2}, {"world_size": 3}, None, "run `flowc launch -n 3 --hosts HOST1,HOST2 train.py`"),
    (2, {}, {}, "x", "FLOWC_DEVICES_PER_MACHINE='x' (set by flowc launch) is not an int >= 1"),
]


@pytest.mark.parametrize("size, config, env, per_machine_env, message", REFUSED)
def test_check_configuration_refuses_a_mismatch(size, config, env, per_machine_env, message):
    environ = {} if per_machine_env is None else {"FLOWC_DEVICES_PER_MACHINE": per_machine_env}
    with pytest.raises(WorldError, match=re.escape(message)):
        check_configuration(world(size), config, env, variables=environ, script="train.py")


def test_check_configuration_reads_what_the_script_set():
    flow.config.gpu_device_num(2)
    flow.env.machine("node1", "node2")
    assert check_configuration(world(4), flow.config.values, flow.env.values, variables={}) == 2
    with pytest.raises(WorldError, match=r"run `flowc launch -n 4 --hosts node1,node2 'my script.py'`"):
        check_configuration(world(2), flow.config.values, flow.env.values, variables={}, script="my script.py")


def test_check_configuration_names_the_running_script(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/home/me/train_mlp.py", "--lr", "0.1"])
    with pytest.raises(WorldError, match=r"run `flowc launch -n 2 train_mlp.py`"):
        check_configuration(world(1), {"gpu_device_num": 2}, {}, variables={})


def test_check_configuration_refuses_an_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu': flowc has backends for 'cpu'"):
        check_configuration(world(1), {}, {}, device="tpu", variables={})


# -- flow.config and flow.env record what the world is checked against ----------------------------------
def test_config_records_devices_and_machines():
    flow.config.gpu_device_num(2)
    flow.config.cpu_device_num(4)
    flow.config.machine_num(3)
    assert config_module.values == {"gpu_device_num": 2, "cpu_device_num": 4, "machine_num": 3}
    for name in ("gpu_device_num", "cpu_device_num", "machine_num"):
        assert config_module.OPTIONS[name].status == "implemented"
        with pytest.raises(ValueError, match=f"flow.config.{name}: expected an int >= 0, got 'two'"):
            getattr(flow.config, name)("two")


def test_env_records_machines_ports_and_world_size():
    flow.env.machine([{"addr": "192.168.1.12"}, {"addr": "192.168.1.11", "ctrl_port_agent": 9000}])
    flow.env.ctrl_port(9988)
    flow.env.data_port(9989)
    flow.env.world_size(4)
    assert env_module.values == {"machine": [{"addr": "192.168.1.12"}, {"addr": "192.168.1.11",
                                                                          "ctrl_port_agent": 9000}],
                                 "ctrl_port": 9988, "data_port": 9989, "world_size": 4}
    flow.env.machine("a", "b", "c")                  # strings, as arguments: OneFlow's other forms
    assert env_module.values["machine"] == [{"addr": "a"}, {"addr": "b"}, {"addr": "c"}]
    flow.env.machine(("x",))
    assert env_module.values["machine"] == [{"addr": "x"}]


@pytest.mark.parametrize("call, error, message", [
    (lambda: flow.env.machine([{"addr": "a"}, {"adr": "b"}]), ValueError,
     "machine 1 ({'adr': 'b'}): unknown key 'adr'; a machine has addr, ctrl_port_agent, data_port_agent"),
    (lambda: flow.env.machine([{"addr": "a"}, 7]), TypeError,
     "machine 1 (7): expected a dict with an \"addr\" or an address string"),
    (lambda: flow.env.machine([{"addr": 10}]), ValueError, "machine 0 ({'addr': 10}): expected a non-empty str"),
    (lambda: flow.env.machine([{"addr": ""}]), ValueError, "machine 0 ({'addr': ''}): expected a non-empty str"),
    (lambda: flow.env.machine(["a b"]), ValueError, "machine 0 ('a b'): an address has no spaces or commas"),
    (lambda: flow.env.machine(["a,b"]), ValueError, "machine 0 ('a,b'): an address has no spaces or commas"),
    (lambda: flow.env.machine(["-hosts"]), ValueError, "does not start with '-'"),
    (lambda: flow.env.machine([{"addr": "a", "ctrl_port_agent": 0}]), ValueError,
     "flow.env.machine: machine 0's ctrl_port_agent: expected a port number in 1..65535, got 0"),
    (lambda: flow.env.machine(["a", "b", "a"]), ValueError,
     "machine 2 has the address 'a' of machine 0; each machine is listed once"),
    (lambda: flow.env.machine([]), ValueError, "flow.env.machine: expected at least one machine"),
    (lambda: flow.env.world_size(0), ValueError, "flow.env.world_size: expected an int >= 1, got 0"),
    (lambda: flow.env.world_size(True), ValueError, "flow.env.world_size: expected an int >= 1, got True"),
    (lambda: flow.env.ctrl_port(70000), ValueError, "flow.env.ctrl_port: expected a port number in 1..65535"),
    (lambda: flow.env.data_port("9989"), ValueError, "flow.env.data_port: expected a port number in 1..65535"),
])
def test_env_refuses_bad_arguments_naming_them(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()
    assert env_module.values == {}                   # nothing half-recorded


def test_machine_errors_name_the_users_line():
    with pytest.raises(ValueError, match=r"test_world.py:\d+: flow.env.machine: machine 0"):
        flow.env.machine([{"host": "a"}])

