"""Shared test set-up: an isolated compile cache per test run and a fresh session per test; the check
that tests which need a GPU carry the `gpu` marker."""
from __future__ import annotations

import os
import tempfile

import pytest

from tests.gpu_requirement import NO_GPU, failure_instead_of_skip, gpu_required_here

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
# Where a GPU is present (nvidia-smi lists one, or FLOWC_REQUIRE_GPU=1), a skip for want of a usable
# GPU fails instead, with its reason (tests/gpu_requirement.py): no green run that ran no GPU test.
_NO_GPU = NO_GPU


def _missing_gpu_marker(item: pytest.Item, reason: str) -> str | None:
    if item.get_closest_marker("gpu") is None and _NO_GPU.search(reason):
        return (f"{item.nodeid} skips where there is no GPU ({reason!r}) but lacks the `gpu` marker: "
                "add `pytestmark = pytest.mark.gpu` to its module or `@pytest.mark.gpu` to the test")
    return None


def _skip_refused(reason: str) -> str | None:
    """A GPU is present but unusable: the skip's reason, as a failure (None when it may skip)."""
    if not _NO_GPU.search(reason):        # nvidia-smi is run only for a skip that concerns the GPU
        return None
    return failure_instead_of_skip(reason, gpu_required_here())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """skipif marks, checked whatever their condition says on this machine; those that would skip for
    want of a GPU where one is present fail instead."""
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", ""))
        message = _missing_gpu_marker(item, reason)
        if message:
            pytest.fail(message, pytrace=False)
        condition = mark.args[0] if mark.args else mark.kwargs.get("condition", True)
        if condition is True or (not isinstance(condition, str) and bool(condition)):
            refused = _skip_refused(reason)
            if refused:
                pytest.fail(f"{item.nodeid}: {refused}", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Skips decided while the test runs: pytest.skip(...), pytest.importorskip("pycuda")."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        message = _missing_gpu_marker(item, reason) or _skip_refused(reason)
        if message:
            report.outcome, report.longrepr = "failed", message


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts with no jobs and no variables."""
    import flow
    flow.clear_default_session()
    yield
    flow.clear_default_session()
