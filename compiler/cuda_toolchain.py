"""CUDA toolchain: generated CUDA source -> a cached step library (or cubin), with nvcc.

A GPU job builds into ``step.so`` (`build_step_library`): the kernels and the host step at the
end of the source (``flowc_step``, codegen_templates/cuda/step.cu.j2) in one shared library,
linked with the static CUDA runtime, which the runtime calls once per step through cffi.  Where
that library cannot be built (an nvcc without a host compiler or without ``libcudart_static.a``)
the job warns and builds the kernels alone into a cubin that PyCUDA launches one by one (the
per-launch path, also what ``FLOWC_CUDA_PER_LAUNCH=1`` asks for).

`build_cubin(source, name, arch)` runs ``nvcc -fatbin`` for the arch through the same
content-addressed cache as the CPU libraries (:mod:`compiler.cache`); the entry keeps
``kernel.cu`` next to ``kernel.cubin``, a fat binary holding the SASS for ``sm_XX`` and the
PTX of ``compute_XX`` (a newer GPU's driver JIT-compiles the PTX), built with ``-lineinfo``
so that compute-sanitizer and Nsight name the source lines.  The key covers the source, the
nvcc command line (so the arch), nvcc's version, flowc's version and the contents of the CUDA
headers under ``codegen_templates/cuda``: a cubin built for sm_80 is never served to an sm_90
run, and an nvcc upgrade rebuilds.  The key holds no absolute path (of nvcc, of the headers,
of the checkout), so a cache filled on one machine serves another.

Only nvcc is needed, no GPU: ``build_cubin(src, "job", "sm_90")`` works on a build
machine, and a later run on an sm_90 GPU finds the cubin in the cache.  With
``arch=None`` the arch is the current device's, asked through PyCUDA, which is
imported only here, only then, and only if it is installed.

Example::

    >>> res = build_cubin('extern "C" __global__ void k(float* x) { x[0] = 1; }',
    ...                   "k", "sm_90")                       # doctest: +SKIP
    >>> res.path.name, res.compiled                            # doctest: +SKIP
    ('kernel.cubin', True)
"""
from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.cache import KernelCache, KeyParts
from flowc.compiler.cached_build import BuildResult, ToolchainError, build_cached, run_compiler
from flowc.compiler.toolchain import OUT_PLACEHOLDER, SRC_PLACEHOLDER

__all__ = ["build_cubin", "build_step_library", "cuda_include_dir", "device_arch", "find_nvcc", "key_parts",
           "normalize_arch", "nvcc_command", "nvcc_version"]

INSTALL_NVCC_HINT = ("install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads), put its bin/ on "
                     "PATH, or point $NVCC at nvcc")
# --expt-relaxed-constexpr: the op table's C++ expressions use std::numeric_limits<T>::lowest() and
# friends, constexpr host functions that device code may call only with this flag.
# -fatbin: the SASS and the PTX in one image that cuModuleLoad takes (see gencode_flags);
# -lineinfo: source lines for compute-sanitizer and profilers, with no effect on the code.
BASE_FLAGS = ("-fatbin", "-O3", "-lineinfo", "-std=c++17", "--expt-relaxed-constexpr")
# The step library: the same device code (the same -gencode pair), plus the host step, in a shared
# object; the static CUDA runtime so that the library needs nothing but the driver's libcuda.so.
STEP_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-cudart", "static", "-DFLOWC_HOST_STEP", *BASE_FLAGS[1:])
# What the cache key writes instead of this machine's paths of nvcc and of the CUDA headers: the
# headers' contents are in the key anyway (KeyParts.headers), and nvcc's version.
NVCC_IN_KEY = "nvcc"
INCLUDE_IN_KEY = "<codegen_templates/cuda>"
_ARCH = re.compile(r"^(?:sm_?|compute_)?(\d{2,3}[a-z]?)$")


def find_nvcc() -> str:
    """Path of nvcc: ``$NVCC``, else ``nvcc`` on PATH, else ``$CUDA_HOME/bin/nvcc``; ToolchainError if none.

    Example::

        >>> find_nvcc()   # doctest: +SKIP
        '/usr/local/bin/nvcc'
    """
    env = settings.nvcc() or ""
    candidates = [env] if env else ["nvcc"]
    cuda_home = settings.cuda_home()
    if not env:
        candidates.append(str(Path(cuda_home) / "bin" / "nvcc"))
    for c in candidates:
        found = shutil.which(c)
        if found:
            return found
    origin = f"{env!r} (from $NVCC)" if env else "nvcc"
    raise ToolchainError(f"flowc needs nvcc to build CUDA kernels, but {origin} was not found; {INSTALL_NVCC_HINT}")


@functools.cache
def _nvcc_version(nvcc: str) -> str:
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    except OSError as e:
        raise ToolchainError(f"could not run {nvcc}: {e}; {INSTALL_NVCC_HINT}") from e
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise ToolchainError(f"`{nvcc} --version` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    # "Cuda compilation tools, release 13.0, V13.0.88" and "Build cuda_13.0.r13.0/compiler.36424714_0":
    # the build line tells apart two nvccs of one release.
    wanted = [ln for ln in lines if "release" in ln or ln.startswith("Build")]
    return "; ".join(wanted or lines[-1:])


def nvcc_version() -> str:
    """nvcc's release and build lines, e.g. ``'Cuda compilation tools, release 13.0, V13.0.88; Build ...'``."""
    return _nvcc_version(find_nvcc())


def normalize_arch(arch: str) -> str:
    """``'sm_90'`` from ``'sm_90'``, ``'sm90'``, ``'90'`` or ``'compute_90'``; ValueError otherwise.

    Example::

        >>> normalize_arch("90"), normalize_arch("sm_90a")
        ('sm_90', 'sm_90a')
    """
    m = _ARCH.match(str(arch).strip().lower())
    if not m:
        raise ValueError(f"GPU arch {arch!r} is not of the form sm_XY (e.g. sm_80 for A100, sm_90 for H100)")
    return f"sm_{m.group(1)}"


def arch_number(arch: str) -> int:
    """80 for ``'sm_80'``, 90 for ``'sm_90a'``."""
    return int(re.sub(r"\D", "", normalize_arch(arch)))


def device_arch() -> str:
    """The arch of CUDA device 0 (``'sm_90'`` on an H100), asked through PyCUDA.

    Raises ToolchainError saying what is missing when PyCUDA, the driver or a device is.
    """
    if importlib.util.find_spec("pycuda") is None:
        raise ToolchainError("no GPU arch given and PyCUDA is not installed to ask the device for one; pass an "
                             "arch (e.g. arch='sm_90', or `flowc compile --device gpu --arch sm_90`)")
    try:
        import pycuda.driver as drv
        drv.init()
        if drv.Device.count() == 0:
            raise RuntimeError("the CUDA driver sees no device")
        major, minor = drv.Device(0).compute_capability()
    except Exception as e:        # pycuda raises its own error types; all mean "no device to ask"
        raise ToolchainError(f"no GPU arch given and none can be read from a device ({e}); pass an arch "
                             "such as 'sm_90'") from e
    return f"sm_{major}{minor}"


def cuda_include_dir() -> Path:
    """Directory of the CUDA headers shipped with flowc (``codegen_templates/cuda``)."""
    from flowc.compiler.resources import template_folder
    return template_folder("cuda")


def gencode_flags(arch: str) -> list[str]:
    """The SASS for ``arch`` and the PTX of its virtual arch, which a GPU newer than ``arch`` JIT-compiles.

    Example::

        >>> gencode_flags("sm_90")
        ['-gencode=arch=compute_90,code=sm_90', '-gencode=arch=compute_90,code=compute_90']
    """
    number = normalize_arch(arch)[len("sm_"):]
    return [f"-gencode=arch=compute_{number},code=sm_{number}",
            f"-gencode=arch=compute_{number},code=compute_{number}"]


def nvcc_command(src: Path, out: Path, arch: str, nvcc: str | None = None, include: str | None = None,
                 host_step: bool = False) -> list[str]:
    """Full nvcc argv building ``src`` into the fat binary ``out`` for ``arch`` (``nvcc`` and
    ``include`` replace the found nvcc and the headers' folder: the cache key's stand-ins);
    ``host_step=True``: into the step library (the kernels and ``flowc_step``) instead.

    Example::

        >>> nvcc_command(Path("k.cu"), Path("k.cubin"), "sm_90", nvcc="nvcc")[:4]
        ['nvcc', '-fatbin', '-O3', '-lineinfo']
    """
    flags = STEP_FLAGS if host_step else BASE_FLAGS
    return [nvcc or find_nvcc(), *flags, *gencode_flags(arch), f"-I{include or cuda_include_dir()}",
            str(src), "-o", str(out)]


def key_parts(source: str, arch: str, host_step: bool = False, compiler_version: str | None = None) -> KeyParts:
    """Cache key parts of ``source`` built for ``arch`` by this nvcc (the arch is in the command and target).

    The command holds neither nvcc's path nor the checkout's: a cache built on another machine (or
    from another checkout) with the same nvcc release and headers serves this one.  `compiler_version`
    stands in for this nvcc's (compiler/cuda_prebuilt.py: a machine without one)."""
    arch = normalize_arch(arch)
    command = shlex.join(nvcc_command(Path(SRC_PLACEHOLDER), Path(OUT_PLACEHOLDER), arch,
                                      nvcc=NVCC_IN_KEY, include=INCLUDE_IN_KEY, host_step=host_step))
    return _cache.make_key_parts(source=source, command=command,
                                 compiler_version=compiler_version or nvcc_version(),
                                 cpu_target=f"cuda {arch}", include_dir=cuda_include_dir())


def nvcc_available() -> bool:
    """Would `find_nvcc` find one ($NVCC, PATH, $CUDA_HOME/bin)?"""
    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


def build_cubin(source: str, name: str, arch: str | None = None, *,
                cache: KernelCache | None = None) -> BuildResult:
    """Compile CUDA ``source`` into a cubin for ``arch`` (None: the current device's) through the cache.

    Returns a :class:`BuildResult` whose ``path`` is ``kernel.cubin`` and ``source_path``
    ``kernel.cu``.  Raises ToolchainError when nvcc is missing or the source does not compile
    (with nvcc's output and the path of the kept source).
    """
    return build_cached(NvccToolchain(arch), source, name, cache=cache)


def build_step_library(source: str, name: str, arch: str | None = None, *,
                       cache: KernelCache | None = None) -> BuildResult:
    """Compile CUDA ``source`` into the step library (``step.so``: its kernels and ``flowc_step``)
    for ``arch`` through the cache.  Raises ToolchainError like `build_cubin`."""
    return build_cached(NvccToolchain(arch, host_step=True), source, name, cache=cache)


class StepLibraryUnavailable(UserWarning):
    """The step library could not be built: the job runs launch by launch from Python (slower)."""


class NvccToolchain:
    """The GPU backend's toolchain (compiler/backends.py): a generated step -> a cached step
    library for `arch` (`host_step=True`) or a cubin; `build` picks, and says when it falls back."""
    name = "nvcc"
    label = "CUDA"
    log_name = "nvcc.log"
    output_label = "nvcc output"

    def __init__(self, arch: str | None = None, host_step: bool = False) -> None:
        # None: the arch of the GPU in this machine (needs PyCUDA and a device to ask)
        self.arch = normalize_arch(arch) if arch is not None else device_arch()
        self.host_step = host_step
        self.files = _cache.CUDA_STEP_FILES if host_step else _cache.CUDA_FILES

    def build(self, generated, name: str) -> BuildResult:
        """The step library, unless FLOWC_CUDA_PER_LAUNCH=1; the cubin, with a warning naming
        nvcc's complaint, where the library fails to build but the kernels alone compile."""
        cubin = NvccToolchain(self.arch)
        if settings.cuda_per_launch():
            return cubin._build_one(generated.source, name)
        try:
            return NvccToolchain(self.arch, host_step=True)._build_one(generated.source, name)
        except ToolchainError as err:
            result = cubin._build_one(generated.source, name)     # the kernels' own errors raise here
            warnings.warn(StepLibraryUnavailable(
                f"job {name!r}: the GPU step library (kernels and host step in one shared object) could not "
                f"be built, so each kernel is launched from Python through PyCUDA (slower): {err}"), stacklevel=2)
            return result

    def _build_one(self, source: str, name: str) -> BuildResult:
        """Through the cache with nvcc; without nvcc, what an ahead-of-time build left in the cache."""
        if nvcc_available():
            return build_cached(self, source, name)
        from flowc.compiler.cuda_prebuilt import ANY_NVCC, driver_cuda_version, prebuilt_build
        wanted = key_parts(source, self.arch, self.host_step, compiler_version=ANY_NVCC)
        return prebuilt_build(wanted, name, _cache.default_cache(), driver_cuda_version())

    def key_parts(self, source: str) -> KeyParts:
        return key_parts(source, self.arch, self.host_step)

    def target_words(self) -> str:
        return f" for {self.arch}" + (" (step library)" if self.host_step else "")

    def compile(self, tmp: Path, src: Path, out: Path, units: list[str] | None):
        argv = nvcc_command(src, out, self.arch, host_step=self.host_step)
        return argv, run_compiler(argv, INSTALL_NVCC_HINT)

    def failure_hint(self) -> str:
        return ""


def nvcc_toolchain(arch: str | None = None) -> NvccToolchain:
    """The CUDA toolchain for `arch` ("sm_90"; None: the current device's)."""
    return NvccToolchain(arch)

