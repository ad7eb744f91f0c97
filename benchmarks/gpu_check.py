"""The GPU run book (issue 16): run first whenever a machine with an NVIDIA GPU is available.

`benchmarks/gpu_check.sh` sets up PyCUDA (from the GPU kit, /work/shared/gpu, where it is not
installed) and runs this module, which prints one verdict per line:

    PASS        the check ran on a GPU and held
    FAIL        the check ran and did not hold (the script exits 1)
    SKIP        the check could not run here; the line says why (no usable GPU, a tool missing)
    UNVERIFIED  --fake-driver: the bookkeeping fake of tests/fake_cuda_driver.py stands in for the
                driver, so nothing that needs a GPU can pass; the line names what would have run

A check that needs no GPU (building the step libraries ahead of time with nvcc) runs everywhere.

    python -m benchmarks.gpu_check [--fake-driver] [--only NAME,...] [--list]
    python -m benchmarks.gpu_check --list          # the checks, one per line, and what each runs
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
VERDICTS = ("PASS", "FAIL", "SKIP", "UNVERIFIED")
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TIMEOUT = int(os.environ.get("FLOWC_GPU_CHECK_TIMEOUT", "1800"))     # seconds per command


@dataclass
class Context:
    """What every check may use: the machine's answer, a scratch folder, the environment for children."""
    fake: bool
    usable: bool
    why: str
    work: Path
    env: dict[str, str]
    arch: str = "sm_90"
    notes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    needs_gpu: bool
    what: str                                   # the run book's words for it
    run: Callable[[Context], tuple[str, str]]   # -> (verdict, detail)


def _run(argv: list[str], ctx: Context, env: dict[str, str] | None = None,
         timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env or ctx.env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(argv, 124, e.stdout or "", f"timed out after {timeout} s")


def _tail(proc: subprocess.CompletedProcess, lines: int = 1) -> str:
    text = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    return " | ".join(ln if len(ln) <= 160 else ln[:157] + "..." for ln in text[-lines:])


def _pytest(ctx: Context, *args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """pytest on the GPU with FLOWC_REQUIRE_GPU=1: PASS only when it passes with nothing skipped."""
    child = dict(env or ctx.env, FLOWC_REQUIRE_GPU="1")
    proc = _run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args], ctx, child)
    summary = _tail(proc)
    if proc.returncode == 0 and "skipped" not in summary and "passed" in summary:
        return "PASS", summary
    return "FAIL", summary


# --- the checks ------------------------------------------------------------------------------------------

def environment(ctx: Context) -> tuple[str, str]:
    smi = shutil.which("nvidia-smi")
    driver = "no nvidia-smi"
    if smi:
        proc = _run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], ctx, timeout=60)
        driver = proc.stdout.strip().replace("\n", "; ") or _tail(proc)
    try:
        from flowc.compiler.cuda_toolchain import nvcc_version
        nvcc = nvcc_version()
    except Exception as e:       # ToolchainError: no nvcc
        nvcc = f"no nvcc ({e})"
    try:
        import pycuda
        import pycuda.driver as drv
        built = ".".join(map(str, drv.get_version())) if hasattr(drv, "get_version") else "?"
        pyc = f"PyCUDA {getattr(pycuda, 'VERSION_TEXT', '?')} built for CUDA {built}"
    except Exception as e:
        pyc = f"no PyCUDA ({type(e).__name__}: {e})"
    detail = f"GPU/driver: {driver}; nvcc: {nvcc}; {pyc}; gpu_status: {ctx.why}"
    if ctx.fake:
        return "UNVERIFIED", "fake driver: " + detail
    if ctx.usable:
        return "PASS", detail
    listed = bool(smi) and "GPU" in _run([smi, "-L"], ctx, timeout=60).stdout
    return ("FAIL" if listed else "SKIP"), detail      # a GPU that nvidia-smi lists must be usable


def aot_build(ctx: Context) -> tuple[str, str]:
    """`flowc compile --device gpu --arch ...` on the seeds into a fresh cache: nvcc alone, no GPU."""
    from flowc.compiler.cuda_toolchain import find_nvcc
    from flowc.compiler.toolchain import ToolchainError
    try:
        find_nvcc()
    except ToolchainError as e:
        return "SKIP", f"no nvcc here to build with: {e}"
    cache = ctx.work / "aot-cache"
    shutil.rmtree(cache, ignore_errors=True)
    built = []
    for seed in ("synchronize_single_job", "synchronize_batch_job"):
        proc = _run([sys.executable, "-m", "flowc", "compile", f"examples/seeds/{seed}.py", "--device", "gpu",
                     "--arch", ctx.arch, "--cache-dir", str(cache)], ctx)
        if proc.returncode != 0:
            return "FAIL", f"flowc compile {seed}: {_tail(proc, 3)}"
        built.append(seed)
    libraries = sorted(cache.rglob("step.so"))
    if not libraries:
        return "FAIL", f"no step library (step.so) in {cache}: the jobs would launch from Python"
    commands = [json.loads(m.read_text()).get("parts", {}).get("command", "") for m in cache.rglob("meta.json")]
    absolute = [c for c in commands if re.search(r"(^|\s|-I|=)/", c)]
    if absolute:
        return "FAIL", f"a cache key holds an absolute path: {absolute[0][:200]}"
    ctx.notes["aot-cache"] = str(cache)
    return "PASS", f"{len(libraries)} step libraries for {ctx.arch} in {cache}, keys free of paths"


def aot_run(ctx: Context, hide_nvcc: bool) -> tuple[str, str]:
    """The AOT cache copied, then the seed's job run from the copy: zero compilations."""
    if "aot-cache" not in ctx.notes:          # --only aot-run: build the cache first
        verdict, detail = aot_build(ctx)
        if verdict != "PASS":
            return "FAIL", f"no AOT cache to copy: aot-build {verdict}: {detail}"
    copy = ctx.work / ("aot-copy-no-nvcc" if hide_nvcc else "aot-copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ctx.notes["aot-cache"], copy)
    env = dict(ctx.env, FLOWC_CACHE_DIR=str(copy), FLOWC_DEBUG="1", FLOWC_STRICT_DEVICE="1")
    if hide_nvcc:
        env["NVCC"] = str(ctx.work / "no-such-nvcc")
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not (Path(p) / "nvcc").exists())
    proc = _run([sys.executable, "-m", "benchmarks.gpu_steps", "--one-step", "lenet"], ctx, env)
    compiled = [ln for ln in proc.stderr.splitlines() if "compiling" in ln]
    if proc.returncode != 0:
        return "FAIL", _tail(proc, 2)
    if compiled:
        return "FAIL", f"{len(compiled)} compilation(s) from a copied cache: {compiled[0][:200]}"
    return "PASS", "ran on the GPU from the copied cache with zero compilations" + (" and no nvcc" if hide_nvcc else "")


def device_tests(ctx: Context) -> tuple[str, str]:
    return _pytest(ctx, "tests/test_cuda_device.py", "tests/test_cuda_host_step.py", "-m", "gpu")


def sanitizer(tool: str) -> Callable[[Context], tuple[str, str]]:
    def run(ctx: Context) -> tuple[str, str]:
        exe = shutil.which("compute-sanitizer") or next(
            (str(p) for p in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer",
                              Path("/usr/local/cuda/compute-sanitizer/compute-sanitizer")) if p.is_file()), None)
        if exe is None:
            return "SKIP", "compute-sanitizer not found (it ships with the CUDA toolkit)"
        base = [exe, "--tool", tool, "--error-exitcode", "86", "--print-limit", "20", sys.executable]
        runs = [base + ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_cuda_device.py",
                        "-k", "every_op_and_its_gradient"]] + \
               [base + ["-m", "benchmarks.gpu_steps", "--one-step", m] for m in ("mlp", "lenet")]
        for argv in runs:
            proc = _run(argv, ctx)
            if proc.returncode != 0:
                return "FAIL", f"{' '.join(argv[6:])}: {_tail(proc, 3)}"
        return "PASS", "op tests, one MLP and one LeNet train step: no error reported"
    return run


def nccl_one_rank(ctx: Context) -> tuple[str, str]:
    """The NCCL engine on this GPU, one rank (NCCL refuses two ranks on one GPU): SKIP without NCCL."""
    import ctypes.util
    from flowc.runtime.nccl import SYSTEM_LIBRARY, find_nccl
    if find_nccl() == SYSTEM_LIBRARY and ctypes.util.find_library("nccl") is None:
        return "SKIP", "no NCCL here (pip install 'flowc[nccl]', or FLOWC_NCCL=/path/to/libnccl.so.2)"
    proc = _run([sys.executable, "tests/distributed/nccl_gpu_one_rank.py"], ctx)
    return ("PASS" if proc.returncode == 0 and proc.stdout.strip().endswith("ok") else "FAIL"), _tail(proc, 2)


def run_book_tests(selection: str) -> Callable[[Context], tuple[str, str]]:
    return lambda ctx: _pytest(ctx, "tests/test_gpu_run_book.py", "-k", selection)


def seeds(ctx: Context) -> tuple[str, str]:
    env = dict(ctx.env, FLOWC_STRICT_DEVICE="1")
    for path in sorted((ROOT / "examples" / "seeds").glob("*.py")):
        proc = _run([sys.executable, str(path.relative_to(ROOT))], ctx, env)
        noisy = [ln for ln in proc.stderr.splitlines() if "PyCUDA" in ln or "Warning" in ln]
        if proc.returncode != 0:
            return "FAIL", f"{path.name}: {_tail(proc, 2)}"
        if noisy:
            return "FAIL", f"{path.name} wrote to stderr: {noisy[0][:200]}"
    return "PASS", "every seed ran as a subprocess with nothing of PyCUDA's on stderr"


def bench(tf32: bool) -> Callable[[Context], tuple[str, str]]:
    def run(ctx: Context) -> tuple[str, str]:
        out = ctx.work / f"gpu_steps{'_tf32' if tf32 else ''}.json"
        proc = _run([sys.executable, "-m", "benchmarks.gpu_steps", "--json", str(out)] + (["--tf32"] if tf32 else []),
                    ctx)
        print(proc.stdout.rstrip(), file=sys.stderr)      # the table, for the closing note
        if proc.returncode != 0:
            return "FAIL", _tail(proc, 2)
        rows = json.loads(out.read_text())
        got = {(r["model"], r["framework"]): r.get("steps_per_s") for r in rows}
        ratios = [f"{m} flowc/torch {got[(m, 'flowc')] / got[(m, 'torch')]:.2f}x"
                  for m in ("mlp", "lenet") if got.get((m, "flowc")) and got.get((m, "torch"))]
        return "PASS", ", ".join(ratios) or "flowc measured; no PyTorch with CUDA to compare with"
    return run


CHECKS: list[Check] = [
    Check("environment", False, "driver, nvcc, PyCUDA build, gpu_status()", environment),
    Check("aot-build", False, "flowc compile --device gpu --arch sm_XX of the seeds (nvcc only)", aot_build),
    Check("device-tests", True, "pytest tests/test_cuda_device.py (+ host step) -m gpu, 0 skipped", device_tests),
    *[Check(f"sanitizer-{t}", True, f"compute-sanitizer --tool {t} over the op tests, an MLP and a LeNet step",
            sanitizer(t)) for t in SANITIZER_TOOLS],
    Check("nccl-one-rank", True, "the NCCL engine's bucket, exchanges and settle on this GPU, one rank",
          nccl_one_rank),
    Check("lenet-vs-reference", True, "LeNet one step at batch 100: float64 1e-10, float32 1e-4",
          run_book_tests("lenet_one_step")),
    Check("bitwise-repeat", True, "bitwise-equal losses over two runs", run_book_tests("bitwise")),
    Check("large-sizes", True, "2^24+ pointwise, >65,535-row reduction, a 2^30+ tensor", run_book_tests("large")),
    Check("mixed-and-leaks", True, "mixed GPU/CPU session; memory flat over worker-thread sessions",
          run_book_tests("mixed_session or thread_leak")),
    Check("seeds", True, "the seeds as subprocesses, no PyCUDA warnings on stderr", seeds),
    Check("aot-run", True, "the AOT cache copied: zero compilations", lambda ctx: aot_run(ctx, hide_nvcc=False)),
    Check("aot-run-no-nvcc", True, "the AOT cache on a machine without nvcc: zero compilations",
          lambda ctx: aot_run(ctx, hide_nvcc=True)),
    Check("bench-fp32", True, "train steps/s vs PyTorch on the same GPU (cuDNN on)", bench(tf32=False)),
    Check("bench-tf32", True, "the same with FLOWC_TF32=1 and PyTorch's TF32", bench(tf32=True)),
]


def install_fake_driver() -> None:
    """tests/fake_cuda_driver.py's bookkeeping driver as `pycuda.driver` (CUDA 13.0, an sm_90 'GPU')."""
    import importlib.machinery
    import types

    from tests.fake_cuda_driver import FakeDriver
    driver = FakeDriver()
    package = types.ModuleType("pycuda")
    package.__spec__ = importlib.machinery.ModuleSpec("pycuda", None)
    package.driver = driver          # type: ignore[attr-defined]
    sys.modules["pycuda"], sys.modules["pycuda.driver"] = package, driver


def verdict_line(verdict: str, name: str, detail: str) -> str:
    assert verdict in VERDICTS, verdict
    return f"{verdict:<10} {name:<20} {detail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake-driver", action="store_true",
                        help="stand tests/fake_cuda_driver.py in for the driver: every GPU line is UNVERIFIED")
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    args = parser.parse_args(argv)
    if args.list:
        for c in CHECKS:
            print(f"{c.name:<20} {'GPU' if c.needs_gpu else '   '}  {c.what}")
        return 0
    chosen = [c for c in CHECKS if not args.only or c.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {c.name for c in CHECKS}
    if unknown:
        parser.error(f"unknown check(s) {sorted(unknown)}; --list shows them")
    if args.fake_driver:
        install_fake_driver()
    from flowc.runtime.devices import gpu_status
    usable, why = gpu_status()
    work = args.work or Path(tempfile.mkdtemp(prefix="flowc-gpu-check-"))
    ctx = Context(fake=args.fake_driver, usable=usable and not args.fake_driver, why=why, work=work,
                  env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if ctx.usable:
        from flowc.compiler.cuda_toolchain import device_arch
        ctx.arch = device_arch()
    failed = 0
    for check in chosen:
        if check.needs_gpu and ctx.fake:
            verdict, detail = "UNVERIFIED", f"fake driver ({why}): needs a GPU; would run: {check.what}"
        elif check.needs_gpu and not ctx.usable:
            verdict, detail = "SKIP", f"no usable GPU: {why}; would run: {check.what}"
        else:
            try:
                verdict, detail = check.run(ctx)
            except Exception as e:        # a broken check is a failure of the run book, with its reason
                verdict, detail = "FAIL", f"{type(e).__name__}: {e}"
        failed += verdict == "FAIL"
        print(verdict_line(verdict, check.name, detail), flush=True)
    if args.work is None:            # our own temporary folder (0700, mkdtemp): kept only to look into a failure
        if failed:
            print(f"work folder kept for the failures above: {work}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
