"""The warm path: a job's lowered program and generated step, cached under a key of its traced graph.

The kernel cache (cache.py) is keyed by the generated source, which only exists after every pass and
the code generator have run: on BERT-base that is seconds of Python before a lookup that hits.  This
cache sits in front of it.  Its key is computed from what the passes start from:

  * the traced graph, canonically (every node's op, inputs, attributes, type, user line, name, role;
    outputs, assigns, variables, runtime scalars, placeholders),
  * the compiler itself: a digest of every source file of `compiler/` and every file of
    `codegen_templates/`, and flowc's version,
  * what the build asks of the generator: the device's backend and arch, check_numerics, the
    profile and TF32 settings, and how many parts the step is split into (one per core),

so anything that can change the generated code changes the key.  An entry holds the lowered program
and the generated step (pickled: `job.pickle`) and a summary (`job.txt`); the shared library is then
looked up in the kernel cache by its source as before (and rebuilt from the pickled source if it
was cleared meanwhile).  Entries live in the kernel cache's root, under the same trust rules,
checksums and locks (docs/security.md): a `job.pickle` is loaded only from where a `kernel.so` would
be, after the same checks.

    step, miss_reason = compile_traced(graph, "cpu", None, check_numerics=False)
    step.compiled            # False on a warm hit: no pass, no codegen, no g++
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import time
from pathlib import Path

from flowc.compiler import cache as _cache
from flowc.compiler import settings
from flowc.compiler.backends import get_backend
from flowc.compiler.cache import KernelCache, KeyParts
from flowc.compiler.cached_build import debug
from flowc.compiler.ir import Graph
from flowc.compiler.pipeline import CompiledStep, PassRecord, build_lowered, lower, write_debug_dump

JOB_FILES = ("job.txt", "job.pickle")
# Bumped when what an entry holds changes shape (the pickled objects' classes are covered by the digest).
JOB_FORMAT = 1
_HERE = Path(__file__).resolve().parent
_ATOMS = (type(None), bool, int, float, str)

_job_caches: dict[Path, KernelCache] = {}


def job_cache() -> KernelCache:
    """The job entries' view of the default cache root: its own object, so that the kernel cache's
    counters (`flow.compile_cache_stats()`) still count shared libraries only."""
    root = _cache.default_cache_dir()
    cache = _job_caches.get(root)
    if cache is None:
        cache = _job_caches[root] = KernelCache(root)
    return cache


@functools.cache
def compiler_digest() -> str:
    """SHA-256 over the compiler's sources and the code templates (their names and bytes).

    Example::

        >>> len(compiler_digest())
        64
    """
    h = hashlib.sha256()
    for name, path in digested_files():
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def digested_files() -> list[tuple[str, Path]]:
    """(name, path) of every file `compiler_digest` covers: the compiler's Python sources and every
    file of the code templates folder (templates and headers of each backend)."""
    from flowc.compiler.resources import template_folder
    files = []
    for folder in (_HERE, template_folder("cpu").parent):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append((path.relative_to(folder.parent).as_posix(), path))
    return files


def _plain(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return type(value) in _ATOMS


def graph_text(graph: Graph) -> str | None:
    """The traced graph as canonical text; None when an attribute is not a plain value (its repr
    might not say everything that matters, so such a graph is not cached)."""
    lines = [repr((graph.name, list(graph.outputs), sorted(graph.assigns.items()),
                   sorted((k, (v.shape, v.dtype, v.device)) for k, v in graph.variables.items()),
                   sorted(graph.scalars.items()), list(graph.placeholders)))]
    for n in graph.nodes:
        if not _plain(n.attrs):
            return None
        lines.append(repr((n.id, n.op, n.inputs, n.attrs, n.type.shape, n.type.dtype, n.type.device, n.loc,
                           n.name, n.role)))
    return "\n".join(lines)


def job_key_parts(graph: Graph, device: str, arch: str | None, check_numerics: bool) -> KeyParts | None:
    """The key of `graph`'s job entry for this build (None: the graph cannot be keyed, see graph_text)."""
    text = graph_text(graph)
    if text is None:
        return None
    from flowc.compiler.codegen.cpu import COMPILE_PARTS
    options = {"format": JOB_FORMAT, "device": device, "arch": arch, "check_numerics": check_numerics,
               "profile": settings.profile(), "tf32": settings.tf32(), "compile_parts": COMPILE_PARTS}
    blob = json.dumps(options, sort_keys=True) + "\n" + text
    return KeyParts(source_sha256=hashlib.sha256(blob.encode()).hexdigest(), command="flowc job",
                    compiler_version=compiler_digest(), package_version=_cache.package_version(),
                    cpu_target=f"cpus={os.cpu_count()}", headers=())


def compile_traced(graph: Graph, device: str, arch: str | None, check_numerics: bool,
                   timings: dict[str, float] | None = None) -> tuple[CompiledStep, str | None]:
    """Lower, generate and build `graph`'s step, or take all three from the job cache.

    Returns the step and why the kernel cache missed (None when nothing was compiled).  On a hit the
    step carries no pass records (`flowc show` and `job.lower()` run the passes to print them).
    """
    timings = dict(timings or {})
    backend = get_backend(device)
    toolchain = backend.toolchain(arch)
    parts = job_key_parts(graph, backend.name, toolchain.arch, check_numerics)
    if parts is None:
        debug(f"job {graph.name!r}: an attribute is not a plain value, so the job cache is not used")
        return _lower_and_build(graph, device, arch, check_numerics, timings)
    built: list[tuple[CompiledStep, str | None]] = []

    def build(tmp: Path) -> None:
        step, why = _lower_and_build(graph, device, arch, check_numerics, timings)
        built.append((step, why))
        with open(tmp / JOB_FILES[1], "wb") as f:
            pickle.dump((step.program, step.generated), f, protocol=pickle.HIGHEST_PROTOCOL)
        (tmp / JOB_FILES[0]).write_text(f"flowc job entry of {graph.name!r}: the lowered program and generated "
                                        f"step; the library is the kernel cache's entry for source "
                                        f"{hashlib.sha256(step.generated.source.encode()).hexdigest()}\n")

    start = time.perf_counter()
    entry, _ = job_cache().get_or_build(parts, f"{graph.name}.job", build, files=JOB_FILES)
    if built:
        return built[0]
    with open(entry.library, "rb") as f:
        program, generated = pickle.load(f)    # from a checked, trusted entry, as a kernel.so is
    timings["job_cache"] = time.perf_counter() - start
    start = time.perf_counter()
    library = toolchain.build(generated, graph.name)
    timings["compile"] = time.perf_counter() - start
    debug(f"job cache hit for {graph.name!r} ({parts.key()[:16]}): no pass, no codegen")
    step = CompiledStep(program, generated, library.path, library.source_path, library.compiled, timings, None,
                        device=backend.name, arch=toolchain.arch, check_numerics=check_numerics, traced=graph)
    if settings.debug():
        write_debug_dump(step)
    return step, library.miss_reason


def _lower_and_build(graph: Graph, device: str, arch: str | None, check_numerics: bool,
                     timings: dict[str, float]) -> tuple[CompiledStep, str | None]:
    records: list[PassRecord] = []
    start = time.perf_counter()
    program = lower(graph, records)
    timings["passes"] = time.perf_counter() - start
    return build_lowered(program, records, timings, device, arch, check_numerics=check_numerics)
