"""The test tiers: `make test-fast` runs `pytest -m "not slow and not gpu"`, the edit loop's safety net.

Whatever compares generated code with the reference, gradients with finite differences or output
with the golden files must stay in that tier: marking such a test `slow` means adding it to
SLOW_ON_PURPOSE below, with the reason.  (That a GPU test carries the `gpu` marker is checked by
tests/conftest.py whenever it skips.)
"""
from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
SAFETY_NET = re.compile(r"reference|finite_difference|golden")
# Each costs seconds because it builds or runs a whole train step in the CUDA emulator; the
# emulator's per-kernel test (test_cuda_kernels_equal_the_reference_in_the_emulator) stays fast.
SLOW_ON_PURPOSE = {
    "test_cuda_codegen.py::test_train_steps_equal_the_reference_in_the_emulator",
    "test_cuda_codegen.py::test_cuda_loaded_step_trains_like_the_reference_on_an_emulated_device",
    # ResNet-50 at 224x224 through the NumPy reference (~20 s); the tiny ResNets' reference steps stay fast.
    "test_models_resnet.py::test_resnet50_predicts_at_full_size_like_the_reference_and_nhwc",
}
# End-to-end train steps through the compiled C++, checked against the reference executor.
TRAIN_STEPS = {
    "test_mlp.py::test_one_train_step_equals_reference",
    "test_lenet.py::test_one_train_step_equals_reference_with_the_same_dropout_mask",
}


def marker_names(module, fn) -> set[str]:
    marks = getattr(module, "pytestmark", [])
    marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    return {m.name for m in marks + list(getattr(fn, "pytestmark", []))}


@pytest.fixture(scope="module")
def tests() -> dict[str, set[str]]:
    """'file.py::test_name' -> its marker names (module-level and its own), for every test function.
    The modules are imported under the names pytest gives them (tests/ first on sys.path), so in a
    whole run this reuses what collection imported."""
    found = {}
    for path in sorted(TESTS.glob("test_*.py")):
        module = importlib.import_module(path.stem)
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("test_") and fn.__module__ == module.__name__:
                found[f"{path.name}::{name}"] = marker_names(module, fn)
    return found


def test_the_safety_net_stays_in_the_fast_tier(tests):
    slow = {name for name, marks in tests.items() if "slow" in marks and SAFETY_NET.search(name.split("::")[1])}
    assert slow == SLOW_ON_PURPOSE, (f"marked slow, so `make test-fast` skips them: {sorted(slow - SLOW_ON_PURPOSE)}; "
                                     f"no longer slow, or gone: {sorted(SLOW_ON_PURPOSE - slow)}")
    assert len([name for name in tests if SAFETY_NET.search(name)]) > 10


def test_the_fast_tier_trains_through_the_compiled_cpp(tests):
    for name in TRAIN_STEPS:
        assert name in tests and not tests[name] & {"slow", "gpu"}, name

