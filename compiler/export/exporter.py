"""`flowc export`'s work: a predict job and a checkpoint -> a C library, its header and its weights.

    result = export_job(predict_job, "lenet_models_1", "out/", prefix="lenet")
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

from flowc.compiler.export.render import render_sources
from flowc.compiler.export.spec import ExportError, ExportSpec, check_prefix, interface_of
from flowc.compiler.export.weights import parse_weights, write_weights
from flowc.compiler.ir import TensorType

DEVICES = ("cpu", "gpu")


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
    if device == "gpu":
        raise ExportError(f"job {job.name!r}: --device gpu is not built yet: `flowc export` builds the CPU "
                          f"library only (the CUDA variant is future work of issue 18)")
    if device != "cpu":
        raise ExportError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    if job.job_type != "predict":
        raise ExportError(f"job {job.name!r} is a {job.job_type} job: only predict jobs can be exported "
                          f"(a train job updates its variables, which the exported library does not save)")
    for p in job.placeholders:
        if p.is_dynamic and not dynamic_at_max:
            raise ExportError(f"job {job.name!r}: input {p.name!r} has a dynamic shape (at most {list(p.shape)}); "
                              f"the exported library runs fixed shapes: pass --dynamic-at-max to export it at "
                              f"{list(p.shape)} (callers pad to it), or declare it tp.Numpy.Placeholder")


def weights_of(spec: ExportSpec, variables: dict[str, TensorType], checkpoint: str | os.PathLike) -> dict:
    """name -> array of every variable of `spec`, read from the checkpoint folder and checked."""
    from flowc.runtime.checkpoint import CheckpointError, read_checkpoint
    try:
        saved = read_checkpoint(checkpoint)
    except CheckpointError as e:
        raise ExportError(f"--checkpoint: {e}") from None
    arrays = {}
    for v in spec.variables:
        if v.name not in saved:
            raise ExportError(f"checkpoint {os.fspath(checkpoint)} has no variable {v.name!r}, which job "
                              f"{spec.job!r} reads")
        try:
            arrays[v.name] = saved[v.name].read_as(variables[v.name])
        except CheckpointError as e:
            raise ExportError(f"--checkpoint: {e}") from None
    return arrays


def _copy_headers(src: Path) -> None:
    """The runtime headers the step and the API include, beside them in src/."""
    from flowc.compiler.resources import template_folder
    for folder in (template_folder("cpu"), template_folder("export")):
        for header in folder.glob("*.h"):
            shutil.copyfile(header, src / header.name)


def _build(src: Path) -> None:
    from flowc.compiler.toolchain import find_compiler
    env = {**os.environ, "CXX": shlex.join(find_compiler())}
    proc = subprocess.run(["sh", "build.sh"], cwd=src, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"building the exported library failed (exit {proc.returncode}); the sources are in "
                          f"{src} (rebuild with `sh build.sh` there):\n{proc.stdout}{proc.stderr}")


def export_job(job, checkpoint: str | os.PathLike, out_dir: str | os.PathLike, prefix: str | None = None,
               device: str = "cpu", dynamic_at_max: bool = False) -> ExportResult:
    """Export predict `job` with the variables of `checkpoint` into the folder `out_dir` (made if missing).

    `prefix` starts every C symbol and file name (default: the job's name).

    Example:
        >>> r = export_job(eval_job, "lenet_models_1", "out", prefix="lenet")    # doctest: +SKIP
        >>> r.header.name, r.weights.name                                       # doctest: +SKIP
        ('lenet.h', 'lenet.weights')
    """
    from flowc.compiler.cache import package_version
    check_exportable(job, device, dynamic_at_max)
    prefix = check_prefix(prefix if prefix is not None else job.name, "--prefix" if prefix else "the job's name")
    step = job.compile(device="cpu").step
    spec = interface_of(job, step, prefix)
    arrays = weights_of(spec, dict(step.program.graph.variables), checkpoint)
    folder = Path(out_dir)
    src = folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    for relative, text in render_sources(spec, step.generated.source, package_version()).items():
        (folder / relative).write_text(text if text.endswith("\n") else text + "\n")
    _copy_headers(src)
    weights = folder / f"{prefix}.weights"
    write_weights(weights, arrays)
    parse_weights(weights.read_bytes(), str(weights))      # what the library will check, checked now
    _build(src)
    return ExportResult(folder, folder / f"{prefix}.h", folder / f"lib{prefix}.so", folder / f"lib{prefix}.a",
                        weights, folder / "README.txt", spec)
