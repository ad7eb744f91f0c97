"""Data- and model-parallel GPU steps: their collectives through NCCL (codegen_templates/cuda/flowc_comm_nccl.cu).

Without a GPU (CI), the real engine runs on the CUDA emulator (tests/fake_cudart.h) against a fake
NCCL over MPI (tests/fake_nccl.c), one process per rank (tests/distributed/nccl_emulated_step.py):
* the generated host step calls the engine between its launches: a bucket starts after the launch
  that writes its last gradient, the step's stream waits for it before the first sum is unpacked,
  each exchange of a model-parallel layer is one call in its place, and the step ends in the
  engine's settle (a wait that watches the peers), not a plain synchronize;
* 2 ranks train OneFlow's hybrid-parallel MLP as the logical job's NumPy reference does;
* NCCL's failures (a call, an asynchronous error, a peer that stops answering, the bootstrap) stop
  the step with the reason, not a hang;
* the engine says which NCCL it could not open, and where flowc looks for one.
Where nvcc is installed the engine builds with it (host code only, no NCCL header).
"""
from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cffi
import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.codegen.collectives import plan_buckets
from flowc.compiler.codegen.cuda_host import CommCall
from flowc.compiler.comm_library import mpi_tool
from flowc.compiler.pipeline import lower
from tests.test_cuda_host_step import emulator, host_step_device  # noqa: F401  (fixtures)
from tests.test_model_parallel_pass import hybrid_mlp, on_ranks, train_job_of

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "distributed" / "nccl_emulated_step.py"
COMM_CUDA_TEMPLATES = {"comm_unpack.cu.j2"}
MPIEXEC = mpi_tool("mpiexec")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ runs the CUDA emulator")
needs_mpi = pytest.mark.skipif(MPIEXEC is None or mpi_tool("mpicc") is None,
                               reason="no mpiexec/mpicc (pip install 'flowc[distributed]')")


def _step_on_ranks(optimizer: str = "adam", ranks: int = 2):
    from tests.test_cuda_codegen import render
    on_ranks(ranks)
    program = lower(train_job_of(hybrid_mlp, optimizer).graph)
    return program, render(program)


def test_a_parallel_gpu_step_calls_the_engine_between_its_launches():
    program, step = _step_on_ranks()
    plan = plan_buckets(program.graph, program.kernels)
    assert step.uses_comm and step.comm_buckets == len(plan) >= 1
    assert step.bindings[-1] == ("comm",) and "comm_unpack.cu.j2" in step.templates
    ops = {c.op for c in step.comm_calls}
    assert ops == {"start", "wait", "exchange"}
    kinds = sorted({c.sizes[0] for c in step.comm_calls if c.op == "exchange"})
    assert kinds == [1, 2, 3]          # all_gather, reduce_scatter, all_to_all (flowc_cuda_comm.h)
    unpacks = [i for i, la in enumerate(step.launches) if la.args and la.args[0][0] == "bucket"]
    for bucket in range(step.comm_buckets):
        start = next(c for c in step.comm_calls if c.op == "start" and c.bucket == bucket)
        wait = next(c for c in step.comm_calls if c.op == "wait" and c.bucket == bucket)
        mine = [i for i in unpacks if step.launches[i].args[0][1] == bucket]
        # after the backward launches that write its gradients (that it is after the last of them, the
        # emulated training below shows: a sum of stale gradients would not train as the reference)
        assert 0 < start.at <= wait.at <= min(mine), (start, wait, mine)
        assert len(start.args) == len(start.sizes) and sum(start.sizes) == sum(
            program.graph.node(m).type.size for m in plan[bucket].members)
    source = step.source[step.source.index('extern "C" int flowc_step'):]
    assert '#include "flowc_cuda_comm.h"' in step.source
    assert "comm->settle(comm->ctx, s)" in source and "flowc_host::synchronize(s)" not in source
    assert source.index("comm->start(") < source.index("comm->wait(")
    assert step.host_sync      # the settle is where a lost peer is noticed: every such step waits


def test_a_gpu_step_without_collectives_is_as_before():
    flow.clear_default_session()
    program = lower(train_job_of(hybrid_mlp, "sgd").graph)     # one process: nothing to sum
    from tests.test_cuda_codegen import render
    step = render(program)
    assert not step.uses_comm and step.comm_calls == [] and ("comm",) not in step.bindings
    assert "flowc_cuda_comm.h" not in step.source and "comm->" not in step.source


def test_a_comm_call_renders_with_addresses_from_the_table():
    from flowc.compiler.codegen.cuda_host import comm_text
    table = [("arena",), ("scratch",), ("status",), ("variable", "w"), ("comm",)]
    start = comm_text(CommCall(0, "start", 1, (("arena", 64), ("variable", "w")), (4, 6)), table)
    assert start == ("{ const void* g[] = {static_cast<const void*>(buffers[0] + 64), "
                     "static_cast<const void*>(buffers[3])}; static const int64_t n[] = {4, 6}; "
                     "if ((err = comm->start(comm->ctx, 1, 2, g, n, FLOWC_COMM_FLOAT32, s))) return err; }")
    double = comm_text(CommCall(0, "start", 0, (("arena", 0),), (3,), "float64"), table)
    assert "comm->start(comm->ctx, 0, 1, g, n, FLOWC_COMM_FLOAT64, s)" in double
    exchange = comm_text(CommCall(0, "exchange", args=(("bucket", 0, 8), ("arena", 0)), sizes=(3, 5),
                                  dtype="int64"), table)
    assert "comm->exchange(comm->ctx, 3, static_cast<const void*>(static_cast<char*>(" \
           "comm->data(comm->ctx, 0)) + 8), static_cast<void*>(buffers[0]), 5, FLOWC_COMM_INT64, s)" in exchange


def _run_ranks(*args: str, env: dict[str, str] | None = None, ranks: int = 2,
               cleanup: bool = True) -> subprocess.CompletedProcess:
    """`cleanup=False`: Hydra does not kill the other ranks when one ends with an error, so each rank
    prints its own error (else a slow rank may be killed halfway through its traceback)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "FLOWC_COMM_TIMEOUT": "60",
                   **(env or {})}
    launcher = [str(MPIEXEC)] + ([] if cleanup else ["-disable-auto-cleanup"]) + ["-n", str(ranks)]
    return subprocess.run(launcher + [sys.executable, str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=300, env=environment)


@needs_gxx
@needs_mpi
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_two_emulated_gpus_train_the_hybrid_mlp_as_the_logical_job(optimizer):
    proc = _run_ranks(optimizer, "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok: 3 steps on 2 ranks") == 1, proc.stdout


@needs_gxx
@needs_mpi
@pytest.mark.parametrize("optimizer, net", [("adam", "wide"), ("momentum", "double")])
def test_two_emulated_gpus_sum_and_exchange_values_in_their_own_types(optimizer, net):
    """"wide": NCCL sums each bucket in its type (ncclFloat64, ncclInt32: a float64 layer, a float32
    one and an int32 count over the batch); "double": a float64 model-parallel layer's ncclAllGather,
    ncclReduceScatter and all-to-all sends in ncclFloat64.  nccl_emulated_step.py checks the types
    NCCL was given, and that the steps train as the logical job."""
    proc = _run_ranks(optimizer, "2", net)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok: 2 steps on 2 ranks") == 1, proc.stdout


@needs_gxx
@needs_mpi
def test_two_emulated_gpus_train_synchronised_batch_norm_as_the_logical_job():
    """The CUDA step gathers each batch norm's statistics through ncclAllGather in the forward pass,
    and its input gradient divides by the whole batch's count."""
    proc = _run_ranks("momentum", "3", "bn")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok: 3 steps on 2 ranks") == 1, proc.stdout


@needs_gxx
@needs_mpi
@pytest.mark.parametrize("env, code, reason", [
    ({"FLOWC_FAKE_NCCL_FAIL": "ncclAllReduce"}, 900001, "ncclAllReduce: unhandled system error"),
    ({"FLOWC_FAKE_NCCL_FAIL": "async", "FLOWC_FAKE_STREAM_BUSY": "5"}, 900001,
     "NCCL reported an error in the step's collectives"),
    ({"FLOWC_FAKE_STREAM_BUSY": "1000000000", "FLOWC_COMM_TIMEOUT": "1"}, 900002,
     "a collective: did not complete within FLOWC_COMM_TIMEOUT (1 s)"),
    # the step stops between a bucket's start and its wait, for a reason of its own (no engine error):
    # the bucket's sum may still wait for peers that went on
    ({"FLOWC_TEST_STEP_STOPS_AFTER_START": "1"}, 7, ""),
], ids=["call", "asynchronous", "timeout", "step_stops_after_a_start"])
def test_an_nccl_failure_stops_the_step_with_the_reason(env, code, reason):
    proc = _run_ranks("sgd", "2", env=env)
    assert proc.returncode != 0
    for rank in (0, 1):
        assert f"rank {rank}: step 0 returned {code}: {reason}" in proc.stdout, proc.stdout + proc.stderr
        # aborted, never destroyed: ncclCommDestroy waits for collectives that may never complete
        assert f"rank {rank}: the communicator's end: ['nccl CommAbort 0']" in proc.stdout, proc.stdout


@needs_gxx
@needs_mpi
@pytest.mark.parametrize("env, message", [
    ({"FLOWC_FAKE_NCCL_FAIL": "ncclGetUniqueId"},
     "NCCL could not start (rank 0: ncclGetUniqueId: unhandled system error"),
    ({"FLOWC_FAKE_NCCL_FAIL": "ncclCommInitRankConfig"},
     "NCCL could not start on rank 1 of 2: ncclCommInitRankConfig: unhandled system error"),
    # one host without NCCL: the other rank must not go on into NCCL's start, to wait there for it
    ({"FLOWC_TEST_NCCL_MISSING_ON": "1"},
     "NCCL could not start (rank 1: DistributedError: FLOWC_NCCL='/nonexistent/libnccl.so.2' is not a file"),
    # a rank that never joins (it stopped, or NCCL cannot connect the hosts): the start is polled, then aborted
    ({"FLOWC_FAKE_NCCL_STALL_RANK": "1", "FLOWC_COMM_TIMEOUT": "1"},
     "NCCL could not start on rank 0 of 2: ncclCommInitRankConfig: did not complete within FLOWC_COMM_TIMEOUT "
     "(1 s): a rank did not join the communicator"),
], ids=["unique_id", "init", "missing_on_one_rank", "a_rank_never_joins"])
def test_a_bootstrap_failure_is_an_error_on_every_rank(env, message):
    proc = _run_ranks("sgd", "1", env=env, cleanup=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.count("DistributedError: NCCL could not start") == 2     # no rank left waiting


# --- which NCCL, and when it cannot be opened --------------------------------------------------------

def _engine_api(library: Path):
    ffi = cffi.FFI()
    ffi.cdef("int flowc_nccl_unique_id(const char* library, void* id, char* error, int error_len);")
    return ffi, ffi.dlopen(str(library))


def _unique_id_error(library: Path, nccl: str) -> str:
    ffi, lib = _engine_api(library)
    error, unique = ffi.new("char[]", 512), ffi.new("char[]", 128)
    assert lib.flowc_nccl_unique_id(nccl.encode(), unique, error, len(error)) == 900001
    return ffi.string(error).decode()


@needs_gxx
def test_the_engine_names_an_nccl_it_cannot_open_or_use():
    from tests.nccl_emulated import engine_library
    library = engine_library()
    assert _unique_id_error(library, "/nonexistent/libnccl.so.2").startswith("could not open the NCCL library: ")
    # a library that is not NCCL: the first missing entry point is named
    assert _unique_id_error(library, "libm.so.6") == "the NCCL library has no symbol: ncclGetUniqueId"


def test_flowc_looks_for_nccl_in_flowc_nccl_then_the_wheel_then_the_system(tmp_path, monkeypatch):
    from flowc.compiler.errors import DistributedError
    from flowc.runtime import nccl
    monkeypatch.setenv("FLOWC_NCCL", str(tmp_path / "missing.so"))
    with pytest.raises(DistributedError, match="FLOWC_NCCL=.*missing.so.* is not a file"):
        nccl.find_nccl()
    mine = tmp_path / "libnccl.so.2"
    mine.write_bytes(b"")
    monkeypatch.setenv("FLOWC_NCCL", str(mine))
    assert nccl.find_nccl() == str(mine)
    monkeypatch.delenv("FLOWC_NCCL")
    # the nvidia-nccl-cu12 wheel: nvidia/nccl/lib/libnccl.so.2 in the `nvidia` namespace package
    site = tmp_path / "site"
    wheel = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    assert nccl.find_nccl() == str(wheel)
    wheel.unlink()
    found = nccl.find_nccl()           # another installed wheel's (torch brings one), else the system loader's search
    assert found != str(wheel) and (found == "libnccl.so.2" or found.endswith("nvidia/nccl/lib/libnccl.so.2"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_engine_builds_with_nvcc_without_an_nccl_header(tmp_path, monkeypatch):
    from flowc.compiler import nccl_library
    monkeypatch.setenv("FLOWC_CORE_DIR", str(tmp_path / "core"))
    nccl_library._ensure.cache_clear()
    built = nccl_library.ensure_nccl_engine()
    assert built.is_file() and str(built).startswith(str(tmp_path))
    assert "#include <nccl.h>" not in nccl_library.engine_source()
    # NCCL is opened before any CUDA call: no GPU is needed to hear that it is missing
    assert _unique_id_error(built, "/nonexistent/libnccl.so.2").startswith("could not open the NCCL library")
    assert nccl_library.ensure_nccl_engine() == built      # once per nvcc release: cached


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_the_engine_opens_an_installed_nccl_wheel_and_asks_it_for_an_id(tmp_path, monkeypatch):
    """Every entry point the engine declares resolves in the real NCCL, and ncclGetUniqueId (which needs
    no GPU) answers: the declarations match NCCL's ABI where a wheel is installed."""
    from flowc.compiler import nccl_library
    from flowc.runtime.nccl import find_nccl
    monkeypatch.delenv("FLOWC_NCCL", raising=False)
    found = find_nccl()
    if found == "libnccl.so.2":
        pytest.skip("no NCCL wheel installed (pip install 'flowc[nccl]')")
    monkeypatch.setenv("FLOWC_CORE_DIR", str(tmp_path / "core"))
    nccl_library._ensure.cache_clear()
    ffi, lib = _engine_api(nccl_library.ensure_nccl_engine())
    error, unique = ffi.new("char[]", 512), ffi.new("char[]", 128)
    assert lib.flowc_nccl_unique_id(found.encode(), unique, error, len(error)) == 0, ffi.string(error)
    assert any(ffi.buffer(unique, 128))


# --- CudaLoadedStep: the engine comes from the session's cluster -------------------------------------------

TABLE_CDEF = """
typedef struct {
  void* ctx;
  int (*start)(void*, int, int, const void* const*, const int64_t*, int, void*);
  int (*wait)(void*, int, void*);
  void* (*data)(void*, int);
  int (*exchange)(void*, int, const void*, void*, int64_t, int, void*);
  int (*settle)(void*, void*);
} table_t;
"""


class TwinEngine:
    """An engine for one emulated rank whose peer holds the same gradients: a bucket's sum is twice
    its own (so the step equals the logical job on its share stacked twice).  `fail_with` makes
    the next settle fail with that code."""

    def __init__(self) -> None:
        from tests.cuda_emulator_harness import DeviceBuffer, device_copy
        self.ffi = ffi = cffi.FFI()
        ffi.cdef(TABLE_CDEF)
        self.buckets: dict[int, DeviceBuffer] = {}
        self.calls: list[str] = []
        self.fail_with = 0
        self.closed = False

        def start(ctx, b, count, grads, sizes, dtype, stream):
            assert dtype == 0, dtype          # FLOWC_COMM_FLOAT32: the twin sums float32 buckets
            total = sum(sizes[i] for i in range(count))
            bucket = self.buckets.setdefault(b, DeviceBuffer(4 * total))
            offset = 0
            for i in range(count):
                device_copy(bucket.address + 4 * offset, int(ffi.cast("uintptr_t", grads[i])), 4 * sizes[i])
                offset += sizes[i]
            bucket.write(2 * bucket.view(np.float32, total))
            self.calls.append(f"start {b}")
            return 0

        def wait(ctx, b, stream):
            self.calls.append(f"wait {b}")
            return 0

        def data(ctx, b):
            return ffi.cast("void*", self.buckets[b].address)

        def settle(ctx, stream):
            self.calls.append("settle")
            return self.fail_with

        self._callbacks = [ffi.callback("int(*)(void*, int, int, const void* const*, const int64_t*, int, void*)",
                                        start),
                           ffi.callback("int(*)(void*, int, void*)", wait), ffi.callback("void*(*)(void*, int)", data),
                           ffi.callback("int(*)(void*, void*)", settle)]
        self.table = np.zeros(48, np.uint8)
        t = ffi.cast("table_t*", self.table.ctypes.data)
        t.start, t.wait, t.data, t.settle = self._callbacks

    def error(self) -> str:
        return "peer 1 stopped answering (twin)"

    def close(self) -> None:
        self.closed = True


class TwinCluster:
    """Two ranks, one per machine."""
    ranks = 2

    def __init__(self) -> None:
        from flowc.runtime.world import World
        self.world = World(rank=0, size=2, local_rank=0, local_size=1)
        self.engines: list[TwinEngine] = []

    def gpu_engine(self, buckets: int, context=None, device: str | None = None) -> TwinEngine:
        assert buckets >= 1 and context is not None
        assert device == "0000:00:00.0"        # the fake driver's GPU 0: which GPU, for NCCL's one per rank
        self.engines.append(TwinEngine())
        return self.engines[-1]


def _gpu_mlp():
    @flow.global_function(type="train")
    def gpu_mlp(x: tp.Numpy.Placeholder((8, 6)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0"):
            init = flow.random_normal_initializer(0, 0.5)
            h = flow.layers.dense(x, 5, activation=flow.nn.relu, kernel_initializer=init, name="twin_hidden")
            logits = flow.layers.dense(h, 3, kernel_initializer=init, name="twin_out")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss
    return gpu_mlp


@needs_gxx
@pytest.mark.filterwarnings("ignore:job 'gpu_mlp' is placed on 'gpu'")     # the logical job, traced for its reference
@pytest.mark.usefixtures("host_step_device")       # fake PyCUDA over the emulator, the step library built there
def test_a_loaded_gpu_step_sums_through_its_clusters_engine():
    from flowc.runtime.session import default_session
    flow.clear_default_session()
    on_ranks(1)
    logical = _gpu_mlp().graph
    session = default_session()
    values = {name: session.value(name).copy() for name in logical.variables}
    flow.clear_default_session()
    on_ranks(2)
    session = default_session()
    graph = _gpu_mlp().graph
    for name, value in values.items():
        np.copyto(session.value(name), value)
    session.cluster = cluster = TwinCluster()
    try:
        _train_through_the_twin(graph, logical, values, session, cluster)
    finally:
        session.cluster = None       # a fake: clearing the session must not tell it
        flow.clear_default_session()


def _train_through_the_twin(graph, logical, values, session, cluster) -> None:
    from flowc.compiler.errors import DistributedError
    from flowc.compiler.pipeline import compile_graph
    from flowc.compiler.reference import run_reference
    from flowc.runtime.devices import load_step, sync_to_host
    compiled = compile_graph(graph, device="gpu", arch="sm_80")
    step = load_step(compiled, session)
    assert compiled.generated.uses_comm and len(cluster.engines) == 1
    engine = cluster.engines[0]
    rng = np.random.default_rng(3)
    lr = {name: 0.1 for name in graph.scalars if name.startswith("learning_rate")}
    for _ in range(3):
        x, y = rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32)
        (loss,) = step.run([x, y], lr)
        want, updates = run_reference(logical, [np.concatenate([x, x]), np.concatenate([y, y])], values,
                                      {name: 0.1 for name in logical.scalars})
        values.update(updates)
        np.testing.assert_allclose(loss, want[0][:4], rtol=1e-5, atol=1e-6)
        assert engine.calls[-1] == "settle" and engine.calls[0].startswith("start")
    sync_to_host(session)
    for name in graph.assigns:
        np.testing.assert_allclose(session.value(name), values[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # a job that would read a variable at another shape (split in one job, whole in another) is refused
    from flowc.compiler.errors import StepError
    name = sorted(graph.assigns)[0]
    with pytest.raises(StepError, match=f"variable {name!r}: one GPU job of this session splits it"):
        step.variables.pointer(name, (1,))
    engine.fail_with = 900002
    with pytest.raises(DistributedError, match=r"did not complete within FLOWC_COMM_TIMEOUT seconds.*"
                                               r"peer 1 stopped answering \(twin\)"):
        step.run([x, y], lr)
    step.release()
    assert engine.closed


class GatheringComm:
    """The bootstrap's communicator, as far as the one-GPU-per-rank check reaches: every rank's
    (host, bus id) is `devices`."""

    def __init__(self, devices: list[tuple[str, str]]) -> None:
        self.devices = devices

    def allgather(self, mine):
        assert mine[1] == self.devices[0][1]          # this rank's (host, bus id)
        return self.devices

    def Get_rank(self) -> int:
        raise AssertionError("the engine must not start when two ranks share a GPU")


def test_ranks_sharing_a_gpu_are_refused_on_every_rank_before_nccl_starts():
    from flowc.compiler.errors import DistributedError
    from flowc.runtime.nccl import NcclEngine, check_one_gpu_per_rank
    # one GPU each, whatever CUDA_VISIBLE_DEVICES numbers them (srun --gpus-per-task=1: each rank's is 0)
    check_one_gpu_per_rank([("a", "0000:17:00.0"), ("a", "0000:65:00.0"), ("b", "0000:17:00.0")])
    shared = [("a", "0000:17:00.0"), ("a", "0000:65:00.0"), ("a", "0000:17:00.0")]
    with pytest.raises(DistributedError, match=r"ranks 0, 2 would all use the GPU at 0000:17:00.0 on a, .*"
                                               r"3 ranks run there on 2 GPU\(s\)"):
        check_one_gpu_per_rank(shared)
    with pytest.raises(DistributedError, match="ranks 0, 2 would all use the GPU"):
        NcclEngine(GatheringComm(shared), 1, engine_library=Path("/nonexistent"), device=shared[0][1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_a_parallel_step_library_builds_with_nvcc(tmp_path):
    """The host step's engine calls compile against the real CUDA runtime (the emulator's g++ build
    above is laxer about types)."""
    from flowc.compiler.cache import KernelCache
    from flowc.compiler.cuda_toolchain import build_step_library
    _, step = _step_on_ranks("momentum")
    built = build_step_library(step.source, "hybrid_on_2_ranks", "sm_90", cache=KernelCache(tmp_path))
    assert built.path.name == "step.so" and built.compiled


@pytest.mark.gpu
def test_the_engine_runs_on_a_real_gpu_with_one_rank():
    from flowc.runtime.devices import gpu_status
    from flowc.runtime.nccl import find_nccl
    usable, why = gpu_status()
    if not usable:
        pytest.skip(f"no usable GPU: {why}")
    if find_nccl() == "libnccl.so.2" and ctypes.util.find_library("nccl") is None:
        pytest.skip("NCCL is not installed (pip install 'flowc[nccl]', or FLOWC_NCCL)")
    pytest.importorskip("mpi4py")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed" / "nccl_gpu_one_rank.py")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
