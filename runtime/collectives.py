"""The MPI engine a data-parallel step calls (compiler/comm_library.py builds it).

One engine per loaded step: it holds the step's bucket buffers and their requests, on the
session's collective communicator (runtime/distributed.py).  The step reads the engine's function
table (codegen_templates/cpu/flowc_comm.h) from its pointer table, so a step library never links
MPI itself.

Example::

    engine = CommEngine(cluster.collective, buckets=4)
    step_table_entry = engine.table.ctypes.data       # what ptrs[k] of flowc_step points at
    engine.waited_seconds()                            # time the step spent waiting for the sums
"""
from __future__ import annotations

import cffi
import numpy as np

from flowc.compiler import settings
from flowc.compiler.comm_library import ensure_comm_library

_ffi = cffi.FFI()
_ffi.cdef("""
void* flowc_comm_open(const void* comm_handle, int buckets, double timeout_seconds);
void flowc_comm_fill(void* ctx, void* table);
double flowc_comm_waited_seconds(void* ctx);
void flowc_comm_close(void* ctx);
""")
TABLE_BYTES = 6 * 8          # struct flowc_comm: ctx and five function pointers
_library = None


def _lib():
    global _library
    if _library is None:
        _library = _ffi.dlopen(str(ensure_comm_library()))
    return _library


class CommEngine:
    """The engine of one loaded step: `buckets` buckets on the MPI communicator `comm` (mpi4py)."""

    def __init__(self, comm, buckets: int) -> None:
        from mpi4py import MPI
        self._comm = comm                     # kept alive: the engine holds its handle
        timeout = settings.comm_timeout()
        lib = _lib()
        self._ctx = lib.flowc_comm_open(_ffi.cast("void*", MPI._addressof(comm)), buckets,
                                        timeout if timeout is not None else 0.0)
        if self._ctx == _ffi.NULL:
            raise MemoryError("flowc's MPI engine could not allocate its buckets")
        self.table = np.zeros(TABLE_BYTES, dtype=np.uint8)
        lib.flowc_comm_fill(self._ctx, _ffi.cast("void*", self.table.ctypes.data))

    def waited_seconds(self) -> float:
        """Seconds the step's waits for its sums took, summed over every step so far: the
        communication that the backward pass did not hide."""
        return float(_lib().flowc_comm_waited_seconds(self._ctx)) if self._ctx is not None else 0.0

    def close(self) -> None:
        if self._ctx is not None:
            _lib().flowc_comm_close(self._ctx)
            self._ctx = None
