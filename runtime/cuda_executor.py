"""Running a compiled CUDA step with PyCUDA: the GPU backend's `LoadedStep` (runtime/loaded_step.py).

Imported only where `runtime.devices.gpu_status()` said a GPU is usable (it imports PyCUDA).

Per job: the step library (`step.so`, loaded with cffi: the kernels and `flowc_step`, the host
step that launches them) or, on the per-launch path, the cubin's module; one device arena (the
memory plan), one scratch buffer, one status int, a compute stream and a copy stream.  Per
register slot: device buffers for the placeholders and runtime scalars, page-locked host
staging buffers for them and for the outputs, and the table of device addresses the host step
takes (per-launch: every launch's argument list), resolved once.  Feeding a slot (caller
thread) copies the caller's arrays into its staging buffers and queues their upload on the copy
stream, so it overlaps the step computing on the other slot; the compute stream waits for that
upload, then one call of `flowc_step` queues the launches, the device copies and the downloads
of what the host reads (the outputs, the status) and waits for them.  A step whose host reads
nothing is not waited for: the next feed of its slot waits for it instead (`CudaSlot.done`), so
such steps stay in flight back to back.

Which path a job takes is its artifact's: `step.so` runs the host step, `kernel.cubin` (built
with FLOWC_CUDA_PER_LAUNCH=1, or where the step library could not be built, with a warning)
launches each kernel from Python through PyCUDA.

Variables live on the device, one buffer per variable per session, shared by every GPU job
of the session (a train job's update is what the predict job reads).  Each variable has one
owner at a time, the side holding its latest value (`DeviceVariables.owner`): a GPU step's
updates make the GPU the owner, and a CPU job of the same session that reads the variable
moves it back first (`runtime.devices.acquire_variables`); a CPU step's updates make the host the
owner, and the next GPU step uploads them.  `runtime.devices.sync_to_host(session)` copies
everything back (checkpoints, `get_all_variables`), `sync_to_device(session)` uploads host changes.

Device memory, pinned host memory, streams and events are freed explicitly, with the context
pushed on the freeing thread, when the session closes (`release`): PyCUDA frees an object left
to the garbage collector only where its context is current, and otherwise warns and leaks it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

import cffi
import numpy as np
import pycuda.driver as cuda

from flowc.compiler.backends import HOST_DEVICE
from flowc.compiler.codegen.cuda import GeneratedCudaStep
from flowc.compiler.codegen.cuda_host import host_buffers
from flowc.compiler.errors import DistributedError, StepError
from flowc.compiler.ir import numpy_dtype
from flowc.runtime.devices import DEVICE_VARIABLES_ATTR
from flowc.runtime.loaded_step import COMM_ERRORS, LoadedStep

MIN_ALLOC = 256    # bytes; cuMemAlloc refuses 0, and 256 is its alignment anyway
STEP_LIBRARY_SUFFIX = ".so"     # a step library (host step); anything else is a cubin for PyCUDA
STOPPED = -1       # flowc_step's answer when a check_numerics check set the status

_ffi = cffi.FFI()
_ffi.cdef("int flowc_step(void* stream, char** buffers, void** outputs, int* host_status, float* launch_ms);"
          "const char* flowc_step_error(int code);")


_libraries: dict[str, Any] = {}
_libraries_lock = threading.Lock()


def open_step_library(path: str):
    """The step library at `path`, opened with cffi once per process and never closed: closing it
    would run its static CUDA runtime's teardown (unregistering its kernels) on whichever thread
    dropped the last reference, and a session cleared and rebuilt loads the same entry again.
    Tests replace this function to run the library's host step on the emulator."""
    with _libraries_lock:
        if path not in _libraries:
            _libraries[path] = _ffi.dlopen(path)
        return _libraries[path]


class _Device:
    """The primary context of this process's GPU (device 0 in a process launched alone; the local
    rank's, modulo the GPUs, under mpiexec), made current around every CUDA call, on whichever thread."""

    _lock = threading.Lock()
    _instance: _Device | None = None

    def __init__(self) -> None:
        cuda.init()
        # One process per GPU (flowc launch / mpiexec): the process's rank on its machine picks the device.
        from flowc.runtime.world import detect_world
        self.index = detect_world().local_rank % max(cuda.Device.count(), 1)
        self.device = cuda.Device(self.index)
        self.context = self.device.retain_primary_context()

    @classmethod
    def get(cls) -> _Device:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def bus_id(self) -> str:
        """The GPU's PCI bus id: which physical GPU this is, whatever CUDA_VISIBLE_DEVICES numbers it."""
        return str(self.device.pci_bus_id())

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        self.context.push()
        try:
            yield
        finally:
            cuda.Context.pop()


def _alloc(nbytes: int):
    return cuda.mem_alloc(max(int(nbytes), MIN_ALLOC))


class DeviceVariables:
    """The device copies of a session's variables, uploaded at first use."""

    def __init__(self, session, device: _Device, name: str) -> None:
        self.session = session
        self.device = device
        self.name = name                      # the backend's device name, for `owner`
        self.buffers: dict[str, Any] = {}        # name -> pycuda DeviceAllocation
        self.host_stale: set[str] = set()     # owned by the GPU: changed there since the host copy
        self.device_stale: set[str] = set()   # owned by the host: changed there since the upload
        self.rows: dict[str, np.ndarray] = {}     # split variables: this rank's rows (views of the whole)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, session, device: _Device, name: str) -> DeviceVariables:
        store = getattr(session, DEVICE_VARIABLES_ATTR, None)
        if store is None:
            store = cls(session, device, name)
            setattr(session, DEVICE_VARIABLES_ATTR, store)
        return store

    def pointer(self, name: str, shape: tuple | None = None) -> int:
        """The device address of variable `name`, uploading its current value the first time; a
        variable split over the ranks (model parallelism: `shape`, the job's, is a slice of the
        whole) holds this rank's rows only."""
        with self._lock:
            if name in self.buffers and shape is not None and tuple(shape) != self.host(name).shape:
                held = "this rank's rows" if name in self.rows else "the whole variable"
                raise StepError(f"variable {name!r}: one GPU job of this session splits it over the ranks and "
                                f"another reads it whole, and its device copy holds {held} only: GPU jobs do not "
                                "move between the two yet (declare it with the same distribute= in every job)")
            if name not in self.buffers:
                whole = self.session.value(name)
                if shape is not None and tuple(shape) != whole.shape:
                    from flowc.runtime.distributed import shard_rows
                    self.rows[name] = shard_rows(whole, self.session.cluster).reshape(shape)
                value = np.ascontiguousarray(self.host(name))
                with self.device.current():
                    buf = _alloc(value.nbytes)
                    cuda.memcpy_htod(buf, value)
                self.buffers[name] = buf
                self.device_stale.discard(name)
            return int(self.buffers[name])

    def host(self, name: str) -> np.ndarray:
        """Where the device copy of `name` lives on the host: the session's array, or this rank's rows
        of it (a view) for a split variable."""
        rows = self.rows.get(name)
        return rows if rows is not None else self.session.value(name)

    def owner(self, name: str) -> str | None:
        """The device holding `name`'s latest value alone (this one, or the host); None when both agree."""
        return self.name if name in self.host_stale else HOST_DEVICE if name in self.device_stale else None

    def acquire(self, device: str, reads, writes) -> None:
        """Before a step on `device`: move what it reads there, mark what it writes as owned there
        (runtime.devices.acquire_variables).  A GPU step marks its writes after it ran (`written`)."""
        if device == HOST_DEVICE:
            stale = [n for n in reads if n in self.host_stale]
            if stale:
                self.to_host(stale)
            with self._lock:
                self.device_stale.update(n for n in writes if n in self.buffers)
        else:
            stale = [n for n in reads if n in self.device_stale]
            if stale:
                self.to_device(stale)

    def written(self, names) -> None:
        with self._lock:
            self.host_stale.update(n for n in names if n in self.buffers)
            self.device_stale.difference_update(names)

    def to_host(self, names=None) -> None:
        with self._lock, self.device.current():
            cuda.Context.synchronize()            # steps still running on any stream
            for name in list(self.host_stale if names is None else names):
                if name in self.buffers:
                    host = self.host(name)       # in place: CPU steps hold its address
                    staging = np.empty_like(host)
                    cuda.memcpy_dtoh(staging, self.buffers[name])
                    np.copyto(host, staging)
                    self.host_stale.discard(name)

    def to_device(self, names=None) -> None:
        with self._lock, self.device.current():
            cuda.Context.synchronize()
            for name in list(self.buffers if names is None else names):
                if name in self.buffers:
                    cuda.memcpy_htod(self.buffers[name], np.ascontiguousarray(self.host(name)))
                    self.host_stale.discard(name)
                    self.device_stale.discard(name)

    def release(self) -> None:
        """Copy what the GPU owns back to the host, then free every device copy (session close)."""
        self.to_host()
        with self._lock, self.device.current():
            for buf in self.buffers.values():
                buf.free()
            self.buffers.clear()
            self.device_stale.clear()


class CudaSlot:
    """One register slot: a step's inputs and scalars on both sides, its outputs' staging, its launch args."""

    def __init__(self, step: CudaLoadedStep) -> None:
        graph = step.graph
        self.inputs: list[np.ndarray] = []          # page-locked, shaped like the placeholders
        self.device_inputs = []
        for p in graph.placeholders:
            t = graph.node(p).type
            self.inputs.append(_pinned(t.shape, t.dtype))
            self.device_inputs.append(_alloc(t.nbytes))
        self.scalars: dict[str, np.ndarray] = {}
        self.device_scalars: dict[str, Any] = {}   # name -> pycuda DeviceAllocation
        for name, dtype in graph.scalars.items():
            self.scalars[name] = _pinned((), dtype)
            self.device_scalars[name] = _alloc(np.dtype(numpy_dtype(dtype)).itemsize)
        self.outputs = [_pinned(graph.node(o).type.shape, graph.node(o).type.dtype) for o in graph.outputs]
        self.fetch = [(out, step.pointer(step.binding(o), self)) for out, o in zip(self.outputs, graph.outputs)]
        self.fed = cuda.Event()
        # Recorded after a step its host does not wait for; the slot's next feed waits for it.
        self.done: Any = None if step.host_sync else cuda.Event()
        self.in_flight = False
        if step.library is not None:      # the host step's tables: device addresses, output staging
            entries = host_buffers(step.generated.bindings)
            self.buffers: Any = _ffi.new("char*[]", [_ffi.cast("char*", step.pointer(b, self)) for b in entries])
            self.output_table: Any = _ffi.new("void*[]", [_ffi.cast("void*", out.ctypes.data) for out in self.outputs]
                                         or [_ffi.NULL])
            self.args: list[tuple] = []
        else:
            self.args = [tuple(step.pointer(b, self) for b in launch.args) for launch in step.launches]

    def release(self) -> None:
        """Free the slot's device and pinned buffers and drop its event (the caller pushed the context)."""
        for buf in [*self.device_inputs, *self.device_scalars.values()]:
            buf.free()
        for host in [*self.inputs, *self.scalars.values(), *self.outputs]:
            _free_pinned(host)
        self.device_inputs, self.device_scalars, self.fetch, self.args = [], {}, [], []
        self.inputs, self.scalars, self.outputs = [], {}, []      # their memory is gone: no view may stay
        self.buffers = self.output_table = None
        self.fed = self.done = None   # PyCUDA destroys an event when its last reference goes: here, context current


def _pinned(shape: tuple, dtype: str) -> np.ndarray:
    """A page-locked host array (the DMA engine copies it while the CPU does other work)."""
    size = int(np.prod(shape, dtype=np.int64))
    flat = cuda.pagelocked_empty(max(size, 1), numpy_dtype(dtype))
    return flat[:size].reshape(shape)


def _free_pinned(array: np.ndarray) -> None:
    """Free the page-locked memory under `array` (PyCUDA's HostAllocation is the base of the views)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    free = getattr(base, "free", None)
    if free is not None:
        free()


class CudaLoadedStep(LoadedStep):
    """A compiled CUDA step bound to its device buffers, with `depth` slots."""

    def __init__(self, compiled, session, depth: int = 1) -> None:
        if not isinstance(compiled.generated, GeneratedCudaStep):
            raise ValueError(f"job {compiled.program.graph.name!r} was compiled for {compiled.device!r}, "
                             "not for the CUDA backend")
        self.compiled = compiled
        self.graph = compiled.program.graph
        self.session = session
        self.device = _Device.get()
        generated = compiled.generated
        self.launches = generated.launches
        self.copies = generated.copies
        self.label_checks = generated.label_checks
        self.assigned = list(self.graph.assigns)
        self.read = list(self.graph.variables)
        self.variables = DeviceVariables.of(session, self.device, compiled.device)
        self.generated = generated
        self.host_sync = generated.host_sync
        # The step library (one call per step) or, on the per-launch path, PyCUDA's module of the cubin.
        self.library: Any = (open_step_library(str(compiled.library))
                        if str(compiled.library).endswith(STEP_LIBRARY_SUFFIX) else None)
        self._engine: Any = None        # the NCCL engine of a step that sums over ranks (runtime/nccl.py)
        if generated.uses_comm and self.library is None:
            raise StepError(f"job {self.graph.name!r} sums over the ranks with NCCL, which only the step library's "
                            "host step calls: it runs launch by launch instead (FLOWC_CUDA_PER_LAUNCH=1, or the "
                            "step library failed to build: see the warning), so it cannot run")
        with self.device.current():
            self.module: Any = None
            self.functions = []
            if self.library is None:
                self.module = cuda.module_from_file(str(compiled.library))
                for launch in self.launches:
                    fn = self.module.get_function(launch.kernel)
                    fn.prepare("P" * len(launch.args))
                    self.functions.append(fn)
            self.stream = cuda.Stream()           # the steps, in call order
            self.copy_stream = cuda.Stream()      # uploads of fed slots, overlapping the steps
            self.arena = _alloc(compiled.program.memory.arena_bytes)
            self.scratch = _alloc(generated.scratch_bytes)
            self.status = _alloc(4)
            self.host_status = cuda.pagelocked_empty(1, np.int32)
            self.slots = [CudaSlot(self) for _ in range(depth)]
            # Copy-backs move arena values into variables: neither depends on the slot.
            self.copy_args = [(self.pointer(c.dst, self.slots[0]), self.pointer(c.src, self.slots[0]), c.nbytes)
                              for c in self.copies]
        self._profiled = list(generated.profiled_kernels)
        self.released = False
        self._seconds = [0.0] * len(self._profiled)
        self._launch_ms = _ffi.new("float[]", len(self._profiled)) if self._profiled else _ffi.NULL

    @property
    def mode(self) -> str:
        """How a step runs: "host step" (one call of flowc_step) or "per launch" (PyCUDA, from Python)."""
        return "host step" if self.library is not None else "per launch"

    # -- buffers ------------------------------------------------------------------------
    def binding(self, node_id: int) -> tuple:
        """Where the memory plan keeps `node_id`, as a launch-argument binding."""
        buf = self.compiled.program.memory.storage[node_id]
        return ("arena", buf.key) if buf.kind == "arena" else (buf.kind, buf.key)

    def pointer(self, binding: tuple, slot: CudaSlot) -> int:
        """The device address a launch argument names."""
        kind = binding[0]
        if kind in ("arena", "scratch"):     # the host step's table names them without an offset
            offset = int(binding[1]) if len(binding) > 1 else 0
            return int(self.arena if kind == "arena" else self.scratch) + offset
        if kind == "status":
            return int(self.status)
        if kind == "input":
            return int(slot.device_inputs[binding[1]])
        if kind == "scalar":
            return int(slot.device_scalars[binding[1]])
        if kind == "variable":
            return self.variables.pointer(binding[1], self.graph.variables[binding[1]].shape
                                          if binding[1] in self.graph.variables else None)
        if kind == "comm":          # the NCCL engine's table (made by every rank at once, at the first slot)
            if self._engine is None:
                cluster = self.session.cluster
                if cluster is None:
                    raise StepError(f"job {self.graph.name!r} was compiled for several ranks, but this process "
                                    "is not one of a launched job's ranks (flowc launch / mpiexec)")
                # NCCL needs a GPU of its own for each rank: the engine compares the ranks' (host, bus id)
                self._engine = cluster.gpu_engine(self.generated.comm_buckets, context=self.device.current,
                                                  device=self.device.bus_id())
            return int(self._engine.table.ctypes.data)
        raise ValueError(f"unknown buffer binding {binding!r}")

    def view(self, node_id: int, slot: CudaSlot) -> np.ndarray:
        """`node_id`'s value: the staged output after `compute(slot)`, or a copy from the device."""
        if node_id in self.graph.outputs:
            return slot.outputs[self.graph.outputs.index(node_id)]
        t = self.graph.node(node_id).type
        out = np.empty(t.shape, numpy_dtype(t.dtype))
        with self.device.current():
            self.stream.synchronize()
            cuda.memcpy_dtoh(out, self.pointer(self.binding(node_id), slot))
        return out

    # -- a step --------------------------------------------------------------------------
    def feed(self, slot: CudaSlot, arrays: Sequence[np.ndarray], scalars: dict[str, float] | None = None) -> None:
        """Copy the caller's arrays and this step's scalars into `slot`'s staging buffers and queue
        the upload of what was given: a train step's scalars come in a second feed when the step
        runs (ReadyStep.compute), which must not upload the inputs again."""
        if slot.in_flight:          # its last step was not waited for and may still read these buffers
            with self.device.current():
                slot.done.synchronize()
            slot.in_flight = False
        fed = [(host, dev) for host, dev, a in zip(slot.inputs, slot.device_inputs, arrays)]
        for (host, _), a in zip(fed, arrays):
            np.copyto(host, a, casting="same_kind")
        given = [name for name in (scalars or {}) if name in slot.scalars]
        for name in given:
            slot.scalars[name][...] = scalars[name]      # type: ignore[index]
        with self.device.current():
            for host, dev in fed:
                if host.size:
                    cuda.memcpy_htod_async(dev, host, self.copy_stream)
            for name in given:
                cuda.memcpy_htod_async(slot.device_scalars[name], slot.scalars[name], self.copy_stream)
            slot.fed.record(self.copy_stream)

    def compute_borrowed(self, slot: CudaSlot, arrays: Sequence[np.ndarray],
                         scalars: dict[str, float] | None = None) -> list[np.ndarray]:
        """A synchronous call run on the caller's thread (see Pipeline.run_now).  A GPU step reads
        its inputs from device memory, so they go through the pinned staging buffers as usual."""
        self.feed(slot, arrays, scalars)
        return self.compute(slot)

    def compute(self, slot: CudaSlot) -> list[np.ndarray]:
        """Run the step on `slot` and return copies of its outputs (waits for the GPU)."""
        # Labels fed as inputs are checked on the host before anything is launched: a step that
        # fails on one changes no variable (the kernels' own status covers computed labels).
        for check in self.label_checks:
            if check.fails(slot.inputs[check.input]):
                self.raise_step_error(check.code)
        self.variables.acquire(self.compiled.device, self.read, self.assigned)    # a CPU job may own some of them
        with self.device.current():
            try:
                self.stream.wait_for_event(slot.fed)
                if self.library is not None:
                    self._host_step(slot)
                else:
                    self._launch_each(slot)
            except cuda.Error as err:
                raise StepError(f"job {self.graph.name!r}: the GPU step failed: {err}") from err
        self.variables.written(self.assigned)
        code = int(self.host_status[0]) if self.host_sync else 0
        if code:
            self.raise_step_error(code, slot)
        return [out.copy() for out in slot.outputs]

    def _host_step(self, slot: CudaSlot) -> None:
        """The whole step in one foreign call: flowc_step queues it on the stream (and waits where
        the host reads); a step it does not wait for marks its slot in flight."""
        rc = self.library.flowc_step(_ffi.cast("void*", self.stream.handle), slot.buffers, slot.output_table,
                                     _ffi.cast("int*", self.host_status.ctypes.data), self._launch_ms)
        if rc in COMM_ERRORS:
            raise DistributedError(f"job {self.graph.name!r}: {COMM_ERRORS[rc]}: {self._engine.error()}")
        if rc > 0:
            why = _ffi.string(self.library.flowc_step_error(rc)).decode(errors="replace")
            raise StepError(f"job {self.graph.name!r}: the GPU step failed: {why} (CUDA error {rc})")
        if self._profiled:
            self._seconds = [float(ms) * 1e-3 for ms in self._launch_ms[0:len(self._profiled)]]
        if not self.host_sync and rc != STOPPED:
            slot.done.record(self.stream)
            slot.in_flight = True

    def _launch_each(self, slot: CudaSlot) -> None:
        """The per-launch path: every kernel launched from Python through PyCUDA, then one wait."""
        profiling = bool(self._profiled)
        cuda.memset_d32_async(int(self.status), 0, 1, self.stream)
        events: list[tuple[Any, Any]] = []     # (start, end) pycuda Events per launch
        stopped = False
        for launch, fn, args in zip(self.launches, self.functions, slot.args):
            if profiling:
                events.append((cuda.Event().record(self.stream), None))
            fn.prepared_async_call(launch.grid, launch.block, self.stream, *args,
                                   shared_size=launch.shared_bytes)
            if profiling:
                events[-1] = (events[-1][0], cuda.Event().record(self.stream))
            if launch.checks_status and self._status_set():
                stopped = True          # check_numerics: nothing after the first bad value
                break
        if not stopped:
            for dst, src, nbytes in self.copy_args:
                cuda.memcpy_dtod_async(dst, src, nbytes, self.stream)
            for host, src in slot.fetch:
                if host.size:
                    cuda.memcpy_dtoh_async(host, src, self.stream)
            cuda.memcpy_dtoh_async(self.host_status, int(self.status), self.stream)
            self.stream.synchronize()
        for k, (start, end) in enumerate(events):
            self._seconds[k] += end.time_since(start) * 1e-3

    def _status_set(self) -> bool:
        """Wait for the launches so far and read the status (check_numerics, after each check)."""
        cuda.memcpy_dtoh_async(self.host_status, int(self.status), self.stream)
        self.stream.synchronize()
        return bool(self.host_status[0])

    def failed_value(self, node_id: int, slot: CudaSlot) -> np.ndarray:
        """`node_id`'s value on the device, where a failed step left it (its outputs were not fetched)."""
        t = self.graph.node(node_id).type
        out = np.empty(t.shape, numpy_dtype(t.dtype))
        with self.device.current():
            self.stream.synchronize()
            cuda.memcpy_dtoh(out, self.pointer(self.binding(node_id), slot))
        return out

    def profile(self) -> list[tuple[str, float]]:
        """(kernel, GPU seconds summed over the steps so far), for a step compiled with FLOWC_PROFILE=1."""
        if not self._profiled:
            raise self.profile_not_built(self.graph)
        totals: dict[str, float] = {}
        for name, seconds in zip(self._profiled, self._seconds):
            totals[name] = totals.get(name, 0.0) + seconds
        return list(totals.items())

    def sync_to_host(self) -> None:
        """Copy every variable this session's GPU jobs changed back into the session's arrays."""
        self.variables.to_host()

    def release(self) -> None:
        """Free the step's device memory, pinned memory, streams and events now, with the context
        pushed on this thread (Session.close, once no step runs)."""
        if self.released:
            return
        self.released = True
        with self.device.current():
            self.stream.synchronize()
            self.copy_stream.synchronize()
            for buf in (self.arena, self.scratch, self.status):
                buf.free()
            _free_pinned(self.host_status)
            for slot in self.slots:
                slot.release()
            # Streams have no free(): PyCUDA destroys them when the last reference goes, which
            # must happen here, where the context is current.
            self.slots, self.stream, self.copy_stream, self.copy_args = [], None, None, []
            self.module = None
            self.functions = []
            if self._engine is not None:
                self._engine.close()
        self.library = None     # the library stays loaded for the process (open_step_library)
