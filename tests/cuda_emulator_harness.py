"""The CUDA emulator from Python: build generated CUDA sources as instrumented host code, run
launch lists on emulated device memory, and turn every violation the runtime finds into a test
failure.

* tests/cuda_emulator.h: the kernel side, force-included into each generated source;
* tests/cuda_emulator_runtime.cpp: fibers, barriers, warp collectives and the checkers (races,
  divergent barriers, out-of-bounds, uninitialised reads, launch limits), built once per process
  into libflowc_emu.so, which every kernel library links against (so all of them share one set
  of device allocations).

    emulator = Emulator(tmp_path)
    lib = emulator.build(step.source, [la.kernel for la in step.launches])
    outputs, status = replay(emulator, lib, program, step, feeds, {}, {})
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import cffi
import numpy as np

HERE = Path(__file__).resolve().parent
HEADER = HERE / "cuda_emulator.h"
RUNTIME = HERE / "cuda_emulator_runtime.cpp"
CUDA_DIR = HERE.parent / "codegen_templates" / "cuda"

RUNTIME_API = """
void* emu_alloc(size_t);
void emu_free(void*);
void emu_write(void*, const void*, size_t);
void emu_copy(void*, const void*, size_t);
void emu_mark_written(void*, size_t);
const char* emu_error(void);
const char* emu_host_log(void);
void emu_host_log_clear(void);
"""
# Every load and store of a kernel calls the runtime (__asan_{load,store}N_noabort); the
# runtime's own memory (threadIdx & co.) is reached through calls, and fiber stacks are skipped.
# Static (shared) arrays get redzones and are registered (__asan_register_globals); template
# statics stay private to their module (-fno-gnu-unique).
INSTRUMENT = ["-fsanitize=kernel-address", "--param", "asan-instrumentation-with-call-threshold=0",
              "--param", "asan-stack=0", "--param", "asan-globals=1", "-fno-gnu-unique"]


# A kernel declared with __launch_bounds__(N) fails to launch with more than N threads per block.
LAUNCH_BOUNDS = re.compile(r'__global__\s+void\s+__launch_bounds__\(\s*(\d+)[^)]*\)\s*(\w+)\s*\(')


class EmulatorError(AssertionError):
    """A kernel did something a GPU would not forgive: the message names the kernel, the block and
    thread, the address and the class of error."""


@functools.cache
def runtime_dir() -> Path:
    """Folder of libflowc_emu.so, built once per source digest (atomically: parallel runs share it)."""
    source = RUNTIME.read_bytes()
    digest = hashlib.sha256(source + HEADER.read_bytes()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"flowc-emu-{os.getuid()}-{digest}"
    # A shared temp folder: the library loaded from it must be ours alone (docs/security.md), so the
    # folder is created private and refused when someone else owns it or can write into it.
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.stat()
    assert info.st_uid == os.getuid() and info.st_mode & 0o077 == 0, \
        f"{folder} is not a private folder of this user: remove it"
    so = folder / "libflowc_emu.so"
    if not so.exists():
        tmp = folder / f"libflowc_emu.{os.getpid()}.so"
        proc = subprocess.run(["g++", "-std=c++17", "-O2", "-g", "-shared", "-fPIC", str(RUNTIME), "-o", str(tmp)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[:4000]
        os.replace(tmp, so)
    return folder


@functools.cache
def runtime():
    """(ffi, lib) of the runtime: device memory for the host side."""
    ffi = cffi.FFI()
    ffi.cdef(RUNTIME_API)
    return ffi, ffi.dlopen(str(runtime_dir() / "libflowc_emu.so"))


class DeviceBuffer:
    """An emulated device allocation: poisoned and uninitialised until written."""

    def __init__(self, nbytes: int) -> None:
        ffi, lib = runtime()
        self.nbytes = nbytes
        self.address = int(ffi.cast("uintptr_t", lib.emu_alloc(nbytes)))
        assert self.address, f"emu_alloc({nbytes}) failed"

    def __int__(self) -> int:
        return self.address

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        assert offset + data.nbytes <= self.nbytes, (offset, data.nbytes, self.nbytes)
        ffi, lib = runtime()
        lib.emu_write(ffi.cast("void*", self.address + offset), ffi.cast("void*", data.ctypes.data), data.nbytes)

    def view(self, dtype=np.uint8, count: int = -1, offset: int = 0) -> np.ndarray:
        """The bytes as a NumPy array (reads do not check initialisation: a host copy may copy garbage)."""
        raw = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * self.nbytes).from_address(self.address))
        return np.frombuffer(raw, dtype=dtype, count=count, offset=offset)

    def free(self) -> None:
        if self.address:
            ffi, lib = runtime()
            lib.emu_free(ffi.cast("void*", self.address))
            self.address = 0

    def __del__(self) -> None:
        self.free()


def device_copy(dst: int, src: int, nbytes: int) -> None:
    """A device-to-device copy (initialised bits travel with the bytes)."""
    ffi, lib = runtime()
    lib.emu_copy(ffi.cast("void*", dst), ffi.cast("void*", src), nbytes)


def host_log(clear: bool = True) -> list[str]:
    """The calls the host steps (flowc_step built with FLOWC_HOST_STEP) made since the last clear, one per line."""
    ffi, lib = runtime()
    lines = ffi.string(lib.emu_host_log()).decode().splitlines()
    if clear:
        lib.emu_host_log_clear()
    return lines


def mark_written(address: int, nbytes: int) -> None:
    ffi, lib = runtime()
    lib.emu_mark_written(ffi.cast("void*", address), nbytes)


class Emulator:
    """Builds generated CUDA sources as instrumented host code over cuda_emulator.h and launches their kernels."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def build(self, source: str, kernels: list[str], optimize: str = "-O0", extra_cdef: str = ""):
        rt = runtime_dir()
        digest = hashlib.sha256((source + optimize + str(rt)).encode()).hexdigest()[:16]
        src, so = self.folder / f"{digest}.cpp", self.folder / f"{digest}.so"
        if not so.exists():
            src.write_text(source)
            proc = subprocess.run(["g++", "-std=c++17", optimize, "-w", "-shared", "-fPIC", *INSTRUMENT, "-include",
                                   str(HEADER), f"-I{CUDA_DIR}", "-x", "c++", str(src), "-x", "none",
                                   f"-L{rt}", "-lflowc_emu", f"-Wl,-rpath,{rt}", "-Wl,--no-undefined",
                                   "-o", str(so)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[:4000]
        ffi = cffi.FFI()
        ffi.flowc_launch_bounds = {name: int(n) for n, name in LAUNCH_BOUNDS.findall(source)}  # type: ignore[attr-defined]
        ffi.cdef("int emu_launch(const char*, void*, int, void**, unsigned, unsigned, unsigned, unsigned, unsigned,"
                 " unsigned, unsigned);" + RUNTIME_API
                 + "".join(f"void {name}(void);" for name in sorted(set(kernels))) + extra_cdef)
        return ffi, ffi.dlopen(str(so))

    @staticmethod
    def launch(ffi, lib, kernel: str, pointers: list[int], grid, block, shared_bytes: int = 0) -> None:
        """Run one launch; raise EmulatorError with the runtime's message on a violation."""
        bound = getattr(ffi, "flowc_launch_bounds", {}).get(kernel)
        threads = block[0] * block[1] * block[2]
        if bound is not None and threads > bound:
            raise EmulatorError(f"kernel {kernel}: launch over limits: block ({block[0]},{block[1]},{block[2]}) = "
                                f"{threads} threads, over the kernel's __launch_bounds__({bound})")
        argv = ffi.new("void*[]", [ffi.cast("void*", p) for p in pointers])
        name = ffi.new("char[]", kernel.encode())
        if lib.emu_launch(name, ffi.cast("void*", ffi.addressof(lib, kernel)), len(pointers), argv, *grid, *block,
                          shared_bytes):
            raise EmulatorError(ffi.string(lib.emu_error()).decode(errors="replace"))


def replay(emulator: Emulator, lib_pair, program, step, inputs, variables, scalars):
    """Run `step` on emulated device memory, as CudaLoadedStep does on the device; return (outputs, status).

    The arena and the scratch buffer start uninitialised (as cuMemAlloc leaves them), the status
    word zero; inputs, variables and scalars are copied in, variables copied back (they update in
    place), outputs copied out."""
    ffi, lib = lib_pair
    graph = program.graph
    feeds = [np.ascontiguousarray(a, dtype=graph.node(p).type.dtype) for p, a in zip(graph.placeholders, inputs)]
    fed_scalars = {name: np.array(scalars[name], dtype=dtype) for name, dtype in graph.scalars.items()}
    buffers = {"arena": DeviceBuffer(max(program.memory.arena_bytes, 64)),
               "scratch": DeviceBuffer(max(step.scratch_bytes, 64)), "status": DeviceBuffer(4)}
    buffers["status"].write(np.zeros(1, np.int32))
    tables: dict[str, dict] = {"input": {}, "variable": {}, "scalar": {}}
    hosts = {"input": dict(enumerate(feeds)), "variable": variables, "scalar": fed_scalars}

    def device(binding) -> tuple[DeviceBuffer, int]:
        kind = binding[0]
        if kind in buffers:
            return buffers[kind], (binding[1] if len(binding) > 1 else 0)
        table = tables[kind]
        if binding[1] not in table:
            host = np.ascontiguousarray(hosts[kind][binding[1]])
            table[binding[1]] = buf = DeviceBuffer(max(host.nbytes, 1))
            buf.write(host)
        return table[binding[1]], 0

    def pointer(binding) -> int:
        buf, offset = device(binding)
        return buf.address + offset
    try:
        for launch in step.launches:
            Emulator.launch(ffi, lib, launch.kernel, [pointer(b) for b in launch.args], launch.grid, launch.block,
                            launch.shared_bytes)
        for copy in step.copies:
            device_copy(pointer(copy.dst), pointer(copy.src), copy.nbytes)
        for name, buf in tables["variable"].items():
            host = variables[name]
            host[...] = buf.view(host.dtype, host.size).reshape(host.shape)
        outputs = []
        for o in graph.outputs:
            t, storage = graph.node(o).type, program.memory.storage[o]
            buf, offset = device(("arena", storage.key) if storage.kind == "arena" else (storage.kind, storage.key))
            outputs.append(buf.view(np.dtype(t.dtype), t.size, offset).reshape(t.shape).copy())
        return outputs, int(buffers["status"].view(np.int32, 1)[0])
    finally:
        for buf in [*buffers.values(), *(b for table in tables.values() for b in table.values())]:
            buf.free()
