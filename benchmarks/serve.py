"""The serving row (issue 18): LeNet predict at batch 1 (per-call latency) and batch 100 (throughput),
as the exported C library called from C (`flowc export`), as the Python job, and in PyTorch eager.

The exported library is timed by a C program (benchmarks/export_calls.c) that reports its own median
call; the Python job and PyTorch are timed by pytest-benchmark like every steps/s row.  The job is
examples/export/lenet_predict.py's, the seeds' LeNet at the batch asked for (the seed's eval_job is
fixed at 100 images); its weights are whatever its first call initialised (timing does not depend
on them).

    python -m pytest benchmarks/test_bench_export.py --framework=flowc     # or: make bench
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers import NotApplicable, Step
from benchmarks.workloads import Workload, lenet_flops

REPO = Path(__file__).resolve().parents[1]
SERVE_BATCHES = (1, 100)
# Who takes part: flowc's process times the Python job and the exported library; PyTorch eager its
# own model.  The others skip (the NumPy reference takes seconds per LeNet call).
SERVE_FRAMEWORKS = ("flowc", "torch_eager")
PREFIX = "lenet"


def workload(batch: int) -> Workload:
    """The LeNet predict workload at `batch` images per call."""
    return Workload(f"lenet_predict_b{batch}", "lenet", "predict", lenet_flops("predict", batch) / 1e9, batch)


def images_for(batch: int, images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images[:batch], dtype=np.float32)


def _example() -> Any:
    path = REPO / "examples" / "export" / "lenet_predict.py"
    spec = importlib.util.spec_from_file_location("bench_export_lenet_predict", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_step(framework: str, peer: Any, batch: int, images: np.ndarray, labels: np.ndarray) -> Step:
    """One predict call of `framework` on `batch` images."""
    if framework not in SERVE_FRAMEWORKS:
        raise NotApplicable(f"the serving row compares flowc and PyTorch eager, not {framework}")
    x = images_for(batch, images)
    if framework == "flowc":
        job = _example().make_jobs(batch)
        return lambda: job(x)
    return peer.build(workload(batch), x, np.ascontiguousarray(labels[:batch]))


def export_library(batch: int, folder: Path) -> Path:
    """Export the batch-`batch` LeNet into `folder` (weights from its first call); its weights file."""
    import flow
    from flowc.compiler.export import export_job
    job = _example().make_jobs(batch)
    job(np.zeros((batch, 1, 28, 28), np.float32))               # initialises the variables
    flow.checkpoint.save(str(folder / "ckpt"))
    return export_job(job, flow.checkpoint.get(str(folder / "ckpt")), folder / "lib", prefix=PREFIX).weights


def c_call_seconds(batch: int, threads: int, seconds: float) -> dict[str, float]:
    """Export, build benchmarks/export_calls.c against the shared library, run it: its figures."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NotApplicable("no C compiler (cc or gcc) to build the exported library's caller")
    with tempfile.TemporaryDirectory(prefix="flowc-serve-") as tmp:
        folder = Path(tmp)
        weights = export_library(batch, folder)
        lib, exe = folder / "lib", folder / "export_calls"
        subprocess.run([compiler, "-O2", "-std=c99", str(REPO / "benchmarks" / "export_calls.c"), f"-I{lib}",
                        f"-L{lib}", f"-l{PREFIX}", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
        done = subprocess.run([str(exe), str(weights), str(threads), str(seconds)], check=True,
                              capture_output=True, text=True, env=os.environ)
    words = done.stdout.split()
    figures = dict(zip(words[0::2], words[1::2]))
    return {"calls": float(figures["calls"]), "median_s": float(figures["median_s"]),
            "mean_s": float(figures["mean_s"])}

