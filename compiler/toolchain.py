"""Host C++ toolchain: generated source -> cached shared library.

The compiler is ``$CXX`` (which may carry a wrapper, e.g. ``ccache g++``) or
``g++``.  Every failure is turned into a :class:`ToolchainError` whose message
says what to install or where to read the generated code, because "g++: not
found" or a page of template errors pointing at a temp file is what users of
compile-at-first-call systems complain about most.

This module must not import anything GPU-related.

Example::

    >>> from flowc.compiler.toolchain import build_shared_library
    >>> import cffi
    >>> res = build_shared_library('extern "C" int answer() { return 42; }',
    ...                            name="answer")              # doctest: +SKIP
    >>> ffi = cffi.FFI(); ffi.cdef("int answer(void);")        # doctest: +SKIP
    >>> ffi.dlopen(str(res.path)).answer()                      # doctest: +SKIP
    42
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.build_progress import CompileProgress, building
from flowc.compiler.cache import KernelCache, KeyParts
from flowc.compiler.cached_build import BuildResult, ToolchainError, build_cached, debug, run_compiler

__all__ = [
    "BuildResult",
    "ToolchainError",
    "build_shared_library",
    "compiler_version",
    "cpu_target",
    "cxx_command",
    "find_compiler",
    "include_dir",
    "key_parts",
]

INSTALL_GXX_HINT = "install it with `apt-get install g++` (Debian/Ubuntu) or `dnf install gcc-c++`"

# Placeholders substituted for the real paths when the command line goes into
# the cache key, so keys do not depend on temporary directory names.
SRC_PLACEHOLDER = "$SRC"
OUT_PLACEHOLDER = "$OUT"
CORE_PLACEHOLDER = "$CORE"

# How often a build in parts looks at its compilers (and updates its progress line).
PROGRESS_POLL_S = 0.1

# -fno-math-errno: no generated code reads errno, and while a math call may set it GCC keeps every
# loop with a std::sqrt scalar (a branch to libm's sqrtf for negative inputs): the Adam/AdamW/LAMB
# updates were.  Results are unchanged (sqrtps gives NaN where sqrtf does); -ffast-math and its
# finite-math parts stay off (tests/test_special_values.py).
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")


def find_compiler() -> list[str]:
    """Return the C++ compiler command as an argv prefix (``$CXX`` split, or ``["g++"]``).

    Raises :class:`ToolchainError` naming what to install when it cannot be found.

    Example::

        >>> find_compiler()   # doctest: +SKIP
        ['/usr/bin/g++']
    """
    env = settings.cxx() or ""
    argv = shlex.split(env) if env else ["g++"]
    resolved = shutil.which(argv[0])
    if resolved is None:
        origin = f"{argv[0]!r} (from $CXX)" if env else "g++"
        raise ToolchainError(
            f"flowc needs a C++ compiler to build kernels, but {origin} was not found; "
            f"{INSTALL_GXX_HINT}"
            + (", or point $CXX at an installed compiler" if env else "")
        )
    return [resolved, *argv[1:]]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, **kw)
    except OSError as e:  # e.g. $CXX points at something not executable
        raise ToolchainError(
            f"could not run the C++ compiler {shlex.join(argv[:1])}: {e}; {INSTALL_GXX_HINT}"
        ) from e


@functools.cache
def _compiler_version(cxx: tuple[str, ...]) -> str:
    proc = _run([*cxx, "--version"])
    lines = (proc.stdout or proc.stderr).splitlines()
    if proc.returncode != 0 or not lines:
        raise ToolchainError(
            f"`{shlex.join(cxx)} --version` failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()}; {INSTALL_GXX_HINT}"
        )
    return lines[0].strip()


def compiler_version() -> str:
    """First line of ``<cxx> --version``; cached per compiler for the process.

    Example::

        >>> compiler_version()   # doctest: +SKIP
        'g++ (Debian 12.2.0-14+deb12u1) 12.2.0'
    """
    return _compiler_version(tuple(find_compiler()))


@functools.cache
def _cpu_target(cxx: tuple[str, ...]) -> str:
    # What -march=native means differs per machine; the compiler's own resolved
    # target options are the most faithful description, so hash all of them.
    proc = _run([*cxx, "-march=native", "-Q", "--help=target"])
    text = proc.stdout if proc.returncode == 0 else ""
    march = "unknown"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "-march=":
            march = fields[1]
            break
    if not text:
        # Compilers without -Q --help=target (e.g. clang): fall back to the
        # preprocessor's feature macros for -march=native, which are also exact.
        proc = _run([*cxx, "-march=native", "-dM", "-E", "-x", "c++", os.devnull])
        text = proc.stdout
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return f"{march}-{digest}"


def cpu_target() -> str:
    """Stable id of what ``-march=native`` resolves to here, e.g. ``'skylake-1a2b3c4d5e6f7a8b'``.

    Example::

        >>> cpu_target()   # doctest: +SKIP
        'znver3-5c1f0e2d9a7b3c41'
    """
    return _cpu_target(tuple(find_compiler()))


def include_dir() -> Path:
    """Directory of the CPU runtime headers shipped with the package (``codegen_templates/cpu``).

    Example::

        >>> include_dir().name
        'cpu'
    """
    from flowc.compiler.resources import template_folder

    return template_folder("cpu")


def cxx_command(src: Path, out: Path, core_include: str | None = None) -> list[str]:
    """Full compiler argv that builds ``src`` into the shared library ``out``.

    Steps are built against flowc's core library (see ``compiler/core_library.py``): the
    precompiled prelude comes first on the include path; ``core_include`` names its folder
    (default: the core built for this machine, built now if missing).

    Example::

        >>> cxx_command(Path("k.cpp"), Path("k.so"))[1:4]   # doctest: +SKIP
        ['-O3', '-march=native', '-fopenmp']
    """
    from flowc.compiler.core_library import PRELUDE, STEP_DEFINES, ensure_core
    core = core_include if core_include is not None else str(ensure_core().include_dir)
    return [*find_compiler(), *BASE_FLAGS, *STEP_DEFINES, f"-I{core}", f"-I{include_dir()}",
            "-include", PRELUDE, str(src), "-o", str(out)]


def key_parts(source: str) -> KeyParts:
    """Cache key parts for ``source`` under the current toolchain.

    Useful with :meth:`KernelCache.explain_miss` before a build.

    Example::

        >>> cache.explain_miss("job", key_parts(src))   # doctest: +SKIP
        "cache miss for 'job': source changed since the last build"
    """
    command = shlex.join(cxx_command(Path(SRC_PLACEHOLDER), Path(OUT_PLACEHOLDER), CORE_PLACEHOLDER))
    return _cache.make_key_parts(
        source=source,
        command=command,
        compiler_version=compiler_version(),
        cpu_target=cpu_target(),
        include_dir=include_dir(),
    )


@functools.cache
def _openmp_works(cxx: tuple[str, ...]) -> bool:
    probe = "#include <omp.h>\nextern \"C\" int flowc_probe() { return omp_get_max_threads(); }\n"
    with tempfile.TemporaryDirectory(prefix="flowc-omp-probe-") as d:
        src = Path(d) / "probe.cpp"
        src.write_text(probe)
        proc = _run([*cxx, "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(Path(d) / "probe.so")])
    return proc.returncode == 0


def build_shared_library(
    source: str, *, name: str, cache: KernelCache | None = None, units: list[str] | None = None
) -> BuildResult:
    """Compile ``source`` into a shared library through the kernel cache (compiler/cached_build.py).

    ``name`` labels the entry (index, failed sources, debug output); it does not
    enter the key, so two names with the same source share one library.
    Safe to call from several processes at once: one compiles, the others wait
    and reuse its result.  With ``FLOWC_DEBUG=1`` each miss, its reason and the
    compile time are printed to stderr.

    ``units`` (optional) are translation units equivalent to ``source`` together; they are
    compiled in parallel and linked, which shortens the build on several cores.  ``source``
    alone decides the cache key, and a failing unit is rebuilt from ``source`` whole so the
    diagnostics point at the file users read.

    Raises :class:`ToolchainError` when the compiler is missing, OpenMP is
    missing, or the source does not compile (the message includes the
    compiler's stderr and the path of the kept source).

    Example::

        >>> res = build_shared_library('extern "C" int answer() { return 42; }',
        ...                            name="answer", cache=KernelCache(tmp))   # doctest: +SKIP
        >>> res.path.exists()                                                   # doctest: +SKIP
        True
    """
    return build_cached(CppToolchain(), source, name, cache=cache, units=units)


def _build_in_parts(tmp: Path, units: list[str], out: Path) -> bool:
    """Compile `units` at once (one g++ each) and link them into `out`; False if any step failed."""
    objects, procs = [], []
    progress = CompileProgress(building.get(), len(units))
    for i, text in enumerate(units):
        src, obj = tmp / f"part{i}.cpp", tmp / f"part{i}.o"
        src.write_text(text)
        argv = [a for a in cxx_command(src, obj) if a != "-shared"]
        argv.insert(len(argv) - 3, "-c")
        debug("$ " + shlex.join(argv))
        # Diagnostics are dropped: a failed part is rebuilt whole, and that build reports them.  (An
        # unread pipe here would block a part whose errors outgrow the pipe's buffer.)
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        objects.append(obj)
    while any(p.poll() is None for p in procs):
        progress.update(sum(p.returncode is not None for p in procs))
        time.sleep(PROGRESS_POLL_S)
    ok = all(p.returncode == 0 for p in procs)
    progress.update(len(procs))
    if ok:
        link = [*find_compiler(), "-shared", "-fopenmp", *map(str, objects), "-o", str(out)]
        debug("$ " + shlex.join(link))
        ok = _run(link).returncode == 0
    progress.finish(ok)
    for i in range(len(units)):
        (tmp / f"part{i}.cpp").unlink(missing_ok=True)
        (tmp / f"part{i}.o").unlink(missing_ok=True)
    return ok


class CppToolchain:
    """The CPU backend's toolchain (compiler/backends.py): a generated step -> a cached shared library."""
    name = "g++"
    arch: str | None = None           # -march=native: the target is this machine, keyed by cpu_target()
    label = "C++"
    files = (_cache.SOURCE_FILE, _cache.LIBRARY_FILE)
    log_name = "compiler.log"
    output_label = "compiler output"

    def build(self, generated, name: str) -> BuildResult:
        """Build `generated.source` (in `generated.parts` at once where it was split) through the cache."""
        return build_cached(self, generated.source, name, units=generated.parts)

    def key_parts(self, source: str) -> KeyParts:
        return key_parts(source)

    def target_words(self) -> str:
        return ""

    def compile(self, tmp: Path, src: Path, out: Path, units: list[str] | None):
        if units and _build_in_parts(tmp, units, out):
            return [], None
        argv = cxx_command(src, out)
        return argv, run_compiler(argv, INSTALL_GXX_HINT)

    def failure_hint(self) -> str:
        if _openmp_works(tuple(find_compiler())):
            return ""
        return ("\nOpenMP is missing: a probe `#include <omp.h>` compiled with -fopenmp failed. "
                "Install your compiler's OpenMP support: with g++, `apt-get install g++` "
                "(Debian/Ubuntu, brings libgomp and omp.h) or `dnf install gcc-c++ libgomp`; "
                "with clang++, `apt-get install libomp-dev`.")


def cpp_toolchain(arch: str | None = None) -> CppToolchain:
    """The CPU toolchain; it builds for this machine, so an `arch` is an error."""
    if arch is not None:
        raise ValueError(f"arch {arch!r}: the CPU backend builds for this machine (-march=native) and takes no arch")
    return CppToolchain()

