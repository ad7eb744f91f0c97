"""Golden generated code: the C++ and CUDA that the seed jobs compile to, kept in tests/golden/.

A refactor of the compiler must leave these byte-identical; a change that is meant to alter the
generated code regenerates them, and the diff goes into the commit for review:

    python -m tests.golden_sources          # rewrite tests/golden/* from the current compiler

`tests/test_golden_sources.py` compares the current output with the files.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
VERSION = "golden"          # stands in for the package version, which the sources name
CUDA_ARCH = "sm_90"

# label -> (example file, job function); the coverage jobs reach the kernels the seeds do not.
SEED_JOBS = {
    "mlp_train": ("mlp_train_demo", "train_job"),
    "mlp_predict": ("mlp_train_demo", "eval_job"),
    "lenet_train": ("seeds/synchronize_single_job", "train_job"),
    "lenet_predict": ("seeds/synchronize_batch_job", "eval_job"),
}


def _jobs() -> dict:
    from tests.coverage_jobs import coverage_jobs
    from tests.test_mlp import load_example
    jobs = {label: getattr(load_example(example), fn) for label, (example, fn) in SEED_JOBS.items()}
    jobs["coverage_train"], jobs["coverage_predict"] = coverage_jobs()
    return jobs


def _describe(items) -> str:
    return "".join(f"{item!r}\n" for item in items)


def render_all() -> dict[str, str]:
    """File name -> generated text, for every golden job and backend."""
    from flowc.compiler.codegen.cpu import CppGenerator
    from flowc.compiler.codegen.cuda import CudaGenerator
    from flowc.compiler.pipeline import lower
    from flowc.runtime.session import Session
    from tests.test_cuda_codegen import graph_of
    out: dict[str, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, job in _jobs().items():
            program = lower(graph_of(job, Session()))
            if not label.startswith("coverage"):
                cpu = CppGenerator(program.graph, program.kernels, program.memory, VERSION).render()
                out[f"{label}.cpp"] = cpu.source
                out[f"{label}.cpp.bindings"] = _describe(cpu.bindings) + _describe(sorted(cpu.error_nodes.items()))
            cuda = CudaGenerator(program.graph, program.kernels, program.memory, VERSION, arch=CUDA_ARCH).render()
            out[f"{label}.cu"] = cuda.source
            out[f"{label}.cu.launches"] = (_describe(cuda.launches) + _describe(cuda.copies)
                                          + _describe(cuda.bindings) + _describe(sorted(cuda.error_nodes.items()))
                                          + f"scratch_bytes={cuda.scratch_bytes}\n")
    return out


def main() -> int:
    GOLDEN_DIR.mkdir(exist_ok=True)
    rendered = render_all()
    for old in GOLDEN_DIR.iterdir():
        if old.name not in rendered:
            old.unlink()
    for name, text in rendered.items():
        (GOLDEN_DIR / name).write_text(text)
    print(f"wrote {len(rendered)} golden files to {GOLDEN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
