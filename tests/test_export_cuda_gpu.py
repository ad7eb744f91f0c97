"""The exported GPU library on a GPU (skipped without one): the trained LeNet of examples/export exported
with `flowc export --device gpu` (the current GPU's arch), examples/export/predict.c built with the system
C compiler against it and the real driver gets the Python job's logits (to float32 rounding: the GPU
sums in another order) and its accuracy; four instances on four threads agree; device buffers give
what host buffers give.  Written on a machine without a GPU: it has not run yet (docs/export.md)."""
from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from flowc.runtime.devices import gpu_status

USABLE, WHY = gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(not USABLE, reason=f"no usable GPU: {WHY}"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")]

from tests.export_cuda_support import EXAMPLES, ROOT, run  # noqa: E402
from tests.test_export_lenet import IMAGES, _python_logits  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint, export folder, images file, labels file, labels)."""
    import flow
    base = tmp_path_factory.mktemp("export_gpu")
    ckpt, out = base / "ckpt", base / "lenet_gpu"
    env = {"PYTHONPATH": str(ROOT)}
    run([sys.executable, EXAMPLES / "lenet_predict.py", ckpt], env=env)
    proc = run([sys.executable, "-m", "flowc", "export", f"{EXAMPLES / 'lenet_predict.py'}:predict_job",
                "--checkpoint", ckpt, "-o", out, "--prefix", "lenet", "--device", "gpu"], env=env)
    assert "liblenet.so" in proc.stdout
    _, (x, y) = flow.data.load_mnist_sample(100, 1)
    images, labels = np.ascontiguousarray(x[:IMAGES], np.float32), np.ascontiguousarray(y[:IMAGES], np.int32)
    images.tofile(base / "images.bin")
    labels.tofile(base / "labels.bin")
    return ckpt, out, base / "images.bin", base / "labels.bin", labels.ravel()


def _close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_predict_c_on_the_gpu_gets_the_python_jobs_logits_and_accuracy(exported, tmp_path):
    ckpt, out, images, labels_file, labels = exported
    exe = tmp_path / "predict"
    run(["cc", "-std=c99", "-O2", "-Wall", "-Werror", EXAMPLES / "predict.c", f"-I{out}", f"-L{out}", "-llenet",
         f"-Wl,-rpath,{out}", "-o", exe])
    proc = run([exe, out / "lenet.weights", images, labels_file, tmp_path / "logits.bin"])
    logits = np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10)
    expected = _python_logits(ckpt)
    _close(logits, expected)
    right = int((expected.argmax(1) == labels).sum())
    assert f"accuracy {right}/{IMAGES}" in proc.stdout and right >= 0.8 * IMAGES


def test_four_instances_on_four_threads_on_the_gpu(exported, tmp_path):
    ckpt, out, images, *_ = exported
    exe = tmp_path / "predict_threads"
    run(["g++", "-std=c++17", "-O2", EXAMPLES / "predict_threads.cpp", f"-I{out}", f"-L{out}", "-llenet",
         f"-Wl,-rpath,{out}", "-pthread", "-o", exe])
    proc = run([exe, out / "lenet.weights", images, 4, tmp_path / "logits.bin"])
    assert "4 instances on 4 threads, 200 batches each: all equal" in proc.stdout
    _close(np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10), _python_logits(ckpt))


def test_device_buffers_on_the_gpu_give_what_host_buffers_give(exported, tmp_path):
    ckpt, out, images, *_ = exported
    exe = tmp_path / "run_device"
    run(["nvcc", "-x", "c++", "-std=c++17", "-O2", "-cudart", "none", ROOT / "tests" / "export_cuda_run_device.cpp",
         f"-I{out}", f"-L{out}", "-llenet", "-l:libcuda.so.1", "-Xlinker", f"-rpath={out}", "-o", exe])
    proc = run([exe, out / "lenet.weights", images, tmp_path / "logits.bin"])
    assert f"{IMAGES} batches on device buffers: equal to lenet_run" in proc.stdout
    _close(np.fromfile(tmp_path / "logits.bin", np.float32).reshape(IMAGES, 10), _python_logits(ckpt))
