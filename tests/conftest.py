"""Shared test set-up: an isolated compile cache per test run and a fresh session per test; the check
that tests which need a GPU carry the `gpu` marker."""
from __future__ import annotations

import os
import re
import tempfile

import pytest

# Set before flowc compiles anything: tests never read or fill the user's ~/.cache/flowc.
# FLOWC_TEST_CACHE_DIR lets a developer keep one warm cache across runs.
os.environ.setdefault("FLOWC_CACHE_DIR", os.environ.get("FLOWC_TEST_CACHE_DIR")
                      or tempfile.mkdtemp(prefix="flowc-test-cache-"))
# The core library (GEMM kernel, precompiled prelude) too: built once per test run.
os.environ.setdefault("FLOWC_CORE_DIR", os.path.join(os.environ["FLOWC_CACHE_DIR"], "core"))
# Idle threads sleep instead of spinning: the compiled steps' OpenMP team (see the note on
# OMP_WAIT_POLICY in codegen_templates/cpu/flowc_gemm.h) and NumPy's OpenBLAS, which runs the
# reference executor.  With spinning, a test that alternates compiled steps with reference steps
# (tests/test_mlp.py's hundred steps) ran 8 s instead of 1 s whenever another process held the
# second core of a 2-core machine.  Neither changes a result; set before NumPy and libgomp load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


# Test tiers (setup.cfg registers the markers; the Makefile's test-fast deselects both):
#   slow: a training run, a subprocess, an nvcc / emulator / wheel build, the soak;
#   gpu:  needs a real GPU with PyCUDA, and skips itself where there is none.
# A test that skips for want of a GPU but lacks the `gpu` marker fails instead, naming the marker,
# so that `make test-fast` never lists GPU tests as skips and `-m gpu` selects all of them.
_NO_GPU = re.compile(r"no usable GPU|no GPU|PyCUDA|pycuda|needs? an? (NVIDIA )?GPU", re.IGNORECASE)


def _missing_gpu_marker(item: pytest.Item, reason: str) -> str | None:
    if item.get_closest_marker("gpu") is None and _NO_GPU.search(reason):
        return (f"{item.nodeid} skips where there is no GPU ({reason!r}) but lacks the `gpu` marker: "
                "add `pytestmark = pytest.mark.gpu` to its module or `@pytest.mark.gpu` to the test")
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """skipif marks, checked whatever their condition says on this machine."""
    for mark in item.iter_markers("skipif"):
        message = _missing_gpu_marker(item, str(mark.kwargs.get("reason", "")))
        if message:
            pytest.fail(message, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Skips decided while the test runs: pytest.skip(...), pytest.importorskip("pycuda")."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple):
        message = _missing_gpu_marker(item, str(report.longrepr[2]))
        if message:
            report.outcome, report.longrepr = "failed", message


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts with no jobs and no variables."""
    import flow
    flow.clear_default_session()
    yield
    flow.clear_default_session()
