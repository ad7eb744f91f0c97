"""`flow.config`: environment settings.  flowc runs on one device, so these only check their input."""
from __future__ import annotations


def gpu_device_num(n: int) -> None:
    """Accepted for compatibility (flowc uses at most one GPU)."""
    if int(n) < 0:
        raise ValueError(f"flow.config.gpu_device_num: expected a count >= 0, got {n}")


def cpu_device_num(n: int) -> None:
    """Accepted for compatibility (flowc runs one CPU device; threads come from OpenMP)."""
    if int(n) < 0:
        raise ValueError(f"flow.config.cpu_device_num: expected a count >= 0, got {n}")


def enable_debug_mode(flag: bool = True) -> None:
    """Accepted for compatibility.  flowc's own debugging switches are environment variables:
    FLOWC_DEBUG=1 (IR after each pass, generated code, memory plan) and FLOWC_PROFILE=1."""
    if not isinstance(flag, bool):
        raise TypeError(f"flow.config.enable_debug_mode: expected True or False, got {flag!r}")
