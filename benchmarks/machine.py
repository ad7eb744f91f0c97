"""Was the machine busy while a benchmark run measured it?  The load average before and after the
run, and the CPU time other work took on the benchmark's CPUs during it.

Other work on the CPUs skews every ratio, and differently for each framework: OpenMP runtimes spin
while they wait for their threads, and with another process on the CPU a spinning thread waits out
whole scheduler time slices; a VM's host may also steal vCPU time.  Alternating the frameworks
does not cancel that, so a run taken on a busy machine is reported as such and its targets are not
judged.  A run is busy when either signal says so:

- the 1-minute load average before the run is above BUSY_LOAD_PER_CPU per CPU (half the CPUs
  already had work queued), or
- during the run, work other than the benchmark's own processes took more than BUSY_SHARE of the
  time of the CPUs the benchmark runs on: from /proc/stat, the busy time of those CPUs (user,
  nice, system, irq, softirq and steal: time stolen by a VM's host counts as other work) minus the
  CPU time of the driver and every process it started and waited for (getrusage).

Where neither can be measured (no /proc/stat, no load average) the run is "unknown" and its targets
are not judged either.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

BUSY_LOAD_PER_CPU = 0.5
BUSY_SHARE = 0.10
PROC_STAT = Path("/proc/stat")
# The fields of a cpuN line of /proc/stat, in order; guest time is already inside user.
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


@dataclass
class MachineLoad:
    """The load of the machine around one run, as the report and bench.json show it."""
    cpus: int                                   # os.cpu_count()
    measured_cpus: list[int] = field(default_factory=list)   # the CPUs /proc/stat was read for
    load_before: list[float] | None = None      # 1, 5 and 15-minute load averages before the run
    load_after: list[float] | None = None
    others_share: float | None = None           # share of the measured CPUs' time other work took
    seconds: float = 0.0                        # wall time the share was measured over
    busy: bool | None = None                    # None: could not be measured
    reason: str = ""                            # the figures behind `busy`, in words
    per_process: dict[str, float | None] = field(default_factory=dict)  # "r1-flowc" -> others' share meanwhile

    def describe(self) -> str:
        """One sentence for the report: the load averages, the CPU count and other work's share."""
        parts = []
        if self.load_before is not None:
            after = f", {self.load_after[0]:.2f} after it" if self.load_after else ""
            parts.append(f"Load average {self.load_before[0]:.2f} before the run{after}, on {self.cpus} CPUs")
        else:
            parts.append(f"{self.cpus} CPUs, load average unknown")
        if self.others_share is not None:
            cpus = ",".join(map(str, self.measured_cpus))
            parts.append(f"other work took {self.others_share:.0%} of CPUs {cpus} during the run")
        verdict = {True: "busy machine", False: "idle machine", None: "machine load unknown"}[self.busy]
        return "; ".join(parts) + f" ({verdict})"


def judge(cpus: int, load_before: list[float] | None, others_share: float | None) -> tuple[bool | None, str]:
    """(busy, why) from the load average before the run and other work's share during it."""
    reasons, busy = [], []
    if load_before is not None:
        limit = BUSY_LOAD_PER_CPU * cpus
        busy.append(load_before[0] > limit)
        relation = ">" if busy[-1] else "≤"
        reasons.append(f"1-minute load average before the run {load_before[0]:.2f} {relation} {limit:g} "
                       f"({BUSY_LOAD_PER_CPU:g} per CPU)")
    if others_share is not None:
        busy.append(others_share > BUSY_SHARE)
        relation = ">" if busy[-1] else "≤"
        reasons.append(f"other work's share of the benchmark CPUs during the run {others_share:.0%} {relation} "
                       f"{BUSY_SHARE:.0%}")
    if not busy:
        return None, "neither the load average nor /proc/stat could be read"
    return any(busy), "; ".join(reasons)


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, where the system has them."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_busy_seconds(cpus: list[int], stat: Path = PROC_STAT) -> float | None:
    """Seconds the given CPUs have spent busy since boot (/proc/stat), or None where unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    ticks, seen = 0, set()
    for line in lines:
        name, *values = line.split()
        if name in wanted:
            row = dict(zip(_STAT_FIELDS, map(int, values)))
            ticks += sum(row.get(f, 0) for f in _BUSY_FIELDS)
            seen.add(name)
    if seen != wanted:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU time of this process and of every child it has waited for (and theirs, recursively)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class LoadMonitor:
    """Measures the machine's load from construction to `finish()`; the benchmark's processes must
    have been waited for by then (subprocess.call / run do).

    Example:
        monitor = LoadMonitor(cpus=[0, 1])
        ...                                   # run the benchmark processes
        load = monitor.finish()               # MachineLoad; load.busy says whether to judge targets
    """

    def __init__(self, cpus: list[int] | None = None) -> None:
        self.cpus = sorted(cpus if cpus else _allowed_cpus())
        self.load_before = load_average()
        self._busy = cpu_busy_seconds(self.cpus)
        self._own = own_cpu_seconds()
        self._start = time.perf_counter()

    def others_share(self) -> float | None:
        """Other work's share of the measured CPUs' time since the monitor started."""
        busy = cpu_busy_seconds(self.cpus)
        wall = time.perf_counter() - self._start
        if busy is None or self._busy is None or wall <= 0:
            return None
        others = (busy - self._busy) - (own_cpu_seconds() - self._own)
        return min(1.0, max(0.0, others / (wall * len(self.cpus))))

    def finish(self) -> MachineLoad:
        share = self.others_share()
        cpus = os.cpu_count() or 1
        busy, reason = judge(cpus, self.load_before, share)
        return MachineLoad(cpus=cpus, measured_cpus=self.cpus, load_before=self.load_before,
                           load_after=load_average(), others_share=share,
                           seconds=round(time.perf_counter() - self._start, 1), busy=busy, reason=reason)


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def machine_load_from_json(data: dict | None) -> MachineLoad | None:
    """The MachineLoad of a bench.json "run" entry (or machine.json), or None."""
    if not data:
        return None
    known = {k: v for k, v in data.items() if k in MachineLoad.__dataclass_fields__}
    return MachineLoad(**known)
