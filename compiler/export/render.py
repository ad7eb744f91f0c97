"""The exported library's sources, rendered from codegen_templates/export/ for an ExportSpec.

User text (the job's, inputs' and variables' names) reaches the C sources only as escaped string
literals (`c_string`) or as sanitised comments (`emit`); the prefix is a checked identifier.

Example:
    >>> files = render_sources(spec, step_source)          # doctest: +SKIP
    >>> sorted(files)[:2]                                  # doctest: +SKIP
    ['README.txt', 'src/build.sh']
"""
from __future__ import annotations

import shlex

from flowc.compiler.codegen.sanitise import CodeText, c_identifier, c_string, code
from flowc.compiler.codegen.templates import environment
from flowc.compiler.export.spec import ExportSpec, Tensor
from flowc.compiler.export.weights import DTYPE_CODES, ERROR_CODES
from flowc.compiler.toolchain import BASE_FLAGS

# What each return code of the API means (the header's comments).
ERROR_DOCS = {
    "ARGUMENT": "a NULL pointer, an index out of range, a negative thread count",
    "IO": "the weights file cannot be opened or read",
    "TRUNCATED": "the weights file is shorter than its header says",
    "MAGIC": "not a flowc weights file",
    "VERSION": "a weights format version this library does not read",
    "VARIABLE": "a variable the model does not have, one it lacks, or one given twice",
    "SHAPE": "a variable's shape differs from the model's",
    "DTYPE": "a variable's dtype differs from the model's (or is unknown)",
    "RANGE": "an offset or size in the weights file out of range",
    "CHECKSUM": "the weights file's CRC-32 does not match (a corrupt file)",
    "MEMORY": "out of memory",
    "STEP": "the step found bad data in an input (the message names the op and its line)",
    "INTERNAL": "a bug in the library: please report it",
}

STEP_SOURCE = "step.cpp"


def _row(t: Tensor, offsets: list[int] | None = None) -> dict:
    row = {"name_literal": c_string(t.name), "name_bytes": len(t.name.encode("utf-8", errors="surrogatepass")),
           "dtype": t.dtype, "dtype_code": DTYPE_CODES[t.dtype], "shape": list(t.shape), "nbytes": t.nbytes,
           "slot": t.slot, "offset": t.offset, "source": t.source, "source_offset": 0}
    if offsets is not None and t.source and t.source[0] == "variable":
        row["source_offset"] = offsets[t.source[1]]
    return row


def build_commands(prefix: str) -> list[CodeText]:
    """The shell lines of src/build.sh, run in src/ (flowc export runs that script itself)."""
    flags = [f for f in BASE_FLAGS if f not in ("-shared", "-march=native")]
    q = shlex.quote
    step_flags = " ".join(q(f) for f in flags)
    return [code(line) for line in (
        f"$CXX {step_flags} $MARCH -fvisibility=hidden -I. -include flowc_prelude.h "
        f"-Dflowc_step={prefix}_flowc_step -c {STEP_SOURCE} -o step.o",
        f"$CXX {step_flags} $MARCH -fvisibility=hidden -I. -c {prefix}_api.cpp -o api.o",
        f"$CXX -shared -fopenmp -Wl,--version-script=exports.map step.o api.o -o ../lib{prefix}.so",
        f"rm -f ../lib{prefix}.a && ar rcs ../lib{prefix}.a step.o api.o",
        "rm -f step.o api.o",
    )]


def render_sources(spec: ExportSpec, step_source: str, version: str) -> dict[str, str]:
    """Relative path in the output folder -> text, for every generated file but the weights."""
    env = environment("export")
    prefix = c_identifier(spec.prefix)
    upper = c_identifier(spec.prefix.upper())
    offsets = [v.offset for v in spec.variables]
    context = dict(
        job=spec.job, version=version, prefix=prefix, PREFIX=upper, step_symbol=code(f"{prefix}_flowc_step"),
        inputs=[_row(t) for t in spec.inputs], outputs=[_row(t, offsets) for t in spec.outputs],
        variables=[_row(t) for t in spec.variables], table_size=spec.table_size, arena_bytes=spec.arena_bytes,
        weights_bytes=spec.weights_bytes, shares_scratch=spec.shares_scratch,
        errors=[(c_identifier(name), number) for name, number in ERROR_CODES.items()],
        error_docs={c_identifier(name): code(f"  /* {text} */") for name, text in ERROR_DOCS.items()},
        dtypes=[(c_identifier(name.upper()), number) for name, number in DTYPE_CODES.items()],
        dtype_names=[c_string(name) for name, _ in sorted(DTYPE_CODES.items(), key=lambda kv: kv[1])],
        step_errors=[(number, c_string(message)) for number, message in sorted(spec.step_errors.items())],
    )
    return {
        f"{spec.prefix}.h": env.get_template("model.h.j2").render(**context),
        f"src/{spec.prefix}.h": env.get_template("model.h.j2").render(**context),
        f"src/{spec.prefix}_api.cpp": env.get_template("model.cpp.j2").render(**context),
        "src/exports.map": env.get_template("exports.map.j2").render(**context),
        "src/build.sh": env.get_template("build.sh.j2").render(commands=build_commands(spec.prefix), **context),
        f"src/{STEP_SOURCE}": step_source,
        "README.txt": env.get_template("README.txt.j2").render(**{**context, "variables": len(spec.variables)}),
    }
