"""Tests for compiler.cache: keys, validation, explain_miss and admin helpers.

These drive KernelCache with a fake build callback (no compiler needed), so
they test the cache logic alone; tests/test_toolchain.py covers real builds.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from flowc.compiler import cache as cache_mod
from flowc.compiler.cache import CacheError, KernelCache, KeyParts, hash_headers, make_key_parts


def parts(source: str = "int x;", include_dir: Path | None = None, **over: str) -> KeyParts:
    kw = dict(command="g++ -O3 $SRC -o $OUT", compiler_version="g++ 12.2.0",
              cpu_target="znver3-0", package_version_="0.1.0")
    kw.update(over)
    return make_key_parts(source=source, include_dir=include_dir, **kw)


def fake_build(payload: bytes = b"\x7fELF fake library"):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "kernel.cpp").write_text("int x;")
        (tmp / "kernel.so").write_bytes(payload)

    build.calls = calls  # type: ignore[attr-defined]
    return build


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOWC_CACHE_DIR", str(tmp_path / "c"))
    assert cache_mod.default_cache_dir() == tmp_path / "c"
    assert cache_mod.default_cache().root == tmp_path / "c"
    monkeypatch.delenv("FLOWC_CACHE_DIR")
    assert cache_mod.default_cache_dir() == Path.home() / ".cache" / "flowc"


def test_key_covers_every_part(tmp_path: Path) -> None:
    base = parts()
    variants = [
        parts(source="int y;"),
        parts(command="g++ -O2 $SRC -o $OUT"),
        parts(compiler_version="g++ 13.1.0"),
        parts(package_version_="0.2.0"),
        parts(cpu_target="skylake-1"),
    ]
    keys = {base.key()} | {v.key() for v in variants}
    assert len(keys) == 1 + len(variants)
    assert parts().key() == base.key()  # deterministic
    assert KeyParts.from_json(json.loads(json.dumps(base.to_json()))) == base


def test_header_edit_changes_key_and_is_explained(tmp_path: Path) -> None:
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "flowc_rt.h").write_text("#pragma once\n")
    (inc / "notes.txt").write_text("not a header")
    cache = KernelCache(tmp_path / "cache")
    p1 = parts(include_dir=inc)
    assert [n for n, _ in p1.headers] == ["flowc_rt.h"]
    cache.get_or_build(p1, "job", fake_build())

    (inc / "notes.txt").write_text("still not a header")
    assert parts(include_dir=inc).key() == p1.key()

    (inc / "flowc_rt.h").write_text("#pragma once\n// edited\n")
    p2 = parts(include_dir=inc)
    assert p2.key() != p1.key()
    why = cache.explain_miss("job", p2)
    assert "headers (flowc_rt.h)" in why and "source" not in why
    assert hash_headers(tmp_path / "missing") == ()


def test_explain_miss_names_each_part(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    assert "no previous build" in cache.explain_miss("job", parts())
    cache.get_or_build(parts(), "job", fake_build())
    assert "no miss" in cache.explain_miss("job", parts())
    assert cache.explain_miss("job", parts(source="int y;")).endswith(
        "source changed since the last build")
    assert "compiler version ('g++ 12.2.0' -> 'g++ 13.1.0')" in cache.explain_miss(
        "job", parts(compiler_version="g++ 13.1.0"))
    assert "package version" in cache.explain_miss("job", parts(package_version_="9"))
    assert "cpu target" in cache.explain_miss("job", parts(cpu_target="other"))
    assert "command" in cache.explain_miss("job", parts(command="clang++ $SRC -o $OUT"))
    two = cache.explain_miss("job", parts(source="int y;", cpu_target="other"))
    assert "source" in two and "cpu target" in two
    cache.clear()
    assert "no previous build" in cache.explain_miss("job", parts())


def test_explain_miss_when_entry_vanished(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    entry, _ = cache.get_or_build(parts(), "job", fake_build())
    (entry.path / "kernel.so").unlink()
    why = cache.explain_miss("job", parts())
    assert "unchanged" in why and "corrupt" in why


def test_hit_miss_counters_and_layout(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    build = fake_build()
    p = parts()
    entry, compiled = cache.get_or_build(p, "job", build)
    assert compiled and len(build.calls) == 1
    key = p.key()
    assert entry.path == tmp_path / key[:2] / key
    meta = json.loads((entry.path / "meta.json").read_text())
    assert meta["key"] == key and meta["name"] == "job"
    assert meta["so_size"] == len(b"\x7fELF fake library")
    assert meta["parts"]["source_sha256"] == p.source_sha256
    assert {"created", "compile_seconds", "so_sha256"} <= set(meta)
    again, compiled = cache.get_or_build(p, "job", build)
    assert not compiled and again.path == entry.path and len(build.calls) == 1
    assert cache.stats() == {"hits": 1, "misses": 1, "compilations": 1}
    index = json.loads((tmp_path / "index" / "job.json").read_text())
    assert index["key"] == key


@pytest.mark.parametrize("damage", ["truncate", "delete_so", "delete_meta", "garble_meta",
                                    "flip_byte", "delete_source"])
def test_corrupt_entries_are_rebuilt(tmp_path: Path, damage: str) -> None:
    cache = KernelCache(tmp_path)
    p = parts()
    entry, _ = cache.get_or_build(p, "job", fake_build())
    so, meta = entry.path / "kernel.so", entry.path / "meta.json"
    if damage == "truncate":
        so.write_bytes(so.read_bytes()[:3])
    elif damage == "delete_so":
        so.unlink()
    elif damage == "delete_meta":
        meta.unlink()
    elif damage == "garble_meta":
        meta.write_text("{not json")
    elif damage == "flip_byte":
        data = bytearray(so.read_bytes())
        data[0] ^= 1
        so.write_bytes(bytes(data))
    elif damage == "delete_source":
        (entry.path / "kernel.cpp").unlink()
    assert cache.lookup(p.key()) is None
    rebuilt, compiled = cache.get_or_build(p, "job", fake_build())
    assert compiled and cache.compilations == 2
    assert cache.lookup(p.key()) is not None
    assert (rebuilt.path / "kernel.so").read_bytes() == b"\x7fELF fake library"


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)

    def boom(tmp: Path) -> None:
        (tmp / "kernel.cpp").write_text("junk")
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        cache.get_or_build(parts(), "job", boom)
    assert cache.lookup(parts().key()) is None
    assert list((tmp_path / "tmp").iterdir()) == []
    assert cache.compilations == 0 and cache.misses == 1

    def no_library(tmp: Path) -> None:
        (tmp / "kernel.cpp").write_text("int x;")

    with pytest.raises(CacheError):
        cache.get_or_build(parts(), "job", no_library)


def test_threads_share_one_build(tmp_path: Path) -> None:
    # flock is per open file description, so it also serialises threads that
    # each open the lock file; a slow build makes the race real.
    caches = [KernelCache(tmp_path) for _ in range(4)]
    started = threading.Barrier(len(caches))
    builds = []

    def slow_build(tmp: Path) -> None:
        builds.append(tmp)
        time.sleep(0.2)
        (tmp / "kernel.cpp").write_text("int x;")
        (tmp / "kernel.so").write_bytes(b"lib")

    def worker(c: KernelCache) -> None:
        started.wait()
        c.get_or_build(parts(), "job", slow_build)

    threads = [threading.Thread(target=worker, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert sum(c.compilations for c in caches) == 1
    assert sum(c.hits for c in caches) == len(caches) - 1


def test_entries_info_clear(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    cache.get_or_build(parts("a"), "alpha", fake_build())
    cache.get_or_build(parts("b"), "beta", fake_build(b"longer library bytes"))
    names = sorted(e.name for e in cache.entries())
    assert names == ["alpha", "beta"]
    for e in cache.entries():
        assert e.size > 0 and e.age >= 0 and len(e.key) == 64
    info = cache.info()
    assert info["entries"] == 2 and info["bytes"] == sum(e.size for e in cache.entries())
    assert info["root"] == str(tmp_path) and info["compilations"] == 2
    cache_mod._PINS.release_all()      # this process was handed both: it would keep them
    assert cache.clear() == cache_mod.Cleared(removed=2, in_use=0)
    assert cache.entries() == [] and cache.info()["entries"] == 0
    # Still usable after clearing.
    _, compiled = cache.get_or_build(parts("a"), "alpha", fake_build())
    assert compiled


def test_unwritable_root_is_explained(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = KernelCache(blocker / "cache")
    with pytest.raises(CacheError, match="FLOWC_CACHE_DIR"):
        cache.get_or_build(parts(), "job", fake_build())
