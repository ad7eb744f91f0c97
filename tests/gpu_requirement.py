"""Where a GPU is present, the GPU tests must run: a GPU that cannot be used is a failure, not a skip.

`make test` on a machine with an NVIDIA GPU but without PyCUDA (or with a driver older than the
toolkit, or without nvcc) would otherwise report green while every GPU test skipped.  A GPU counts
as present when `nvidia-smi -L` lists one, or when FLOWC_REQUIRE_GPU=1 says so (CI runners whose
GPU nvidia-smi cannot see); FLOWC_REQUIRE_GPU=0 turns the rule off.  tests/conftest.py applies it.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Callable, Mapping

REQUIRE_ENV = "FLOWC_REQUIRE_GPU"
# The reasons a test gives when it skips for want of a usable GPU (tests/conftest.py's marker check).
NO_GPU = re.compile(r"no usable GPU|no GPU|PyCUDA|pycuda|needs? an? (NVIDIA )?GPU", re.IGNORECASE)


def nvidia_smi_listing() -> str:
    """`nvidia-smi -L`'s output ("GPU 0: NVIDIA H200 (UUID: ...)"), or "" where it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def gpu_required(env: Mapping[str, str] | None = None,
                 listing: Callable[[], str] = nvidia_smi_listing) -> bool:
    """True where GPU tests must not skip: FLOWC_REQUIRE_GPU=1, or nvidia-smi lists a GPU (unless
    FLOWC_REQUIRE_GPU=0)."""
    env = os.environ if env is None else env
    setting = env.get(REQUIRE_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    return bool(re.search(r"^GPU \d+:", listing(), re.MULTILINE))


@functools.lru_cache(maxsize=1)
def gpu_required_here() -> bool:
    return gpu_required()


def failure_instead_of_skip(reason: str, required: bool) -> str | None:
    """The failure message for a skip whose `reason` is the want of a usable GPU, where one is
    `required`; None where the skip may stand."""
    if not required or not NO_GPU.search(reason):
        return None
    return (f"a GPU is present here (nvidia-smi lists one, or {REQUIRE_ENV}=1) but the GPU tests cannot "
            f"use it: {reason}.  Install what is missing (pip install -e '.[gpu]'; see the README's "
            f"GPU section), or set {REQUIRE_ENV}=0 to let them skip")
