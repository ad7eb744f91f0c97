"""The exported GPU library's step, run: under a test double of the CUDA driver (tests/fake_libcuda.cpp)
whose launches run the step's kernels on the CUDA emulator (races, out-of-bounds and uninitialised
reads checked), a C program (examples/export/predict.c) and a C++ one on two threads get the Python
job's logits, device buffers (`lenet_run_device`) give what host buffers give, and a check_numerics
stop is ERR_STEP naming the op and the user's line.  The emulator is
not a GPU: the same kernels, the same launch geometry and the same driver calls, on the CPU; the
GPU itself is tests/test_export_cuda_gpu.py's.  nvcc and the emulator: slow."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.export import export_job
from flowc.compiler.export.weights import ERROR_CODES
from tests.export_cuda_support import (EXAMPLES, build_emulated_kernels, build_fake_driver, fake_driver_env,
                                       lenet_job, needs_nvcc, run, seeded_values)

pytestmark = [pytest.mark.slow, needs_nvcc]

BATCH = 2
IMAGES = 4


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """(export folder, fake driver folder, emulated kernels, images file, labels, Python logits)."""
    base = tmp_path_factory.mktemp("export_cuda_emulated")
    job = lenet_job(BATCH)
    values = seeded_values(job, seed=7)
    result = export_job(job, values, base / "lenet_gpu", prefix="lenet", device="gpu", arch="sm_90")
    source = (result.folder / "src" / "step.cu").read_text()
    kernels = re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))? (\w+)\(', source)
    _, (x, y) = flow.data.load_mnist_sample(100, 1)
    images = np.ascontiguousarray(x[:IMAGES], np.float32).reshape(IMAGES, 1, 28, 28)
    labels = np.ascontiguousarray(y[:IMAGES], np.int32).ravel()
    images.tofile(base / "images.bin")
    labels.tofile(base / "labels.bin")
    flow.load_variables(values)
    expected = np.concatenate([job(images[i:i + BATCH]) for i in range(0, IMAGES, BATCH)])
    return (result.folder, build_fake_driver(base / "driver"), build_emulated_kernels(source, base / "emu", kernels),
            base, expected)


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    # The GPU kernels sum in another order than the CPU step: equal to float32 rounding, same classes.
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert (got.argmax(1) == expected.argmax(1)).all()


def test_predict_c_under_the_emulated_driver_gets_the_python_jobs_logits(emulated, tmp_path):
    out, driver, kernels, base, expected = emulated
    exe = tmp_path / "predict"
    run(["cc", "-std=c99", "-O2", EXAMPLES / "predict.c", f"-I{out}", f"-L{out}", "-llenet", f"-Wl,-rpath,{out}",
         f"-Wl,-rpath-link,{driver}", "-o", exe])
    proc = run([exe, out / "lenet.weights", base / "images.bin", base / "labels.bin", tmp_path / "logits.bin"],
               env=fake_driver_env(driver, kernels))
    assert f"/{IMAGES}" in proc.stdout
    _close(np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10), expected)


def test_two_instances_on_two_threads_under_the_emulated_driver(emulated, tmp_path):
    out, driver, kernels, base, expected = emulated
    exe = tmp_path / "predict_threads"
    run(["g++", "-std=c++17", "-O2", EXAMPLES / "predict_threads.cpp", f"-I{out}", f"-L{out}", "-llenet",
         f"-Wl,-rpath,{out}", f"-Wl,-rpath-link,{driver}", "-pthread", "-o", exe])
    proc = run([exe, out / "lenet.weights", base / "images.bin", 2, tmp_path / "logits.bin"],
               env=fake_driver_env(driver, kernels))
    assert "2 instances on 2 threads" in proc.stdout and "all equal" in proc.stdout, proc.stdout
    _close(np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10), expected)


def test_device_buffers_give_what_host_buffers_give(emulated, tmp_path):
    out, driver, kernels, base, expected = emulated
    exe = tmp_path / "run_device"
    run(["nvcc", "-x", "c++", "-std=c++17", "-O2", "-cudart", "none", EXAMPLES.parents[1] / "tests" /
         "export_cuda_run_device.cpp", f"-I{out}", f"-L{out}", "-llenet", f"-L{driver}", "-l:libcuda.so.1",
         "-Xlinker", f"-rpath={out}", "-o", exe])
    proc = run([exe, out / "lenet.weights", base / "images.bin", tmp_path / "logits.bin"],
               env=fake_driver_env(driver, kernels))
    assert f"{IMAGES // BATCH} batches on device buffers: equal to lenet_run" in proc.stdout
    _close(np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10), expected)


def _ratio_job():
    config = flow.function_config()
    config.check_numerics(True)

    @flow.global_function(type="predict", function_config=config)
    def ratio(x: tp.Numpy.Placeholder((4,)), y: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        q = x / y  # DIVIDE
        return flow.math.reduce_sum(q)
    return ratio


def test_a_check_numerics_stop_on_the_gpu_is_err_step_naming_the_op_and_its_line(tmp_path):
    job = _ratio_job()
    result = export_job(job, {}, tmp_path / "ratio", prefix="ratio", device="gpu", arch="sm_90")
    source = (result.folder / "src" / "step.cu").read_text()
    kernels = re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))? (\w+)\(', source)
    assert "check_finite" in source
    env = fake_driver_env(build_fake_driver(tmp_path / "driver"),
                          build_emulated_kernels(source, tmp_path / "emu", kernels))
    x, y = np.arange(1, 5, dtype=np.float32), np.array([1, 2, 4, 8], np.float32)
    for name, a in (("x", x), ("y", y), ("zero", np.array([1, 0, 4, 8], np.float32))):
        np.save(tmp_path / f"{name}.npy", a)
    argv = [sys.executable, "-m", "tests.export_cuda_probe", "run", result.shared_library, "ratio", result.weights,
            tmp_path / "out.npy", tmp_path / "x.npy"]
    proc = run([*argv, tmp_path / "y.npy"], env=env)
    assert json.loads(proc.stdout) == {"stage": "run", "code": 0, "message": ""}
    with open(tmp_path / "out.npy", "rb") as f:
        got = np.load(f).view(np.float32)
    np.testing.assert_allclose(got, job(x, y), rtol=1e-6)
    proc = run([*argv, tmp_path / "zero.npy"], env=env)
    row = json.loads(proc.stdout)
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith("# DIVIDE"))
    assert row["code"] == ERROR_CODES["STEP"], row
    assert f"{Path(__file__).name}:{line}" in row["message"] and "divide produced a NaN or an infinity" in \
        row["message"], row
