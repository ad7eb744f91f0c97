"""The backend registry: every device is one record, and every op lowers on every backend.

Adding an op without a lowering in some backend, or a backend without a lowering for some op,
fails here with the op and the backend named, before any job needs it.
"""
from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path

import pytest

from flowc.compiler import backends
from flowc.compiler.backends import HOST_DEVICE, Backend, get_backend
from flowc.compiler.ops import OPS, OpRule
from flowc.compiler.program import KERNEL_KINDS
from flowc.compiler.resources import template_folder

ROOT = Path(__file__).resolve().parent.parent
# Where a device name may be written as a string: the registry itself (tests are not scanned).
SOURCE_FOLDERS = ("compiler", "runtime", "flow", "flowc/cli")


def missing_lowerings(ops: dict[str, OpRule]) -> list[str]:
    """'op on backend' for every op some registered backend cannot lower."""
    return [f"{name!r} on backend {b.name!r}" for b in backends.backends() for name, rule in sorted(ops.items())
            if b.generator().lowering_of(rule) is None]


def test_every_op_has_a_lowering_in_every_backend():
    assert missing_lowerings(OPS) == []


def test_an_op_without_a_lowering_is_named_with_its_backend():
    window = OPS["max_pool2d"]
    orphan = OpRule("orphan_pool", "window", window.infer, window.reference)
    assert missing_lowerings({"orphan_pool": orphan}) == [f"'orphan_pool' on backend {b!r}"
                                                          for b in backends.device_names()]


@pytest.mark.parametrize("device", backends.device_names())
def test_every_kernel_kind_has_a_layout_method(device):
    generator = get_backend(device).generator()
    for kind in KERNEL_KINDS:
        assert hasattr(generator, generator.KIND_METHODS.get(kind, "-")), (device, kind)


@pytest.mark.parametrize("device", backends.device_names())
def test_every_lowering_names_a_template_of_its_backend(device):
    backend = get_backend(device)
    folder = template_folder(backend.templates)
    for op, lowering in backend.generator().LOWERINGS.items():
        assert op in OPS, f"{device}: LOWERINGS names {op!r}, which is no op"
        assert (folder / lowering.template).is_file(), f"{device}: {op} renders missing {lowering.template}"


def test_the_device_names_type_lists_the_registered_backends():
    assert set(typing.get_args(backends.DeviceName)) == set(backends.device_names())
    assert backends.device_names()[0] == HOST_DEVICE and backends.host_backend().is_host


def test_every_reference_of_every_record_names_an_existing_module_and_attribute():
    for b in backends.backends():
        for ref in (b.generator_ref, b.toolchain_ref, b.loaded_step_ref, b.probe_ref):
            module, _, attribute = ref.partition(":")
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, (b.name, ref)
            # read, not imported: the CUDA executor imports PyCUDA
            tree = ast.parse(Path(spec.origin).read_text())
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert attribute in defined, (b.name, ref)


def test_an_unknown_device_is_refused_with_the_registered_names():
    names = ", ".join(repr(n) for n in backends.device_names())
    with pytest.raises(backends.UnknownDeviceError, match=f"unknown device 'tpu': flowc has backends for {names}$"):
        get_backend("tpu")
    with pytest.raises(ValueError, match="registered twice"):
        backends.register_backend(Backend(HOST_DEVICE, "cpu", "step.cpp", "", "", "", "", ""))


def test_the_host_backend_loads_and_runs_here():
    host = backends.host_backend()
    assert host.status()[0]
    from flowc.runtime.executor import CpuLoadedStep
    from flowc.runtime.loaded_step import LoadedStep
    assert host.loaded_step() is CpuLoadedStep and issubclass(CpuLoadedStep, LoadedStep)
    assert host.toolchain().arch is None
    with pytest.raises(ValueError, match="takes no arch"):
        host.toolchain("sm_90")


def test_a_broken_probe_is_a_reason_not_an_exception(monkeypatch):
    broken = Backend("broken", "cpu", "step.cpp", "", "", "", "flowc.compiler.backends:no_such_probe", "")
    usable, why = broken.status()
    assert not usable and "no_such_probe" in why


def test_no_device_name_is_spelled_out_beyond_the_registry():
    """Device names come from the registry everywhere else (placement checks, CLI choices, messages)."""
    accelerators = {b.name for b in backends.backends() if not b.is_host}
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "compiler" / "backends.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in accelerators:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == []
