"""How much CPU a worker spends while the master's script does something else between two job
calls (loads data, evaluates, pauses): it should wait for the next step, not spin on a core.

    mpiexec -n 2 python idle_worker.py SECONDS

The master prints the worker's CPU seconds over SECONDS of its own sleep (from /proc: both ranks
run on this host), then calls the job again to show the worker still answers.
"""
import os
import sys
import time

import numpy as np

import flow
import flow.typing as tp
from flowc.runtime.session import default_session

SECONDS = float(sys.argv[1])


@flow.global_function()
def double(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    return x * 2.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")     # utime + stime


x = np.arange(12, dtype=np.float32).reshape(4, 3)
assert (double(x) == 2 * x).all()
worker = default_session().cluster.peers[1][1]
before = cpu_seconds(worker)
time.sleep(SECONDS)
used = cpu_seconds(worker) - before
assert (double(x) == 2 * x).all()
print(f"worker cpu {used:.3f} s in {SECONDS:g} s", flush=True)
