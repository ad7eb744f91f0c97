"""`flowc launch -n N [--hosts h1,h2] script.py args...`: run a script in N processes through mpiexec.

A thin wrapper: it finds mpiexec (the one beside this Python first, which the `mpich` wheel of
`pip install 'flowc[distributed]'` puts there; then PATH), asks it which launcher it is (MPICH's Hydra
and Open MPI spell the host list and the environment differently), and runs

    mpiexec [-disable-auto-cleanup] -n N [hosts] [FLOWC_DEVICES_PER_MACHINE=N/len(hosts)] <python> script.py args

(Hydra's `-disable-auto-cleanup` leaves the other ranks running when one dies, so that flowc's own
watchdog stops them with an error naming the lost rank.)

forwarding its exit code.  Every argument is an argv item, never a shell word.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from flowc.compiler.comm_library import mpi_tool
from flowc.cli.modules import CliError
from flowc.compiler import settings
from flowc.runtime.world import DEVICES_PER_MACHINE_ENV

EPILOG = """examples:
  flowc launch -n 2 train.py                       two processes on this machine
  flowc launch -n 4 --hosts node1,node2 train.py   two processes on each of two machines
  flowc launch -n 2 --dry-run train.py --lr 0.1    print the mpiexec command, run nothing

Plain `mpiexec -n 2 python train.py` works too; the script's flow.config.gpu_device_num /
cpu_device_num and flow.env.machine must agree with the launch (one process per device)."""

INSTALL_HINT = "pip install 'flowc[distributed]'"


@dataclass(frozen=True)
class Flavour:
    """How one kind of mpiexec is told the hosts and an environment variable for every process."""
    name: str
    marks: tuple[str, ...]                           # words of its `--version` output
    hosts: Callable[[list[str], int], list[str]]     # (hosts, processes per host) -> arguments
    env: Callable[[str, str], list[str]]             # (name, value) -> arguments
    # Leave the other processes running when one dies: flowc's watchdog (runtime/distributed.py) then
    # stops them with an error naming the lost rank, where the launcher would kill them without one.
    keep_survivors: tuple[str, ...] = ()


FLAVOURS: tuple[Flavour, ...] = (
    Flavour("MPICH (Hydra)", ("HYDRA", "Intel(R) MPI"),
            lambda hosts, per_host: ["-hosts", ",".join(hosts), "-ppn", str(per_host)],
            lambda name, value: ["-genv", name, value], ("-disable-auto-cleanup",)),
    Flavour("Open MPI", ("Open MPI", "OpenRTE", "PRRTE"),
            lambda hosts, per_host: ["--host", ",".join(f"{h}:{per_host}" for h in hosts)],
            lambda name, value: ["-x", f"{name}={value}"]),
)


def add_parser(sub) -> None:
    p = sub.add_parser("launch", help="run a script in N processes (one per device) through mpiexec",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
                       description="Run SCRIPT.py with this Python in N MPI processes: mpiexec -n N, with "
                                   f"{DEVICES_PER_MACHINE_ENV} set to the processes per machine.")
    p.add_argument("-n", "--processes", type=int, required=True, metavar="N",
                   help="the number of processes (machines x devices per machine)")
    p.add_argument("--hosts", metavar="H1,H2", help="the machines, comma-separated (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="print the mpiexec command and run nothing")
    p.add_argument("script", metavar="SCRIPT.py", help="the script every process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def find_mpiexec(python: str = sys.executable, path: str | None = None) -> str:
    """mpiexec beside `python` (a venv with the mpich wheel), else the first on PATH."""
    found = mpi_tool("mpiexec", python, path)
    if found is None:
        raise CliError(f"no mpiexec beside {python} or on PATH; `{INSTALL_HINT}` installs MPICH's (or install "
                       "Open MPI or MPICH with the system's package manager)")
    return found


def flavour_of(mpiexec: str) -> Flavour:
    """Which launcher `mpiexec` is, from its `--version` output."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CliError(f"{mpiexec} --version failed: {e}") from None
    said = done.stdout + done.stderr
    for flavour in FLAVOURS:
        if any(mark in said for mark in flavour.marks):
            return flavour
    first = said.strip().splitlines()[0] if said.strip() else "nothing"
    raise CliError(f"{mpiexec} is neither MPICH's Hydra nor Open MPI's launcher (its --version said: {first}); "
                   f"run it yourself: mpiexec -n N {shlex.quote(sys.executable)} SCRIPT.py")


def parse_hosts(text: str | None) -> list[str]:
    """`--hosts a,b` as a list; each a non-empty name without spaces, not an option, listed once."""
    if text is None:
        return []
    hosts = text.split(",")
    for i, host in enumerate(hosts):
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise CliError(f"--hosts: host {i} ({host!r}) is not a host name (empty, starts with '-', or holds "
                           "a space)")
        if host in hosts[:i]:
            raise CliError(f"--hosts: {host!r} is listed twice; list each machine once")
    return hosts


def per_machine(processes: int, hosts: list[str]) -> int:
    """N / len(hosts) processes per machine (all of them on this machine when no hosts are given)."""
    if processes < 1:
        raise CliError(f"-n: expected a number of processes >= 1, got {processes}")
    machines = len(hosts) or 1
    if processes % machines:
        raise CliError(f"-n {processes} does not divide evenly over the {machines} hosts of --hosts "
                       f"({','.join(hosts)}): one process per device, the same devices on each machine")
    return processes // machines


def command(mpiexec: str, flavour: Flavour, processes: int, hosts: list[str], script: str,
            args: list[str]) -> list[str]:
    """The mpiexec argv that runs `script` with this Python in `processes` processes."""
    per_host = per_machine(processes, hosts)
    placement = flavour.hosts(hosts, per_host) if hosts else []
    return [mpiexec, *flavour.keep_survivors, "-n", str(processes), *placement,
            *flavour.env(DEVICES_PER_MACHINE_ENV, str(per_host)), sys.executable, script, *args]


def run(args: argparse.Namespace) -> int:
    hosts = parse_hosts(args.hosts)
    per_host = per_machine(args.processes, hosts)
    if not Path(args.script).is_file():
        raise CliError(f"no such script: {args.script}")
    mpiexec = find_mpiexec()
    argv = command(mpiexec, flavour_of(mpiexec), args.processes, hosts, args.script, list(args.args))
    if args.dry_run:
        print(shlex.join(argv))
        return 0
    settings.set_devices_per_machine(per_host)       # for the ranks on this machine; -genv / -x for all
    with subprocess.Popen(argv) as proc:
        try:
            code = proc.wait()
        except KeyboardInterrupt:        # mpiexec got the Ctrl-C too (same process group) and stops the ranks
            code = proc.wait()
    return 128 - code if code < 0 else code     # killed by signal s: the shell's 128 + s
