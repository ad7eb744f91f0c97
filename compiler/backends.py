"""The backends flowc generates code for: one registered record per device, one registry.

A backend is what a `flow.scope.placement(device_tag)` names.  Its record says everything the
compiler and the runtime need to target that device:

    backend = get_backend("cpu")
    backend.generator()        # CppGenerator: the program -> a generated step (its LOWERINGS table)
    backend.toolchain(arch)    # CppToolchain: generated source -> cached library, through the one cache
    backend.loaded_step()      # the runtime's LoadedStep class that binds and runs the library
    backend.status()           # (True, "...") where it can run here, else (False, why not)

References are "module:attribute" strings, loaded on first use: a machine without a GPU never
imports the CUDA generator, nvcc's toolchain or PyCUDA, and the compiler never imports the
runtime (the runtime's parts of a record are names the runtime resolves).

Adding a backend is its own modules (generator, toolchain, loaded step, probe) plus one
`register_backend(...)` line at the bottom of this file; docs/architecture.md lists the files.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Literal

# The device tags users write in `flow.scope.placement`; kept in step with the registrations below
# (tests/test_backends.py checks it), so type checkers know the names.
DeviceName = Literal["cpu", "gpu"]
# The device the Python process runs on: its memory holds the session's NumPy variables, and a job
# placed nowhere else runs there.
HOST_DEVICE: DeviceName = "cpu"


class UnknownDeviceError(ValueError):
    """A device name that no registered backend has."""


@dataclass(frozen=True)
class Backend:
    """One device flowc can compile for and run on (see the module docstring)."""
    name: str                 # the device tag: "cpu", "gpu"
    templates: str            # its folder under codegen_templates/: "cpu", "cuda"
    source_file: str          # what the generated source is called in caches and dumps: "step.cpp"
    generator_ref: str        # "module:Class", a KernelGenerator subclass (`from_program(...).render()`)
    toolchain_ref: str        # "module:function", (arch or None) -> a Toolchain
    loaded_step_ref: str      # "module:Class", the runtime's LoadedStep for this device
    probe_ref: str            # "module:function", () -> (usable here, why not / what)
    summary: str              # one line for `flowc --help` and error messages

    def generator(self) -> Any:
        return _load(self.generator_ref)

    def toolchain(self, arch: str | None = None) -> Any:
        return _load(self.toolchain_ref)(arch)

    def loaded_step(self) -> Any:
        return _load(self.loaded_step_ref)

    def status(self) -> tuple[bool, str]:
        """(True, what runs it) where this backend can run a job here, else (False, why not). Never raises."""
        try:
            return _load(self.probe_ref)()
        except Exception as e:            # a probe that breaks means the backend cannot run here
            return False, f"probing the {self.name!r} backend failed: {type(e).__name__}: {e}"

    @property
    def is_host(self) -> bool:
        return self.name == HOST_DEVICE


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add a backend to the registry (once per name)."""
    if backend.name in _BACKENDS:
        raise ValueError(f"backend {backend.name!r} registered twice")
    _BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str) -> Backend:
    """The backend for device tag `name`; UnknownDeviceError naming the registered ones otherwise."""
    try:
        return _BACKENDS[name]
    except (KeyError, TypeError):
        raise UnknownDeviceError(f"unknown device {name!r}: flowc has backends for "
                                 f"{', '.join(repr(n) for n in _BACKENDS)}") from None


def backends() -> list[Backend]:
    """Every registered backend, the host's first."""
    return list(_BACKENDS.values())


def device_names() -> tuple[str, ...]:
    """The device tags `flow.scope.placement` accepts, the host's first."""
    return tuple(_BACKENDS)


def host_backend() -> Backend:
    return _BACKENDS[HOST_DEVICE]


@functools.cache
def _load(ref: str) -> Any:
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def host_status() -> tuple[bool, str]:
    """The host always runs its jobs (the C++ toolchain's own errors say what is missing)."""
    return True, "this machine's CPU"


register_backend(Backend(
    "cpu", templates="cpu", source_file="step.cpp",
    generator_ref="flowc.compiler.codegen.cpu:CppGenerator",
    toolchain_ref="flowc.compiler.toolchain:cpp_toolchain",
    loaded_step_ref="flowc.runtime.executor:CpuLoadedStep",
    probe_ref="flowc.compiler.backends:host_status",
    summary="C++ with OpenMP, built by g++, loaded with cffi"))
register_backend(Backend(
    "gpu", templates="cuda", source_file="step.cu",
    generator_ref="flowc.compiler.codegen.cuda:CudaGenerator",
    toolchain_ref="flowc.compiler.cuda_toolchain:nvcc_toolchain",
    loaded_step_ref="flowc.runtime.cuda_executor:CudaLoadedStep",
    probe_ref="flowc.runtime.devices:gpu_status",
    summary="CUDA, built by nvcc into a step library run in one call per step, memory through PyCUDA"))
