"""`flowc export`'s work: a predict job and a checkpoint -> a C library, its header and its weights.

    result = export_job(predict_job, flow.checkpoint.get("lenet_models_1"), "out/", prefix="lenet")
    result.shared_library     # out/liblenet.so; out/liblenet.a, out/lenet.h, out/lenet.weights too

The job is compiled for the CPU as its Python calls run it (the same generated step, the same
compiler flags), so the library computes the same values bit for bit on the same machine.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flowc.compiler.backends import HOST_DEVICE, device_names, get_backend
from flowc.compiler.export.render import render_sources
from flowc.compiler.export.spec import ExportError, ExportSpec, check_prefix, interface_of
from flowc.compiler.export.weights import parse_weights, write_weights
from flowc.compiler.ir import TensorType, numpy_dtype



@dataclass(frozen=True)
class ExportResult:
    """The files `export_job` wrote (all in `folder`) and what the library exposes."""
    folder: Path
    header: Path
    shared_library: Path
    static_library: Path
    weights: Path
    readme: Path
    spec: ExportSpec


def check_exportable(job, device: str, dynamic_at_max: bool = False) -> None:
    """Refuse, before anything is compiled, what `flowc export` does not build (naming the job and input)."""
    if device not in device_names():
        raise ExportError(f"--device {device!r}: expected one of {', '.join(device_names())}")
    if job.job_type != "predict":
        raise ExportError(f"job {job.name!r} is a {job.job_type} job: only predict jobs can be exported "
                          f"(a train job updates its variables, which the exported library does not save)")
    for p in job.placeholders:
        if p.is_dynamic and not dynamic_at_max:
            raise ExportError(f"job {job.name!r}: input {p.name!r} has a dynamic shape (at most {list(p.shape)}); "
                              f"the exported library runs fixed shapes: pass --dynamic-at-max to export it at "
                              f"{list(p.shape)} (callers pad to it), or declare it tp.Numpy.Placeholder")


def weights_of(spec: ExportSpec, variables: dict[str, TensorType], values: Mapping[str, Any]) -> dict:
    """name -> array of every variable of `spec`, from `values` (arrays, or what `flow.checkpoint.get`
    returns: objects whose `numpy()` reads the array), each checked against the compiled job's type."""
    arrays = {}
    for v in spec.variables:
        if v.name not in values:
            raise ExportError(f"no value for variable {v.name!r} (the checkpoint lacks it), which job {spec.job!r} "
                              f"reads")
        value = values[v.name]
        try:
            array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        except ValueError as e:           # a checkpoint's own check (CheckpointError) names the variable
            raise ExportError(str(e)) from None
        want = variables[v.name]
        if tuple(array.shape) != tuple(want.shape) or array.dtype != numpy_dtype(want.dtype):
            raise ExportError(f"variable {v.name!r} is {array.dtype}{list(array.shape)} in the checkpoint, job "
                              f"{spec.job!r} reads {want.dtype}{list(want.shape)}")
        arrays[v.name] = np.ascontiguousarray(array)
    return arrays


def _copy_headers(src: Path) -> None:
    """The runtime headers the step and the API include, beside them in src/."""
    from flowc.compiler.resources import template_folder
    for folder in (template_folder(get_backend(HOST_DEVICE).templates), template_folder("export")):
        for header in folder.glob("*.h"):
            shutil.copyfile(header, src / header.name)


def _build(src: Path) -> None:
    from flowc.compiler.toolchain import find_compiler
    # The compiler flowc itself uses ($CXX, read by compiler/settings.py), as build.sh's argument.
    proc = subprocess.run(["sh", "build.sh", shlex.join(find_compiler())], cwd=src, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"building the exported library failed (exit {proc.returncode}); the sources are in "
                          f"{src} (rebuild with `sh build.sh` there):\n{proc.stdout}{proc.stderr}")


def export_job(job, values: Mapping[str, Any], out_dir: str | os.PathLike, prefix: str | None = None,
               device: str = HOST_DEVICE, dynamic_at_max: bool = False, arch: str | None = None) -> ExportResult:
    """Export predict `job` with the variables `values` into the folder `out_dir` (made if missing).

    `values` maps each variable's name to its array: `flow.checkpoint.get(DIR)` (a checkpoint, as
    `flow.load_variables` takes it) or any dict of arrays.  `prefix` starts every C symbol and file
    name (default: the job's name).  `device="gpu"` builds the CUDA library for `arch` ("sm_90"; None:
    the current GPU's) instead (compiler/export/cuda_export.py).

    Example:
        >>> r = export_job(eval_job, flow.checkpoint.get("lenet_models_1"), "out", prefix="lenet")  # doctest: +SKIP
        >>> r.header.name, r.weights.name                                       # doctest: +SKIP
        ('lenet.h', 'lenet.weights')
    """
    from flowc.compiler.cache import package_version
    check_exportable(job, device, dynamic_at_max)
    prefix = check_prefix(prefix if prefix is not None else job.name, "--prefix" if prefix else "the job's name")
    folder = Path(out_dir)
    if device != HOST_DEVICE:
        return _export_accelerator(job, values, folder, prefix, device, arch)
    step = job.compile(device=HOST_DEVICE).step
    spec = interface_of(job, step, prefix)
    arrays = weights_of(spec, dict(step.program.graph.variables), values)
    src = folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    for relative, text in render_sources(spec, step.generated.source, package_version()).items():
        (folder / relative).write_text(text if text.endswith("\n") else text + "\n")
    _copy_headers(src)
    weights = _write_checked_weights(folder, prefix, arrays)
    _build(src)
    return ExportResult(folder, folder / f"{prefix}.h", folder / f"lib{prefix}.so", folder / f"lib{prefix}.a",
                        weights, folder / "README.txt", spec)


def _write_checked_weights(folder: Path, prefix: str, arrays: dict) -> Path:
    weights = folder / f"{prefix}.weights"
    write_weights(weights, arrays)
    parse_weights(weights.read_bytes(), str(weights))      # what the library will check, checked now
    return weights


def _export_accelerator(job, values: Mapping[str, Any], folder: Path, prefix: str, device: str,
                        arch: str | None) -> ExportResult:
    """The GPU library (compiler/export/cuda_export.py): the same files, the same weights."""
    from flowc.compiler.cuda_toolchain import device_arch
    from flowc.compiler.export.cuda_export import build_gpu, export_gpu_sources
    spec, step = export_gpu_sources(job, device, prefix, arch or device_arch(), folder)
    arrays = weights_of(spec, dict(step.program.graph.variables), values)
    weights = _write_checked_weights(folder, prefix, arrays)
    build_gpu(folder / "src")
    return ExportResult(folder, folder / f"{prefix}.h", folder / f"lib{prefix}.so", folder / f"lib{prefix}.a",
                        weights, folder / "README.txt", spec)
