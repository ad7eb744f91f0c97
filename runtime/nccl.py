"""The NCCL engine a data-parallel GPU step calls (compiler/nccl_library.py builds it).

One engine per loaded step, as runtime/collectives.py is for CPU steps: its gradient buckets, a
stream of its own for their sums, and one NCCL communicator over the job's ranks.  The
communicator is bootstrapped over MPI: rank 0 asks NCCL for a unique id and broadcasts it on the
session's collective communicator (runtime/distributed.py), then every rank joins with it, on its
own GPU (runtime/cuda_executor.py picks the local rank's device).  The step reads the engine's
function table (codegen_templates/cuda/flowc_cuda_comm.h) from its table of buffers.

Example::

    engine = NcclEngine(cluster.collective, buckets=4)     # every rank at once
    entry = engine.table.ctypes.data                       # the step's ("comm",) entry
    engine.waited_seconds()                                # the sums the backward pass did not hide
"""
from __future__ import annotations

import contextlib
import importlib.util
import socket
from pathlib import Path
from typing import Any, Callable, ContextManager

import cffi
import numpy as np

from flowc.compiler import settings
from flowc.compiler.errors import DistributedError

_ffi = cffi.FFI()
_ffi.cdef("""
int flowc_nccl_check(const char* library, char* error, int error_len);
int flowc_nccl_unique_id(const char* library, void* id, char* error, int error_len);
void* flowc_nccl_open(const char* library, const void* id, int ranks, int rank, int buckets,
                      double timeout_seconds, char* error, int error_len);
void flowc_nccl_fill(void* ctx, void* table);
double flowc_nccl_waited_seconds(void* ctx);
const char* flowc_nccl_error(void* ctx);
void flowc_nccl_close(void* ctx);
""")
TABLE_BYTES = 6 * 8          # struct flowc_cuda_comm: ctx and five function pointers
ID_BYTES = 128               # ncclUniqueId
WHEEL_LIBRARY = Path("nccl") / "lib" / "libnccl.so.2"      # inside the `nvidia` namespace package
SYSTEM_LIBRARY = "libnccl.so.2"
INSTALL_HINT = "pip install 'flowc[nccl]' (the nvidia-nccl-cu12 wheel), or point FLOWC_NCCL at a libnccl.so.2"
_libraries: dict[str, object] = {}      # engine libraries, opened once per process


def find_nccl() -> str:
    """The NCCL library to open: $FLOWC_NCCL, else the nvidia-nccl-cu12 wheel's, else the name the
    system's loader resolves (where neither is there, opening it fails with INSTALL_HINT)."""
    configured = settings.nccl()
    if configured is not None:
        if not configured.is_file():
            raise DistributedError(f"FLOWC_NCCL={str(configured)!r} is not a file: point it at a libnccl.so.2")
        return str(configured)
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(folder) / WHEEL_LIBRARY
        if candidate.is_file():
            return str(candidate)
    return SYSTEM_LIBRARY


def _hint(why: str) -> str:
    """How to install NCCL, where the reason is that it could not be opened."""
    return f"; {INSTALL_HINT}" if "could not open the NCCL library" in why or "has no symbol" in why else ""


def _open_library(path: Path):
    key = str(path)
    if key not in _libraries:
        _libraries[key] = _ffi.dlopen(key)
    return _libraries[key]


def check_one_gpu_per_rank(devices: list[tuple[str, str]]) -> None:
    """Refuse ranks that share a GPU (`devices`: every rank's (host, PCI bus id)), on every rank
    alike: NCCL refuses them too, but only once inside its start, where a rank's failure can leave
    the others waiting.  Ranks that see one GPU each (CUDA_VISIBLE_DEVICES, srun --gpus-per-task)
    number it 0 but have different bus ids."""
    users: dict[tuple[str, str], list[int]] = {}
    for rank, (host, bus) in enumerate(devices):
        users.setdefault((host, bus), []).append(rank)
    shared = [(key, ranks) for key, ranks in users.items() if len(ranks) > 1]
    if shared:
        (host, bus), ranks = shared[0]
        per_host = sum(1 for h, _ in devices if h == host)
        gpus = len({b for h, b in devices if h == host})
        raise DistributedError(f"ranks {', '.join(map(str, ranks))} would all use the GPU at {bus} on {host}, and NCCL "
                               f"needs a GPU of its own for each rank: {per_host} ranks run there on {gpus} GPU(s); "
                               "launch at most one process per GPU, or give each its own (CUDA_VISIBLE_DEVICES)")


class NcclEngine:
    """The engine of one loaded step: `buckets` buckets on a communicator over `comm`'s ranks (an
    mpi4py communicator, used for the bootstrap only).  Every rank makes its engine together.

    `engine_library` and `nccl_library` replace the built engine and the found NCCL (the tests run
    the engine on the CUDA emulator against a fake NCCL over MPI)."""

    def __init__(self, comm, buckets: int, engine_library: Path | None = None, nccl_library: str | None = None,
                 context: Callable[[], ContextManager[Any]] | None = None, device: str | None = None) -> None:
        self._ctx = None
        self._context = context        # makes the engine's device current around its close
        if device is not None:
            check_one_gpu_per_rank(comm.allgather((socket.gethostname(), device)))
        rank, ranks = comm.Get_rank(), comm.Get_size()
        error = _ffi.new("char[]", 1024)
        unique = _ffi.new("char[]", ID_BYTES)
        # Every rank builds the engine and opens NCCL before any starts it: one that cannot would leave
        # the others waiting in NCCL's start (or in this gather), so each says why, and all stop alike.
        cannot: str | None = None
        try:
            if engine_library is None:
                from flowc.compiler.nccl_library import ensure_nccl_engine
                engine_library = ensure_nccl_engine()
            lib = self._lib = _open_library(engine_library)
            library = nccl_library or find_nccl()
            if lib.flowc_nccl_check(library.encode(), error, len(error)) != 0:
                cannot = _ffi.string(error).decode(errors="replace")
        except Exception as err:          # the engine's build, FLOWC_NCCL: this rank's reason, for every rank
            cannot = f"{type(err).__name__}: {err}"
        reasons = [(r, why) for r, why in enumerate(comm.allgather(cannot)) if why is not None]
        if reasons:
            raise DistributedError("NCCL could not start (" + "; ".join(f"rank {r}: {why}" for r, why in reasons) +
                                   ")" + _hint(reasons[0][1]))
        # Rank 0's id, or why it has none: every rank learns either, so none waits for the others forever.
        answer: tuple[bool, bytes | str] | None = None
        if rank == 0:
            if lib.flowc_nccl_unique_id(library.encode(), unique, error, len(error)) == 0:
                answer = (True, bytes(_ffi.buffer(unique, ID_BYTES)))
            else:
                answer = (False, _ffi.string(error).decode(errors="replace"))
        ok, value = comm.bcast(answer, root=0)
        if not ok:
            raise DistributedError(f"NCCL could not start (rank 0: {value})" + _hint(str(value)))
        assert isinstance(value, bytes)
        _ffi.memmove(unique, value, ID_BYTES)
        timeout = settings.comm_timeout()
        self._ctx = lib.flowc_nccl_open(library.encode(), unique, ranks, rank, max(buckets, 1),
                                        timeout if timeout is not None else 0.0, error, len(error))
        if self._ctx == _ffi.NULL:
            why = _ffi.string(error).decode(errors="replace")
            raise DistributedError(f"NCCL could not start on rank {rank} of {ranks}: {why}" + _hint(why))
        self.table = np.zeros(TABLE_BYTES, dtype=np.uint8)
        lib.flowc_nccl_fill(self._ctx, _ffi.cast("void*", self.table.ctypes.data))

    def waited_seconds(self) -> float:
        """Seconds the steps' streams stood waiting for their sums, summed over every step so far."""
        return float(self._lib.flowc_nccl_waited_seconds(self._ctx)) if self._ctx is not None else 0.0

    def error(self) -> str:
        """Why the engine's last failing call failed ("" when none has)."""
        if self._ctx is None:
            return ""
        return _ffi.string(self._lib.flowc_nccl_error(self._ctx)).decode(errors="replace")

    def close(self) -> None:
        """Free the buckets, the stream and the communicator (the device's context current)."""
        if self._ctx is not None:
            with self._context() if self._context is not None else contextlib.nullcontext():
                self._lib.flowc_nccl_close(self._ctx)
            self._ctx = None
