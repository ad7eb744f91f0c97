"""Shared test set-up: an isolated compile cache per test run and a fresh session per test."""
from __future__ import annotations

import os
import tempfile

import pytest

# Set before flowc compiles anything: tests never read or fill the user's ~/.cache/flowc.
# FLOWC_TEST_CACHE_DIR lets a developer keep one warm cache across runs.
os.environ.setdefault("FLOWC_CACHE_DIR", os.environ.get("FLOWC_TEST_CACHE_DIR")
                      or tempfile.mkdtemp(prefix="flowc-test-cache-"))
# The core library (GEMM kernel, precompiled prelude) too: built once per test run.
os.environ.setdefault("FLOWC_CORE_DIR", os.path.join(os.environ["FLOWC_CACHE_DIR"], "core"))


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts with no jobs and no variables."""
    import flow
    flow.clear_default_session()
    yield
    flow.clear_default_session()
