"""flowc's MPI engine: the library a data-parallel step calls for its collectives.

A step never includes mpi.h: it calls the function table of codegen_templates/cpu/flowc_comm.h,
and this module builds the library that fills that table from MPI
(``codegen_templates/cpu/flowc_comm_mpi.c``), with the compiler wrapper of the MPI installation
mpi4py uses (``mpicc``).  So step libraries stay independent of the MPI vendor (the MPICH wheel,
Debian's Open MPI): only this small library is built per installation, once, into the core cache
(``$FLOWC_CORE_DIR``), keyed by its source, the wrapper's full command line and the mpi.h it
reads.

Example::

    >>> engine = ensure_comm_library()            # doctest: +SKIP
    >>> engine.name
    'kernel.so'
"""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import sys
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.cache import KernelCache

COMM_SOURCE = "flowc_comm_mpi.c"
COMM_FILES = ("kernel.c", _cache.LIBRARY_FILE)
FLAGS = ("-O2", "-fPIC", "-shared", "-std=c11")
INSTALL_HINT = "pip install 'flowc[distributed]' (mpi4py and the MPICH wheel, with its mpicc)"


class CommLibraryError(RuntimeError):
    """The MPI engine could not be built: no mpicc, or it failed."""


def mpi_tool(name: str, python: str = sys.executable, path: str | None = None) -> str | None:
    """MPI's `name` (mpiexec, mpicc) beside `python` (a venv with the MPICH wheel), else the first on
    PATH (`path`, when given), else None: the one lookup flowc, `flowc launch`, the benchmarks and
    the tests use, so they all find the MPI that mpi4py's wheel brought."""
    beside = Path(python).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name, path=path)


def find_mpicc() -> list[str]:
    """The MPI C compiler wrapper as an argv prefix: ``$FLOWC_MPICC``, else `mpi_tool("mpicc")`."""
    env = settings.mpicc()
    if env:
        argv = shlex.split(env)
        resolved = shutil.which(argv[0])
        if resolved is None:
            raise CommLibraryError(f"FLOWC_MPICC={env!r}: {argv[0]!r} was not found")
        return [resolved, *argv[1:]]
    found = mpi_tool("mpicc")
    if found is None:
        raise CommLibraryError(f"building flowc's MPI engine needs mpicc, which was not found: {INSTALL_HINT}, "
                               "or point FLOWC_MPICC at your MPI's wrapper")
    return [found]


def _wrapped_command(mpicc: list[str]) -> list[str]:
    """What the wrapper runs (``-show`` for MPICH, ``--showme`` for Open MPI): it names the headers
    and libraries, so it belongs in the cache key."""
    for option in ("-show", "--showme"):
        proc = _cache_run([*mpicc, option])
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            return shlex.split(proc.stdout.strip())
    raise CommLibraryError(f"{shlex.join(mpicc)} -show / --showme did not say what it runs: is it an MPI "
                           "compiler wrapper?")


def _cache_run(argv: list[str]):
    """The wrapper's run, or None where it cannot run at all (the caller names the wrapper)."""
    from flowc.compiler.toolchain import ToolchainError, _run
    try:
        return _run(argv)
    except ToolchainError:
        return None


def _headers_digest(wrapped: list[str]) -> str:
    """sha256 of the mpi.h the wrapper's include folders hold (the ABI the engine is built for)."""
    digest = hashlib.sha256()
    for arg in wrapped:
        if arg.startswith("-I"):
            header = Path(arg[2:]) / "mpi.h"
            if header.is_file():
                digest.update(header.read_bytes())
    return digest.hexdigest()


def _source() -> str:
    from flowc.compiler.toolchain import include_dir
    return (include_dir() / COMM_SOURCE).read_text()


def ensure_comm_library() -> Path:
    """The MPI engine's shared library, built on first use (about a second, once per installation)."""
    return _ensure(str(settings.core_dir()), shlex.join(find_mpicc()))


@functools.cache
def _ensure(root: str, mpicc_text: str) -> Path:
    from flowc.compiler.toolchain import compiler_version, cpu_target, include_dir
    mpicc = shlex.split(mpicc_text)
    wrapped = _wrapped_command(mpicc)
    command = shlex.join(["comm", *mpicc, *FLAGS, "->", *wrapped, "mpi.h", _headers_digest(wrapped)])
    parts = _cache.make_key_parts(source=_source(), command=command, compiler_version=compiler_version(),
                                  cpu_target=cpu_target(), include_dir=include_dir())

    def build(folder: Path) -> None:
        source = folder / COMM_FILES[0]
        source.write_text(_source())
        argv = [*mpicc, *FLAGS, str(source), "-o", str(folder / COMM_FILES[1])]
        proc = _cache_run(argv)
        if proc is None or proc.returncode != 0:
            output = proc.stderr.strip() if proc is not None else "could not run it"
            raise CommLibraryError(f"building flowc's MPI engine failed.\ncommand: {shlex.join(argv)}\n{output}")

    entry, _ = KernelCache(root, setting="FLOWC_CORE_DIR").get_or_build(parts, "flowc_comm_mpi", build,
                                                                          files=COMM_FILES)
    return entry.library
