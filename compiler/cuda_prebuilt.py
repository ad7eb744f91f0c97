"""A GPU machine without nvcc: run what an ahead-of-time build left in the kernel cache.

`flowc compile --device gpu --arch sm_90` on a build machine fills the cache; copied to a GPU
machine that has the driver but no CUDA toolkit, the cache must serve the job with zero
compilations.  The cache key holds nvcc's version, which such a machine cannot ask, so the
entry is found by every other part of the key (source, command line and so arch, flowc's
version, the CUDA headers' contents) and the nvcc release it records is checked against the
driver instead: code of a CUDA release newer than the driver supports would not load.

    parts = key_parts(source, "sm_90", host_step=True, compiler_version=ANY_NVCC)
    result = prebuilt_build(parts, name, cache, driver_cuda_version())
"""
from __future__ import annotations

import re
import time

from flowc.compiler.cache import KernelCache, KeyParts
from flowc.compiler.cached_build import BuildResult, ToolchainError

# What key_parts writes for nvcc's version when none can be asked; never a real version's text.
ANY_NVCC = "<any nvcc: none on this machine>"


def driver_cuda_version() -> int | None:
    """The CUDA version the driver supports (13000 for 13.0), asked through PyCUDA; None if it cannot say."""
    try:
        import pycuda.driver as drv
        drv.init()
        return int(drv.get_driver_version())
    except Exception:          # no PyCUDA, no driver: nothing is checked, loading the code will say
        return None


def _release(compiler_version: str) -> tuple[int, int] | None:
    m = re.search(r"release (\d+)\.(\d+)", compiler_version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def prebuilt_build(wanted: KeyParts, name: str, cache: KernelCache, driver_version: int | None) -> BuildResult:
    """The newest entry of `cache` equal to `wanted` in every part but nvcc's version, built by an
    nvcc release the driver supports; ToolchainError saying what to do when there is none.

    Example::

        >>> prebuilt_build(parts, "mlp_train", default_cache(), 13000).compiled   # doctest: +SKIP
        False
    """
    t0 = time.perf_counter()
    refused: list[str] = []
    candidates = []
    for key, parts, created in cache.recorded_parts():
        if parts.compiler_version == ANY_NVCC or _without_nvcc(parts) != _without_nvcc(wanted):
            continue
        release = _release(parts.compiler_version)
        if release is None:
            refused.append(f"an entry whose nvcc version is unreadable ({parts.compiler_version[:60]!r})")
            continue
        if driver_version is not None and release > (driver_version // 1000, driver_version % 1000 // 10):
            refused.append(f"a build by nvcc {release[0]}.{release[1]}, newer than the driver's CUDA "
                           f"{driver_version // 1000}.{driver_version % 1000 // 10}")
            continue
        candidates.append((created, key))
    for _, key in sorted(candidates, reverse=True):       # the youngest first: the last build wins
        entry = cache.lookup(key)                         # its files checked, as any hit's are
        if entry is not None:
            return BuildResult(path=entry.library, key=entry.key, compiled=False,
                               seconds=time.perf_counter() - t0, source_path=entry.source, miss_reason=None)
        refused.append(f"an entry {key[:16]} that is corrupt or untrusted")
    also = f" (the cache holds {'; '.join(sorted(set(refused)))})" if refused else ""
    raise ToolchainError(
        f"nvcc is not installed here, and the kernel cache at {cache.root} holds no ahead-of-time build of "
        f"{name!r} for this GPU{also}: run `flowc compile --device gpu --arch sm_XX` for this script on a "
        f"machine with nvcc and copy its cache (FLOWC_CACHE_DIR) here, or install the CUDA toolkit")


def _without_nvcc(parts: KeyParts) -> tuple:
    return (parts.source_sha256, parts.command, parts.package_version, parts.cpu_target, parts.headers)
