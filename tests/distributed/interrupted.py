"""A consistent-view test program for what ends a run on several ranks besides its end.

    mpiexec -n 2 python interrupted.py MODE

MODE "interrupt": the master's script raises KeyboardInterrupt after its calls (as Ctrl-C would):
every rank must end at once, not wait for the abandoned calls. MODE "fork": the master forks a child
that tries a job call (refused: the workers serve the parent, which must not lose them or see its
shares mixed with the child's) and ends; the parent then calls again. MODE "spawn": a
multiprocessing 'spawn' child runs the job alone (the whole batch in one process), and its result
equals the parent's.
"""
import multiprocessing
import os
import sys

import numpy as np

import flow
import flow.typing as tp
from flowc.compiler.errors import DistributedError

MODE = sys.argv[1]
X = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)


@flow.global_function(type="predict")
def predict_job(x: tp.Numpy.Placeholder((8, 4), dtype=flow.float)) -> tp.Numpy:
    w = flow.get_variable("w", shape=(4, 3), initializer=flow.constant_initializer(0.5))
    return flow.matmul(x, w)


def in_child(queue) -> None:
    queue.put(predict_job(X))


if __name__ == "__main__":
    first = predict_job(X)
    print(f"{MODE}: first call", flush=True)
    if MODE == "interrupt":
        predict_job(X)
        raise KeyboardInterrupt
    if MODE == "fork":
        pid = os.fork()
        if pid == 0:
            try:
                predict_job(X)
                print("fork: the child's call ran", flush=True)
            except DistributedError as err:
                print(f"fork: refused in the child: {err}", flush=True)
            sys.stdout.flush()
            os._exit(0)          # MPI's own exit handler would wait in the child (docs/distributed.md)
        os.waitpid(pid, 0)
        np.testing.assert_array_equal(predict_job(X), first)
    if MODE == "spawn":
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=in_child, args=(queue,))
        child.start()
        np.testing.assert_allclose(queue.get(timeout=120), first, rtol=1e-6)
        child.join()
        assert child.exitcode == 0, child.exitcode
    print(f"{MODE}: done", flush=True)
