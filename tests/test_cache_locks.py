"""A process stuck holding an entry's lock is named and given up on, and the build folders of dead
processes are removed by the next run (issue 13).  Every wait here is bounded."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from flowc.compiler import cache_locks, settings
from flowc.compiler.cache import KernelCache, make_key_parts

ROOT = Path(__file__).resolve().parent.parent


def parts(source: str = "int x;"):
    return make_key_parts(source=source, command="g++ $SRC -o $OUT", compiler_version="g++ 12",
                          cpu_target="znver3-0", include_dir=None, package_version_="0.1.0")


def fake_build(tmp: Path) -> None:
    (tmp / "kernel.cpp").write_text("int x;")
    (tmp / "kernel.so").write_bytes(b"lib")


def child(code: str, *args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


STUCK = """
    import sys, time
    from pathlib import Path
    from flowc.compiler import cache_locks
    with cache_locks.exclusive(Path(sys.argv[1]), "an entry"):
        print("holding", flush=True)
        time.sleep(120)          # a compile that hangs; the test kills it
"""


@pytest.mark.slow
def test_a_stuck_holder_is_named_and_the_wait_gives_up(tmp_path, monkeypatch, capfd):
    cache = KernelCache(tmp_path)
    cache.get_or_build(parts("seed"), "seed", fake_build)          # make the root and its locks/ folder
    lock = tmp_path / "locks" / f"{parts().key()}.lock"
    stuck = child(STUCK, str(lock))
    try:
        assert stuck.stdout.readline().strip() == "holding"
        monkeypatch.setenv("FLOWC_LOCK_TIMEOUT", "2")
        monkeypatch.setattr(cache_locks, "PROGRESS_AFTER_SECONDS", 0.3)
        outcome: list[BaseException | object] = []

        def wait() -> None:
            try:
                outcome.append(cache.get_or_build(parts(), "job", fake_build))
            except BaseException as e:
                outcome.append(e)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(timeout=30)
        assert not waiter.is_alive(), "the wait for a stuck lock holder never ended"
    finally:
        stuck.kill()
        stuck.wait(timeout=30)
    [error] = outcome
    assert isinstance(error, cache_locks.LockTimeout)
    assert f"process {stuck.pid} (running)" in str(error) and "FLOWC_LOCK_TIMEOUT" in str(error)
    assert f"waiting for cache entry {parts().key()[:16]} ('job')" in capfd.readouterr().err
    entry, compiled = cache.get_or_build(parts(), "job", fake_build)          # its holder is gone now
    assert compiled


def test_the_holder_is_recorded_and_a_dead_one_is_said_to_be_dead(tmp_path):
    lock = tmp_path / "x.lock"
    with cache_locks.exclusive(lock, "an entry"):
        assert cache_locks.holder(lock) == f"process {os.getpid()} (running, this process)"
        with cache_locks.try_exclusive(lock) as free:
            assert not free
    assert cache_locks.holder(lock).startswith("another process")
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket
    lock.write_text(f"{done.stdout.strip()} {socket.gethostname()}\n")
    assert cache_locks.holder(lock).endswith("(no longer running)")


@pytest.mark.parametrize("raw, seconds", [(None, 600.0), ("", 600.0), ("5", 5.0), ("0", None), ("-1", None)])
def test_lock_timeout_setting(monkeypatch, raw, seconds):
    monkeypatch.delenv("FLOWC_LOCK_TIMEOUT", raising=False)
    if raw is not None:
        monkeypatch.setenv("FLOWC_LOCK_TIMEOUT", raw)
    assert settings.lock_timeout() == seconds


def test_a_lock_timeout_that_is_not_a_number_is_named(monkeypatch):
    monkeypatch.setenv("FLOWC_LOCK_TIMEOUT", "ten")
    with pytest.raises(ValueError, match=r"FLOWC_LOCK_TIMEOUT='ten'"):
        settings.lock_timeout()


DIES_WHILE_BUILDING = """
    import os, sys
    from flowc.compiler.cache import KernelCache, make_key_parts
    def build(tmp):
        (tmp / "kernel.cpp").write_text("int x;")
        os._exit(3)                 # killed mid-compile: no cleanup runs
    p = make_key_parts(source="dies", command="c", compiler_version="v", cpu_target="t", include_dir=None,
                       package_version_="0")
    KernelCache(sys.argv[1]).get_or_build(p, "job", build)
"""


@pytest.mark.slow
def test_build_folders_of_dead_processes_are_removed_by_the_next_run(tmp_path):
    dead = child(DIES_WHILE_BUILDING, str(tmp_path))
    assert dead.wait(timeout=60) == 3
    [leftover] = (tmp_path / "tmp").iterdir()
    assert leftover.name.startswith("build-") and f"-{dead.pid}-" in leftover.name
    KernelCache(tmp_path).get_or_build(parts(), "next", fake_build)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_build_folder_in_use_is_kept_by_the_sweep(tmp_path):
    cache = KernelCache(tmp_path)
    seen: list[list[str]] = []

    def build(tmp: Path) -> None:
        KernelCache(tmp_path)._sweep_tmp()       # another process opening the cache meanwhile
        seen.append([p.name for p in (tmp_path / "tmp").iterdir()])
        fake_build(tmp)

    cache.get_or_build(parts(), "job", build)
    assert len(seen[0]) == 1 and seen[0][0].startswith(f"build-{parts().key()}-{os.getpid()}-")
