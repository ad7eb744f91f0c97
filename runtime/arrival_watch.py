"""Stop a rank whose peers on its host ended before their first job call, instead of waiting forever.

Every rank starts MPI at its first job call, and MPI's start waits for every rank to start it too: a
rank that ended before its first call (an error in its part of the script, or a script whose ranks
do not call the same jobs) leaves the others inside MPI_Init, which holds Python's lock, so no thread
of theirs can notice.  So at the first call each rank looks at the processes its launcher started
on this host (the launcher's proxy's children: Hydra's `hydra_pmi_proxy`, Open MPI's `prted`):

* one already gone: `check_arrivals` raises at once, naming its rank, before MPI starts;
* all alive: a small watcher process (this file, run as a script: it imports nothing of flowc) looks
  every WATCH_SECONDS until MPI has started on every rank; if one ends first, it names it on stderr
  and ends the waiting rank (SIGKILL: nothing else reaches a process inside MPI_Init).

Where it cannot tell (no /proc, a rank started through a wrapper such as `bash -c`, a launcher it does
not know, ranks on other hosts) nothing is watched, as before.

Example:
    watch = check_arrivals(world)      # raises DistributedError if a local peer already ended
    try:
        start_mpi()
    finally:
        watch.stop()
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from flowc.runtime.world import World

# How often the watcher looks at the peers.
WATCH_SECONDS = 0.2
# The processes that start an MPI job's ranks on a host, by the name the kernel gives them (/proc/PID/comm,
# at most 15 characters), with the variable that says how many ranks they started there.
LAUNCHER_PROXIES = {"hydra_pmi_proxy": "MPI_LOCALNRANKS", "prted": "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "orted": "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun": "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "mpiexec": "OMPI_COMM_WORLD_LOCAL_SIZE", "orterun": "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "prterun": "OMPI_COMM_WORLD_LOCAL_SIZE"}


def alive(pid: int) -> bool:
    """Is process `pid` running (not gone, not a zombie waiting to be reaped)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):
        return False
    except (OSError, IndexError):       # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _children(parent: int) -> list[int]:
    """The live processes whose parent is `parent` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue                    # ended while we looked
        if len(fields) > 1 and int(fields[1]) == parent and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def _start_variables(pid: int) -> dict[str, str]:
    """The environment variables process `pid` started with ({} where they cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as listing:
            items = listing.read().split(b"\0")
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in items if b"=" in item)
    return {name: value for name, _, value in pairs}


def local_peers(world: World, variables: Mapping[str, str] | None = None) -> tuple[dict[int, int | None], int] | None:
    """The other live ranks its launcher started on this host, {pid: rank (None: unreadable)}, and how
    many ranks it started here; None where that cannot be told (see the module's docstring).
    `variables`: this process's launcher variables (default: read through flowc.compiler.settings)."""
    from flowc.compiler import settings
    from flowc.runtime.world import detect_world, WorldError
    variables = settings.mpi_launcher_variables() if variables is None else variables
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as comm:
            proxy = comm.read().strip()
    except OSError:
        return None
    count_variable = LAUNCHER_PROXIES.get(proxy)
    if count_variable is None or count_variable not in variables:
        return None
    peers: dict[int, int | None] = {}
    for pid in _children(parent):
        if pid == os.getpid():
            continue
        try:
            peers[pid] = detect_world(_start_variables(pid)).rank
        except WorldError:
            peers[pid] = None
    return peers, world.local_size


def _named(ranks: list[int | None], pids: list[int] | None = None) -> str:
    names = [f"rank {r}" if r is not None else "a rank" for r in ranks]
    if pids is not None:
        names = [f"{name} (pid {pid} on {socket.gethostname()})" for name, pid in zip(names, pids)]
    return ", ".join(names)


def ended_before_call(world: World, peers: dict[int, int | None], started: int) -> str | None:
    """Why this rank cannot start, when fewer of the `started` ranks of this host than that remain
    (`peers`: the others alive, {pid: rank}); None when all are there."""
    if len(peers) + 1 >= started:
        return None
    missing: list[int | None]
    if started == world.size and None not in peers.values():     # every rank on this host: name the lost
        gone = set(range(world.size)) - {r for r in peers.values() if r is not None} - {world.rank}
        missing = [r for r in sorted(gone)]
    else:
        missing = [None] * (started - 1 - len(peers))
    return (f"{_named(missing)} of this job ended before its first job call: rank {world.rank} cannot start "
            "the job (every rank must call the same jobs; the lost rank's own output says why it ended)")


class ArrivalWatch:
    """The watcher process of one rank's first call (or nothing to stop, where nothing is watched)."""

    def __init__(self, process: subprocess.Popen | None) -> None:
        self.process = process

    def stop(self) -> None:
        """MPI has started on every rank (or this rank gave up): the watcher is no longer needed."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def check_arrivals(world: World) -> ArrivalWatch:
    """Raise DistributedError if a rank the launcher started on this host has already ended; else watch
    them until `stop` (the first job call's MPI start)."""
    from flowc.compiler.errors import DistributedError
    found = local_peers(world)
    if found is None:
        return ArrivalWatch(None)
    peers, started = found
    already = ended_before_call(world, peers, started)
    if already is not None:
        raise DistributedError(already)
    arguments = [str(os.getpid()), str(world.rank)] + [f"{pid}:{'' if rank is None else rank}"
                                                     for pid, rank in peers.items()]
    process = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), *arguments],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return ArrivalWatch(process)


def watch(rank_pid: int, rank: int, peers: dict[int, int | None]) -> None:
    """The watcher's loop: end `rank_pid` when one of `peers` ends first; return when `rank_pid` ends."""
    while alive(rank_pid):
        lost = [pid for pid in peers if not alive(pid)]
        if lost:
            sys.stderr.write(f"flowc: {_named([peers[pid] for pid in lost], lost)} ended before its first job call: "
                             f"rank {rank} stops too (every rank must call the same jobs; the lost rank's own "
                             "output says why it ended)\n")
            sys.stderr.flush()
            os.kill(rank_pid, signal.SIGKILL)
            return
        time.sleep(WATCH_SECONDS)


if __name__ == "__main__":
    _pid, _rank, *_peers = sys.argv[1:]
    watch(int(_pid), int(_rank), {int(p): (int(r) if r else None) for p, _, r in (a.partition(":") for a in _peers)})
