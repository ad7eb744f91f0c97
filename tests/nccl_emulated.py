"""The NCCL engine on the CUDA emulator: the real engine (codegen_templates/cuda/flowc_comm_nccl.cu)
built with g++ over tests/fake_cudart.h, against a fake NCCL over MPI (tests/fake_nccl.c, built with
mpicc), both linked to the emulator's runtime so that they move emulated device memory and log
their calls in the host step's log.  For tests that run under `mpiexec` (one process per rank).

    engine = NcclEngine(MPI.COMM_WORLD, buckets, engine_library=engine_library(),
                        nccl_library=str(fake_nccl()))
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

from flowc.compiler.comm_library import mpi_tool
from tests.cuda_emulator_harness import CUDA_DIR, HERE, runtime_dir

ENGINE = CUDA_DIR / "flowc_comm_nccl.cu"
FAKE_CUDART = HERE / "fake_cudart.h"
FAKE_NCCL = HERE / "fake_nccl.c"


def _built(name: str, sources: list[Path], argv_of) -> Path:
    """`name` built by `argv_of(output)` in the emulator runtime's private folder, once per source
    digest; atomic, since the ranks of one test build it at the same time."""
    folder = runtime_dir()
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    so = folder / f"{name}-{digest}.so"
    if not so.exists():
        tmp = folder / f"{name}-{digest}.{os.getpid()}.so"
        proc = subprocess.run(argv_of(tmp), capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[:4000]
        os.replace(tmp, so)
    return so


def _emulator_link(folder: Path) -> list[str]:
    return [f"-L{folder}", "-lflowc_emu", f"-Wl,-rpath,{folder}"]


@functools.cache
def engine_library() -> Path:
    """The real engine, its CUDA runtime calls on the emulator."""
    rt = runtime_dir()
    return _built("flowc_nccl_engine", [ENGINE, CUDA_DIR / "flowc_cuda_comm.h", FAKE_CUDART],
                  lambda out: ["g++", "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                               "-include", str(FAKE_CUDART), f"-I{CUDA_DIR}", "-x", "c++", str(ENGINE), "-x", "none",
                               *_emulator_link(rt), "-ldl", "-Wl,--no-undefined", "-o", str(out)])


@functools.cache
def fake_nccl() -> Path:
    """The fake NCCL over MPI, built with the mpicc of the MPI that mpi4py loads."""
    mpicc = mpi_tool("mpicc")
    assert mpicc is not None, "no mpicc (pip install 'flowc[distributed]')"
    rt = runtime_dir()
    return _built("fake_nccl", [FAKE_NCCL],
                  lambda out: [mpicc, "-std=c11", "-O1", "-g", "-Wall", "-Werror", "-shared", "-fPIC", str(FAKE_NCCL),
                               *_emulator_link(rt), "-o", str(out)])
