"""`make bench`: each framework in its own pytest process, rounds alternating A B A B, then the report.

    python -m benchmarks.run_bench                        # 3 rounds of every installed framework
    python -m benchmarks.run_bench --rounds 1 --frameworks flowc,torch_eager
    python -m benchmarks.run_bench --readme               # and put the run into README.md's Speed section

Writes under benchmarks/results/: raw/ (one pytest-benchmark JSON per process), logs/ (each
process's output), bench.json (all of it merged, with the summary), bench.md and bench.png, and
run.json (what the raw files do not say: the machine's load, the environment, the code measured).
The load is measured around the whole run (benchmarks/machine.py); on a busy machine the report
says so and judges no target.
Compile caches of the steps/s processes live in results/cache/, apart from the user's; the
first-call benchmarks make their own empty ones.  They fill the warm cache by running the job
in an earlier process; `flowc compile MODULE.py` fills the same entries and can take its place.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.machine import LoadMonitor, load_average
from benchmarks.peers import FRAMEWORKS, unavailable
from benchmarks.readme import update_readme
from benchmarks.report import load_runs, write_report
from benchmarks.report_md import RunInfo
from benchmarks.threads import DEFAULT_THREADS, pinned_cpus, thread_env
from benchmarks.workloads import SGEMM_SIZE

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
TEST_FILES = ("benchmarks/test_bench_steps.py", "benchmarks/test_bench_async.py", "benchmarks/test_bench_overhead.py",
              "benchmarks/test_bench_export.py")
FIRST_CALL_FILE = "benchmarks/test_bench_first_call.py"
PYTEST_NO_TESTS = 5         # pytest's exit code when everything was deselected or skipped


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every framework (default 3)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated, in the order each round runs them (default {','.join(FRAMEWORKS)})")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="threads for every framework")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="time budget of each steps/s benchmark")
    # torch.compile's cold first call costs 20-35 s per model on 2 cores, so by default only the first
    # round measures first calls; raise these on a machine with time to spare.
    parser.add_argument("--latency-rounds", type=int, default=1,
                        help="how many rounds, from the first, include the first-call benchmarks (0: none)")
    parser.add_argument("--latency-repeats", type=int, default=1, help="fresh processes per first-call benchmark")
    parser.add_argument("--omp-wait-policy", choices=["active", "passive"],
                        help="OMP_WAIT_POLICY for every framework; passive keeps OpenMP runtimes from spinning "
                             "on a machine shared with other work (default: each runtime's own default)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip the data-parallel scaling row (flowc on 1 and 2 MPI ranks: benchmarks/scaling.py)")
    parser.add_argument("--readme", action="store_true",
                        help="rewrite the run section of README.md's Speed section (between its bench markers) "
                             "with this run")
    return parser.parse_args(argv)


def shared_env(args: argparse.Namespace) -> dict[str, str]:
    """Settings every framework's process gets, as shown in the report."""
    env = thread_env(args.threads)
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    return env


def child_env(args: argparse.Namespace) -> dict[str, str]:
    cache = args.out / "cache"
    return {**os.environ, **shared_env(args),
            "FLOWC_CACHE_DIR": str(cache / "flowc"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor")}


def pytest_command(args: argparse.Namespace, framework: str, round_no: int, json_path: Path) -> list[str]:
    files = list(TEST_FILES) + ([FIRST_CALL_FILE] if round_no < args.latency_rounds else [])
    return [sys.executable, "-m", "pytest", *files, "-q", "-rs", "-p", "no:cacheprovider",
            "-W", "ignore::DeprecationWarning", "--benchmark-only", "--benchmark-disable-gc",
            f"--benchmark-json={json_path}", f"--framework={framework}", f"--bench-round={round_no}",
            f"--threads={args.threads}", f"--step-seconds={args.step_seconds}",
            f"--latency-repeats={args.latency_repeats}"]


def run_one(args: argparse.Namespace, framework: str, round_no: int) -> tuple[Path, bool, float | None]:
    """Benchmark `framework` in a fresh process; return its JSON path, whether it passed, and the
    share of the benchmark CPUs' time other work took meanwhile (None where unmeasurable)."""
    name = f"r{round_no + 1}-{framework}"
    json_path, log_path = args.out / "raw" / f"{name}.json", args.out / "logs" / f"{name}.log"
    monitor = LoadMonitor(pinned_cpus(args.threads))
    start = time.perf_counter()
    with log_path.open("w") as log:
        code = subprocess.call(pytest_command(args, framework, round_no, json_path), cwd=REPO,
                               env=child_env(args), stdout=log, stderr=subprocess.STDOUT)
    ok = code in (0, PYTEST_NO_TESTS)
    status = "ok" if ok else f"FAILED (exit {code}), see {log_path}"
    share = monitor.others_share()
    others = "?" if share is None else f"{share:.0%}"
    load = "?" if monitor.load_before is None else f"{monitor.load_before[0]:.1f}"
    print(f"  round {round_no + 1}/{args.rounds}  {framework:<14} {time.perf_counter() - start:6.1f} s  "
          f"(load before {load}, other work {others} of the CPUs)  {status}", flush=True)
    if not ok:
        print("\n".join(log_path.read_text().splitlines()[-15:]), flush=True)
    return json_path, ok, share


def run_scaling(args: argparse.Namespace, frameworks: list[str]) -> list[dict] | None:
    """The scaling row (benchmarks/scaling.py): [] when skipped (said why), None when it failed."""
    if args.no_scaling or "flowc" not in frameworks:
        return []
    from benchmarks.scaling import find_mpiexec, scaling_rows
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("skipping the scaling row: mpi4py is not installed (pip install 'flowc[distributed]')")
        return []
    if find_mpiexec() is None:
        print("skipping the scaling row: no mpiexec (pip install 'flowc[distributed]')")
        return []
    print("scaling: flowc's train jobs on 1 rank and on 2 MPI ranks, one thread each", flush=True)
    try:
        return scaling_rows(seconds=max(2.0, 2 * args.step_seconds), rounds=min(args.rounds, 2),
                            progress=lambda line: print(line, flush=True))
    except RuntimeError as err:
        print(f"scaling FAILED: {err}", flush=True)
        return None


def busy_machine_warning(load: list[float] | None, args: argparse.Namespace) -> str:
    """A warning, printed before the run, when other work kept the machine's CPUs busy.

    OpenMP runtimes spin while they wait for their threads; with another process on the CPU a
    spinning thread waits out whole scheduler time slices, which turns a 2 ms step into a 50 ms
    one, differently for each framework, and no alternation cancels that.  The report then marks
    the run as taken on a busy machine (benchmarks/machine.py) whatever the wait policy.
    """
    cpus = os.cpu_count() or 1
    if load is None or load[0] <= 0.5 * cpus:
        return ""
    advice = "" if args.omp_wait_policy == "passive" else ", or with --omp-wait-policy passive"
    return (f"the machine was busy before the run (load average {load[0]:.2f} on {cpus} CPUs), so OpenMP "
            f"threads that spin-wait lose scheduler time slices; rerun on an idle machine{advice}; "
            "the report will not judge the targets.")


def code_commit() -> str:
    """The checkout's commit (short hash, "-dirty" with uncommitted changes), or "" outside git."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    missing = {f: why for f in wanted if (why := unavailable(f))}
    frameworks = [f for f in wanted if f not in missing]
    for sub in ("raw", "logs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    for old in (args.out / "raw").glob("*.json"):      # the report merges this run only
        old.unlink()
    for framework, why in missing.items():
        print(f"skipping {framework}: {why}")

    warning = busy_machine_warning(load_average(), args)
    if warning:
        print(f"warning: {warning}")
    monitor = LoadMonitor(pinned_cpus(args.threads))
    start = time.perf_counter()
    print(f"benchmarking {', '.join(frameworks)}: {args.rounds} round(s), {args.threads} threads each", flush=True)
    results = [run_one(args, f, r) for r in range(args.rounds) for f in frameworks]
    failed = [p.stem for p, ok, _ in results if not ok]
    scaling = run_scaling(args, frameworks)
    if scaling is None:
        failed.append("scaling")

    environment = shared_env(args)
    cpus = pinned_cpus(args.threads)
    if cpus:
        environment["CPUs"] = ",".join(map(str, cpus))
    machine_load = monitor.finish()
    machine_load.per_process = {p.stem: None if share is None else round(share, 3) for p, _, share in results}
    info = RunInfo(threads=args.threads, sgemm_size=SGEMM_SIZE, missing=missing, environment=environment,
                   machine_load=machine_load, commit=code_commit(), warning=warning, scaling=scaling or [])
    markdown, notes = write_report(load_runs([p for p, _, _ in results if p.exists()]), args.out, info)
    (args.out / "run.json").write_text(json.dumps(asdict(info), indent=1))     # with the date write_report found
    print("\n" + markdown)
    print("\n".join(notes))
    if args.readme:
        print(update_readme(args.out / "bench.json", REPO / "README.md"))
    print(f"total {time.perf_counter() - start:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
