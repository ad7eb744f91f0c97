"""flowc's NCCL engine: the library a data-parallel GPU step calls for its collectives.

The GPU twin of compiler/comm_library.py: ``codegen_templates/cuda/flowc_comm_nccl.cu`` fills the
function table of ``flowc_cuda_comm.h`` from NCCL, which it opens with dlopen at run time, so
building it needs nvcc and no NCCL header.  It holds no kernels: it is built once per nvcc release
(not per arch) into the core cache (``$FLOWC_CORE_DIR``), keyed by its source, the command and
nvcc's version.

Example::

    >>> ensure_nccl_engine().name            # doctest: +SKIP
    'kernel.so'
"""
from __future__ import annotations

import functools
import shlex
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.cache import KernelCache

ENGINE_SOURCE = "flowc_comm_nccl.cu"
ENGINE_FILES = ("kernel.cu", _cache.LIBRARY_FILE)
# Host code only: the CUDA runtime linked statically, as in the step libraries.
FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-cudart", "static", "-O2", "-std=c++17")


class NcclEngineError(RuntimeError):
    """The NCCL engine could not be built (no nvcc, or it failed)."""


def engine_source() -> str:
    from flowc.compiler.cuda_toolchain import cuda_include_dir
    return (cuda_include_dir() / ENGINE_SOURCE).read_text()


def ensure_nccl_engine() -> Path:
    """The NCCL engine's shared library, built on first use (a few seconds, once per nvcc release)."""
    from flowc.compiler.cuda_toolchain import find_nvcc
    from flowc.compiler.toolchain import ToolchainError
    try:
        nvcc = find_nvcc()
    except ToolchainError as err:
        raise NcclEngineError(f"building flowc's NCCL engine needs nvcc: {err}") from None
    return _ensure(str(settings.core_dir()), nvcc)


@functools.cache
def _ensure(root: str, nvcc: str) -> Path:
    from flowc.compiler.cuda_toolchain import cuda_include_dir, nvcc_version
    from flowc.compiler.toolchain import ToolchainError, _run
    command = shlex.join(["nccl-engine", "nvcc", *FLAGS])
    parts = _cache.make_key_parts(source=engine_source(), command=command, compiler_version=nvcc_version(),
                                  cpu_target="cuda host", include_dir=cuda_include_dir())

    def build(folder: Path) -> None:
        source = folder / ENGINE_FILES[0]
        source.write_text(engine_source())
        argv = [nvcc, *FLAGS, f"-I{cuda_include_dir()}", str(source), "-o", str(folder / ENGINE_FILES[1]), "-ldl"]
        try:
            proc = _run(argv)
        except ToolchainError as err:
            raise NcclEngineError(f"building flowc's NCCL engine failed: {err}") from None
        if proc.returncode != 0:
            raise NcclEngineError(f"building flowc's NCCL engine failed.\ncommand: {shlex.join(argv)}\n"
                                  f"{proc.stderr.strip()}")

    entry, _ = KernelCache(root, setting="FLOWC_CORE_DIR").get_or_build(parts, "flowc_comm_nccl", build,
                                                                          files=ENGINE_FILES)
    return entry.library
