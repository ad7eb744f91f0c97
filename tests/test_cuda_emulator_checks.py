"""The CUDA emulator's checkers catch what they claim to (tests/kernels/emulator_checks.cu: one
deliberately broken kernel per class of error, and correct kernels that must pass), and the seed
jobs' train steps (the MLP and LeNet, one step each) run through the checked emulator and equal
the NumPy reference.

Each violation fails with a message naming the kernel, the block and thread, the address (for
memory errors) and the class of error.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.runtime.session import Session
from tests.cuda_emulator_harness import DeviceBuffer, Emulator, EmulatorError, replay

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")

SOURCE = Path(__file__).parent / "kernels" / "emulator_checks.cu"
KERNELS = re.findall(r'^extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', SOURCE.read_text(),
                     re.MULTILINE)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return Emulator(tmp_path_factory.mktemp("emulator-checks")).build(SOURCE.read_text(), KERNELS, "-O1")


def buffers(n_out: int = 64, n_in: int = 64, write_in: bool = True, seed: int = 0):
    out, src = DeviceBuffer(4 * n_out), DeviceBuffer(4 * n_in)
    values = np.random.default_rng(seed).standard_normal(n_in).astype(np.float32)
    if write_in:
        src.write(values)
    return out, src, values


def launch(lib, kernel: str, out: DeviceBuffer, src: DeviceBuffer, grid=(1, 1, 1), block=(64, 1, 1), shared=0):
    Emulator.launch(*lib, kernel, [out.address, src.address], grid, block, shared)


def caught(lib, kernel: str, cls: str, **kw) -> str:
    """Launch a broken kernel, expect its class of error, return the message."""
    out, src = kw.pop("out", None), kw.pop("src", None)
    if out is None:
        out, src, _ = buffers()
    with pytest.raises(EmulatorError) as info:
        launch(lib, kernel, out, src, **kw)
    message = str(info.value)
    assert message.startswith(f"kernel {kernel}: {cls}"), message
    return message


# --- correct kernels pass, with the right values --------------------------------------------------------

def test_a_correct_block_reduction_passes_and_sums(lib):
    out, src = DeviceBuffer(4 * 3), DeviceBuffer(4 * 192)
    x = np.random.default_rng(1).standard_normal(192).astype(np.float32)
    src.write(x)
    launch(lib, "block_sum", out, src, grid=(3, 1, 1))
    np.testing.assert_allclose(out.view(np.float32, 3), x.reshape(3, 64).sum(axis=1), rtol=1e-5)


def test_a_correctly_synchronised_shift_passes(lib):
    out, src, x = buffers()
    launch(lib, "shift_synced", out, src)
    np.testing.assert_array_equal(out.view(np.float32, 64), np.concatenate([x[:1], x[:-1]]))


def test_the_warp_intrinsics_compute_what_cuda_specifies(lib):
    out, src, x = buffers(n_out=256)
    x[::3] = np.abs(x[::3])          # a mix of signs for the ballot, whatever the seed
    src.write(x)
    launch(lib, "warp_intrinsics", out, src)
    got = out.view(np.float32, 256).reshape(4, 64)
    warps = x.reshape(2, 32)
    np.testing.assert_allclose(got[0], np.repeat(warps.sum(axis=1), 32), rtol=1e-5)
    ballots = np.repeat([sum(1 << lane for lane in range(32) if w[lane] > 0) for w in warps], 32)
    np.testing.assert_array_equal(got[1], ballots & 0xFFFF)
    np.testing.assert_array_equal(got[2], ballots >> 16)
    np.testing.assert_array_equal(got[3], x[np.arange(64) ^ 1])


# --- each broken kernel is caught ---------------------------------------------------------------------------

def test_a_shared_memory_race_is_caught(lib):
    message = caught(lib, "shift_racy", "write/read race")
    assert "block (0,0,0) thread (1,0,0)" in message and "shared memory" in message
    assert "written by block (0,0,0) thread (0,0,0)" in message


def test_a_write_after_read_in_one_phase_is_caught(lib):
    message = caught(lib, "reuse_racy", "write/read race")
    assert "shared memory" in message


def test_a_cross_block_global_race_is_caught(lib):
    out, src, _ = buffers(n_in=4)
    message = caught(lib, "every_block_writes_one", "write/write race", out=out, src=src, grid=(4, 1, 1))
    assert "block (1,0,0) thread (0,0,0)" in message and f"0x{out.address:x}" in message
    assert "also written by block (0,0,0) thread (0,0,0)" in message


def test_a_divergent_barrier_is_caught(lib):
    message = caught(lib, "divergent_barrier", "divergent barrier")
    lines = SOURCE.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "void divergent_barrier(" in line)
    waiting, reached = first + 3, first + 5               # 1-based lines of the two __syncthreads()
    assert "__syncthreads" in lines[waiting - 1] and "__syncthreads" in lines[reached - 1]
    assert "thread (32,0,0)" in message
    pattern = rf"reached __syncthreads\(\) at \S+:{reached} while 32 thread\(s\) wait at \S+:{waiting}$"
    assert re.search(pattern, message), message


def test_a_barrier_some_threads_never_reach_is_a_deadlock(lib):
    message = caught(lib, "barrier_and_syncwarp", "barrier not reached by every thread")
    assert "1 thread(s) wait at __syncthreads()" in message and "block (0,0,0)" in message


def test_an_out_of_bounds_write_is_caught(lib):
    message = caught(lib, "write_one_past", "out-of-bounds write", block=(65, 1, 1))
    assert "thread (64,0,0)" in message and "byte 256 of allocation" in message and "256 bytes" in message


def test_an_out_of_bounds_shared_write_is_caught(lib):
    message = caught(lib, "shared_one_past", "out-of-bounds write", block=(65, 1, 1))
    assert "thread (64,0,0)" in message and "byte 256 of s[]" in message and "shared array s[] of 256 bytes" in message


def test_an_uninitialised_read_is_caught(lib):
    out, src, _ = buffers(write_in=False)
    message = caught(lib, "copy", "uninitialised read", out=out, src=src)
    assert f"address 0x{src.address:x}" in message and "block (0,0,0) thread (0,0,0)" in message


def test_an_uninitialised_shared_read_is_caught(lib):
    message = caught(lib, "shared_never_written", "uninitialised read")
    assert "shared memory" in message and "thread (0,0,0)" in message


def test_an_uninitialised_read_of_a_template_shared_array_is_caught(lib):
    message = caught(lib, "template_partial_unwritten", "uninitialised read")
    assert "thread (63,0,0)" in message and "shared memory" in message      # reads partial[31]


def test_a_divergent_warp_collective_is_caught(lib):
    message = caught(lib, "divergent_shuffle", "divergent warp collective")
    assert "thread (16,0,0)" in message and "lanes 0x0000ffff wait at __shfl_xor_sync" in message


def test_a_shuffle_after_lanes_exited_is_caught(lib):
    caught(lib, "shuffle_after_exit", "warp collective after lanes exited")


@pytest.mark.parametrize("grid, block, shared, what", [
    ((1, 1, 1), (2048, 1, 1), 0, "block (2048,1,1)"),
    ((1, 1, 1), (8, 8, 128), 0, "block (8,8,128)"),
    ((1, 70000, 1), (64, 1, 1), 0, "grid (1,70000,1)"),
    ((1, 1, 0), (64, 1, 1), 0, "zero dimension"),
    ((1, 1, 1), (64, 1, 1), 300 * 1024, "dynamic shared memory")])
def test_a_launch_over_the_sm90_limits_is_caught(lib, grid, block, shared, what):
    message = caught(lib, "copy", "launch over limits", grid=grid, block=block, shared=shared)
    assert what in message


def test_a_launch_over_the_kernels_launch_bounds_is_caught(lib):
    message = caught(lib, "bounded_copy", "launch over limits")
    assert "64 threads, over the kernel's __launch_bounds__(32)" in message
    out, src, x = buffers()
    launch(lib, "bounded_copy", out, src, block=(32, 1, 1))
    np.testing.assert_array_equal(out.view(np.float32, 32), x[:32])


def test_static_shared_memory_over_48_kib_is_caught(lib):
    message = caught(lib, "shared_64k", "launch over limits")
    assert "65536 bytes of static shared memory" in message


def test_the_host_copy_initialises_and_a_later_launch_does_not_race(lib):
    """Launches are ordered: the same bytes written by one launch and read by the next are fine."""
    out, src, x = buffers()
    launch(lib, "copy", out, src)
    again = DeviceBuffer(256)
    launch(lib, "copy", again, out)
    np.testing.assert_array_equal(again.view(np.float32, 64), x)


def test_launches_from_several_threads_do_not_mix(lib):
    """cffi releases the GIL: the runtime serialises launches, and each thread reads its own violation."""
    from concurrent.futures import ThreadPoolExecutor

    def run(i: int) -> str:
        if i % 2:
            return caught(lib, "shift_racy", "write/read race")
        out, src = DeviceBuffer(4 * 3), DeviceBuffer(4 * 192)
        x = np.random.default_rng(i).standard_normal(192).astype(np.float32)
        src.write(x)
        launch(lib, "block_sum", out, src, grid=(3, 1, 1))
        np.testing.assert_allclose(out.view(np.float32, 3), x.reshape(3, 64).sum(axis=1), rtol=1e-5)
        return "ok"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(16)))
    assert results[::2] == ["ok"] * 8 and all("shift_racy" in r for r in results[1::2])


# --- the seed jobs' train steps, one each, through the checked emulator ---------------------------------------

@pytest.mark.parametrize("label, batch", [("mlp_train", 4), ("lenet_train", 2)])
def test_a_seed_train_step_equals_the_reference_in_the_checked_emulator(label, batch, tmp_path):
    from tests.test_cuda_codegen import graph_of, render, seed_jobs
    job = seed_jobs()[label]
    job.placeholders = [dataclasses.replace(p, shape=(batch,) + p.shape[1:]) for p in job.placeholders]
    session = Session()
    program = lower(graph_of(job, session))
    graph = program.graph
    step = render(program, prefix=f"checked_{label}_")
    lib = Emulator(tmp_path).build(step.source, [la.kernel for la in step.launches], "-O1")
    rng = np.random.default_rng(0)
    inputs = [rng.random(graph.node(p).type.shape).astype(graph.node(p).type.dtype)
              if graph.node(p).type.dtype.startswith("float") else rng.integers(0, 10, graph.node(p).type.shape)
              for p in graph.placeholders]
    reference = {name: session.value(name).copy() for name in graph.variables}
    device = {name: value.copy() for name, value in reference.items()}
    scalars = {name: 0.05 for name in graph.scalars if name.startswith("learning_rate")}
    if "train_step" in graph.scalars:
        scalars["train_step"] = 0
    got, status = replay(Emulator(tmp_path), lib, program, step, inputs, device, scalars)
    want, updates = run_reference(graph, inputs, reference, scalars)
    assert status == 0
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert updates
    for name, value in updates.items():
        scale = max(float(np.max(np.abs(value))), 1e-30)
        assert float(np.max(np.abs(device[name] - value))) / scale < 1e-4, name
