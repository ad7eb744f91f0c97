"""Issue 15's peer of `figures.py`: torch.compile's compile time for the model zoo's train steps.

    python examples/models/torch_compile_figures.py                    # bert:base resnet:resnet50 ...
    python examples/models/torch_compile_figures.py dcgan:tiny --timeout 300

The networks are examples/models/torch_models.py's (ResNet: benchmarks/peers/torch_resnet.py's) under
`torch.compile` (default mode: TorchDynamo, AOTAutograd for the backward, Inductor's C++/OpenMP code),
the optimizer steps eager, as the benchmark's torch.compile peers run them.  Each model runs in a
fresh process with an empty Inductor cache (TORCHINDUCTOR_CACHE_DIR in a new temporary folder), 2
threads, and TORCHINDUCTOR_COMPILE_THREADS=1 so that the C++ compilers are the process's own children
(their CPU time is counted: no worker pool).  "cold" = the first train step there (trace, AOTAutograd,
Inductor, g++, then the step itself); "warm" = the first step of a second process on the cache the
first one filled (Dynamo traces again; the FX-graph and AOTAutograd caches give the compiled code);
"step" = the fastest of the next steps, so `cold - step` is what compiling took.  CPU s = CPU time of
the process and the compilers it ran, over the first step.  Kernels: the calls the compiled graphs'
wrapper code (Inductor's output modules in the cache) makes, once per graph, summed over the graphs
(forward, backward, any graph after a break or a recompilation): Inductor's generated C++ kernels
(`cpp_fused_*`) and library kernels (GEMMs, convolutions, random numbers: `extern_kernels.*`,
`aten.*`, `torch.ops.*`).  flowc's `figures.py` counts the kernels its step calls the same way.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = ["bert:base", "resnet:resnet50", "wide_and_deep:large", "dcgan:mnist"]
THREADS = "2"
STEADY_STEPS = 2

# A line of a wrapper's `call` that runs a kernel: a generated one (`cpp_fused_...(`) or a library one
# (`extern_kernels.mm(`, `torch.ops.mkldnn._convolution_pointwise.default(`, `aten.convolution_backward.default(`).
_GENERATED_CALL = re.compile(r"^\s+cpp_fused_\w+\(", re.MULTILINE)
_LIBRARY_CALL = re.compile(r"^\s+(?:\w+\s*=\s*)?(?:extern_kernels\.\w+|torch\.ops\.[\w.]+|aten\.[\w.]+)\(",
                           re.MULTILINE)


def wrapper_calls(source: str) -> tuple[int, int]:
    """(generated kernel calls, library kernel calls) in one Inductor output module's source.

    Example:
        wrapper_calls("def call(args):\\n    cpp_fused_add_0(buf0)\\n    extern_kernels.mm(a, b, out=c)\\n")
        == (1, 1)
    """
    if "def call(" not in source:
        return 0, 0
    body = source[source.index("def call("):]
    return len(_GENERATED_CALL.findall(body)), len(_LIBRARY_CALL.findall(body))


def cache_calls(cache_dir: str) -> tuple[int, int]:
    """`wrapper_calls` summed over the output modules Inductor wrote under `cache_dir`."""
    generated = library = 0
    for path in glob.glob(os.path.join(cache_dir, "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8", errors="replace") as f:
            g, lib = wrapper_calls(f.read())
        generated, library = generated + g, library + lib
    return generated, library


def _cpu_seconds() -> float:
    """CPU time of this process and the compilers it waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(target: str) -> dict:
    """Build `target`'s ("model:config") compiled train step in this process and time its first steps."""
    import torch
    torch.set_num_threads(int(THREADS))
    from torch._dynamo.utils import counters
    sys.path.insert(0, HERE)
    import torch_models
    model_name, config_name = target.split(":")
    model = __import__(model_name)
    step = torch_models.train_step(model_name, model.CONFIGS[config_name], compiled=True)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    loss = step()
    first, first_cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    steady = []
    for _ in range(STEADY_STEPS):
        start = time.perf_counter()
        step()
        steady.append(time.perf_counter() - start)
    generated_calls, library_calls = cache_calls(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return {"target": target, "first_s": first, "first_cpu_s": first_cpu, "step_s": min(steady), "loss": loss,
            "graphs": int(counters["stats"]["unique_graphs"]),
            "generated_calls": generated_calls, "library_calls": library_calls,
            "fxgraph_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_misses": int(counters["inductor"]["fxgraph_cache_miss"])}


def child_env(cache: str) -> dict[str, str]:
    """The environment of one measuring process: its own Inductor cache, 2 threads, no compile workers."""
    return dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1",
                OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS)


def run_child(target: str, cache: str, timeout: float) -> dict | str:
    """The child's figures, or why there are none (a timeout or the error's last lines)."""
    try:
        done = subprocess.run([sys.executable, __file__, "--child", target], capture_output=True, text=True,
                              env=child_env(cache), timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if done.returncode:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="torch.compile's cold and warm compile time of the model "
                                                 "zoo's train steps, one fresh process each.")
    parser.add_argument("targets", nargs="*", default=DEFAULT, metavar="MODEL:CONFIG",
                        help=f"models to time (default: {' '.join(DEFAULT)})")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds each process may take before its row says so (default: 900)")
    args = parser.parse_args(argv)
    for target in args.targets:
        model, _, config = target.partition(":")
        if model not in ("bert", "wide_and_deep", "dcgan", "resnet") or not config:
            parser.error(f"MODEL:CONFIG: expected bert|wide_and_deep|dcgan|resnet:<config>, got {target!r}")
    if args.timeout <= 0:
        parser.error(f"--timeout: must be positive, got {args.timeout}")
    return args


def row(target: str, cold: dict | str, warm: dict | str) -> str:
    """One markdown row of the table `main` prints."""
    if isinstance(cold, str):
        return f"| {target} | {cold} | | | | | | |"
    warm_s = f"{warm:s}" if isinstance(warm, str) else f"{warm['first_s']:.1f} ({warm['first_cpu_s']:.1f} CPU)"
    return (f"| {target} | {cold['graphs']} | {cold['generated_calls']} + {cold['library_calls']} | "
            f"{cold['first_s']:.1f} | {cold['first_cpu_s']:.1f} | "
            f"{cold['step_s']:.2f} | {cold['first_s'] - cold['step_s']:.1f} | {warm_s} |")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(argv[1])))
        return 0
    args = parse_args(argv)
    print("| model | graphs | kernel calls (generated + library) | cold s | cold CPU s | step s | cold - step s "
          "| warm s |")
    print("|---|---|---|---|---|---|---|---|")
    for target in args.targets:
        with tempfile.TemporaryDirectory(prefix="torch_compile_figures_") as cache:
            cold = run_child(target, cache, args.timeout)
            warm = run_child(target, cache, args.timeout) if not isinstance(cold, str) else "not run"
        print(row(target, cold, warm), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
