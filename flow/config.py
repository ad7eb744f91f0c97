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
