"""flowc's core library: the job-independent part of every CPU step, built once per machine.

A generated step used to compile the packed GEMM kernel and parse every runtime header
itself, which was most of its compile time (about 0.4 s of 0.6 s for the MLP train step).
Those parts do not depend on the job, so they are built once per compiler, CPU target and
header version, the way a JIT ships its runtime:

* `libflowc_core` (``codegen_templates/cpu/flowc_core.cpp``): the GEMM tile kernel.  Step
  libraries leave its symbols undefined; the runtime loads it with RTLD_GLOBAL first.
* ``flowc_prelude.h.gch``: the precompiled prelude, built with exactly the steps' flags,
  so a step's compile parses none of the standard or runtime headers.

Both live in their own content-addressed cache, ``$FLOWC_CORE_DIR`` (default
``~/.cache/flowc-core``), separate from the job cache: emptying the job cache (or pointing
``FLOWC_CACHE_DIR`` at a fresh folder) leaves the core in place, as deleting torch.compile's
cache leaves libtorch.  `flowc cache clear --core` empties it.  The core cache is trusted on the
same terms as the job cache (compiler/cache_trust.py), and its entry's meta.json checksums both
files: a damaged precompiled header (a truncated ``.gch`` made every compile fail with a cryptic
g++ error) is found before a compile reads it, and the entry is rebuilt.

Example::

    >>> core = ensure_core()          # doctest: +SKIP
    >>> core.library.name, core.include_dir.joinpath(PRELUDE + ".gch").exists()   # doctest: +SKIP
    ('kernel.so', True)
"""
from __future__ import annotations

import ctypes
import functools
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.cache import KernelCache

CORE_SOURCE = "flowc_core.cpp"
PRELUDE = "flowc_prelude.h"
# Steps built against the core: the GEMM tile kernel is declared, not defined.
STEP_DEFINES = ("-DFLOWC_CORE_LIBRARY",)


def core_dir() -> Path:
    """The core cache's root: ``$FLOWC_CORE_DIR`` or ``~/.cache/flowc-core``."""
    return settings.core_dir()


@dataclass(frozen=True)
class CoreLibrary:
    library: Path          # libflowc_core (stored as the entry's kernel.so)
    include_dir: Path      # holds flowc_prelude.h.gch: put it first on the steps' include path
    compiled: bool         # built by this call


def _flags() -> list[str]:
    from flowc.compiler.toolchain import BASE_FLAGS
    return [f for f in BASE_FLAGS if f != "-shared"]


def _key_parts():
    from flowc.compiler.toolchain import compiler_version, cpu_target, include_dir
    source = (include_dir() / CORE_SOURCE).read_text()
    command = shlex.join(["core", *_flags(), *STEP_DEFINES, "-include", PRELUDE])
    return _cache.make_key_parts(source=source, command=command, compiler_version=compiler_version(),
                                 cpu_target=cpu_target(), include_dir=include_dir())


def _build(folder: Path) -> None:
    from flowc.compiler.toolchain import ToolchainError, _run, find_compiler, include_dir
    cxx, headers, flags = find_compiler(), include_dir(), _flags()
    steps = [
        # the library: the GEMM kernel, defined
        [*cxx, *flags, "-shared", f"-I{headers}", str(headers / CORE_SOURCE), "-o",
         str(folder / _cache.LIBRARY_FILE)],
        # the precompiled prelude, with the steps' own flags (g++ ignores a .gch whose flags differ)
        [*cxx, *flags, *STEP_DEFINES, f"-I{headers}", "-x", "c++-header", str(headers / PRELUDE), "-o",
         str(folder / f"{PRELUDE}.gch")],
    ]
    for argv in steps:
        proc = _run(argv)
        if proc.returncode != 0:
            raise ToolchainError(f"building flowc's core library failed (exit {proc.returncode}).\n"
                                 f"command: {shlex.join(argv)}\ncompiler output:\n{proc.stderr.strip()}")
    (folder / _cache.SOURCE_FILE).write_text((headers / CORE_SOURCE).read_text())


def ensure_core(*, for_compile: bool = True) -> CoreLibrary:
    """The core library for this machine and compiler, built on first use (about 1.5 s, once).

    `for_compile` (a step is about to be compiled against it) checks the sha256 of the precompiled
    header too (26 MB, about 40 ms once per process); loading the library checks only its own,
    and the header's size.
    """
    return _ensure_core(str(core_dir()), for_compile)


@functools.cache
def _ensure_core(root: str, for_compile: bool = True) -> CoreLibrary:
    cache = KernelCache(root, setting="FLOWC_CORE_DIR")
    entry, compiled = cache.get_or_build(_key_parts(), "flowc_core", _build, verify_all=for_compile)
    return CoreLibrary(entry.library, entry.library.parent, compiled)


_loaded: dict[str, ctypes.CDLL] = {}


def load_core() -> None:
    """Load the core library with RTLD_GLOBAL, so step libraries resolve its symbols (once per process)."""
    core = ensure_core(for_compile=False)
    if str(core.library) not in _loaded:
        _loaded[str(core.library)] = ctypes.CDLL(str(core.library), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
