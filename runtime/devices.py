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

    Checks, in order: PyCUDA installed, the CUDA driver initializes, at least one device,
    nvcc on the machine (kernels are compiled at a job's first call unless cached).
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
    if not _nvcc_found():
        return False, "nvcc is not installed (needed to compile the kernels); install the CUDA toolkit"
    try:
        dev = drv.Device(0)
        major, minor = dev.compute_capability()
        return True, f"{dev.name()} (sm_{major}{minor})"
    except Exception as e:
        return False, f"GPU 0 cannot be queried: {type(e).__name__}: {e}"


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
    return get_backend(compiled.device).loaded_step()(compiled, session, depth)


def sync_to_host(session, names=None) -> None:
    """Copy the session's variables from the GPU into its NumPy arrays (in place).

    Call after the pipeline is idle and before anything reads variables on the host:
    checkpoint saves, `session.value()` for users, a CPU job sharing them.  Free when no
    GPU job ever ran in this session.
    """
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.to_host(names)


def sync_to_device(session, names=None) -> None:
    """Copy the session's NumPy variables to the GPU after the host changed them
    (checkpoint load, re-initialization).  Free when no GPU job ever ran in this session."""
    store = getattr(session, DEVICE_VARIABLES_ATTR, None)
    if store is not None:
        store.to_device(names)
