"""One cached build path for every backend's toolchain: generated source -> a cache entry, built once.

A toolchain (compiler/toolchain.py for g++, compiler/cuda_toolchain.py for nvcc) says how to key
and how to compile; everything else is here, the same for both: the content-addressed cache
lookup, the explanation of a miss, at most one compile when several processes ask at once, the
debug log, and on failure a kept copy of the source with the compiler's output and a message
that says where to read it:

    result = build_cached(toolchain, source, "train_job")
    result.path, result.compiled, result.miss_reason
"""
from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.build_progress import building
from flowc.compiler.cache import KernelCache, KeyParts


class ToolchainError(RuntimeError):
    """A toolchain is missing or a compile failed; the message says what to do.

    Example::

        >>> try:
        ...     build_shared_library("this is not C++", name="bad")   # doctest: +SKIP
        ... except ToolchainError as e:
        ...     print(e)                                               # doctest: +SKIP
    """


@dataclass(frozen=True)
class BuildResult:
    """Outcome of a cached build.

    ``path`` is the cached artifact (``kernel.so``, ``kernel.cubin``); ``source_path`` the source it
    was built from (open it to read the generated code); ``compiled`` is False on a cache hit;
    ``seconds`` is the wall time of the whole call; ``miss_reason`` says why a compile was needed
    (None on a hit).

    Example::

        >>> res = build_shared_library(src, name="answer")   # doctest: +SKIP
        >>> res.compiled, res.path.name                      # doctest: +SKIP
        (True, 'kernel.so')
    """

    path: Path
    key: str
    compiled: bool
    seconds: float
    source_path: Path
    miss_reason: str | None = None


class Compiler(Protocol):
    """What `build_cached` needs of a toolchain."""
    label: str                      # the language in messages: "C++", "CUDA"
    files: tuple[str, str]          # the cache entry's (source, artifact) file names
    log_name: str                   # the compiler log kept beside a failed source
    output_label: str               # "compiler output", "nvcc output"

    def key_parts(self, source: str) -> KeyParts: ...

    def target_words(self) -> str: ...          # "" or " for sm_90", after the job's name in messages

    def compile(self, tmp: Path, src: Path, out: Path, units: list[str] | None
                ) -> tuple[list[str], subprocess.CompletedProcess | None]: ...
    # (the argv that built `src` whole, its process; None when `units` built it in parts)

    def failure_hint(self) -> str: ...          # what to install, when the failure looks like a setup problem


def debug(msg: str) -> None:
    """Print `msg` to stderr under FLOWC_DEBUG=1 (cache misses, command lines, compile times)."""
    if settings.debug_level() >= 1:
        print(f"[flowc] {msg}", file=sys.stderr, flush=True)


def build_cached(toolchain: Compiler, source: str, name: str, *, cache: KernelCache | None = None,
                 units: list[str] | None = None) -> BuildResult:
    """Build `source` with `toolchain` through the kernel cache (see the module docstring).

    `name` labels the entry (index, failed sources, debug output); it does not enter the key.
    `units`, where given, are translation units equivalent to `source` that the toolchain may
    compile in parallel; `source` alone decides the key.  Raises ToolchainError when the
    compile fails, with the compiler's output and the path of the kept source.
    """
    t0 = time.perf_counter()
    cache = cache if cache is not None else _cache.default_cache()
    parts = toolchain.key_parts(source)
    key = parts.key()
    miss_reason: list[str] = []

    def build(tmp: Path) -> None:
        miss_reason.append(cache.explain_miss(name, parts))
        debug(f"{miss_reason[0]}; compiling {toolchain.label} key {key[:16]}{toolchain.target_words()}")
        src, out = tmp / toolchain.files[0], tmp / toolchain.files[1]
        src.write_text(source)
        t = time.perf_counter()
        argv, proc = toolchain.compile(tmp, src, out, units)
        if proc is None:
            debug(f"compiled {name!r} in {len(units or [])} parallel parts in {time.perf_counter() - t:.2f}s")
            return
        debug(f"compiled {name!r}{toolchain.target_words()} in {time.perf_counter() - t:.2f}s")
        if proc.returncode != 0:
            raise _compile_error(toolchain, cache, name, key, source, argv, proc)

    token = building.set(repr(name))        # the progress line of a long build names the job
    try:
        entry, compiled = cache.get_or_build(parts, name, build, files=toolchain.files)
    finally:
        building.reset(token)
    seconds = time.perf_counter() - t0
    if not compiled:
        debug(f"cache hit for {toolchain.label} {name!r} ({key[:16]}) in {seconds * 1e3:.1f} ms")
    return BuildResult(path=entry.library, key=key, compiled=compiled, seconds=seconds,
                       source_path=entry.source, miss_reason=miss_reason[0] if miss_reason else None)


def run_compiler(argv: list[str], install_hint: str) -> subprocess.CompletedProcess:
    """Run a compiler; a compiler that cannot start is a ToolchainError saying what to install."""
    debug("$ " + shlex.join(argv))
    try:
        return subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:            # e.g. $CXX points at something not executable
        raise ToolchainError(f"could not run {shlex.join(argv[:1])}: {e}; {install_hint}") from e


def _compile_error(toolchain: Compiler, cache: KernelCache, name: str, key: str, source: str, argv: list[str],
                   proc: subprocess.CompletedProcess) -> ToolchainError:
    # The build folder is deleted on failure, so keep the source and the compiler's output where
    # the user can open them, and point the diagnostics (which name the temp path) at the kept copy.
    kept = cache.failed_dir(name, key)
    kept_src = kept / toolchain.files[0]
    kept_src.write_text(source)
    tmp_src = argv[-3]
    output = "\n".join(s for s in ((proc.stdout or "").strip(), (proc.stderr or "").strip()) if s)
    output = output.replace(tmp_src, str(kept_src))
    command = shlex.join(argv).replace(tmp_src, str(kept_src))
    (kept / toolchain.log_name).write_text(f"$ {command}\n{output}\n")
    return ToolchainError(f"{toolchain.label} compilation of {name!r}{toolchain.target_words()} failed "
                          f"(exit {proc.returncode}).\n"
                          f"generated source kept at: {kept_src}\n"
                          f"command: {command}\n"
                          f"{toolchain.output_label}:\n{output}{toolchain.failure_hint()}")
