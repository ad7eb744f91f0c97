"""One foreign call per GPU step: the host step (`flowc_step`) at the end of every generated .cu.

Without a GPU (CI):
* the host step runs on the CUDA emulator (tests/cuda_emulator.h maps its launches to the
  emulator's fibers and logs every call): the log is the step's launch list (kernel, grid, block,
  shared bytes, stream, argument addresses) in order, then the device copies, the downloads of
  what the host reads, and one wait at the end (none where the host reads nothing); the results
  equal the per-launch replay bit for bit and the NumPy reference within tolerance;
* a check_numerics check stops the host step at the first bad value;
* `CudaLoadedStep` over a fake PyCUDA (emulated device memory) calls `flowc_step` once per step and
  launches nothing through PyCUDA;
* the toolchain builds the step library, falls back to the cubin with a warning where the library
  cannot be built, and takes the cubin without a warning under FLOWC_CUDA_PER_LAUNCH=1;
* where nvcc is installed, the step library builds with it and its `flowc_step` answers a CUDA error
  by name on a machine without a driver.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import stat
import sys
import types
import warnings
from pathlib import Path

import cffi
import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.backends import _load
from flowc.compiler.codegen.cuda_host import host_buffers
from flowc.compiler.pipeline import compile_graph, lower
from flowc.compiler.reference import run_reference
from flowc.runtime.session import Session
from tests.cuda_emulator_harness import DeviceBuffer, Emulator, host_log, replay
from tests.fake_cuda_driver import write_fake_nvcc
from tests.test_cuda_codegen import FakeDriver as EmulatedDriver
from tests.test_cuda_codegen import graph_of, render

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
STEP_CDEF = ("int flowc_step(void* stream, char** buffers, void** outputs, int* host_status, float* launch_ms);"
             "const char* flowc_step_error(int code);")
STREAM = 0x5EED0      # a stream handle the log must show on every call
LR = {"learning_rate:float32": 0.1}


def _hidden():
    return flow.get_variable("host_step_hidden", shape=(6, 5), initializer=flow.random_normal_initializer(0, 0.5))


def _output():
    return flow.get_variable("host_step_output", shape=(5, 3), initializer=flow.random_normal_initializer(0, 0.5))


@flow.global_function(type="train")
def small_train(x: tp.Numpy.Placeholder((8, 6)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        hidden = flow.nn.relu(flow.matmul(x, _hidden()))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.matmul(hidden, _output()))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="train")
def silent_train(x: tp.Numpy.Placeholder((8, 6))):
    """Returns nothing and checks no data: its host reads nothing of a step."""
    with flow.scope.placement("gpu", "0:0"):
        loss = flow.math.reduce_mean(flow.matmul(x, _hidden()))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)


@flow.global_function(type="predict")
def loss_predict(x: tp.Numpy.Placeholder((8, 6)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        return flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.matmul(x, _hidden()))


@flow.global_function(type="predict")
def tiny_predict(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        return flow.math.sqrt(flow.matmul(x, _hidden()))


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return Emulator(tmp_path_factory.mktemp("host-step"))


def _build(emulator: Emulator, step, prefix: str):
    """The step's source with its host step, on the emulator: (ffi, lib)."""
    return emulator.build("#define FLOWC_HOST_STEP 1\n" + step.source, [la.kernel for la in step.launches],
                          extra_cdef=STEP_CDEF)


class HostRun:
    """One program's device buffers on the emulator, and the table `flowc_step` takes."""

    def __init__(self, lib_pair, program, step, inputs, variables, scalars) -> None:
        self.ffi, self.lib = lib_pair
        graph = program.graph
        self.fixed = {"arena": DeviceBuffer(max(program.memory.arena_bytes, 64)),
                      "scratch": DeviceBuffer(max(step.scratch_bytes, 64)), "status": DeviceBuffer(4)}
        self.fixed["status"].write(np.full(1, 7, np.int32))      # the host step clears it
        self.host = {"input": {i: np.ascontiguousarray(a, graph.node(p).type.dtype)
                               for i, (p, a) in enumerate(zip(graph.placeholders, inputs))},
                     "variable": variables,
                     "scalar": {n: np.array(scalars[n], dtype) for n, dtype in graph.scalars.items()}}
        self.buffers: dict[tuple, DeviceBuffer] = {}
        for b in step.bindings[1:]:
            value = np.ascontiguousarray(self.host[b[0]][b[1]])
            self.buffers[b] = buf = DeviceBuffer(max(value.nbytes, 1))
            buf.write(value)
        self.entries = host_buffers(step.bindings)
        self.addresses = [self.address(b) for b in self.entries]
        self.table = self.ffi.new("char*[]", [self.ffi.cast("char*", a) for a in self.addresses])
        self.outputs = [np.zeros(graph.node(o).type.shape, graph.node(o).type.dtype) for o in graph.outputs]
        self.output_table = self.ffi.new("void*[]", [self.ffi.cast("void*", o.ctypes.data) for o in self.outputs]
                                         or [self.ffi.NULL])
        self.status = np.zeros(1, np.int32)
        self.step, self.graph = step, graph

    def address(self, binding: tuple) -> int:
        if binding[0] in self.fixed:
            return self.fixed[binding[0]].address + (int(binding[1]) if len(binding) > 1 else 0)
        return self.buffers[binding].address

    def __call__(self, launch_ms=None) -> int:
        host_log()          # start a fresh log
        return self.lib.flowc_step(self.ffi.cast("void*", STREAM), self.table, self.output_table,
                                   self.ffi.cast("int*", self.status.ctypes.data),
                                   launch_ms if launch_ms is not None else self.ffi.NULL)

    def variable(self, name: str) -> np.ndarray:
        host = self.host["variable"][name]
        return self.buffers[("variable", name)].view(host.dtype, host.size).reshape(host.shape).copy()

    def expected_log(self, sync: bool) -> list[str]:
        """What the host step must do, in order: the launch list, the copies, what the host reads."""
        s = f"{STREAM:#x}"
        lines = [f"clear_status {self.address(('status',)):#x} (nil) 4 {s}"]
        for la in self.step.launches:
            args = "".join(f" {self.address(b):#x}" for b in la.args)
            lines.append(f"launch {la.kernel} {','.join(map(str, la.grid))} {','.join(map(str, la.block))} "
                         f"{la.shared_bytes} {s}{args}")
        for c in self.step.copies:
            lines.append(f"copy_device {self.address(c.dst):#x} {self.address(c.src):#x} {c.nbytes} {s}")
        for f in self.step.fetches:
            if f.nbytes:
                lines.append(f"copy_to_host {self.outputs[f.output].ctypes.data:#x} {self.address(f.src):#x} "
                             f"{f.nbytes} {s}")
        if sync:
            lines += [f"copy_to_host {self.status.ctypes.data:#x} {self.address(('status',)):#x} 4 {s}",
                      f"synchronize (nil) (nil) 0 {s}"]
        return lines


def _session_values(job):
    session = Session()
    graph = graph_of(job, session)
    return lower(graph), {name: session.value(name).copy() for name in graph.variables}


# --- the generated host step on the emulator -------------------------------------------------------------

@needs_gxx
def test_the_host_step_is_the_launch_list_in_one_call_and_equals_the_per_launch_replay(emulator):
    program, variables = _session_values(small_train)
    step = render(program, prefix="hs_")
    assert step.host_sync and step.fetches and "flowc_step" in step.source
    lib = _build(emulator, step, "hs_")
    x, y = _data()
    run = HostRun(lib, program, step, [x, y], {n: v.copy() for n, v in variables.items()}, LR)
    assert run() == 0
    assert host_log() == run.expected_log(sync=True)
    assert run.status[0] == 0
    # The same kernels launched one by one from the host (tests/cuda_emulator_harness.replay): the same bits.
    per_launch_vars = {n: v.copy() for n, v in variables.items()}
    outputs, status = replay(emulator, lib, program, step, [x, y], per_launch_vars, LR)
    assert status == 0
    np.testing.assert_array_equal(run.outputs[0], outputs[0])
    for name in program.graph.assigns:
        np.testing.assert_array_equal(run.variable(name), per_launch_vars[name], err_msg=name)
    want, updates = run_reference(program.graph, [x, y], variables, LR)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=1e-5, atol=1e-6)
    for name, value in updates.items():
        np.testing.assert_allclose(run.variable(name), value, rtol=1e-5, atol=1e-6, err_msg=name)


@needs_gxx
def test_a_step_whose_host_reads_nothing_is_not_waited_for(emulator):
    program, variables = _session_values(silent_train)
    step = render(program, prefix="silent_")
    assert not step.host_sync and not step.fetches
    assert "It does not wait for the stream" in step.source
    run = HostRun(_build(emulator, step, "silent_"), program, step, [_data()[0]], variables, LR)
    assert run() == 0
    log = host_log()
    assert log == run.expected_log(sync=False) and not [ln for ln in log if ln.startswith("synchronize")]


@needs_gxx
def test_the_status_of_a_bad_label_reaches_the_host(emulator):
    # (A predict job: in a train step the gradient kernels after the loss read the rows the loss
    # kernel left unwritten for the bad label, which the emulator reports as uninitialised reads.)
    program, variables = _session_values(loss_predict)
    step = render(program, prefix="label_")
    run = HostRun(_build(emulator, step, "label_"), program, step, [_data()[0], np.full(8, 9, np.int32)],
                  variables, {})
    rc = run()
    assert rc == 0, run.ffi.string(run.lib.flowc_step_error(rc))
    assert run.status[0] in step.error_nodes


@needs_gxx
def test_check_numerics_stops_the_host_step_at_the_first_bad_value(emulator):
    from flowc.compiler.codegen.cuda import CudaGenerator
    program, variables = _session_values(tiny_predict)
    step = CudaGenerator(program.graph, program.kernels, program.memory, "test", arch="sm_80",
                         check_numerics=True).render()
    checks = [i for i, la in enumerate(step.launches) if la.checks_status]
    assert checks and step.host_sync
    lib = _build(emulator, step, "")
    hidden = np.abs(variables["host_step_hidden"])
    good = HostRun(lib, program, step, [np.abs(_data()[0])], dict(variables, host_step_hidden=hidden), {})
    assert good() == 0 and good.status[0] == 0
    assert len([ln for ln in host_log() if ln.startswith("launch")]) == len(step.launches)
    bad = HostRun(lib, program, step, [-np.abs(_data()[0])], dict(variables, host_step_hidden=hidden), {})
    assert bad() == -1 and bad.status[0] in step.numerics_nodes
    assert program.graph.node(step.numerics_nodes[int(bad.status[0])]).op == "sqrt"
    log = host_log()
    launched = [ln.split()[1] for ln in log if ln.startswith("launch")]
    assert len(launched) - 1 in checks, launched          # it stopped right after a check
    assert launched == [la.kernel for la in step.launches[:len(launched)]]
    assert log[-1].startswith("synchronize") and log[-2].startswith("copy_to_host")


@needs_gxx
def test_the_host_step_times_each_launch_when_profiled(emulator):
    program, variables = _session_values(small_train)
    step = render(program, prefix="timed_")
    run = HostRun(_build(emulator, step, "timed_"), program, step, list(_data()), variables, LR)
    ms = run.ffi.new("float[]", len(step.launches))
    assert run() == 0 and run(ms) == 0 and run(ms) == 0
    assert list(ms) == [2.0] * len(step.launches)      # the emulator's timer counts each launch once per step


# --- CudaLoadedStep: one call of flowc_step per step ---------------------------------------------------------

@pytest.fixture
def host_step_device(emulator, monkeypatch, tmp_path):
    """A fake PyCUDA over emulated memory, a fake nvcc, and the step library opened as its emulator build."""
    driver = EmulatedDriver(emulator)
    driver.Stream.handle = STREAM
    driver.Event.synchronize = lambda self: None
    package = types.ModuleType("pycuda")
    package.driver = driver        # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.delitem(sys.modules, "flowc.runtime.cuda_executor", raising=False)
    monkeypatch.setenv("NVCC", str(write_fake_nvcc(tmp_path)))
    monkeypatch.delenv("FLOWC_CUDA_PER_LAUNCH", raising=False)
    _load.cache_clear()
    import flowc.runtime.cuda_executor as executor
    calls: list[str] = []

    class Counted:
        def __init__(self, lib) -> None:
            self.lib = lib

        def flowc_step(self, *args):
            calls.append("flowc_step")
            return self.lib.flowc_step(*args)

        def flowc_step_error(self, code):
            return self.lib.flowc_step_error(code)

    def open_library(path: str):
        assert Path(path).name == "step.so"
        source = (Path(path).parent / "kernel.cu").read_text()
        names = re.findall(r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', source, re.MULTILINE)
        _, lib = emulator.build("#define FLOWC_HOST_STEP 1\n" + source, names, "-O1", extra_cdef=STEP_CDEF)
        return Counted(lib)
    monkeypatch.setattr(executor, "open_step_library", open_library)
    driver.calls = calls
    yield driver
    sys.modules.pop("flowc.runtime.cuda_executor", None)
    _load.cache_clear()


@needs_gxx
def test_cuda_loaded_step_makes_one_foreign_call_per_step(host_step_device, monkeypatch):
    from flowc.runtime.devices import load_step, sync_to_host
    monkeypatch.setenv("FLOWC_PROFILE", "1")
    session = Session()
    graph = graph_of(small_train, session)
    compiled = compile_graph(graph, device="gpu", arch="sm_80")
    assert compiled.library.name == "step.so"
    step = load_step(compiled, session, depth=2)
    assert step.mode == "host step" and step.module is None
    reference = {name: session.value(name).copy() for name in graph.variables}
    host_log()          # forget what earlier tests' host steps did
    for i in range(3):
        x, y = _data(i)
        slot = step.slots[i % 2]
        step.feed(slot, [x, y], LR)
        (loss,) = step.compute(slot)
        want, updates = run_reference(graph, [x, y], reference, LR)
        reference.update(updates)
        np.testing.assert_allclose(loss, want[0], rtol=1e-5, atol=1e-6)
        log = host_log()
        assert [ln for ln in log if ln.startswith("synchronize")] == [log[-1]]     # one wait, at the end
        assert all(ln.split()[-1] == f"{STREAM:#x}" or ln.startswith("launch") for ln in log)
    assert host_step_device.calls == ["flowc_step"] * 3 and host_step_device.launches == 0    # none from Python
    sync_to_host(session)
    for name in graph.assigns:
        np.testing.assert_allclose(session.value(name), reference[name], rtol=1e-4, atol=1e-6, err_msg=name)
    profile = dict(step.profile())
    assert set(profile) == {la.kernel for la in step.launches}
    assert all(s == pytest.approx(3e-3 * sum(la.kernel == k for la in step.launches)) for k, s in profile.items())
    with pytest.raises(flow.StepError, match="out of range"):
        step.run([x, np.full(8, 5, np.int32)], LR)
    step.release()


@needs_gxx
def test_a_slot_whose_step_was_not_waited_for_is_waited_for_before_its_next_feed(host_step_device):
    from flowc.runtime.devices import load_step
    session = Session()
    step = load_step(compile_graph(graph_of(silent_train, session), device="gpu", arch="sm_80"), session, depth=1)
    slot = step.slots[0]
    waited: list[int] = []
    host_log()
    type(slot.done).synchronize = lambda self: waited.append(1)
    step.feed(slot, [_data()[0]], LR)
    assert step.compute(slot) == [] and slot.in_flight and not waited
    assert not [ln for ln in host_log() if ln.startswith("synchronize")]
    step.feed(slot, [_data(1)[0]], LR)
    assert waited == [1] and not slot.in_flight
    step.release()


# --- the toolchain: the step library, the fallback, the setting -------------------------------------------------

def _nvcc_without_shared_libraries(folder: Path) -> Path:
    """A fake nvcc that builds cubins but fails every `-shared` link (no libcudart_static.a, say)."""
    (folder / "inner").mkdir(parents=True)
    real = write_fake_nvcc(folder / "inner", "13.1")     # another version: nothing of the cache serves it
    path = folder / "nvcc"
    path.write_text("#!/bin/sh\n"
                    "for a in \"$@\"; do if [ \"$a\" = -shared ]; then "
                    "echo 'nvlink fatal: could not find -lcudart_static' >&2; exit 1; fi; done\n"
                    f"exec '{real}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_step_library_is_the_default_and_the_cubin_a_fallback_that_says_why(monkeypatch, tmp_path):
    from flowc.compiler.cuda_toolchain import StepLibraryUnavailable
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FLOWC_CUDA_PER_LAUNCH", raising=False)
    graph = graph_of(tiny_predict, Session())
    monkeypatch.setenv("NVCC", str(write_fake_nvcc(tmp_path)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_graph(graph, device="gpu", arch="sm_90").library.name == "step.so"
    monkeypatch.setenv("FLOWC_CUDA_PER_LAUNCH", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_graph(graph, device="gpu", arch="sm_90").library.name == "kernel.cubin"
    monkeypatch.delenv("FLOWC_CUDA_PER_LAUNCH")
    monkeypatch.setenv("NVCC", str(_nvcc_without_shared_libraries(tmp_path / "broken")))
    with pytest.warns(StepLibraryUnavailable, match=r"(?s)launched from Python.*lcudart_static"):
        fallback = compile_graph(graph, device="gpu", arch="sm_90")
    assert fallback.library.name == "kernel.cubin"


def test_flowc_show_kernels_says_how_a_gpu_step_runs(monkeypatch):
    monkeypatch.delenv("FLOWC_CUDA_PER_LAUNCH", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        text = tiny_predict.lower(device="gpu").kernels_text()
    assert text.splitlines()[0].startswith("GPU step mode: one foreign call per step: flowc_step")
    monkeypatch.setenv("FLOWC_CUDA_PER_LAUNCH", "1")
    assert "GPU step mode: per launch (FLOWC_CUDA_PER_LAUNCH=1)" in tiny_predict.lower(device="gpu").kernels_text()
    assert "GPU step mode" not in tiny_predict.lower(device="cpu").kernels_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_step_library_builds_with_nvcc_and_names_a_cuda_error(tmp_path):
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_step_library
    from flowc.runtime.devices import gpu_status
    program, _ = _session_values(tiny_predict)
    step = render(program)
    built = build_step_library(step.source, "tiny_predict", "sm_90", cache=KernelCache(tmp_path))
    assert built.path.name == "step.so" and built.compiled
    ffi = cffi.FFI()
    ffi.cdef(STEP_CDEF)
    lib = ffi.dlopen(str(built.path))
    image = built.path.read_bytes()
    assert all(la.kernel.encode() in image for la in step.launches)     # the kernels are in the library
    if gpu_status()[0]:
        return          # tests/test_cuda_device.py runs it on the GPU
    arena = ctypes.create_string_buffer(max(program.memory.arena_bytes, 64))
    table = ffi.new("char*[]", [ffi.cast("char*", ctypes.addressof(arena))] * len(host_buffers(step.bindings)))
    out = np.zeros(program.graph.node(program.graph.outputs[0]).type.shape, np.float32)
    status = np.zeros(1, np.int32)
    rc = lib.flowc_step(ffi.NULL, table, ffi.new("void*[]", [ffi.cast("void*", out.ctypes.data)]),
                        ffi.cast("int*", status.ctypes.data), ffi.NULL)
    assert rc > 0       # no driver (or no device) here: the first runtime call says so
    assert re.search(r"driver|device", ffi.string(lib.flowc_step_error(rc)).decode(), re.IGNORECASE)


# --- on a real GPU (tests/test_cuda_device.py runs everything else there) ----------------------------------------

def _gpu_usable() -> tuple[bool, str]:
    from flowc.runtime.devices import gpu_status
    return gpu_status()


@pytest.mark.gpu
def test_the_host_step_and_the_per_launch_path_agree_bit_for_bit_on_the_gpu(monkeypatch):
    usable, why = _gpu_usable()
    if not usable:
        pytest.skip(f"no usable GPU: {why}")
    from flowc.runtime.devices import load_step, sync_to_host
    results = {}
    for mode, per_launch in (("host step", None), ("per launch", "1")):
        if per_launch:
            monkeypatch.setenv("FLOWC_CUDA_PER_LAUNCH", per_launch)
        session = Session()
        graph = graph_of(small_train, session)
        rng = np.random.default_rng(3)      # the same weights for both paths, uploaded by load_step
        for name in ("host_step_hidden", "host_step_output"):
            session.value(name)[...] = rng.standard_normal(session.value(name).shape)
        step = load_step(compile_graph(graph, device="gpu"), session, depth=2)
        assert step.mode == mode
        losses = []
        for i in range(4):
            slot = step.slots[i % 2]
            step.feed(slot, list(_data(i)), LR)
            losses.append(step.compute(slot)[0])
        sync_to_host(session)
        results[mode] = (losses, {n: session.value(n).copy() for n in ("host_step_hidden", "host_step_output")})
        step.release()
    (a, va), (b, vb) = results["host step"], results["per launch"]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    for name in va:
        np.testing.assert_array_equal(va[name], vb[name], err_msg=name)
