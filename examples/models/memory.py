"""Issue 15's peak-memory figures: peak RSS of one train step in flowc and in PyTorch eager.

    python examples/models/memory.py                          # every model and config
    python examples/models/memory.py bert:small bert:base dcgan:mnist resnet:resnet50
    python examples/models/memory.py --frameworks flowc,torch,torch_compile bert:base

Each (framework, model) runs in its own process, measured the same way: 2 threads; the process imports
its framework and reads its resident set (`base`); it builds the model and runs two train steps (flowc
traces and compiles on the first; PyTorch allocates its optimizer state on the first); then it resets
the kernel's high-water mark (`echo 5 > /proc/self/clear_refs`), runs one more step and reads `VmHWM`
from /proc/self/status: the peak resident set during that step (`peak`).  `peak - base` is what the
model, its optimizer state and the step's intermediate values took above the framework itself.
flowc's planned figures (`flowc show --memory`: arena and variables) are printed next to them.
PyTorch's models are torch_models.py's (its ResNet is benchmarks/peers/torch_resnet.py's, NCHW);
`torch_compile` runs them under torch.compile, which compiles on the first step (the measured third
step runs the compiled code; the compiler's own memory is what it left resident).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ALL = ["bert:tiny", "bert:small", "bert:base", "wide_and_deep:small", "wide_and_deep:large", "dcgan:tiny",
       "dcgan:mnist", "resnet:resnet18", "resnet:resnet50"]
FRAMEWORKS = ("flowc", "torch", "torch_compile")
DEFAULT_FRAMEWORKS = ("flowc", "torch")
THREADS = "2"
MIB = float(1 << 20)


def status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Reset VmHWM to the current resident set (Linux >= 4.0); failing is an error, not a fallback."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _flowc_step(model, config):
    jobs = model.make_jobs(config)
    batch = model.synthetic_batch(config)
    if hasattr(model, "gan_step"):
        step = model.gan_step(jobs)
        return lambda: step(*batch)
    return lambda: jobs[0](*batch)


def _load(target: str):
    sys.path.insert(0, HERE)
    model_name, config_name = target.split(":")
    model = __import__(model_name)
    return model_name, model, model.CONFIGS[config_name]


def measure(framework: str, target: str) -> dict:
    """Peak RSS of one train step of `target` ("model:config") under `framework`, in this process."""
    if framework in ("torch", "torch_compile"):
        import torch
        torch.set_num_threads(int(THREADS))
        import torch_models
    elif framework == "flowc":
        import flow  # noqa: F401
    else:
        raise ValueError(f"framework: expected one of {FRAMEWORKS}, got {framework!r}")
    model_name, model, config = _load(target)
    base = status_kib("VmRSS")
    step = (_flowc_step(model, config) if framework == "flowc"
            else torch_models.train_step(model_name, config, compiled=framework == "torch_compile"))
    step()
    step()
    before = status_kib("VmRSS")
    reset_peak()
    step()
    return {"framework": framework, "target": target, "base_kib": base, "before_kib": before,
            "peak_kib": status_kib("VmHWM")}


def planned(target: str) -> dict:
    """flowc's memory plan of the train jobs of `target` (`flowc show --memory`'s summary): the arenas
    added (the jobs of a GAN step run one after the other, each with its own arena) and the variables."""
    _, model, config = _load(target)
    jobs = [j for j in model.make_jobs(config) if j.job_type == "train"]
    summaries = [job.lower().memory_plan().summary for job in jobs]
    return {"arena": sum(s.arena_bytes for s in summaries), "live": max(s.live_peak_bytes for s in summaries),
            "variables": max(s.variable_bytes for s in summaries)}


def run_child(mode: str, target: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=THREADS, MKL_NUM_THREADS=THREADS, OPENBLAS_NUM_THREADS=THREADS)
    done = subprocess.run([sys.executable, __file__, "--child", mode, target], capture_output=True, text=True,
                          env=env, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{mode} {target}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Peak RSS of one train step of the model zoo's models, "
                                                 "one process per framework and model.")
    parser.add_argument("targets", nargs="*", default=ALL, metavar="MODEL:CONFIG",
                        help="models to measure (default: all of them)")
    parser.add_argument("--frameworks", default=",".join(DEFAULT_FRAMEWORKS),
                        help=f"comma-separated, of {', '.join(FRAMEWORKS)} (default: {','.join(DEFAULT_FRAMEWORKS)})")
    args = parser.parse_args(argv)
    args.frameworks = args.frameworks.split(",")
    for framework in args.frameworks:
        if framework not in FRAMEWORKS:
            parser.error(f"--frameworks: expected names from {', '.join(FRAMEWORKS)}, got {framework!r}")
    for target in args.targets:
        if ":" not in target:
            parser.error(f"MODEL:CONFIG: expected a model and a config such as bert:base, got {target!r}")
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(planned(argv[2]) if argv[1] == "plan" else measure(argv[1], argv[2])))
        return 0
    args = parse_args(argv)
    print(f"{'model':<22}{'framework':>14}{'base MiB':>10}{'peak MiB':>10}{'peak-base':>11}"
          f"{'arena MiB':>11}{'live MiB':>10}{'vars MiB':>10}")
    for target in args.targets:
        plan = run_child("plan", target) if "flowc" in args.frameworks else {}
        for framework in args.frameworks:
            r = run_child(framework, target)
            figures = (f"{plan['arena'] / MIB:>11.1f}{plan['live'] / MIB:>10.1f}{plan['variables'] / MIB:>10.1f}"
                       if framework == "flowc" else "")
            print(f"{target:<22}{framework:>14}{r['base_kib'] / 1024:>10.1f}{r['peak_kib'] / 1024:>10.1f}"
                  f"{(r['peak_kib'] - r['base_kib']) / 1024:>11.1f}{figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
