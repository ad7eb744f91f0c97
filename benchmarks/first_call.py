"""One fresh process, one first call: how long a framework takes from the first call of a step to
its result (trace + compile + run), with whatever compile cache the environment points it to.

    python -m benchmarks.first_call --framework flowc --workload mlp_train

Prints one JSON line: first_call_s, second_call_s (the step once compiled), setup_s (imports and
building the model or job, not timed as part of the first call) and compilations (where the
framework counts them; flowc: builds that missed the cache).  test_bench_first_call.py runs it.
"""
from __future__ import annotations

import argparse
import json
import time

from benchmarks.threads import DEFAULT_THREADS, pin


def measure(framework: str, workload: str, threads: int) -> dict[str, object]:
    started = time.perf_counter()
    from benchmarks.peers import load       # imports NumPy: after pin()
    from benchmarks.workloads import STEP_WORKLOADS, batch_for
    peer = load(framework)
    peer.configure(threads)
    images, labels = batch_for(workload)
    step = peer.build(STEP_WORKLOADS[workload], images, labels)
    ready = time.perf_counter()
    step()
    first = time.perf_counter()
    step()
    second = time.perf_counter()
    return {"framework": framework, "workload": workload, "setup_s": ready - started,
            "first_call_s": first - ready, "second_call_s": second - first, "compilations": peer.compilations()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    args = parser.parse_args(argv)
    pin(args.threads)
    print(json.dumps(measure(args.framework, args.workload, args.threads)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
