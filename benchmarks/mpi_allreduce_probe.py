"""Measure MPI all-reduce on this machine and fit the scaling model's alpha and beta to it.

    mpiexec -n 2 python -m benchmarks.mpi_allreduce_probe                     # table + fit on stdout
    mpiexec -n 2 python -m benchmarks.mpi_allreduce_probe --json probe.json   # and as JSON
    mpiexec -n 2 python -m benchmarks.mpi_allreduce_probe --buckets 524288,262144,1024

For float32 messages from 4 B to 64 MB (every power of 4), it times `Allreduce` (blocking) and
`Iallreduce` + `Wait` (what the data-parallel step issues): all ranks enter each call together (a
barrier first), a call's time is the slowest rank's, and a size's time is the fastest of its calls:
the time without interference from other work on a shared machine (the medians are in the JSON too).
It then fits t = 2(p-1) alpha + 2(p-1)/p S / beta (the ring model of benchmarks/scaling_model.py) by
least squares on relative error, so that the small messages (latency) weigh as much as the large
ones (bandwidth).  With `--buckets`, it also times one step's worth of non-blocking all-reduces of
those sizes (all started, then all awaited, in order, as the data-parallel runtime does) and prints the
model's prediction for them next to it.  Rank 0 prints and writes; the others only take part.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Sequence

SIZES = [4 ** k for k in range(1, 14)]          # 4 B .. 64 MiB
MIN_SECONDS = 0.05                               # time per size at least (and at least MIN_CALLS calls)
MIN_CALLS, MAX_CALLS = 5, 1000


def _timed(comm: Any, call: Callable[[], None], calls: int) -> list[float]:
    """Per-call times (the slowest rank's) of `calls` calls, each entered together after a barrier."""
    from mpi4py import MPI
    out = []
    for _ in range(calls):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        out.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return out


def _best_and_median(comm: Any, call: Callable[[], None]) -> tuple[float, float]:
    """The fastest and the median call time, over enough calls to fill MIN_SECONDS."""
    first = _timed(comm, call, MIN_CALLS)
    calls = int(min(MAX_CALLS, max(0.0, MIN_SECONDS / max(min(first), 1e-9) - MIN_CALLS)))
    calls = comm.bcast(calls, root=0)
    times = first + _timed(comm, call, calls)
    return min(times), statistics.median(times)


def fit_alpha_beta(p: int, sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """alpha (s per ring step) and beta (bytes/s) of t = 2(p-1) alpha + 2(p-1)/p S / beta, by least
    squares on the relative error (each equation divided by its measured time).

    Example:
        fit_alpha_beta(2, [4, 4e6], [2e-6 + 4 / 5e9, 2e-6 + 4e6 / 5e9])     # (1e-06, 5e9)
    """
    if p < 2:
        raise ValueError(f"p: a fit needs at least 2 ranks, got {p}")
    a_col = [2.0 * (p - 1) / t for t in seconds]                    # coefficient of alpha
    b_col = [2.0 * (p - 1) / p * s / t for s, t in zip(sizes, seconds)]  # coefficient of 1/beta
    ones = [1.0] * len(seconds)
    # normal equations of the 2x2 least-squares problem [a b] [alpha, 1/beta]^T = 1
    aa = sum(x * x for x in a_col)
    ab = sum(x * y for x, y in zip(a_col, b_col))
    bb = sum(y * y for y in b_col)
    a1 = sum(x * o for x, o in zip(a_col, ones))
    b1 = sum(y * o for y, o in zip(b_col, ones))
    det = aa * bb - ab * ab
    if det == 0:
        raise ValueError("fit_alpha_beta: the sizes must differ")
    alpha = (a1 * bb - b1 * ab) / det
    inv_beta = (aa * b1 - ab * a1) / det
    if inv_beta <= 0:
        raise ValueError(f"fit_alpha_beta: the times do not grow with the size (1/beta = {inv_beta})")
    return max(alpha, 0.0), 1.0 / inv_beta


def measure(comm: Any, sizes: Sequence[int]) -> dict[str, dict[int, tuple[float, float]]]:
    """{"blocking"|"nonblocking": {bytes: (fastest, median) seconds}} for float32 messages of these sizes."""
    import numpy as np
    out: dict[str, dict[int, tuple[float, float]]] = {"blocking": {}, "nonblocking": {}}
    for size in sizes:
        send = np.ones(size // 4, np.float32)
        recv = np.empty_like(send)
        out["blocking"][size] = _best_and_median(comm, lambda s=send, r=recv: comm.Allreduce(s, r))
        out["nonblocking"][size] = _best_and_median(comm, lambda s=send, r=recv: comm.Iallreduce(s, r).Wait())
    return out


def measure_buckets(comm: Any, sizes: Sequence[int]) -> tuple[float, float]:
    """(Fastest, median) time of one step's all-reduces: Iallreduce of every bucket, then Wait on each
    in order."""
    import numpy as np
    bufs = [(np.ones(max(s // 4, 1), np.float32), np.empty(max(s // 4, 1), np.float32)) for s in sizes]

    def step() -> None:
        for request in [comm.Iallreduce(s, r) for s, r in bufs]:
            request.Wait()

    return _best_and_median(comm, step)


def probe(comm: Any, sizes: Sequence[int] = SIZES, buckets: Sequence[int] = ()) -> dict:
    """Everything the probe measures and fits, as a JSON-ready dict (the same on every rank)."""
    from benchmarks.scaling_model import predict_comm_seconds
    p = comm.Get_size()
    times = measure(comm, sizes)
    result: dict[str, Any] = {"ranks": p, "sizes": list(sizes), "fits": {}}
    for kind, by_size in times.items():
        best = {s: t[0] for s, t in by_size.items()}
        alpha, beta = fit_alpha_beta(p, list(best), list(best.values()))
        result[kind] = {str(s): t for s, t in best.items()}
        result[kind + "_median"] = {str(s): t[1] for s, t in by_size.items()}
        result["fits"][kind] = {"alpha": alpha, "beta": beta}
    if buckets:
        fit = result["fits"]["nonblocking"]
        best_step, median_step = measure_buckets(comm, buckets)
        result["buckets"] = {"sizes": list(buckets), "measured": best_step, "measured_median": median_step,
                             "predicted": predict_comm_seconds(buckets, p, fit["alpha"], fit["beta"])}
    return result


def _format(result: dict) -> str:
    lines = [f"MPI all-reduce on {result['ranks']} ranks (float32; fastest call; slowest rank)",
             f"{'bytes':>10} {'blocking (us)':>14} {'Iallreduce+Wait (us)':>21}"]
    for s in result["sizes"]:
        lines.append(f"{s:>10} {result['blocking'][str(s)] * 1e6:>14.1f} {result['nonblocking'][str(s)] * 1e6:>21.1f}")
    for kind, fit in result["fits"].items():
        lines.append(f"fit ({kind}): alpha = {fit['alpha'] * 1e6:.2f} us per step, beta = {fit['beta'] / 1e9:.2f} GB/s")
    if "buckets" in result:
        b = result["buckets"]
        lines.append(f"buckets {b['sizes']}: measured {b['measured'] * 1e3:.3f} ms, "
                     f"model {b['predicted'] * 1e3:.3f} ms (ratio {b['measured'] / b['predicted']:.2f})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from mpi4py import MPI
    parser = argparse.ArgumentParser(description="Fit the all-reduce cost model's alpha and beta to MPI here.")
    parser.add_argument("--json", metavar="PATH", help="also write the measurements and fits as JSON")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest message (default 64 MiB)")
    parser.add_argument("--buckets", default="", help="comma-separated bucket sizes in bytes to time as one step")
    args = parser.parse_args(argv)
    try:
        buckets = [int(b) for b in args.buckets.split(",") if b]
    except ValueError:
        parser.error(f"--buckets: expected comma-separated integers, got {args.buckets!r}")
    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        parser.error("run it under mpiexec with at least 2 ranks: "
                     "mpiexec -n 2 python -m benchmarks.mpi_allreduce_probe")
    result = probe(comm, [s for s in SIZES if s <= args.max_bytes], buckets)
    if comm.Get_rank() == 0:
        print(_format(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
