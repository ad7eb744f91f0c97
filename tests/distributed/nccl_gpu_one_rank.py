"""The NCCL engine on a real GPU, one rank (the machines lent to this project have one GPU, and NCCL
refuses two ranks on one GPU): the bootstrap, a bucket's sum (over one rank: the gradients as they
are) in float32, float64 and int64, the three exchanges (over one rank: copies) and the settle,
driven through the function table as a step's host step drives it.  Prints "ok".

    python tests/distributed/nccl_gpu_one_rank.py       # MPI starts as a singleton
"""
import cffi
import numpy as np
import pycuda.driver as cuda
from mpi4py import MPI

from flowc.runtime.nccl import NcclEngine
from tests.test_nccl_engine import TABLE_CDEF

cuda.init()
context = cuda.Device(0).retain_primary_context()
context.push()
try:
    engine = NcclEngine(MPI.COMM_WORLD, 3)
    ffi = cffi.FFI()
    ffi.cdef(TABLE_CDEF)
    table = ffi.cast("table_t*", engine.table.ctypes.data)
    stream = cuda.Stream()
    s = ffi.cast("void*", stream.handle)
    a = np.arange(10, dtype=np.float32)
    b = np.array([-0.0, np.inf, np.nan, 3.5, -2.0], np.float32)
    da, db, dout = cuda.to_device(a), cuda.to_device(b), cuda.mem_alloc(4 * 10)

    def floats(allocation, const=False):
        return ffi.cast("const float*" if const else "float*", int(allocation))
    grads = ffi.new("const void*[]", [floats(da, True), floats(db, True)])
    sizes = ffi.new("int64_t[]", [10, 5])
    for _ in range(2):               # a second step reuses the bucket
        assert table.start(table.ctx, 0, 2, grads, sizes, 0, s) == 0, engine.error()     # FLOWC_COMM_FLOAT32
        assert table.wait(table.ctx, 0, s) == 0
        assert table.settle(table.ctx, s) == 0, engine.error()
        sums = np.empty(15, np.float32)
        cuda.memcpy_dtoh(sums, int(ffi.cast("uintptr_t", table.data(table.ctx, 0))))
        np.testing.assert_array_equal(sums, np.concatenate([a, b]))
        assert np.signbit(sums[10])                           # -0.0 stays -0.0
    # buckets of other types (FLOWC_COMM_FLOAT64, FLOWC_COMM_INT64): summed in their own type
    for bucket, (code, value) in enumerate([(1, np.array([1e-300, -0.0, np.pi], np.float64)),
                                            (3, np.array([2**40 + 1, -7, 0], np.int64))], start=1):
        device = cuda.to_device(value)
        one = ffi.new("const void*[]", [ffi.cast("const void*", int(device))])
        assert table.start(table.ctx, bucket, 1, one, ffi.new("int64_t[]", [3]), code, s) == 0, engine.error()
        assert table.wait(table.ctx, bucket, s) == 0
        assert table.settle(table.ctx, s) == 0, engine.error()
        sums = np.empty(3, value.dtype)
        cuda.memcpy_dtoh(sums, int(ffi.cast("uintptr_t", table.data(table.ctx, bucket))))
        np.testing.assert_array_equal(sums, value)
    for kind in (1, 2, 3):          # all_gather, reduce_scatter, all_to_all: on one rank, copies
        cuda.memset_d32(dout, 0, 10)
        assert table.exchange(table.ctx, kind, floats(da, True), floats(dout), 10, 0, s) == 0, engine.error()
        assert table.settle(table.ctx, s) == 0, engine.error()
        got = np.empty(10, np.float32)
        cuda.memcpy_dtoh(got, dout)
        np.testing.assert_array_equal(got, a, err_msg=f"exchange {kind}")
    assert engine.waited_seconds() >= 0.0 and engine.error() == ""
    engine.close()
finally:
    context.pop()
print("ok")
