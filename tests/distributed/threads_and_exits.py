"""Threads, session clears and exits that must end the same on 2 ranks as in one process: the
same lines printed (by the master alone), the same exit status, no hang.

    python threads_and_exits.py MODE                # one process
    mpiexec -n 2 python threads_and_exits.py MODE   # two ranks

MODE:
    clear_from_thread   a thread calls the train job while the main thread clears the session
                        (the old session's last callback keeps the clear going for a while)
    exit_handler        an exit handler registered before the first job call calls a job
    thread_then_main    the first job call comes from a thread; the main thread calls later
    two_first_calls     two threads make their first job calls at once
    exit_from_thread    the first job call comes from a thread; the script ends with sys.exit(4)
    exit_after_trace    the script traces its jobs (get_all_variables), makes no call, sys.exit(3)
"""
import atexit
import sys
import threading
import time

import numpy as np

import flow
import flow.typing as tp

MODE = sys.argv[1]
rng = np.random.RandomState(0)
X = rng.randn(8, 4).astype(np.float32)
Y = rng.randint(0, 3, 8).astype(np.int32)


def dense(x):
    return flow.layers.dense(x, 3, name="d", kernel_initializer=flow.random_normal_initializer(seed=1))


@flow.global_function(type="train")
def train(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, dense(x))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def predict(x: tp.Numpy.Placeholder((8, 4))) -> tp.Callback[tp.Numpy]:
    return dense(x)


def loss() -> float:
    return round(float(train(X, Y).mean()), 5)


if MODE == "clear_from_thread":
    print("trained", [loss() for _ in range(5)], flush=True)
    predict(X)(lambda p: time.sleep(1.0))        # the clear waits for this callback
    results = []
    thread = threading.Thread(target=lambda: (time.sleep(0.3), results.extend(loss() for _ in range(3))))
    thread.start()
    flow.clear_default_session()
    thread.join()
    print("new session, thread", results, flush=True)
    print("new session, main", [loss() for _ in range(2)], flush=True)
elif MODE == "exit_handler":
    atexit.register(lambda: print("exit handler", loss(), flush=True))
    print("script", loss(), flush=True)
elif MODE == "thread_then_main":
    first = threading.Thread(target=lambda: print("thread", loss(), flush=True))
    first.start()
    first.join()
    print("main", loss(), flush=True)
elif MODE == "two_first_calls":
    results = []
    threads = [threading.Thread(target=lambda: results.append(loss())) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print("two threads", sorted(results), flush=True)
elif MODE == "exit_from_thread":
    first = threading.Thread(target=lambda: print("thread", loss(), flush=True))
    first.start()
    first.join()
    sys.exit(4)
elif MODE == "exit_after_trace":
    print("variables", sorted(flow.get_all_variables()), flush=True)
    sys.exit(3)
else:
    raise SystemExit(f"unknown mode {MODE!r}")
