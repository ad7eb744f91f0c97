"""The CUDA backend on a machine without a GPU (runs in CI).

* every CUDA template renders for the seed MLP and LeNet jobs (train and predict) and for a
  job that uses every other kernel, and where nvcc is installed every rendered translation unit
  compiles with `nvcc -cubin` for sm_80 and sm_90, through the compile cache;
* the placement pass: a no-op for CPU jobs, explicit copies for mixed ones, which still equal
  the reference on the CPU fallback;
* `runtime.devices` answers without importing PyCUDA;
* the kernels' semantics: a CPU emulation of the CUDA execution model (tests/cuda_emulator_harness.py:
  one ucontext fiber per CUDA thread, __syncthreads and warp shuffles as cooperative barriers,
  checked for races, divergent barriers, out-of-bounds and uninitialised accesses and launch
  limits) runs the generated kernels against the NumPy reference, and, with a fake
  `pycuda.driver` over emulated device memory, drives `runtime.cuda_executor.CudaLoadedStep`
  through whole training steps.

The GPU itself is tested by tests/test_cuda_device.py.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import sys
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.backends import _load
from flowc.compiler.build import build_job_graph
from flowc.compiler.cache import KernelCache
from flowc.compiler.pipeline import compile_graph, lower
from flowc.compiler.reference import run_reference
from flowc.runtime.session import Session, default_session
from tests.coverage_jobs import coverage_jobs
from tests.cuda_emulator_harness import DeviceBuffer, Emulator, EmulatorError, device_copy, mark_written, replay  # noqa: F401
from tests.test_mlp import load_example

CUDA_DIR = Path(__file__).resolve().parent.parent / "codegen_templates" / "cuda"


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    return found or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")


# --- the jobs ---------------------------------------------------------------------------------------

def graph_of(job, session: Session):
    return build_job_graph(job.name, job.job_type, job.fn, job.placeholders, job.result_spec, session,
                           job.config).graph


def seed_jobs() -> dict:
    demo = load_example("mlp_train_demo")
    lenet_train = load_example("seeds/synchronize_single_job")
    lenet_eval = load_example("seeds/synchronize_batch_job")
    cov_train, cov_predict = coverage_jobs()
    return {"mlp_train": demo.train_job, "mlp_predict": demo.eval_job, "lenet_train": lenet_train.train_job,
            "lenet_predict": lenet_eval.eval_job, "coverage_train": cov_train, "coverage_predict": cov_predict}


def render(program, tf32: bool = False, arch: str = "sm_80", prefix: str = ""):
    from flowc.compiler.codegen.cuda import CudaGenerator
    kernels = [dataclasses.replace(k, name=prefix + k.name) for k in program.kernels]
    return CudaGenerator(program.graph, kernels, program.memory, "test", tf32=tf32, arch=arch).render()


@pytest.fixture(scope="module")
def programs():
    """label -> (lowered program, its session): every job lowered once."""
    out = {}
    for label, job in seed_jobs().items():
        session = Session()
        out[label] = (lower(graph_of(job, session)), session)
    return out


@pytest.fixture(scope="module")
def steps(programs):
    """label -> GeneratedCudaStep (FP32), plus the MLP train step on TF32 tensor cores."""
    out = {label: render(program) for label, (program, _) in programs.items()}
    out["mlp_train_tf32"] = render(programs["mlp_train"][0], tf32=True)
    return out


# --- rendering ----------------------------------------------------------------------------------

def test_every_cuda_template_renders_for_the_seed_jobs(steps):
    used = {t for step in steps.values() for t in step.templates}
    # check_numerics.cu.j2 renders only for jobs built with that option (tests/test_check_numerics.py)
    templates = {p.name for p in CUDA_DIR.glob("*.cu.j2")} - {"step.cu.j2", "check_numerics.cu.j2"}
    # the indexing kernels render (and run in the emulator) in tests/test_indexing_ops.py
    from tests.test_indexing_ops import INDEXING_CUDA_TEMPLATES
    templates -= INDEXING_CUDA_TEMPLATES
    from tests.test_sparse_embedding_update import INDEXED_SLICES_CUDA_TEMPLATES     # and the sparse update's
    templates -= INDEXED_SLICES_CUDA_TEMPLATES
    from tests.test_fused_bert_kernels import FUSED_CUDA_TEMPLATES      # and BERT's fused rows there
    templates -= FUSED_CUDA_TEMPLATES
    from tests.test_batch_norm_op import BATCH_NORM_CUDA_TEMPLATES     # and batch normalisation's
    templates -= BATCH_NORM_CUDA_TEMPLATES
    from tests.test_nccl_engine import COMM_CUDA_TEMPLATES      # and the data-parallel step's, on 2 ranks
    templates -= COMM_CUDA_TEMPLATES
    assert used == templates, f"never rendered: {sorted(templates - used)}"
    for label in ("mlp_train", "mlp_predict", "lenet_train", "lenet_predict"):
        assert steps[label].launches, label
    lenet = set(steps["lenet_train"].templates)
    assert {"conv2d.cu.j2", "conv2d_grad_input.cu.j2", "conv2d_grad_filter.cu.j2", "pool2d.cu.j2",
            "pool2d_grad.cu.j2", "matmul.cu.j2", "sparse_xent.cu.j2", "pointwise.cu.j2"} <= lenet
    assert "dropout_keep" in steps["lenet_train"].source


def test_every_launch_names_a_kernel_of_its_source(steps):
    for label, step in steps.items():
        for launch in step.launches:
            assert f" {launch.kernel}(" in step.source, (label, launch.kernel)
            assert all(n >= 1 for n in launch.grid + launch.block), (label, launch)
            assert launch.grid[1] <= 65535 and launch.grid[2] <= 65535
            for arg in launch.args:
                assert arg[0] in ("arena", "input", "variable", "scalar", "scratch", "status"), arg
        assert step.bindings[0] == ("arena",)


def test_tensor_cores_only_when_asked_and_the_arch_has_them(programs, steps):
    assert not steps["mlp_train"].tensor_cores and "gemm_tile_tf32" not in steps["mlp_train"].source
    assert steps["mlp_train_tf32"].tensor_cores and "flowc::gemm_tile_tf32<" in steps["mlp_train_tf32"].source
    old = render(programs["mlp_train"][0], tf32=True, arch="sm_75")
    assert not old.tensor_cores and "no TF32 tensor cores" in old.source


def test_the_filter_gradient_splits_its_long_sum_into_scratch(steps):
    step = steps["lenet_train"]
    sums = [la for la in step.launches if la.kernel.endswith("_sum")]
    assert sums and step.scratch_bytes > 0
    assert all(("scratch", 0) in la.args for la in sums)


# --- nvcc and the cache ------------------------------------------------------------------------------

@pytest.mark.slow
@needs_nvcc
def test_every_step_compiles_with_nvcc_for_sm80_and_sm90(programs, steps, tmp_path):
    from flowc.compiler.cuda_toolchain import arch_number, build_cubin
    from tests.test_cuda_runtime_fixes import fatbin_entries
    cache = KernelCache(tmp_path / "cache")
    # The seeds' four steps one translation unit each, as a job builds them; the rest in one more
    # (kernel names prefixed apart), since every nvcc run costs a second or two of start-up.
    units = {label: steps[label] for label in ("mlp_train", "mlp_predict", "lenet_train", "lenet_predict")}
    extra = [render(programs["coverage_train"][0], prefix="train_"),
             render(programs["coverage_predict"][0], prefix="predict_"),
             render(programs["mlp_train"][0], tf32=True, prefix="tf32_")]
    units["extras"] = dataclasses.replace(extra[0], source="\n".join(e.source for e in extra),
                                          launches=[la for e in extra for la in e.launches])
    jobs = [(label, step, arch) for label, step in units.items() for arch in ("sm_80", "sm_90")]

    def build(job):
        label, step, arch = job
        return build_cubin(step.source, label, arch, cache=cache)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(build, jobs))
    for (label, step, arch), res in zip(jobs, results):
        assert res.compiled and res.path.name == "kernel.cubin" and res.source_path.name == "kernel.cu"
        cubin = res.path.read_bytes()        # a fat binary: the arch's SASS and its PTX
        assert sorted(fatbin_entries(cubin)) == [("elf", arch_number(arch)), ("ptx", arch_number(arch))], label
        for launch in step.launches:
            assert launch.kernel.encode() in cubin, (label, arch, launch.kernel)
    again = build_cubin(steps["mlp_train"].source, "mlp_train", "sm_90", cache=cache)
    assert not again.compiled and again.path == results[jobs.index(("mlp_train", steps["mlp_train"], "sm_90"))].path
    names = {e.source.name for e in cache.entries()}
    assert names == {"kernel.cu"} and len(cache.entries()) == len(jobs)


@needs_nvcc
def test_the_cache_key_covers_the_arch_and_the_nvcc_version(tmp_path):
    from flowc.compiler.cuda_toolchain import key_parts, normalize_arch, nvcc_version
    src = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    sm80, sm90 = key_parts(src, "sm_80"), key_parts(src, "sm_90")
    assert sm80.key() != sm90.key() and "-gencode=arch=compute_90,code=sm_90" in sm90.command
    assert sm80.compiler_version == nvcc_version() and "release" in sm80.compiler_version
    assert key_parts(src, "90").key() == sm90.key()
    assert normalize_arch("compute_80") == "sm_80"
    with pytest.raises(ValueError, match="sm_XY"):
        normalize_arch("hopper")
    cache = KernelCache(tmp_path)
    from flowc.compiler.cuda_toolchain import build_cubin
    build_cubin(src, "k", "sm_80", cache=cache)
    assert "cpu target ('cuda sm_80' -> 'cuda sm_90')" in cache.explain_miss("k", sm90)


@needs_nvcc
def test_an_nvcc_error_names_the_kept_source(tmp_path):
    from flowc.compiler.cuda_toolchain import build_cubin
    from flowc.compiler.toolchain import ToolchainError
    with pytest.raises(ToolchainError) as info:
        build_cubin('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n', "broken", "sm_90",
                    cache=KernelCache(tmp_path))
    message = str(info.value)
    assert "CUDA compilation of 'broken' for sm_90 failed" in message and "undefined_name" in message
    kept = Path(message.split("generated source kept at: ")[1].splitlines()[0])
    assert kept.name == "kernel.cu" and kept.is_file() and (kept.parent / "nvcc.log").is_file()


@pytest.mark.slow
@needs_nvcc
def test_compile_graph_for_the_gpu_needs_only_nvcc():
    job = seed_jobs()["mlp_predict"]
    graph = graph_of(job, Session())
    step = compile_graph(graph, device="gpu", arch="sm_90")
    assert (step.device, step.arch) == ("gpu", "sm_90")
    assert step.library.name == "step.so" and step.source_path.suffix == ".cu"     # kernels and host step
    assert step.generated.launches and set(step.timings) >= {"passes", "codegen", "compile"}
    assert [p.name for p in step.passes][:2] == ["simplify", "place_devices"]
    assert not compile_graph(graph, device="gpu", arch="sm_90").compiled     # a later run compiles nothing
    cpu = compile_graph(graph)
    assert cpu.device == "cpu" and cpu.library.suffix == ".so"
    with pytest.raises(ValueError, match="unknown device 'tpu': flowc has backends for 'cpu', "):
        compile_graph(graph, device="tpu")


def test_no_arch_and_no_gpu_is_a_clear_error():
    pytest.importorskip("flowc.compiler.cuda_toolchain")
    from flowc.compiler.cuda_toolchain import device_arch
    from flowc.compiler.toolchain import ToolchainError
    from flowc.runtime.devices import gpu_status
    if gpu_status()[0]:
        pytest.skip("a GPU is usable here")
    with pytest.raises(ToolchainError, match="pass an arch|sm_90"):
        device_arch()


# --- devices -------------------------------------------------------------------------------------------

def test_gpu_status_says_why_without_importing_pycuda():
    from flowc.runtime.devices import gpu_status
    usable, why = gpu_status()
    assert isinstance(usable, bool) and why
    if not usable and "PyCUDA is not installed" in why:
        assert "pycuda" not in sys.modules and "flowc.runtime.cuda_executor" not in sys.modules


def test_job_device_falls_back_with_a_reason_or_raises_when_strict(monkeypatch):
    from flowc.runtime import devices
    jobs = seed_jobs()
    cpu_graph, gpu_graph = graph_of(jobs["mlp_train"], Session()), graph_of(jobs["lenet_predict"], Session())
    assert devices.job_device(cpu_graph) == ("cpu", None)
    monkeypatch.setattr(devices, "device_status", lambda device: (False, "no driver here"))
    device, why = devices.job_device(gpu_graph)
    assert device == "cpu" and "no driver here" in why and "eval_job" in why
    monkeypatch.setenv("FLOWC_STRICT_DEVICE", "1")
    with pytest.raises(devices.DeviceUnavailable, match="FLOWC_STRICT_DEVICE=1"):
        devices.job_device(gpu_graph)
    monkeypatch.setattr(devices, "device_status", lambda device: (True, "a GPU"))
    assert devices.job_device(gpu_graph) == ("gpu", None)


def test_load_step_picks_the_cpu_executor_for_cpu_steps():
    from flowc.runtime.devices import load_step, sync_to_device, sync_to_host
    from flowc.runtime.executor import CpuLoadedStep
    session = Session()
    step = load_step(compile_graph(graph_of(seed_jobs()["mlp_predict"], session)), session, 2)
    assert isinstance(step, CpuLoadedStep) and len(step.slots) == 2
    sync_to_host(session)       # no GPU job ran: nothing to do, nothing imported
    sync_to_device(session)
    assert "flowc.runtime.cuda_executor" not in sys.modules


# --- placement ------------------------------------------------------------------------------------------

def test_placement_leaves_cpu_graphs_alone():
    from flowc.compiler.passes.placement import insert_device_copies
    graph = graph_of(seed_jobs()["mlp_train"], Session())
    assert insert_device_copies(graph) is graph


def test_a_job_placed_on_the_gpu_needs_no_copies(programs):
    graph = programs["lenet_train"][0].graph
    assert not [n for n in graph.nodes if n.op == "device_copy"]
    computed = [n for n in graph.nodes if n.op not in ("input", "variable", "scalar", "constant")]
    assert {n.type.device for n in computed} == {"gpu"}       # backward and update nodes follow


@flow.global_function(type="train")
def mixed_train(images: tp.Numpy.Placeholder((8, 20)),
                labels: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        hidden = flow.layers.dense(images, 16, activation=flow.nn.relu, name="mixed_hidden")
    with flow.scope.placement("cpu", "0:0"):
        logits = flow.layers.dense(hidden, 4, name="mixed_output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
    return loss


def test_mixed_placement_gets_copies_and_still_equals_the_reference_on_the_cpu(monkeypatch):
    monkeypatch.delenv("FLOWC_STRICT_DEVICE", raising=False)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((8, 20)).astype(np.float32), rng.integers(0, 4, 8).astype(np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # "gpu" runs on the CPU here
        graph = mixed_train.graph
        session = default_session()
        before = {name: session.value(name).copy() for name in graph.variables}
        loss = mixed_train(x, y)
    flow.sync_default_session()     # on a GPU the updates are on the device until the session syncs
    program = mixed_train.compiled.program
    copies = [n for n in program.graph.nodes if n.op == "device_copy"]
    directions = {(n.attr("src"), n.attr("dst")) for n in copies}
    assert directions == {("gpu", "cpu"), ("cpu", "gpu")}, directions    # forward, and the gradient back
    assert "device_copy" in program.format()
    record = next(r for r in mixed_train.compiled.passes if r.name == "place_devices")
    assert "device_copy" in record.dump and "+" in record.summary
    ref_out, ref_updates = run_reference(graph, [x, y], before, {"learning_rate:float32": 0.1})
    np.testing.assert_allclose(loss, ref_out[0], rtol=1e-5, atol=1e-6)
    for name, value in ref_updates.items():
        np.testing.assert_allclose(session.value(name), value, rtol=1e-5, atol=1e-6, err_msg=name)
    lowered_ref, _ = run_reference(program.graph, [x, y], before, {"learning_rate:float32": 0.1})
    np.testing.assert_allclose(lowered_ref[0], ref_out[0], rtol=1e-6)    # device_copy is the identity


# --- the kernels in the CUDA emulator --------------------------------------------------------------------

EMULATED_CASES = ["add_outer_broadcast", "transpose_3d", "broadcast_to", "chain_long", "cast_f32_i32",
                  "reduce_sum_all", "reduce_sum_cols_keep", "reduce_sum_outer_inner", "reduce_max", "reduce_prod",
                  "matmul_nt", "matmul_tn", "matmul_tt", "matmul_batched", "matmul_f64", "matmul_large_epilogue",
                  "conv_valid_stride2", "conv_explicit_dilated", "conv_groups", "conv_bias_relu_epilogue",
                  "max_pool_valid_overlap", "avg_pool_same", "avg_pool_explicit", "concat_axis1",
                  "softmax_axis0", "xent_int64", "xent_f64", "argmax", "gelu"]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return Emulator(tmp_path_factory.mktemp("cuda-emulator"))


@pytest.fixture(scope="module")
def emulated_cases(emulator):
    """Every case lowered and rendered with its own kernel prefix, all built into one library."""
    from tests.oracle import cotangents, trace_case
    from tests.test_ops import CASES
    cases, sources = {}, []
    for i, name in enumerate(EMULATED_CASES):
        fn, inputs = CASES[name]
        graph, _, _ = trace_case(fn, inputs, True)
        program = lower(graph)
        step = render(program, prefix=f"case{i}_")
        feeds = list(inputs) + cotangents(graph, len(inputs), np.random.default_rng(i))
        cases[name] = (program, step, feeds)
        sources.append(step.source)
    kernels = [la.kernel for _, step, _ in cases.values() for la in step.launches]
    return cases, emulator.build("\n".join(sources), kernels)


@needs_gxx
@pytest.mark.parametrize("name", EMULATED_CASES)
def test_cuda_kernels_equal_the_reference_in_the_emulator(name, emulator, emulated_cases):
    from tests.test_ops import assert_outputs_match
    cases, lib = emulated_cases
    program, step, feeds = cases[name]
    got, status = replay(emulator, lib, program, step, feeds, {}, {})
    want, _ = run_reference(program.graph, feeds, {})
    assert status == 0
    assert_outputs_match(got, want)


@needs_gxx
def test_an_out_of_range_label_raises_the_status_in_the_emulator(emulator):
    from tests.oracle import trace_case
    graph, _, _ = trace_case(lambda y, a: flow.nn.sparse_softmax_cross_entropy_with_logits(y, a),
                             [np.array([0, 1, 5, 2], np.int32), np.zeros((4, 3), np.float32)], grads=False)
    program = lower(graph)
    step = render(program, prefix="bad_")
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    _, status = replay(emulator, lib, program, step, [np.array([0, 1, 5, 2], np.int32),
                                                      np.zeros((4, 3), np.float32)], {}, {})
    assert status in step.error_nodes and program.graph.node(step.error_nodes[status]).op.startswith("sparse")


@pytest.mark.slow
@needs_gxx
@pytest.mark.parametrize("label", ["lenet_train", "coverage_train"])
def test_train_steps_equal_the_reference_in_the_emulator(label, emulator, programs):
    """Two train steps (forward, backward, update, dropout, Adam) on a small batch."""
    program, session = programs[label]
    graph = program.graph
    if label == "lenet_train":    # the seed's batch of 100 is slow to emulate: the same job on 2 images
        job = seed_jobs()["lenet_train"]
        session = Session()
        job.placeholders = [dataclasses.replace(p, shape=(2,) + p.shape[1:]) for p in job.placeholders]
        program = lower(graph_of(job, session))
        graph = program.graph
    step = render(program, prefix=f"{label}_")
    lib = emulator.build(step.source, [la.kernel for la in step.launches], "-O1")
    rng = np.random.default_rng(0)
    inputs = [rng.random(graph.node(p).type.shape).astype(graph.node(p).type.dtype)
              if graph.node(p).type.dtype.startswith("float") else rng.integers(0, 5, graph.node(p).type.shape)
              for p in graph.placeholders]
    reference = {name: session.value(name).copy() for name in graph.variables}
    device = {name: value.copy() for name, value in reference.items()}
    lr = {name: 0.05 for name in graph.scalars if name.startswith("learning_rate")}
    for step_index in range(2):
        scalars = dict(lr, train_step=step_index) if "train_step" in graph.scalars else lr
        got, status = replay(emulator, lib, program, step, inputs, device, scalars)
        want, updates = run_reference(graph, inputs, reference, scalars)
        reference.update(updates)
        assert status == 0
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for name in updates:
        scale = max(float(np.max(np.abs(reference[name]))), 1e-30)
        assert float(np.max(np.abs(device[name] - reference[name]))) / scale < 1e-4, name


# --- CudaLoadedStep on an emulated device --------------------------------------------------------------------

class FakeDriver:
    """Just enough of `pycuda.driver` over host memory: allocations are NumPy buffers, copies are
    memmoves, modules are the kernel.cu beside the cubin built for the emulator.  Everything runs
    synchronously, so it checks the executor's bookkeeping, not its overlap."""

    class Error(RuntimeError):
        pass

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.launches = 0
        driver = self

        class Allocation(DeviceBuffer):
            @property
            def buffer(self) -> np.ndarray:
                return self.view()

        class Device:
            def __init__(self, index: int) -> None:
                self.index = index

            @staticmethod
            def count() -> int:
                return 1

            def compute_capability(self):
                return (8, 0)

            def name(self) -> str:
                return "emulated"

            def pci_bus_id(self) -> str:
                return f"0000:{self.index:02x}:00.0"

            def retain_primary_context(self):
                return Context()

        class Context:
            def push(self) -> None:
                pass

            @staticmethod
            def pop() -> None:
                pass

            @staticmethod
            def synchronize() -> None:
                pass

        class Event:
            def record(self, stream=None):
                return self

            def time_since(self, other) -> float:
                return 0.5

        class Stream:
            def synchronize(self) -> None:
                pass

            def wait_for_event(self, event) -> None:
                pass

        class Function:
            def __init__(self, lib_pair, name: str) -> None:
                self.lib_pair, self.name, self.format = lib_pair, name, None

            def prepare(self, arg_types: str):
                self.format = arg_types
                return self

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0) -> None:
                assert self.format == "P" * len(args) and all(isinstance(a, int) for a in args)
                driver.launches += 1
                Emulator.launch(*self.lib_pair, self.name, list(args), grid, block, shared_size)

        class Module:
            def __init__(self, cubin: str) -> None:
                self.source = (Path(cubin).parent / "kernel.cu").read_text()
                self.names = re.findall(r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(',
                                        self.source, re.MULTILINE)
                self.lib_pair = driver.emulator.build(self.source, self.names, "-O1")

            def get_function(self, name: str):
                assert name in self.names, name
                return Function(self.lib_pair, name)

        self.Device, self.Context, self.Event, self.Stream = Device, Context, Event, Stream
        self.mem_alloc = Allocation
        self.module_from_file = Module

    @staticmethod
    def init() -> None:
        pass

    @staticmethod
    def pagelocked_empty(shape, dtype):
        return np.zeros(shape, dtype)

    @staticmethod
    def _address(x) -> int:
        return x.ctypes.data if isinstance(x, np.ndarray) else int(x)

    def memcpy_htod(self, dst, src, stream=None) -> None:
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)
        mark_written(int(dst), src.nbytes)

    def memcpy_dtoh(self, dst, src, stream=None) -> None:
        ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)

    memcpy_htod_async, memcpy_dtoh_async = memcpy_htod, memcpy_dtoh

    def memcpy_dtod_async(self, dst, src, nbytes, stream=None) -> None:
        device_copy(int(dst), int(src), nbytes)

    def memset_d32_async(self, dst, value, count, stream=None) -> None:
        np.frombuffer((ctypes.c_int32 * count).from_address(int(dst)), np.int32)[:] = value
        mark_written(int(dst), 4 * count)


@pytest.fixture
def fake_pycuda(emulator, monkeypatch):
    driver = FakeDriver(emulator)
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.delitem(sys.modules, "flowc.runtime.cuda_executor", raising=False)
    # This driver launches kernels one by one (PyCUDA's way); tests/test_cuda_host_step.py runs the
    # step library's host step on the emulator.
    monkeypatch.setenv("FLOWC_CUDA_PER_LAUNCH", "1")
    # The backend registry caches the class it loaded: forget it, or a later test's steps would run
    # on the first test's driver (and count their launches there).
    _load.cache_clear()
    yield driver
    sys.modules.pop("flowc.runtime.cuda_executor", None)
    _load.cache_clear()


@pytest.mark.slow
@needs_nvcc
@needs_gxx
def test_cuda_loaded_step_trains_like_the_reference_on_an_emulated_device(fake_pycuda, monkeypatch):
    from flowc.runtime.devices import load_step, sync_to_device, sync_to_host
    monkeypatch.setenv("FLOWC_PROFILE", "1")
    job = seed_jobs()["mlp_train"]
    session = Session()
    graph = graph_of(job, session)
    step = load_step(compile_graph(graph, device="gpu", arch="sm_80"), session, depth=2)
    from flowc.runtime.cuda_executor import CudaLoadedStep
    assert isinstance(step, CudaLoadedStep) and len(step.slots) == 2
    rng = np.random.default_rng(1)
    before = {name: session.value(name).copy() for name in graph.variables}
    host_arrays = {name: session.value(name) for name in graph.variables}
    reference = dict(before)
    for i in range(2):
        x = rng.random((100, 1, 28, 28), np.float32)
        y = rng.integers(0, 10, 100).astype(np.int32)
        slot = step.slots[i % 2]
        step.feed(slot, [x, y], {"learning_rate:float32": 0.1})
        (loss,) = step.compute(slot)
        want, updates = run_reference(graph, [x, y], reference, {"learning_rate:float32": 0.1})
        reference.update(updates)
        np.testing.assert_allclose(loss, want[0], rtol=1e-5, atol=1e-6)
    for name in graph.assigns:                 # the device has the new values, the host the old ones
        np.testing.assert_array_equal(session.value(name), before[name])
    sync_to_host(session)
    for name in graph.assigns:
        assert session.value(name) is host_arrays[name]          # updated in place
        np.testing.assert_allclose(session.value(name), reference[name], rtol=1e-4, atol=1e-6, err_msg=name)
    session.value("output-bias")[...] = 7.0      # e.g. a checkpoint loaded on the host
    sync_to_device(session)
    assert (step.variables.buffers["output-bias"].buffer.view(np.float32)[:10] == 7.0).all()
    out = step.view(graph.outputs[0], step.slots[0])
    assert out.shape == (100,)
    assert fake_pycuda.launches == 2 * len(step.launches)
    profile = dict(step.profile())
    assert set(profile) == {la.kernel for la in step.launches} and all(s > 0 for s in profile.values())
    bad = np.full(100, 11, np.int32)
    with pytest.raises(flow.StepError, match="out of range"):
        step.run([x, bad], {"learning_rate:float32": 0.1})


def test_placing_a_placed_graph_again_adds_no_copies():
    from flowc.compiler.passes.placement import insert_device_copies
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        graph = mixed_train.graph
    once = insert_device_copies(graph)
    twice = insert_device_copies(once)
    count = [sum(n.op == "device_copy" for n in g.nodes) for g in (once, twice)]
    assert count[0] > 0 and count[0] == count[1]
