"""Which device a job runs on, and the one door from the runtime to each backend's loaded step.

The devices are the registered backends (compiler/backends.py).  Nothing here imports PyCUDA
unless it is installed, and nothing imports a backend's executor (the CUDA one imports PyCUDA)
unless that backend can run here, so a machine without a GPU never loads any GPU code:

    usable, why = gpu_status()                   # the CUDA backend's probe; never raises
    device, warning = job_device(graph)          # where the placement asks, or the host plus why not
    step = load_step(compile_graph(graph, device), session, depth)
    ...
    sync_to_host(session)                        # before reading variables on the host
    sync_to_device(session)                      # after writing them on the host
"""
from __future__ import annotations

import functools
import importlib.util

from flowc.compiler import settings
from flowc.compiler.backends import HOST_DEVICE, get_backend
from flowc.compiler.ir import Graph

STRICT_ENV = "FLOWC_STRICT_DEVICE"
# The attribute a session carries once a GPU job has loaded: its device copies of the variables.
DEVICE_VARIABLES_ATTR = "_flowc_device_variables"


class DeviceUnavailable(RuntimeError):
    """A job is placed on a device that cannot run it here, and FLOWC_STRICT_DEVICE=1 forbids the
    fallback to the host."""


def _nvcc_found() -> bool:
    """Would the CUDA toolchain find nvcc (its own search: $NVCC, PATH, $CUDA_HOME/bin)?"""
    from flowc.compiler.cached_build import ToolchainError
    from flowc.compiler.cuda_toolchain import find_nvcc
    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """(True, "NVIDIA H100 ... (sm_90)") when a job can run on a GPU here, else (False, why not).

    Checks, in order: PyCUDA installed, the CUDA driver initializes, at least one device, a driver
    not older than nvcc's CUDA.  Without nvcc the GPU is usable for kernels already in the cache
    (an ahead-of-time build), and the answer says so.
    Never raises; the answer is computed once per process (`gpu_status.cache_clear()` to ask again).
    """
    if importlib.util.find_spec("pycuda") is None:
        return False, "PyCUDA is not installed (pip install 'flowc[gpu]')"
    try:
        import pycuda.driver as drv
        drv.init()
        count = drv.Device.count()
    except Exception as e:       # ImportError of the extension, driver missing or too old, ...
        return False, f"the CUDA driver is not usable: {type(e).__name__}: {e}"
    if count == 0:
        return False, "the CUDA driver sees no GPU"
    # Without nvcc a job runs only what an ahead-of-time build left in the kernel cache
    # (compiler/cuda_prebuilt.py); its build says so, naming the cache, where there is none.
    no_nvcc = "" if _nvcc_found() else ("; nvcc is not installed: only kernels built ahead of time "
                                        "(flowc compile --device gpu) run")
    too_old = _driver_older_than_toolkit(drv)
    if too_old:
        return False, too_old
    try:
        dev = drv.Device(0)
        major, minor = dev.compute_capability()
        return True, f"{dev.name()} (sm_{major}{minor}){no_nvcc}"
    except Exception as e:
        return False, f"GPU 0 cannot be queried: {type(e).__name__}: {e}"


def driver_older_than_toolkit(driver_version: int, toolkit_release: str) -> str | None:
    """Why kernels built by nvcc of `toolkit_release` ("13.0") cannot load under a driver reporting
    `driver_version` (cuDriverGetVersion's 12040 for CUDA 12.4), or None when they can.

    The driver must support the toolkit's major version: a CUDA 13 cubin (or its PTX) fails to load
    under a CUDA 12 driver with an opaque "invalid image" at the first call, so it is refused up front.
    Within one major version CUDA's minor-version compatibility runs the cubin built for the device.

    Example:
        >>> driver_older_than_toolkit(12040, "13.0")[:45]
        'the CUDA driver supports CUDA 12.4, older tha'
        >>> driver_older_than_toolkit(13000, "13.0") is None
        True
    """
    major, minor = driver_version // 1000, (driver_version % 1000) // 10
    toolkit = tuple(int(x) for x in toolkit_release.split(".")[:2])
    if major >= toolkit[0]:
        return None
    return (f"the CUDA driver supports CUDA {major}.{minor}, older than the CUDA toolkit's nvcc "
            f"(CUDA {toolkit_release}) that builds the kernels; update the NVIDIA driver, or point $NVCC "
            f"at an nvcc of CUDA {major}.x")


def _driver_older_than_toolkit(drv) -> str | None:
    """driver_older_than_toolkit for this machine's driver and nvcc (None when either cannot say)."""
    import re

    from flowc.compiler.cuda_toolchain import nvcc_version
    try:
        driver_version = int(drv.get_driver_version())
        release = re.search(r"release (\d+\.\d+)", nvcc_version())
    except Exception:      # an nvcc that does not run is reported when it builds, with its own message
        return None
    return driver_older_than_toolkit(driver_version, release.group(1)) if release else None


def placed_device(graph: Graph) -> str:
    """The device the user placed this job's ops on: the first one off the host, else the host."""
    return next((n.type.device for n in graph.nodes if n.type.device != HOST_DEVICE), HOST_DEVICE)


def device_status(device: str) -> tuple[bool, str]:
    """(usable, why not / what runs it) for `device`'s backend; a costly probe caches its own answer."""
    return get_backend(device).status()


def job_device(graph: Graph) -> tuple[str, str | None]:
    """Where `graph` runs: (its placement, None), or (the host, the warning to show once) when the
    placement's backend cannot run here.

    Raises DeviceUnavailable instead of falling back when FLOWC_STRICT_DEVICE=1.
    """
    device = placed_device(graph)
    if device == HOST_DEVICE:
        return HOST_DEVICE, None
    usable, why = device_status(device)
    if usable:
        return device, None
    message = (f"job {graph.name!r} is placed on {device!r}, but no such device can run it here: {why}; "
               f"it runs on the {HOST_DEVICE.upper()}")
    if settings.strict_device():
        raise DeviceUnavailable(message + f" ({STRICT_ENV}=1 makes this an error)")
    return HOST_DEVICE, message


def load_step(compiled, session, depth: int = 1):
    """The loaded step for `compiled`: the `LoadedStep` of the backend it was built for."""
    step = get_backend(compiled.device).loaded_step()(compiled, session, depth)
    if compiled.device != HOST_DEVICE:
        session.loaded_steps.append(step)     # released with the session (release_device_memory)
    return step


def sync_to_host(session, names=None) -> None:
    """Copy the session's variables from the GPU into its NumPy arrays (in place).

    Call after the pipeline is idle and before anything reads variables on the host:
    checkpoint saves, `session.value()` for users, a CPU job sharing them.  Free when no
    GPU job ever ran in this session.
    """
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.to_host(names)


def acquire_variables(session, device: str, reads, writes) -> None:
    """Before a step on `device` that reads `reads` and assigns `writes` (variable names): each
    variable has one owner, the device holding its latest value; those the step reads are moved
    to `device` where another owns them, and those it writes are marked as owned by `device`.
    Called under the session's step lock (every step of the session runs in order).  Free when
    no GPU job ever ran in this session: the host then owns everything."""
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.acquire(device, reads, writes)


def release_device_memory(session) -> None:
    """Free what the session's GPU jobs hold on the device (buffers, streams, events, pinned host
    memory), on this thread with the context current: PyCUDA frees an object left to the garbage
    collector only on a thread where its context is current, and otherwise warns and leaks it.
    Called by `Session.close` once no step runs; the host arrays keep the variables' latest values."""
    for step in session.loaded_steps:
        step.release()
    session.loaded_steps.clear()
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.release()
        delattr(session, DEVICE_VARIABLES_ATTR)


def sync_to_device(session, names=None) -> None:
    """Copy the session's NumPy variables to the GPU after the host changed them
    (checkpoint load, re-initialization).  Free when no GPU job ever ran in this session."""
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.to_device(names)
