"""Tests for compiler.toolchain: building, loading and toolchain error messages.

Every test uses its own cache directory under tmp_path, never ~/.cache.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import cffi
import pytest

from flowc.compiler import cache as cache_mod
from flowc.compiler.cache import KernelCache
from flowc.compiler.toolchain import (
    BuildResult,
    ToolchainError,
    build_shared_library,
    compiler_version,
    cpu_target,
    cxx_command,
    include_dir,
    key_parts,
)

REPO = Path(__file__).resolve().parents[1]


def answer_source(value: int = 42) -> str:
    return f'extern "C" int answer() {{ return {value}; }}\n'


def load_answer(path: Path) -> int:
    ffi = cffi.FFI()
    ffi.cdef("int answer(void);")
    return ffi.dlopen(str(path)).answer()


def run_child(cache_dir: Path, source: str, name: str = "answer") -> subprocess.Popen:
    """Start a separate Python process that builds `source` and prints its counters."""
    code = textwrap.dedent(
        f"""
        from flowc.compiler.toolchain import build_shared_library
        from flowc.compiler import cache
        res = build_shared_library({source!r}, name={name!r})
        s = cache.stats()
        print(s["compilations"], s["hits"], res.path)
        """
    )
    env = dict(os.environ, FLOWC_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    env.pop("FLOWC_DEBUG", None)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_result(proc: subprocess.Popen) -> tuple[int, int, Path]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    compilations, hits, path = out.split()
    return int(compilations), int(hits), Path(path)


def test_build_load_and_hit(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    first = build_shared_library(answer_source(), name="answer", cache=cache)
    assert isinstance(first, BuildResult)
    assert first.compiled and first.path.is_file()
    assert first.source_path.read_text() == answer_source()
    assert first.miss_reason and "no previous build" in first.miss_reason
    assert load_answer(first.path) == 42

    second = build_shared_library(answer_source(), name="answer", cache=cache)
    assert not second.compiled
    assert second.path == first.path and second.key == first.key
    assert (cache.hits, cache.misses, cache.compilations) == (1, 1, 1)


def test_default_cache_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(tmp_path / "envcache"))
    res = build_shared_library(answer_source(7), name="env")
    assert res.path.is_relative_to(tmp_path / "envcache")
    assert cache_mod.stats() == {"hits": 0, "misses": 1, "compilations": 1}
    build_shared_library(answer_source(7), name="env")
    assert cache_mod.stats()["hits"] == 1


@pytest.mark.slow
def test_second_process_hits(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    res = build_shared_library(answer_source(43), name="answer", cache=KernelCache(cache_dir))
    assert res.compiled
    compilations, hits, path = child_result(run_child(cache_dir, answer_source(43)))
    assert (compilations, hits) == (0, 1)
    assert path == res.path


@pytest.mark.slow
def test_concurrent_processes_compile_once(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    # A source no other test builds, so both processes start from a miss.
    source = answer_source(44) + "// concurrent\n"
    procs = [run_child(cache_dir, source), run_child(cache_dir, source)]
    results = [child_result(p) for p in procs]
    assert sum(r[0] for r in results) == 1
    assert sum(r[1] for r in results) == 1
    assert results[0][2] == results[1][2]
    assert load_answer(results[0][2]) == 44
    # Nothing half-built left behind in the temp area.
    assert list((cache_dir / "tmp").iterdir()) == []


def test_corrupt_library_is_rebuilt(tmp_path: Path) -> None:
    # Not loading the library before corrupting it: truncating a mapped .so
    # would crash this very process (SIGBUS), which is not what we test.
    cache = KernelCache(tmp_path / "cache")
    first = build_shared_library(answer_source(45), name="answer", cache=cache)
    with open(first.path, "r+b") as f:
        f.truncate(100)
    second = build_shared_library(answer_source(45), name="answer", cache=cache)
    assert second.compiled
    assert cache.compilations == 2
    assert load_answer(second.path) == 45


def test_missing_meta_is_rebuilt(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    first = build_shared_library(answer_source(46), name="answer", cache=cache)
    (first.path.parent / "meta.json").unlink()
    second = build_shared_library(answer_source(46), name="answer", cache=cache)
    assert second.compiled
    assert (second.path.parent / "meta.json").is_file()
    assert load_answer(second.path) == 46


def test_same_size_corruption_is_detected_by_sha(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    first = build_shared_library(answer_source(47), name="answer", cache=cache)
    data = bytearray(first.path.read_bytes())
    data[-1] ^= 0xFF
    first.path.write_bytes(bytes(data))
    second = build_shared_library(answer_source(47), name="answer", cache=cache)
    assert second.compiled
    assert load_answer(second.path) == 47


def test_compile_error_keeps_source(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    bad = 'extern "C" int answer() { return undefined_thing; }\n'
    with pytest.raises(ToolchainError) as info:
        build_shared_library(bad, name="broken job", cache=cache)
    msg = str(info.value)
    assert "undefined_thing" in msg and "was not declared" in msg
    kept = [Path(line.split(": ", 1)[1]) for line in msg.splitlines()
            if line.startswith("generated source kept at: ")]
    assert len(kept) == 1 and kept[0].read_text() == bad
    assert str(kept[0]) in msg
    assert cache.compilations == 0
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_missing_compiler_says_what_to_install(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(ToolchainError) as info:
        build_shared_library(answer_source(), name="answer", cache=KernelCache(tmp_path))
    msg = str(info.value)
    assert "/nonexistent/g++" in msg
    assert "apt-get install g++" in msg and "dnf install gcc-c++" in msg


def test_missing_openmp_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A compiler wrapper that behaves like g++ without omp.h installed.
    wrapper = tmp_path / "gxx-without-omp"
    wrapper.write_text(textwrap.dedent(
        """\
        #!/bin/sh
        for a in "$@"; do
          if [ -f "$a" ] && grep -q "omp.h" "$a"; then
            echo "$a:1:10: fatal error: omp.h: No such file or directory" >&2
            exit 1
          fi
        done
        exec g++ "$@"
        """))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(wrapper))
    src = '#include <omp.h>\nextern "C" int threads() { return omp_get_max_threads(); }\n'
    with pytest.raises(ToolchainError) as info:
        build_shared_library(src, name="omp", cache=KernelCache(tmp_path / "cache"))
    msg = str(info.value)
    assert "OpenMP is missing" in msg and "omp.h" in msg


def test_toolchain_facts() -> None:
    assert compiler_version() and "\n" not in compiler_version()
    assert cpu_target() == cpu_target()
    cmd = cxx_command(Path("a.cpp"), Path("a.so"))
    for flag in ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC"):
        assert flag in cmd
    assert f"-I{include_dir()}" in cmd
    assert cmd[-3:] == ["a.cpp", "-o", "a.so"]
    assert include_dir().name == "cpu"


def test_key_does_not_depend_on_paths_and_explains_source_change(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "cache")
    assert key_parts(answer_source()).key() == key_parts(answer_source()).key()
    assert "$SRC" in key_parts(answer_source()).command
    build_shared_library(answer_source(48), name="job", cache=cache)
    why = cache.explain_miss("job", key_parts(answer_source(49)))
    assert "source" in why
    for other in ("command", "compiler version", "package version", "cpu target", "headers"):
        assert other not in why


@pytest.mark.slow
def test_a_part_with_pages_of_errors_falls_back_to_the_whole_source(tmp_path: Path) -> None:
    """A parallel part that fails loudly must not block on its unread diagnostics (it once did, forever,
    once they outgrew the pipe's buffer); the whole source then builds the library."""
    code = textwrap.dedent(
        f"""
        from flowc.compiler.cache import KernelCache
        from flowc.compiler.toolchain import build_shared_library
        broken = "\\n".join(f"int f{{i}}() {{{{ return undefined_{{i}}; }}}}" for i in range(800))
        res = build_shared_library({answer_source()!r}, name="loud_part", cache=KernelCache({str(tmp_path)!r}),
                                   units=[broken, broken])
        print(res.compiled, res.path.is_file())
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
