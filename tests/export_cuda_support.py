"""What the tests of the GPU export (tests/test_export_cuda*.py) share: the LeNet predict job with
seeded weights, the export through `export_job(device="gpu")`, and the test double of the CUDA
driver (tests/fake_libcuda.cpp) over the CUDA emulator, which runs the exported library's launches
on a machine without a GPU.

    folder = build_fake_driver(tmp)                 # tmp/libcuda.so.1
    kernels = build_emulated_kernels(step_source, tmp)
    env = fake_driver_env(folder, kernels)          # LD_LIBRARY_PATH and FLOWC_FAKE_CUDA_KERNELS
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "export"
FAKE_DRIVER = Path(__file__).resolve().parent / "fake_libcuda.cpp"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def lenet_job(batch: int):
    """examples/export's LeNet predict job for `batch` images."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lenet_predict
    finally:
        sys.path.remove(str(EXAMPLES))
    return lenet_predict.make_jobs(batch)


def seeded_values(job, seed: int = 0) -> dict[str, np.ndarray]:
    """name -> array of every variable of `job`: He-scaled normal values, so logits are of order 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in job.graph.variables.items():
        fan_in = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        out[name] = (rng.standard_normal(t.shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return out


def run(argv: list, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check:
        assert proc.returncode == 0, f"{argv[:3]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def build_fake_driver(folder: Path) -> Path:
    """Build tests/fake_libcuda.cpp as folder/libcuda.so.1 over the emulator's runtime; return folder."""
    from tests.cuda_emulator_harness import runtime_dir
    rt = runtime_dir()
    folder.mkdir(parents=True, exist_ok=True)
    run(["nvcc", "-x", "c++", "-std=c++17", "-O1", "-shared", "-Xcompiler", "-fPIC,-Wall", "-cudart", "none",
         "-Xlinker", "-soname=libcuda.so.1", FAKE_DRIVER, f"-L{rt}", "-lflowc_emu", "-Xlinker", f"-rpath={rt}",
         "-ldl", "-o", folder / "libcuda.so.1"])
    return folder


def build_emulated_kernels(source: str, folder: Path, kernels: list[str]) -> Path:
    """The step's kernels built for the emulator (tests/cuda_emulator_harness.py): the .so's path."""
    from tests.cuda_emulator_harness import Emulator
    folder.mkdir(parents=True, exist_ok=True)
    Emulator(folder).build(source, kernels)
    built = sorted(folder.glob("*.so"))
    assert len(built) == 1, built
    return built[0]


def fake_driver_env(driver_folder: Path, kernels: Path, **extra: str) -> dict[str, str]:
    """The environment under which a program loads the fake driver and the emulated kernels."""
    path = os.pathsep.join(p for p in [str(driver_folder), os.environ.get("LD_LIBRARY_PATH", "")] if p)
    return {"LD_LIBRARY_PATH": path, "FLOWC_FAKE_CUDA_KERNELS": str(kernels), **extra}
