"""Train steps per second on one GPU: flowc (host step, and the per-launch path) against PyTorch
eager on the same GPU (cuDNN on), for the seeds' MLP and LeNet at batch 100.

    python -m benchmarks.gpu_steps                 # every row, each in its own process, as a table
    python -m benchmarks.gpu_steps --tf32          # the same with TF32 (FLOWC_TF32=1, PyTorch's allow_tf32)
    python -m benchmarks.gpu_steps --one-step lenet     # one flowc train step on the GPU (compute-sanitizer)

Each step returns its loss to the host (flowc's train job returns it; PyTorch copies it out), so
both wait for the GPU once per step.  benchmarks/gpu_check.sh runs it; it needs a usable GPU
(`flowc.runtime.devices.gpu_status()`), and PyTorch with CUDA for the PyTorch rows.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import flow
import flow.typing as tp

ROOT = Path(__file__).resolve().parent.parent
BATCH = 100
MODELS = ("mlp", "lenet")
FRAMEWORKS = ("flowc", "flowc-per-launch", "torch")


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((BATCH, 1, 28, 28), np.float32), rng.integers(0, 10, BATCH).astype(np.int32)


def flowc_step(model: str):
    """A function running one flowc train step of `model` on GPU 0 (placement "gpu"), returning the loss."""
    from benchmarks.peers.flowc_jobs import load_example
    seed = load_example("seeds/synchronize_single_job")

    def mlp(images):
        init = flow.truncated_normal(0.1)
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init, name="hidden")
        return flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")
    body = {"mlp": mlp, "lenet": lambda images: seed.lenet(images, train=True)}[model]

    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28)),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"), flow.scope.namespace(f"gpu_steps_{model}"):
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, body(images), name="loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    x, y = _data()

    def step():
        return train(x, y)
    step()
    if train.compiled.device != "gpu":
        raise SystemExit(f"the {model} job ran on {train.compiled.device!r}, not on the GPU")
    return step


def torch_step(model: str, tf32: bool):
    """A function running one PyTorch train step of `model` on cuda:0 (cuDNN on), returning the loss."""
    import torch
    from torch import nn
    if not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no CUDA device")
    torch.backends.cudnn.enabled = True
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(3136, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 10))
    net = net.cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = (torch.from_numpy(a).cuda() for a in _data())
    y = y.long()
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach().cpu().numpy()
    step()
    return step


def measure(step, seconds: float) -> float:
    """Steps per second over at least `seconds` (after 3 warm-up steps)."""
    for _ in range(3):
        step()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - start)


def run_one(model: str, framework: str, tf32: bool, seconds: float) -> float:
    if framework == "torch":
        return measure(torch_step(model, tf32), seconds)
    return measure(flowc_step(model), seconds)


def child(model: str, framework: str, tf32: bool, seconds: float) -> dict:
    """One row, in its own process (the per-launch path and TF32 are read when a job is compiled)."""
    env = dict(os.environ, FLOWC_STRICT_DEVICE="1")
    env.pop("FLOWC_CUDA_PER_LAUNCH", None)
    env.pop("FLOWC_TF32", None)
    if framework == "flowc-per-launch":
        env["FLOWC_CUDA_PER_LAUNCH"] = "1"
    if tf32:
        env["FLOWC_TF32"] = "1"
    argv = [sys.executable, "-m", "benchmarks.gpu_steps", "--row", model, framework, "--seconds", str(seconds)]
    proc = subprocess.run(argv + (["--tf32"] if tf32 else []), capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        return {"model": model, "framework": framework, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict], tf32: bool) -> str:
    lines = [f"train steps/s at batch {BATCH}, {'TF32' if tf32 else 'FP32'}:",
             "model  " + "".join(f"{f:>18}" for f in FRAMEWORKS) + "   flowc/torch"]
    for model in MODELS:
        got = {r["framework"]: r for r in rows if r["model"] == model}
        cells = [f"{got[f]['steps_per_s']:18.1f}" if "steps_per_s" in got.get(f, {}) else f"{'n/a':>18}"
                 for f in FRAMEWORKS]
        ratio = (got["flowc"]["steps_per_s"] / got["torch"]["steps_per_s"]
                 if "steps_per_s" in got.get("flowc", {}) and "steps_per_s" in got.get("torch", {}) else None)
        lines.append(f"{model:<7}" + "".join(cells) + (f"   {ratio:.2f}x" if ratio else "   n/a"))
    errors = [f"  {r['model']} {r['framework']}: {r['error']}" for r in rows if "error" in r]
    return "\n".join(lines + (["errors:"] + errors if errors else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tf32", action="store_true", help="TF32 tensor cores for flowc and PyTorch")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per row (default 3)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--row", nargs=2, metavar=("MODEL", "FRAMEWORK"), help=argparse.SUPPRESS)
    parser.add_argument("--one-step", choices=MODELS, help="run one flowc train step of MODEL on the GPU")
    args = parser.parse_args(argv)
    if args.one_step:
        loss = flowc_step(args.one_step)()
        print(f"{args.one_step}: one train step on the GPU, mean loss {float(np.mean(loss)):.6f}")
        return 0
    if args.row:
        model, framework = args.row
        print(json.dumps({"model": model, "framework": framework,
                          "steps_per_s": run_one(model, framework, args.tf32, args.seconds)}))
        return 0
    rows = [child(m, f, args.tf32, args.seconds) for m in MODELS for f in FRAMEWORKS]
    print(table(rows, args.tf32))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in r and r["framework"] != "torch" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
