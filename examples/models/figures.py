"""Issue 15's compile figures of the model zoo's train jobs: IR nodes, kernels, compile time cold and warm.

    python examples/models/figures.py                       # every model and config
    python examples/models/figures.py bert:tiny wide_and_deep:large

Each model runs in its own process with an empty kernel cache (FLOWC_CACHE_DIR in a temporary folder;
the precompiled core library, FLOWC_CORE_DIR, is kept), so "cold" is a first compile on this machine;
"warm" is the same job compiled again in a second process against the cache the first one filled.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ALL = ["bert:tiny", "bert:small", "bert:base", "wide_and_deep:tiny", "wide_and_deep:small", "wide_and_deep:large",
       "dcgan:tiny", "dcgan:mnist", "resnet:tiny", "resnet:resnet18", "resnet:resnet50"]


def measure(target: str) -> dict:
    """Trace, lower and compile the train job of `target` ("model:config") in this process."""
    from flowc.runtime.session import default_session
    sys.path.insert(0, HERE)
    model_name, config_name = target.split(":")
    model = __import__(model_name)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    train = model.make_jobs(model.CONFIGS[config_name])[0]          # the (first) train job
    compiled = train.compile()          # a warm process takes the lowered job from the cache
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    traced_nodes = len(train._trace(default_session()).graph.nodes)
    program = compiled.step.program
    kernels = program.kernels or []
    return {"target": target, "traced_nodes": traced_nodes, "lowered_nodes": len(program.graph.nodes),
            "kernels": len(kernels), "functions": getattr(compiled.step.generated, "kernel_functions", len(kernels)),
            "distinct_kernel_kinds": len({k.kind for k in kernels}),
            "arena_bytes": compiled.memory_plan().peak_bytes, "from_cache": compiled.from_cache,
            "trace_s": compiled.timings.get("trace", 0.0), "passes_s": compiled.timings.get("passes", 0.0),
            "codegen_s": compiled.timings.get("codegen", 0.0), "compile_s": compiled.timings.get("compile", 0.0),
            "total_s": total, "cpu_s": cpu}


def _cpu_seconds() -> float:
    """CPU time of this process and the compilers it ran (on a busy machine, steadier than wall time)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_child(target: str, cache: str) -> dict:
    env = dict(os.environ, FLOWC_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, __file__, "--child", target], capture_output=True, text=True, env=env,
                          timeout=3600)
    if done.returncode:
        raise SystemExit(f"{target}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(argv[1])))
        return 0
    targets = argv or ALL
    header = (f"{'model':<22}{'IR traced':>10}{'IR lowered':>11}{'kernels':>9}{'functions':>10}{'arena MiB':>10}"
              f"{'trace s':>9}{'passes s':>9}{'codegen s':>10}{'g++ s':>8}{'cold s':>8}{'warm s':>8}"
              f"{'cold CPU s':>11}{'warm CPU s':>11}")
    print(header)
    for target in targets:
        with tempfile.TemporaryDirectory(prefix="flowc_figures_") as cache:
            cold = run_child(target, cache)
            warm = run_child(target, cache)
        print(f"{target:<22}{cold['traced_nodes']:>10}{cold['lowered_nodes']:>11}{cold['kernels']:>9}{cold['functions']:>10}"
              f"{cold['arena_bytes'] / 2**20:>10.1f}{cold['trace_s']:>9.2f}{cold['passes_s']:>9.2f}"
              f"{cold['codegen_s']:>10.2f}{cold['compile_s']:>8.2f}{cold['total_s']:>8.2f}{warm['total_s']:>8.2f}"
              f"{cold['cpu_s']:>11.2f}{warm['cpu_s']:>11.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
