"""The CUDA runtime's bookkeeping on a fake driver (tests/fake_cuda_driver.py), where no GPU is:
the driver-older-than-toolkit check, variable coherence between GPU and CPU jobs of one session,
device memory freed explicitly on the right thread, and the rule that a GPU present but unusable
fails the GPU tests instead of skipping them (tests/gpu_requirement.py)."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import flow
import flow.typing as tp
import flowc.runtime.job
from flowc.runtime.devices import DEVICE_VARIABLES_ATTR
from flowc.runtime.session import default_session
from tests import gpu_requirement
from tests.fake_cuda_driver import FakeDriver, install, uninstall, write_fake_nvcc

X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
TRAINED = np.array([[0.5, -1.0], [2.0, 0.25], [-3.0, 1.5]], np.float32)   # what "the GPU" trained


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A usable fake GPU (driver of CUDA 13.0, sm_90) and a fake nvcc; the session is cleared on it
    at the end, so that its device memory is released while the fake is installed."""
    driver = FakeDriver()
    install(driver, monkeypatch, write_fake_nvcc(tmp_path))
    monkeypatch.delenv("FLOWC_STRICT_DEVICE", raising=False)
    flow.clear_default_session()
    yield driver
    flow.clear_default_session()
    uninstall()


def _w() -> flow.typing.Numpy:
    return flow.get_variable("coherent_w", shape=(3, 2), initializer=flow.constant_initializer(1.0))


@flow.global_function(type="train")
def gpu_fit(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        loss = flow.math.reduce_mean(flow.matmul(x, _w()))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="train")
def cpu_fit(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    loss = flow.math.reduce_mean(flow.matmul(x, _w()))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def cpu_predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    return flow.matmul(x, _w())


@flow.global_function(type="predict")
def gpu_predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        return flow.matmul(x, _w())


def device_copy(name: str) -> np.ndarray:
    """The fake device's copy of variable `name` (a view: writing it is what a kernel would do)."""
    store = getattr(default_session(), DEVICE_VARIABLES_ATTR)
    return store.buffers[name].buffer.view(np.float32)[:6].reshape(3, 2)


# --- the driver older than the toolkit ------------------------------------------------------------

def test_a_driver_older_than_the_toolkit_is_refused_up_front_naming_both_versions(monkeypatch, tmp_path):
    from flowc.runtime import devices
    install(FakeDriver(driver_version=12040), monkeypatch, write_fake_nvcc(tmp_path, "13.0"))
    monkeypatch.setattr(flowc.runtime.job, "_warned_gpu", False)
    monkeypatch.delenv("FLOWC_STRICT_DEVICE", raising=False)
    try:
        usable, why = devices.gpu_status()
        assert not usable and "12.4" in why and "13.0" in why, why
        with pytest.warns(RuntimeWarning, match=r"12\.4.*13\.0"):
            np.testing.assert_allclose(gpu_predict(X), X @ np.ones((3, 2), np.float32), rtol=1e-6)
        assert gpu_predict.compiled.device == "cpu"
        flow.clear_default_session()
        monkeypatch.setenv("FLOWC_STRICT_DEVICE", "1")
        with pytest.raises(devices.DeviceUnavailable, match=r"CUDA 12\.4.*CUDA 13\.0.*FLOWC_STRICT_DEVICE"):
            gpu_predict(X)
    finally:
        flow.clear_default_session()
        uninstall()


def test_a_driver_of_the_toolkits_major_version_is_usable(fake_gpu):
    from flowc.runtime.devices import driver_older_than_toolkit, gpu_status
    assert gpu_status() == (True, "Fake H200 (sm_90)")
    assert driver_older_than_toolkit(13020, "13.0") is None
    assert driver_older_than_toolkit(12090, "13.0") is not None
    assert driver_older_than_toolkit(12020, "12.6") is None     # CUDA's minor-version compatibility


# --- variable coherence across devices --------------------------------------------------------------

def test_a_cpu_predict_job_after_a_gpu_train_job_sees_the_trained_weights(fake_gpu):
    gpu_fit(X)
    assert gpu_fit.compiled.device == "gpu" and cpu_predict.compiled.device == "cpu"
    device_copy("coherent_w")[...] = TRAINED          # the update the (fake) kernels stand for
    np.testing.assert_allclose(cpu_predict(X), X @ TRAINED, rtol=1e-6)
    store = getattr(default_session(), DEVICE_VARIABLES_ATTR)
    assert store.owner("coherent_w") is None
    gpu_fit(X)
    assert store.owner("coherent_w") == "gpu"          # moved to the host: both copies agree


def test_a_gpu_job_after_a_cpu_train_job_reads_the_host_update(fake_gpu):
    gpu_predict(X)                                    # the device copy exists, equal to the host's
    cpu_fit(X)                                        # the host's SGD step changes it
    store = getattr(default_session(), DEVICE_VARIABLES_ATTR)
    assert store.owner("coherent_w") == "cpu"
    host = default_session().value("coherent_w").copy()
    assert not np.array_equal(host, np.ones((3, 2), np.float32))
    gpu_predict(X)
    np.testing.assert_array_equal(device_copy("coherent_w"), host)
    assert store.owner("coherent_w") is None


def test_get_all_variables_checkpoints_and_load_variables_see_the_latest_value(fake_gpu, tmp_path):
    gpu_fit(X)
    device_copy("coherent_w")[...] = TRAINED
    np.testing.assert_array_equal(flow.get_all_variables()["coherent_w"].numpy(), TRAINED)
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    flow.load_variables({"coherent_w": np.zeros((3, 2), np.float32)})
    np.testing.assert_array_equal(device_copy("coherent_w"), 0.0)        # uploaded for the GPU jobs
    np.testing.assert_array_equal(cpu_predict(X), 0.0)
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ckpt")))
    np.testing.assert_array_equal(device_copy("coherent_w"), TRAINED)
    np.testing.assert_allclose(cpu_predict(X), X @ TRAINED, rtol=1e-6)



@pytest.mark.slow
def test_gpu_training_on_the_emulated_device_reaches_a_cpu_predict_job(monkeypatch, tmp_path):
    """The kernels really run (nvcc's build, executed by tests/test_cuda_codegen.py's emulator): three
    GPU train steps, then a CPU predict job of the same session computes with the trained weights,
    which equal three CPU train steps' of a fresh session."""
    import shutil

    from tests.test_cuda_codegen import Emulator
    from tests.test_cuda_codegen import FakeDriver as EmulatedDriver
    nvcc, gxx = shutil.which("nvcc"), shutil.which("g++")
    if nvcc is None or gxx is None:
        pytest.skip("nvcc builds the kernels and g++ the emulator that runs them")
    for _ in range(3):
        cpu_fit(X)
    want = default_session().value("coherent_w").copy()
    assert not np.array_equal(want, np.ones((3, 2), np.float32))
    driver = EmulatedDriver(Emulator(tmp_path))
    driver.mem_alloc.free = lambda self: None          # its allocations are NumPy arrays
    install(driver, monkeypatch, nvcc)
    try:
        flow.clear_default_session()
        for _ in range(3):
            gpu_fit(X)
        assert gpu_fit.compiled.device == "gpu" and driver.launches > 0
        np.testing.assert_allclose(cpu_predict(X), X @ want, rtol=1e-5, atol=1e-6)
    finally:
        flow.clear_default_session()
        uninstall()


# --- frees on the right thread ----------------------------------------------------------------------

def test_device_memory_of_a_job_first_called_on_a_worker_thread_is_freed_at_clear(fake_gpu):
    done: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: done.append(gpu_fit(X)), name="worker")
    worker.start()
    worker.join()
    assert done and fake_gpu.live().get("device memory", 0) >= 5 and fake_gpu.live().get("stream") == 2
    flow.clear_default_session()             # on the main thread, where no context was ever pushed
    gc.collect()
    assert fake_gpu.leaks == []
    assert fake_gpu.live() == {}, fake_gpu.live()
    kinds = {kind for kind, _ in fake_gpu.frees}
    assert {"device memory", "pinned memory", "stream", "event", "module"} <= kinds
    assert {thread for _, thread in fake_gpu.frees} == {"MainThread"}


@pytest.mark.parametrize("cycles", [5, pytest.param(100, marks=pytest.mark.slow)])
def test_clear_and_reload_cycles_keep_device_memory_flat(fake_gpu, cycles):
    counts = []
    for _ in range(cycles):
        gpu_fit(X)
        cpu_predict(X)
        flow.clear_default_session()
        gc.collect()
        counts.append(sum(fake_gpu.live().values()))
    assert set(counts) == {0} and fake_gpu.leaks == []


def test_a_released_step_keeps_the_variables_latest_values_on_the_host(fake_gpu):
    gpu_fit(X)
    device_copy("coherent_w")[...] = TRAINED
    session = default_session()
    flow.clear_default_session()
    np.testing.assert_array_equal(session.value("coherent_w"), TRAINED)


# --- a GPU that is present must be usable -----------------------------------------------------------

@pytest.mark.parametrize("env, smi, required", [
    ({}, "", False),
    ({}, "GPU 0: NVIDIA H200 (UUID: GPU-1)\n", True),
    ({"FLOWC_REQUIRE_GPU": "1"}, "", True),
    ({"FLOWC_REQUIRE_GPU": "0"}, "GPU 0: NVIDIA H200 (UUID: GPU-1)\n", False),
])
def test_a_gpu_is_required_where_nvidia_smi_lists_one_or_flowc_require_gpu_says_so(env, smi, required):
    assert gpu_requirement.gpu_required(env, lambda: smi) is required


def test_a_skip_for_want_of_a_gpu_becomes_a_failure_with_the_reason_where_one_is_required():
    reason = "no usable GPU: PyCUDA is not installed (pip install 'flowc[gpu]')"
    message = gpu_requirement.failure_instead_of_skip(reason, required=True)
    assert message is not None and "PyCUDA is not installed" in message and "nvidia-smi" in message
    assert gpu_requirement.failure_instead_of_skip(reason, required=False) is None
    assert gpu_requirement.failure_instead_of_skip("nvcc is not installed", required=True) is None


@pytest.mark.slow
def test_the_gpu_tests_fail_instead_of_skipping_under_flowc_require_gpu(tmp_path):
    """End to end: pytest on tests/test_cuda_device.py, on this machine without a usable GPU."""
    import os
    import subprocess
    import sys
    from flowc.runtime.devices import gpu_status
    if gpu_status()[0]:
        pytest.skip("a GPU is usable here: its tests run instead")
    env = dict(os.environ, FLOWC_REQUIRE_GPU="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_cuda_device.py", "-k", "test_gpu_jobs_run_on_the_gpu"],
                          capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode != 0, proc.stdout
    assert ("1 failed" in proc.stdout or "1 error" in proc.stdout) and "skipped" not in proc.stdout, proc.stdout
    assert gpu_status()[1] in proc.stdout



# --- ahead of time for another machine: the cache key, PTX next to the SASS, line info --------------

KERNEL = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def _another_checkouts_headers(monkeypatch, folder):
    """The CUDA headers as another checkout (at another path) has them: same contents."""
    import shutil

    from flowc.compiler import cuda_toolchain
    copy = folder / "elsewhere" / "codegen_templates" / "cuda"
    shutil.copytree(cuda_toolchain.cuda_include_dir(), copy)
    monkeypatch.setattr(cuda_toolchain, "cuda_include_dir", lambda: copy)


def test_the_cuda_cache_key_holds_no_path_of_nvcc_or_of_the_checkout(monkeypatch, tmp_path):
    import shlex

    from flowc.compiler.cuda_toolchain import key_parts
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("NVCC", str(write_fake_nvcc(tmp_path / "a")))
    here = key_parts(KERNEL, "sm_90")
    monkeypatch.setenv("NVCC", str(write_fake_nvcc(tmp_path / "b")))
    _another_checkouts_headers(monkeypatch, tmp_path)
    there = key_parts(KERNEL, "sm_90")
    assert here.key() == there.key(), (here.command, there.command)
    words = shlex.split(here.command)
    assert not [w for w in words if w.startswith(("/", "-I/")) or "=/" in w], here.command
    assert "-lineinfo" in words and "-gencode=arch=compute_90,code=compute_90" in words


def fatbin_entries(image: bytes) -> list[tuple[str, int]]:
    """(kind, sm) of each entry of a CUDA fat binary: ("ptx", 90), ("elf", 90).  The layout (magic
    0xBA55ED50, then entries of kind, version, header size, payload size, ..., sm at byte 28) is
    what cuobjdump reads; it is parsed here because the test machine may lack cuobjdump."""
    import struct
    magic, _, header, size = struct.unpack_from("<IHHQ", image, 0)
    assert magic == 0xBA55ED50, hex(magic)
    entries, offset = [], header
    while offset < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHII", image, offset)
        entries.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), struct.unpack_from("<I", image, offset + 28)[0]))
        offset += entry_header + payload
    return entries


@pytest.mark.slow
def test_a_cache_built_elsewhere_serves_this_machine_with_ptx_and_line_info(monkeypatch, tmp_path):
    """`build_cubin` on a "build machine" (its nvcc at one path, its checkout at another), the cache
    folder copied, then the same build on "this machine": no compilation, and the image holds the
    sm_90 SASS with its line table and the compute_90 PTX."""
    import os
    import shutil

    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_cubin
    real = shutil.which("nvcc")
    if real is None:
        pytest.skip("nvcc is not installed")
    for machine in ("build", "run"):
        (tmp_path / machine).mkdir()
        os.symlink(real, tmp_path / machine / "nvcc")
    monkeypatch.setenv("NVCC", str(tmp_path / "build" / "nvcc"))
    built = build_cubin(KERNEL, "k", "sm_90", cache=KernelCache(tmp_path / "build-cache"))
    assert built.compiled
    shutil.copytree(tmp_path / "build-cache", tmp_path / "copied-cache")
    monkeypatch.setenv("NVCC", str(tmp_path / "run" / "nvcc"))
    _another_checkouts_headers(monkeypatch, tmp_path)
    served = build_cubin(KERNEL, "k", "sm_90", cache=KernelCache(tmp_path / "copied-cache"))
    assert not served.compiled
    image = served.path.read_bytes()
    assert sorted(fatbin_entries(image)) == [("elf", 90), ("ptx", 90)]
    assert b".nv_debug_line_sass" in image           # -lineinfo


# --- large tensors: 64-bit indices, grids past 65,535 in y and z -------------------------------------

def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


# (name, fn, inputs): GEMM-template kernels whose y or z grid passes the (patched) limit
GRID_CASES = [
    ("matmul_batched_tall", lambda a, b: flow.matmul(a, b), [_rand(5, 130, 3), _rand(5, 3, 4)]),
    ("matmul_tall", lambda a, b: flow.nn.relu(flow.matmul(a, b)), [_rand(200, 7), _rand(7, 3)]),
    ("conv_groups_many_filters", lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME", groups=2),
     [_rand(3, 4, 5, 5), _rand(140, 2, 3, 3)]),
]


def _generate(graph, arch: str = "sm_80"):
    from flowc.compiler.codegen.cuda import CudaGenerator
    from flowc.compiler.pipeline import lower
    program = lower(graph)
    return program, CudaGenerator(program.graph, program.kernels, program.memory, "test", arch=arch).render()


def test_gemm_grids_stop_at_65535_in_y_and_z_and_the_kernels_stride_over_the_rest():
    """A batch of 70,000 matrices: the grid was refused before (z over 65,535)."""
    from tests.oracle import trace_case
    graph, _, _ = trace_case(lambda a, b: flow.matmul(a, b),
                             [np.zeros((70_000, 2, 3), np.float32), np.zeros((70_000, 3, 2), np.float32)], False)
    _, step = _generate(graph)
    (launch,) = [la for la in step.launches if "matmul" in la.kernel or la.grid[2] > 1]
    assert launch.grid[2] == 65_535 and launch.grid[1] <= 65_535
    assert "b += gridDim.z" in step.source


def test_the_filter_gradient_indexes_images_and_pixels_in_64_bits_past_2_to_the_31():
    """N * P = 2^31 + 2^20 terms (a 46,341^2-pixel image ... here 32 images of 8192 x 8196): the
    (image, pixel) index r of the filter gradient was an int."""
    from tests.oracle import trace_case
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (32, 1, 8192, 8196), (0, 0, 0, 0))
    w = np.zeros((1, 1, 1, 1), np.float32)
    graph, _, _ = trace_case(lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="VALID"), [x, w], True)
    _, step = _generate(graph)
    kernel = step.source[step.source.index("conv2d_grad_filter"):]
    assert "const int64_t r = r_begin + r_in_split;" in kernel
    assert "const int r_begin" not in kernel and "int r)" not in kernel


@pytest.mark.parametrize("name, fn, inputs", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_gemm_kernels_striding_past_the_grid_limit_equal_the_reference_in_the_emulator(
        name, fn, inputs, monkeypatch, tmp_path):
    """The grid limit lowered to 1 block in y and z (and 1-D grids to 1 block): every block strides
    over every batch, image, group, filter tile and split, forward and backward, in the emulator."""
    import shutil

    from flowc.compiler.codegen import cuda as cuda_codegen
    from flowc.compiler.reference import run_reference
    from tests.oracle import cotangents, trace_case
    from tests.test_cuda_codegen import Emulator, replay
    from tests.test_ops import assert_outputs_match
    if shutil.which("g++") is None:
        pytest.skip("g++ runs the CUDA emulator")
    monkeypatch.setattr(cuda_codegen, "MAX_GRID", 1)
    graph, _, _ = trace_case(fn, inputs, True)
    program, step = _generate(graph)
    assert all(la.grid[1:] == (1, 1) for la in step.launches)
    feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(0))
    emulator = Emulator(tmp_path)
    got, status = replay(emulator, emulator.build(step.source, [la.kernel for la in step.launches], "-O1"),
                         program, step, feeds, {}, {})
    want, _ = run_reference(program.graph, feeds, {})
    assert status == 0
    assert_outputs_match(got, want)


# --- installing the gpu extra ------------------------------------------------------------------------

def test_the_gpu_extra_pins_a_pycuda_that_builds_against_cuda_13_and_the_readme_says_what_it_needs():
    import configparser
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    assert config["options.extras_require"]["gpu"].split() == ["pycuda>=2025.1.2"]
    readme = (root / "README.md").read_text()
    gpu_section = readme[readme.index("### Running on an NVIDIA GPU"):]
    gpu_section = gpu_section[:gpu_section.index("\n## ")]
    for needed in ("pycuda>=2025.1.2", "CUDA_ROOT", "libcuda.so", "FLOWC_REQUIRE_GPU"):
        assert needed in gpu_section, needed
