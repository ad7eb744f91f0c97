"""A data- and model-parallel GPU step on the CUDA emulator, one process per rank, its collectives
through the real NCCL engine against a fake NCCL over MPI (tests/nccl_emulated.py):

    mpiexec -n 2 python tests/distributed/nccl_emulated_step.py OPTIMIZER STEPS [NET]

Each rank traces OneFlow's hybrid-parallel MLP (tests/test_model_parallel_pass.py: a data-parallel
hidden layer, whose gradients are summed in buckets, and a model-parallel output layer, with its
all_gather, reduce_scatter and all_to_all; NET "bn": tests/test_synced_batch_norm.py's convolution
with batch norm, whose statistics are all-gathered in the forward pass; NET "wide":
tests/test_data_parallel_pass.py's float64 layer under a float32 one, with an int32 count over the
batch, whose sums fill buckets of three types; NET "double": the hybrid MLP in float64, whose
exchanges move and sum float64 values) as one of the ranks, renders
the CUDA step with its host step, and runs STEPS steps of it on its share of each global batch. Rank
0 checks that the losses and every variable (the split ones put back together) equal the logical
job's NumPy reference on the whole batches, that every rank's whole variables are bit-equal, and
that the host step called the engine in order (the host log), then prints "ok". FLOWC_FAKE_NCCL_FAIL
/ FLOWC_FAKE_STREAM_BUSY (tests/fake_nccl.c, tests/fake_cudart.h) inject faults: the step's error
code is then printed.
"""
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from mpi4py import MPI

import flow

from flowc.compiler.codegen.cuda_host import host_buffers
from flowc.compiler.ops.random_shards import RANK_SCALAR
from flowc.compiler.pipeline import lower
from flowc.compiler.reference import run_reference
from flowc.runtime.nccl import NcclEngine
from flowc.runtime.session import default_session
from tests.cuda_emulator_harness import DeviceBuffer, Emulator, host_log
from tests.nccl_emulated import engine_library, fake_nccl
from tests.test_cuda_codegen import render
from tests.test_cuda_host_step import STEP_CDEF
from tests.test_data_parallel_pass import wide_net
from tests.test_model_parallel_pass import batch, double_hybrid_mlp, hybrid_mlp, on_ranks, train_job_of
from tests.test_synced_batch_norm import bn_net

OPTIMIZER, STEPS = sys.argv[1], int(sys.argv[2])
NET = {"hybrid": hybrid_mlp, "bn": bn_net, "wide": wide_net,
       "double": double_hybrid_mlp}[sys.argv[3] if len(sys.argv) > 3 else "hybrid"]
comm = MPI.COMM_WORLD
rank, ranks = comm.Get_rank(), comm.Get_size()
STREAM = 0x5EED0



def traced(ranks_: int):
    """The job traced as one of `ranks_` ranks (1: the logical job), with its session's variables.
    The session is marked joined: under mpiexec it must not start the runtime's own cluster."""
    flow.clear_default_session()
    on_ranks(ranks_)
    job = train_job_of(NET, OPTIMIZER)
    session = default_session()
    return job.graph, job._traced.distribution, {n: session.value(n).copy() for n in job.graph.variables}


logical, _, values = traced(1)
local, distribution, _ = traced(ranks)
sharded = set(distribution.sharded)
program = lower(local)
step = render(program)
assert step.uses_comm and step.comm_buckets >= 1, "the data-parallel step calls no engine"
# private (0700) and removed at exit; each rank builds its own copy of the step
build_folder = tempfile.TemporaryDirectory(prefix=f"nccl-emulated-{rank}-")
emulator = Emulator(Path(build_folder.name))
ffi, lib = emulator.build("#define FLOWC_HOST_STEP 1\n" + step.source, [la.kernel for la in step.launches],
                          extra_cdef=STEP_CDEF)
# FLOWC_TEST_NCCL_MISSING_ON=R: rank R's FLOWC_NCCL names no file (a host without the library)
missing = os.environ.get("FLOWC_TEST_NCCL_MISSING_ON") == str(rank)
if missing:
    os.environ["FLOWC_NCCL"] = "/nonexistent/libnccl.so.2"
engine = NcclEngine(comm, step.comm_buckets, engine_library=engine_library(),
                    nccl_library=None if missing else str(fake_nccl()))
if os.environ.get("FLOWC_TEST_STEP_STOPS_AFTER_START"):
    # The step stops between a bucket's start and its wait, for a reason of its own (a launch that
    # failed): its `wait` entry (the table's third pointer) returns an error without calling the engine.
    stop_before_wait = ffi.callback("int(void*, int, void*)", lambda ctx, bucket, stream: 7)
    engine.table.view(np.uint64)[2] = int(ffi.cast("uintptr_t", stop_before_wait))

# This rank's device buffers: the fixed three, then each binding of the step's table.
fixed = {"arena": DeviceBuffer(max(program.memory.arena_bytes, 64)),
         "scratch": DeviceBuffer(max(step.scratch_bytes, 64)), "status": DeviceBuffer(4)}
mine = {name: (np.split(v, ranks, axis=0)[rank] if name in sharded else v).copy() for name, v in values.items()}
buffers = {}
for b in step.bindings[1:]:
    if b[0] == "variable":
        buffers[b] = DeviceBuffer(mine[b[1]].nbytes)
        buffers[b].write(mine[b[1]])
    elif b[0] in ("input", "scalar"):
        t = local.node(local.placeholders[b[1]]).type if b[0] == "input" else None
        buffers[b] = DeviceBuffer(t.nbytes if t is not None else 8)


def address(binding):
    if binding[0] in fixed:
        return fixed[binding[0]].address + (int(binding[1]) if len(binding) > 1 else 0)
    if binding == ("comm",):
        return engine.table.ctypes.data
    return buffers[binding].address


table = ffi.new("char*[]", [ffi.cast("char*", address(b)) for b in host_buffers(step.bindings)])
outputs = [np.zeros(local.node(o).type.shape, local.node(o).type.dtype) for o in local.outputs]
output_table = ffi.new("void*[]", [ffi.cast("void*", o.ctypes.data) for o in outputs])
status = np.zeros(1, np.int32)
scalars = {name: (0.1 if name.startswith("learning_rate") else rank if name == RANK_SCALAR else 3)
           for name in local.scalars}
for name, dtype in local.scalars.items():
    buffers[("scalar", name)].write(np.array(scalars[name], dtype))

losses = []
logs = []
for s in range(STEPS):
    inputs = batch(s)
    for i, x in enumerate(inputs):
        buffers[("input", i)].write(np.ascontiguousarray(np.split(x, ranks, axis=0)[rank]))
    host_log()
    rc = lib.flowc_step(ffi.cast("void*", STREAM), table, output_table, ffi.cast("int*", status.ctypes.data), ffi.NULL)
    if rc:
        print(f"rank {rank}: step {s} returned {rc}: {engine.error()}", flush=True)
        failed_step = host_log()
        engine.close()          # a failed engine aborts its communicator: destroying it could wait for ever
        ends = [line for line in failed_step + host_log() if line.startswith(("nccl CommAbort", "nccl CommDestroy"))]
        print(f"rank {rank}: the communicator's end: {ends}", flush=True)
        sys.exit(3)
    logs.append(host_log())
    losses.append(np.concatenate(comm.allgather(outputs[0].copy())))
    want, updates = run_reference(logical, inputs, values, {n: (0.1 if n.startswith("learning_rate") else 3)
                                                            for n in logical.scalars})
    np.testing.assert_allclose(losses[-1], want[0], rtol=1e-5, atol=1e-6, err_msg=f"loss, step {s}")
    values.update(updates)

for name in local.assigns:
    t = local.variables[name]
    got = buffers[("variable", name)].view(np.dtype(t.dtype), int(np.prod(t.shape))).reshape(t.shape).copy()
    parts = comm.allgather(got)
    if name in sharded:
        whole = np.concatenate(parts, axis=0)
    else:
        for r in range(1, ranks):
            np.testing.assert_array_equal(parts[r], parts[0], err_msg=f"ranks disagree on {name!r}")
        whole = parts[0]
    np.testing.assert_allclose(whole, values[name], rtol=1e-5, atol=1e-6, err_msg=name)

# The host step's order: each bucket copied in and summed on the engine's stream after the kernels
# that write its gradients, the step's stream waiting for it before the first sum is unpacked,
# the exchanges as NCCL calls, and the end a settle (the stream queried), not a plain synchronize.
log = logs[-1]
calls = [line.split()[0] + (" " + line.split()[1] if line.startswith("nccl") else "") for line in log]
assert "nccl AllReduce" in calls, calls
if NET in (hybrid_mlp, double_hybrid_mlp):
    assert "nccl AllGather" in calls and "nccl ReduceScatter" in calls, calls
    assert "nccl GroupEnd" in calls, calls                 # the all_to_all: sends and receives in one group
    if NET is double_hybrid_mlp:   # each exchange in its type ("nccl KIND TYPE COUNT", tests/fake_nccl.c)
        kinds = {tuple(line.split()[1:3]) for line in log if line.startswith(("nccl AllGather", "nccl Send",
                                                                              "nccl ReduceScatter"))}
        assert {("AllGather", "float64"), ("ReduceScatter", "float64"), ("Send", "float64")} <= kinds, kinds
elif NET is bn_net:       # each layer's statistics gathered in the forward pass, before the first sum
    assert calls.index("nccl AllGather") < calls.index("nccl AllReduce"), calls
else:                     # a bucket of each type, in its own type (tests/fake_nccl.c logs the NCCL type)
    sums = sorted({line.split()[2] for line in log if line.startswith("nccl AllReduce")})   # "nccl AllReduce T N"
    assert sums == ["float32", "float64", "int32"], sums
assert calls[-1] == "stream_query" and "synchronize" not in calls, calls[-3:]
first_reduce = calls.index("nccl AllReduce")
assert calls[first_reduce - 1] == "stream_wait" and calls[first_reduce - 3] == "engine_copy", calls[:first_reduce]
unpacks = [i for i, line in enumerate(log) if line.startswith("launch") and "all_reduce" in line]
waits = [i for i, line in enumerate(log) if line.startswith("stream_wait") and line.split()[1] == hex(STREAM)]
assert unpacks and waits and waits[0] < unpacks[0], (waits, unpacks)
assert engine.error() == ""
engine.close()
if rank == 0:
    print(f"ok: {STEPS} steps on {ranks} ranks, {step.comm_buckets} buckets, last loss {losses[-1].mean():.6f}",
          flush=True)
