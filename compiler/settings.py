"""Every environment variable flowc reads, declared once: name, kind, default, doc, and who reads it.

The rest of flowc asks the typed accessors below instead of reading ``os.environ``, so each variable
is parsed in one place, and README.md's table is generated from `SETTINGS` (a test compares them).
Values are read at each call, never cached, so a change to the environment takes effect at once:

    >>> import os
    >>> os.environ["FLOWC_DEBUG"] = "2"      # doctest: +SKIP
    >>> debug_level()                        # doctest: +SKIP
    2

    python -m flowc.compiler.settings                   # every variable, its default and its value here
    python -m flowc.compiler.settings --markdown        # the README table
    python -m flowc.compiler.settings --write-readme    # put that table into README.md
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["flag", "level", "path", "text"]
Scope = Literal["flowc", "toolchain", "tests"]


@dataclass(frozen=True)
class Setting:
    """One environment variable: how it parses, what flowc does without it, and what it does."""
    name: str
    kind: Kind        # flag: on/off; level: an integer; path: a folder; text: a command or name
    default: str      # what applies when it is unset or empty, as the README shows it
    doc: str          # one paragraph of Markdown
    read_by: str      # the part of flowc that reads it
    scope: Scope = "flowc"   # toolchain: a variable other tools read too; tests: the test suite's own


SETTINGS: tuple[Setting, ...] = (
    Setting("FLOWC_CACHE_DIR", "path", "`~/.cache/flowc`",
            "root of the compiled-kernel cache. Entries are content-addressed by generated source, full "
            "compiler command line, compiler version, flowc version, CPU target and runtime headers, so "
            "upgrades never reuse stale kernels. Each entry keeps its `kernel.cpp` next to `kernel.so`; "
            "sources that failed to compile are kept under `failed/`. The `--cache-dir` option of "
            "`flowc compile` and `flowc cache` sets it for that command. flowc creates it with mode 0700 and "
            "refuses a folder another user owns or may write (it then warns and builds into a private "
            "temporary folder for that run); a read-only cache owned by root is used as it is "
            "(docs/security.md).",
            "compiler.cache"),
    Setting("FLOWC_CORE_DIR", "path", "`~/.cache/flowc-core`",
            "where the core library lives (the GEMM kernel, col2im and the precompiled prelude every step "
            "uses, built once per compiler, CPU target and header version). Trusted on the same terms as "
            "`FLOWC_CACHE_DIR`. `flowc cache info --core` shows it.",
            "compiler.core_library"),
    Setting("FLOWC_LOCK_TIMEOUT", "level", "`600`",
            "seconds a process waits for another process's lock on a cache entry (while that one compiles "
            "it) before it gives up with an error naming the holder's pid; after 5 s of waiting it prints "
            "whom it waits for. `0` waits without a limit.",
            "compiler.cache_locks"),
    Setting("FLOWC_DEBUG", "level", "`0`",
            "`1` or more prints cache misses with the reason, compiler command lines and compile times to "
            "stderr, and writes each job's IR after every pass, generated source and memory plan to a "
            "folder it names. A value that is not a number (e.g. `yes`) counts as `1`; `0` or a negative "
            "number is off.",
            "compiler.toolchain, compiler.cuda_toolchain, compiler.pipeline"),
    Setting("FLOWC_PROFILE", "flag", "`0`",
            "`1` (any value but empty or `0`) builds each job with a timer around every kernel; "
            "`job.profile()` then shows the time per kernel over the steps run so far. Read when a job "
            "is compiled, so set it before the job's first call.",
            "compiler.pipeline"),
    Setting("FLOWC_TF32", "flag", "`0`",
            "`1` (any value but empty or `0`): float32 GEMMs and convolutions on GPU tensor cores (TF32 "
            "inputs, FP32 accumulation) on sm_80 and newer; older GPUs keep FP32.",
            "compiler.pipeline"),
    Setting("FLOWC_CUDA_PER_LAUNCH", "flag", "`0`",
            "`1` (any value but empty or `0`) builds a GPU job's kernels into a cubin that PyCUDA launches "
            "one by one from Python, instead of the step library whose host step (`flowc_step`) launches "
            "them all in one call per step. That per-launch path is otherwise only the fallback where the "
            "step library cannot be built (with a warning saying why). Read when a job is compiled.",
            "compiler.cuda_toolchain"),
    Setting("FLOWC_STRICT_DEVICE", "flag", "`0`",
            "`1` makes a `\"gpu\"` placement an error where no GPU can run it (otherwise it runs on the CPU "
            "with one warning saying why). Only the exact value `1` turns it on.",
            "runtime.devices"),
    Setting("FLOWC_DEVICES_PER_MACHINE", "text", "unset: the launched processes share one machine",
            "the processes (one per device) `flowc launch` started on each machine: a whole number, set by "
            "`flowc launch` in every process it starts (N / the number of `--hosts`); the script's "
            "`flow.config.gpu_device_num` / `cpu_device_num` must agree with it (docs/distributed.md).",
            "runtime.world, cli.launch_command"),
    Setting("FLOWC_COMM_TIMEOUT", "level", "`300`",
            "seconds a rank of a distributed job waits for the others in one collective or control message "
            "before it stops with an error naming the ranks that did not answer (a lost process); `0` waits "
            "without a limit.",
            "runtime.collectives, runtime.distributed"),
    Setting("FLOWC_MPICC", "text", "`mpicc` next to the Python interpreter, else on `PATH`",
            "the MPI compiler wrapper that builds flowc's MPI engine (`codegen_templates/cpu/flowc_comm_mpi.c`), "
            "once per MPI installation. It must belong to the MPI that mpi4py loads.",
            "compiler.comm_library"),
    Setting("FLOWC_NCCL", "path",
            "the `nvidia-nccl-cu12` (or `-cu13`) wheel's `libnccl.so.2`, else the system's `libnccl.so.2`",
            "the NCCL library a data-parallel GPU job sums its gradients with (one process per GPU); flowc "
            "opens it at the job's first step, so no NCCL header is needed to build.",
            "runtime.nccl"),
    Setting("CXX", "text", "`g++`",
            "C++ compiler to use for CPU kernels, as a command line (`clang++`, `ccache g++`).",
            "compiler.toolchain", "toolchain"),
    Setting("NVCC", "text", "`nvcc` on `PATH`, else `$CUDA_HOME/bin/nvcc`",
            "nvcc to use for GPU kernels (a name on `PATH` or a path).",
            "compiler.cuda_toolchain, runtime.devices", "toolchain"),
    Setting("CUDA_HOME", "path", "`$CUDA_PATH`, else `/usr/local/cuda`",
            "the CUDA toolkit's folder; flowc looks for `bin/nvcc` there when `NVCC` is unset and no "
            "`nvcc` is on `PATH`.",
            "compiler.cuda_toolchain, runtime.devices", "toolchain"),
    Setting("CUDA_PATH", "path", "`/usr/local/cuda`",
            "the CUDA toolkit's folder, read only when `CUDA_HOME` is unset.",
            "compiler.cuda_toolchain, runtime.devices", "toolchain"),
    Setting("FLOWC_TEST_CACHE_DIR", "path", "a new temporary folder per test run",
            "tests only: the `FLOWC_CACHE_DIR` the test suite uses when that is unset, to keep one warm "
            "cache across runs.",
            "tests/conftest.py", "tests"),
    Setting("FLOWC_REQUIRE_GPU", "text", "`1` where `nvidia-smi -L` lists a GPU",
            "tests only: `1` makes a GPU test that would skip for want of a usable GPU (no PyCUDA, a driver "
            "older than the toolkit, no nvcc) fail with the reason; `0` lets it skip even where nvidia-smi "
            "sees a GPU.",
            "tests/gpu_requirement.py", "tests"),
)

_BY_NAME = {s.name: s for s in SETTINGS}
DEFAULT_LOCK_TIMEOUT = 600
DEFAULT_COMM_TIMEOUT = 300.0
README_BEGIN = "<!-- settings-table:begin (generated: python -m flowc.compiler.settings --write-readme) -->"
README_END = "<!-- settings-table:end -->"


def setting(name: str) -> Setting:
    """The declaration of `name`; KeyError if flowc does not declare it."""
    return _BY_NAME[name]


def _raw(name: str) -> str:
    setting(name)    # only declared names may be read, so no variable escapes the table
    return os.environ.get(name, "")


def _flag(name: str) -> bool:
    # The long-standing rule for FLOWC_PROFILE and FLOWC_TF32: on unless empty or "0".
    return _raw(name) not in ("", "0")


def _text(name: str) -> str | None:
    # Surrounding spaces are typing slips; a blank value is the same as unset.
    return _raw(name).strip() or None


def _path(name: str) -> Path | None:
    raw = _raw(name)
    return Path(raw).expanduser() if raw else None


def debug_level() -> int:
    """``$FLOWC_DEBUG`` as an integer: 0 when unset or empty, 1 for a value that is not a number."""
    raw = _raw("FLOWC_DEBUG")
    try:
        return int(raw)
    except ValueError:
        return 1 if raw else 0


def debug() -> bool:
    """Is ``FLOWC_DEBUG`` on (level 1 or more)?"""
    return debug_level() >= 1


def profile() -> bool:
    """Build jobs with per-kernel timers (``$FLOWC_PROFILE`` set, and not ``0``)."""
    return _flag("FLOWC_PROFILE")


def tf32() -> bool:
    """Run float32 GEMMs and convolutions on TF32 tensor cores (``$FLOWC_TF32`` set, and not ``0``)."""
    return _flag("FLOWC_TF32")


def cuda_per_launch() -> bool:
    """Build GPU jobs for the per-launch path (``$FLOWC_CUDA_PER_LAUNCH`` set, and not ``0``)."""
    return _flag("FLOWC_CUDA_PER_LAUNCH")


def strict_device() -> bool:
    """Is a ``"gpu"`` placement with no usable GPU an error (``$FLOWC_STRICT_DEVICE`` is exactly ``1``)?"""
    return _raw("FLOWC_STRICT_DEVICE") == "1"


def cache_dir() -> Path:
    """The compile cache's root: ``$FLOWC_CACHE_DIR``, else ``~/.cache/flowc``."""
    return _path("FLOWC_CACHE_DIR") or Path.home() / ".cache" / "flowc"


def set_cache_dir(folder: str | os.PathLike) -> None:
    """Make `folder` (made absolute) the cache of this process and of the processes it starts."""
    # Written to the environment, not kept here, so a job's worker processes inherit it.
    os.environ["FLOWC_CACHE_DIR"] = os.path.abspath(folder)


def core_dir() -> Path:
    """The core library's cache root: ``$FLOWC_CORE_DIR``, else ``~/.cache/flowc-core``."""
    return _path("FLOWC_CORE_DIR") or Path.home() / ".cache" / "flowc-core"


def lock_timeout() -> float | None:
    """``$FLOWC_LOCK_TIMEOUT`` in seconds (default 600); None for ``0`` or less: wait without a limit.

    A value that is not a whole number is an error that names the variable.
    """
    raw = _raw("FLOWC_LOCK_TIMEOUT").strip()
    try:
        seconds = int(raw) if raw else DEFAULT_LOCK_TIMEOUT
    except ValueError:
        raise ValueError(f"FLOWC_LOCK_TIMEOUT={raw!r}: expected a whole number of seconds "
                         "(0 waits without a limit)") from None
    return float(seconds) if seconds > 0 else None


def devices_per_machine() -> str | None:
    """``$FLOWC_DEVICES_PER_MACHINE`` as written (runtime/world.py parses it, naming it when malformed), or
    None when unset."""
    return _text("FLOWC_DEVICES_PER_MACHINE")


def set_devices_per_machine(count: int) -> None:
    """Tell the processes this one starts (through mpiexec) how many of them share each machine."""
    # Written to the environment, like set_cache_dir: mpiexec hands it on to every rank.
    os.environ["FLOWC_DEVICES_PER_MACHINE"] = str(count)


# What MPI launchers set in each process they start (flowc reads them, never sets them): rank, size,
# and the processes on this machine.  runtime/world.py's LAUNCHERS table says which launcher sets which
# (tests/test_world.py keeps the two lists equal); docs/distributed.md lists them.
MPI_LAUNCHER_VARIABLES: tuple[str, ...] = (
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "PMIX_RANK", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID",
)


def mpi_launcher_variables() -> dict[str, str]:
    """The `MPI_LAUNCHER_VARIABLES` set in this process, name -> value (empty when no launcher started it)."""
    return {name: os.environ[name] for name in MPI_LAUNCHER_VARIABLES if name in os.environ}


def comm_timeout() -> float | None:
    """``$FLOWC_COMM_TIMEOUT`` in seconds (default 300); None for ``0`` or less: wait without a limit."""
    raw = _raw("FLOWC_COMM_TIMEOUT").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_COMM_TIMEOUT
    except ValueError:
        raise ValueError(f"FLOWC_COMM_TIMEOUT={raw!r}: expected a number of seconds "
                         "(0 waits without a limit)") from None
    return seconds if seconds > 0 else None


def mpicc() -> str | None:
    """``$FLOWC_MPICC`` (a command line, not yet split), or None when unset."""
    return _text("FLOWC_MPICC")


def nccl() -> Path | None:
    """``$FLOWC_NCCL``: the NCCL shared library to open, or None when unset."""
    return _path("FLOWC_NCCL")


def cxx() -> str | None:
    """``$CXX`` (a command line, not yet split), or None when unset: the caller then uses ``g++``."""
    return _text("CXX")


def nvcc() -> str | None:
    """``$NVCC``, or None when unset: the caller then looks on PATH and in `cuda_home()`."""
    return _text("NVCC")


def cuda_home() -> Path:
    """The CUDA toolkit's folder: ``$CUDA_HOME``, else ``$CUDA_PATH``, else ``/usr/local/cuda``."""
    return _path("CUDA_HOME") or _path("CUDA_PATH") or Path("/usr/local/cuda")


def markdown_table() -> str:
    """The README's table of environment variables, one row per `SETTINGS` entry (no trailing newline)."""
    rows = ["| Variable | Default | Effect |", "|----------|---------|--------|"]
    for s in SETTINGS:
        doc = s.doc.replace("|", "\\|")    # a `|` would end the cell
        rows.append(f"| `{s.name}` | {s.default} | {doc} |")
    return "\n".join(rows)


def readme_section(text: str) -> str:
    """The table between the settings markers of a README's text; ValueError if the markers are missing."""
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the README has no {README_BEGIN!r} ... {README_END!r} markers")
    return text[begin + len(README_BEGIN):end].strip("\n")


def write_readme(path: str | os.PathLike) -> bool:
    """Put `markdown_table()` between the markers of the README at `path`; True if the file changed."""
    path = Path(path)
    text = path.read_text()
    old = readme_section(text)
    if old == markdown_table():
        return False
    begin = text.index(README_BEGIN) + len(README_BEGIN)
    path.write_text(text[:begin] + "\n" + markdown_table() + "\n" + text[text.index(README_END):])
    return True


def describe() -> str:
    """Plain text for a terminal: each variable, its kind, default and who reads it, and its value here."""
    lines = []
    for s in SETTINGS:
        value = os.environ.get(s.name)
        lines.append(f"{s.name:<21} {'unset' if value is None else repr(value):<24} {s.kind} ({s.scope}), "
                     f"default {s.default.replace('`', '')}; read by {s.read_by}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flowc.compiler.settings [--markdown | --write-readme [README.md]]``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--markdown"]:
        print(markdown_table())
    elif args[:1] == ["--write-readme"]:
        path = args[1] if len(args) > 1 else "README.md"
        print(f"{path}: {'updated' if write_readme(path) else 'already up to date'}")
    elif not args:
        print(describe())
    else:
        print(main.__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
