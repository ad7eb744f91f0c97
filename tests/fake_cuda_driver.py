"""A fake `pycuda.driver` that keeps books instead of running kernels, and a fake nvcc.

It models what the runtime's bookkeeping depends on and PyCUDA enforces on a real machine:

- a context stack per thread (push/pop), and which thread each object was made on;
- device allocations, page-locked host allocations, streams and events that are freed either
  explicitly (`free()`) or when their last reference goes; PyCUDA frees only where the context is
  current on the freeing thread, otherwise it warns and leaks: here that is a recorded leak;
- the driver's CUDA version (`get_driver_version`), to test the driver-older-than-toolkit check.

Launches run nothing (they are counted, and `on_launch` may play a kernel's part); copies are real
memmoves over host memory, so device buffers hold values a test can read and write.
Used by tests/test_cuda_runtime_fixes.py; tests/test_cuda_codegen.py has the emulator-backed one.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import stat
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

import numpy as np

FAKE_NVCC_RELEASE = "13.0"


def write_fake_nvcc(folder: Path, release: str = FAKE_NVCC_RELEASE) -> Path:
    """An executable that answers `--version` (a build line no real nvcc has, so its cache entries
    never mix with a real nvcc's) and writes a placeholder for `-o OUT`."""
    path = folder / "nvcc"
    path.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do\n"
        f"  if [ \"$a\" = --version ]; then echo 'Cuda compilation tools, release {release}, V{release}.0'; "
        "echo 'Build fake_nvcc_for_flowc_tests'; exit 0; fi\n"
        "done\n"
        "out=''; prev=''\n"
        "for a in \"$@\"; do if [ \"$prev\" = -o ]; then out=\"$a\"; fi; prev=\"$a\"; done\n"
        "printf 'fake fatbin' > \"$out\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class FakeDriver(types.ModuleType):
    """The fake `pycuda.driver` module; `live()` counts what is allocated and not yet freed."""

    class Error(RuntimeError):
        pass

    def __init__(self, driver_version: int = 13000, capability: tuple[int, int] = (9, 0)) -> None:
        super().__init__("pycuda.driver")
        self.__spec__ = importlib.machinery.ModuleSpec("pycuda.driver", None)
        self.driver_version = driver_version
        self.launches = 0
        self.on_launch: Callable[[str, tuple], None] | None = None
        self.leaks: list[str] = []          # freed by the garbage collector without a current context
        self.frees: list[tuple[str, str]] = []     # (kind, thread name) of each free
        self.objects: dict[int, tuple[str, int]] = {}      # id -> (kind, bytes) of what is alive
        self._tls = threading.local()
        self._books = threading.Lock()
        driver = self

        def context_current() -> bool:
            return bool(getattr(driver._tls, "stack", None))

        def made(obj: Any, kind: str, nbytes: int = 0) -> None:
            if not context_current():
                raise driver.Error(f"{kind} made without a current context on {threading.current_thread().name}")
            with driver._books:
                driver.objects[id(obj)] = (kind, nbytes)

        def gone(obj: Any, explicit: bool) -> None:
            with driver._books:
                entry = driver.objects.pop(id(obj), None)
            if entry is None:
                return
            thread = threading.current_thread().name
            if not context_current():
                if explicit:
                    raise driver.Error(f"{entry[0]} freed without a current context on {thread}")
                driver.leaks.append(f"{entry[0]} of {entry[1]} bytes, collected on {thread} without a context")
                return
            driver.frees.append((entry[0], thread))

        class Freeable:
            kind = "object"

            def __init__(self, nbytes: int = 0) -> None:
                made(self, self.kind, nbytes)

            def free(self) -> None:
                gone(self, explicit=True)

            def __del__(self) -> None:
                gone(self, explicit=False)

        class DeviceAllocation(Freeable):
            kind = "device memory"

            def __init__(self, nbytes: int) -> None:
                if nbytes <= 0:
                    raise driver.Error("cuMemAlloc failed: invalid argument")
                self.buffer = np.zeros(nbytes, np.uint8)
                super().__init__(nbytes)

            def __int__(self) -> int:
                return self.buffer.ctypes.data

        class HostAllocation(Freeable):
            kind = "pinned memory"

            def __init__(self, shape, dtype) -> None:
                self.array = np.zeros(shape, dtype)
                self.__array_interface__ = self.array.__array_interface__
                super().__init__(self.array.nbytes)

        class Stream(Freeable):
            kind = "stream"

            def synchronize(self) -> None:
                pass

            def wait_for_event(self, event) -> None:
                pass

        class Event(Freeable):
            kind = "event"

            def record(self, stream=None):
                return self

            def time_since(self, other) -> float:
                return 0.5

        class Context:
            def push(self) -> None:
                stack = getattr(driver._tls, "stack", None)
                if stack is None:
                    stack = driver._tls.stack = []
                stack.append(self)

            @staticmethod
            def pop() -> None:
                driver._tls.stack.pop()

            @staticmethod
            def synchronize() -> None:
                if not context_current():
                    raise driver.Error("cuCtxSynchronize without a current context")

        class Device:
            def __init__(self, index: int) -> None:
                self.index = index

            @staticmethod
            def count() -> int:
                return 1

            def compute_capability(self):
                return capability

            def name(self) -> str:
                return "Fake H200"

            def pci_bus_id(self) -> str:
                return f"0000:{self.index:02x}:00.0"

            def retain_primary_context(self):
                return Context()

        class Function:
            def __init__(self, name: str) -> None:
                self.name = name

            def prepare(self, arg_types: str):
                return self

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0) -> None:
                driver.launches += 1
                if driver.on_launch is not None:
                    driver.on_launch(self.name, args)

        class Module(Freeable):
            kind = "module"

            def __init__(self, path: str) -> None:
                self.path = path
                super().__init__(0)

            def get_function(self, name: str):
                return Function(name)

        self.Device, self.Context, self.Stream, self.Event = Device, Context, Stream, Event
        self.mem_alloc = DeviceAllocation
        self.module_from_file = Module
        self.pagelocked_empty = lambda shape, dtype: np.asarray(HostAllocation(shape, dtype))

    # -- the module-level functions --------------------------------------------------------
    def init(self) -> None:
        pass

    def get_driver_version(self) -> int:
        return self.driver_version

    def live(self) -> dict[str, int]:
        """kind -> how many objects of that kind are allocated and not freed."""
        counts: dict[str, int] = {}
        for kind, _ in list(self.objects.values()):
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def memcpy_htod(self, dst, src, stream=None) -> None:
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)

    def memcpy_dtoh(self, dst, src, stream=None) -> None:
        ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)

    def memcpy_htod_async(self, dst, src, stream=None) -> None:
        self.memcpy_htod(dst, src)

    def memcpy_dtoh_async(self, dst, src, stream=None) -> None:
        self.memcpy_dtoh(dst, src)

    def memcpy_dtod_async(self, dst, src, nbytes, stream=None) -> None:
        ctypes.memmove(int(dst), int(src), nbytes)

    def memset_d32_async(self, dst, value, count, stream=None) -> None:
        np.frombuffer((ctypes.c_int32 * count).from_address(int(dst)), np.int32)[:] = value


def install(driver: FakeDriver, monkeypatch, nvcc: Path) -> None:
    """Make `driver` the `pycuda.driver` every later import finds, and `nvcc` the toolchain's nvcc;
    forget every answer computed under the real environment (the GPU probe, the loaded executor)."""
    from flowc.compiler.backends import _load
    from flowc.runtime.devices import gpu_status
    package = types.ModuleType("pycuda")
    package.__spec__ = importlib.machinery.ModuleSpec("pycuda", None)
    package.driver = driver      # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.delitem(sys.modules, "flowc.runtime.cuda_executor", raising=False)
    monkeypatch.setenv("NVCC", str(nvcc))
    # The fake driver has no CUDA runtime to run a step library's host step (a fake nvcc builds no
    # library at all): its tests run the per-launch path; tests/test_cuda_host_step.py the host step.
    monkeypatch.setenv("FLOWC_CUDA_PER_LAUNCH", "1")
    _load.cache_clear()
    gpu_status.cache_clear()


def uninstall() -> None:
    """Forget the fake's answers again (monkeypatch restores the modules and $NVCC)."""
    from flowc.compiler.backends import _load
    from flowc.runtime.devices import gpu_status
    sys.modules.pop("flowc.runtime.cuda_executor", None)
    _load.cache_clear()
    gpu_status.cache_clear()
