"""`flowc cache clear` removes only what the cache made, only in a folder flowc marked as its cache,
and never under a running compile (issue 13).  Fake builds (no compiler): cheap and bounded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flowc.cli import main as flowc_main
from flowc.compiler import cache as cache_mod
from flowc.compiler.cache import CacheError, Cleared, KernelCache, make_key_parts

ROOT = Path(__file__).resolve().parent.parent


def parts(source: str = "int x;"):
    return make_key_parts(source=source, command="g++ $SRC -o $OUT", compiler_version="g++ 12",
                          cpu_target="znver3-0", include_dir=None, package_version_="0.1.0")


def fake_build(seconds: float = 0.0):
    def build(tmp: Path) -> None:
        (tmp / "kernel.cpp").write_text("int x;")
        time.sleep(seconds)
        (tmp / "kernel.so").write_bytes(b"\x7fELF fake")
    return build


def users_folder(tmp_path: Path) -> Path:
    """A folder of the user's that happens to have the names a cache uses."""
    folder = tmp_path / "project"
    for sub in ("index", "tmp", "failed"):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "mine.txt").write_text("the user's")
    return folder


def test_clear_refuses_a_folder_that_is_not_a_flowc_cache(tmp_path):
    folder = users_folder(tmp_path)
    with pytest.raises(CacheError, match=r"not a flowc cache .*nothing was removed"):
        KernelCache(folder).clear()
    assert all((folder / sub / "mine.txt").is_file() for sub in ("index", "tmp", "failed"))


def test_the_cli_refuses_cache_dir_dot(tmp_path, monkeypatch, capsys):
    folder = users_folder(tmp_path)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(folder))     # restored afterwards; --cache-dir sets it
    assert flowc_main(["cache", "clear", "--cache-dir", "."]) == 2
    assert "not a flowc cache" in capsys.readouterr().err
    assert (folder / "index" / "mine.txt").is_file()


def test_a_folder_with_other_files_is_used_but_never_marked(tmp_path):
    folder = users_folder(tmp_path)
    entry, compiled = KernelCache(folder).get_or_build(parts(), "job", fake_build())
    assert compiled and not (folder / ".flowc-cache").exists()
    with pytest.raises(CacheError):
        KernelCache(folder).clear()
    assert entry.library.is_file()


def test_clear_removes_only_what_the_cache_made(tmp_path):
    cache = KernelCache(tmp_path / "c")
    cache.get_or_build(parts("a"), "alpha", fake_build())
    cache.failed_dir("broken", parts("z").key())
    root = cache.root
    (root / "notes.txt").write_text("not flowc's")
    (root / "index" / "README").write_text("not flowc's")
    (root / "tmp" / "mine").mkdir()
    (root / "ab").mkdir()
    (root / "ab" / "not-an-entry").write_text("x")
    cache_mod._PINS.release_all()          # as if the process that built it had exited
    assert cache.clear() == Cleared(removed=1, in_use=0)
    assert list((root / "index").glob("*.json")) == [] and list((root / "failed").iterdir()) == []
    for kept in ("notes.txt", "index/README", "tmp/mine", "ab/not-an-entry", ".flowc-cache", "CACHEDIR.TAG"):
        assert (root / kept).exists(), kept


HOLDER = textwrap.dedent("""
    import sys
    from flowc.compiler.cache import KernelCache, make_key_parts
    p = make_key_parts(source="int a;", command="g++ $SRC -o $OUT", compiler_version="g++ 12",
                       cpu_target="znver3-0", include_dir=None, package_version_="0.1.0")
    entry, _ = KernelCache(sys.argv[1]).get_or_build(p, "alpha", lambda tmp: None)
    print(entry.library, flush=True)
    sys.stdin.read()            # until the test closes it
""")


@pytest.mark.slow
def test_clear_keeps_the_entries_a_running_process_was_handed(tmp_path):
    KernelCache(tmp_path).get_or_build(parts("int a;"), "alpha", fake_build())
    KernelCache(tmp_path).get_or_build(parts("b"), "beta", fake_build())
    cache_mod._PINS.release_all()          # as if the process that built them had exited
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=env, cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        library = Path(holder.stdout.readline().strip())      # it holds alpha now
        assert KernelCache(tmp_path).clear() == Cleared(removed=1, in_use=1)
        assert library.is_file()
    finally:
        holder.communicate(timeout=60)
    assert KernelCache(tmp_path).clear() == Cleared(removed=1, in_use=0)
    assert not library.exists()


def test_this_process_keeps_what_it_was_handed_too(tmp_path):
    cache = KernelCache(tmp_path)
    entry, _ = cache.get_or_build(parts(), "job", fake_build())
    assert cache.clear() == Cleared(removed=0, in_use=1) and entry.library.is_file()


def test_clear_of_a_cache_of_another_user_is_refused(tmp_path, monkeypatch):
    from flowc.compiler import cache_trust
    KernelCache(tmp_path).get_or_build(parts(), "job", fake_build())
    monkeypatch.setattr(cache_trust, "current_uid", lambda: os.geteuid() + 4242)
    with pytest.raises(CacheError, match="not to you"):
        KernelCache(tmp_path).clear()


def test_clearing_next_to_running_builds_breaks_none_of_them(tmp_path):
    # Threads with caches of their own (as separate processes have) build and then read ("load") their
    # entry, while another clears the cache as fast as it can.
    errors: list[BaseException] = []
    done = threading.Event()

    def compile_and_load(worker: int) -> None:
        try:
            for round_ in range(6):
                cache = KernelCache(tmp_path)
                entry, _ = cache.get_or_build(parts(f"int w{worker}r{round_};"), f"w{worker}", fake_build(0.01))
                time.sleep(0.005)
                assert entry.library.read_bytes() == b"\x7fELF fake"
        except BaseException as e:     # reported below, with the worker
            errors.append(e)

    def clear_repeatedly() -> None:
        while not done.is_set():
            try:
                KernelCache(tmp_path).clear()
            except BaseException as e:
                errors.append(e)
                return

    KernelCache(tmp_path).get_or_build(parts("seed"), "seed", fake_build())      # make and mark the root
    workers = [threading.Thread(target=compile_and_load, args=(i,), daemon=True) for i in range(6)]
    clearer = threading.Thread(target=clear_repeatedly, daemon=True)
    clearer.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    done.set()
    clearer.join(timeout=60)
    assert not any(t.is_alive() for t in [*workers, clearer]), "a worker hung"
    assert errors == []


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flowc.compiler.cache import KernelCache, make_key_parts
    root, worker = sys.argv[1], sys.argv[2]
    def build(tmp):
        (tmp / "kernel.cpp").write_text("int x;")
        time.sleep(0.02)
        (tmp / "kernel.so").write_bytes(b"lib")
    for i in range(8):
        p = make_key_parts(source=f"int p{worker}_{i};", command="c", compiler_version="v", cpu_target="t",
                           include_dir=None, package_version_="0")
        entry, _ = KernelCache(root).get_or_build(p, "job", build)
        time.sleep(0.01)
        assert entry.library.read_bytes() == b"lib"
""")


@pytest.mark.slow
def test_clearing_next_to_compiling_processes_breaks_none_of_them(tmp_path):
    KernelCache(tmp_path).get_or_build(parts("seed"), "seed", fake_build())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(i)], env=env, cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    try:
        while any(p.poll() is None for p in procs):
            KernelCache(tmp_path).clear()
        results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [code for code, _ in results] == [0, 0, 0], results


def test_clear_core_removes_the_compiled_templates_older_flowc_kept_there(tmp_path, monkeypatch, capsys):
    core = tmp_path / "core"
    (core / "templates").mkdir(parents=True)
    (core / "templates" / "__jinja2_0123abcd.cache").write_bytes(b"old bytecode")
    KernelCache(core).get_or_build(parts(), "flowc_core", fake_build())       # adopts and marks it
    monkeypatch.setenv("FLOWC_CORE_DIR", str(core))
    assert flowc_main(["cache", "clear", "--core"]) == 0
    assert "kept 1 in use by running processes" in capsys.readouterr().out
    assert not (core / "templates").exists()
