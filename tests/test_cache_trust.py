"""The caches are trusted only when private (issue 13): a root or entry another user could have
written is never loaded, the core folder's files are checksummed, and templates load nothing from disk.

Ownership is tested by moving the current uid (`cache_trust.current_uid`, `cache_trust.ROOT_UID`)
rather than by chown, which needs root; modes are tested with real chmod.
"""
from __future__ import annotations

import builtins
import os
import pickle
import stat
import subprocess
import warnings
from pathlib import Path

import pytest

from flowc.compiler import cache_trust, core_library
from flowc.compiler.cache import CacheTrustWarning, KernelCache, make_key_parts

PAYLOAD = b"\x7fELF our library"


def parts(source: str = "int x;"):
    return make_key_parts(source=source, command="g++ $SRC -o $OUT", compiler_version="g++ 12",
                          cpu_target="znver3-0", include_dir=None, package_version_="0.1.0")


def fake_build(payload: bytes = PAYLOAD, extra: dict[str, bytes] | None = None):
    def build(tmp: Path) -> None:
        (tmp / "kernel.cpp").write_text("int x;")
        (tmp / "kernel.so").write_bytes(payload)
        for name, data in (extra or {}).items():
            (tmp / name).write_bytes(data)
    return build


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def as_another_user(monkeypatch: pytest.MonkeyPatch, owner_is_root: bool = False) -> None:
    """From here on, what the test created belongs to someone else (to root, when `owner_is_root`)."""
    me = os.geteuid()
    monkeypatch.setattr(cache_trust, "current_uid", lambda: me + 4242)
    monkeypatch.setattr(cache_trust, "ROOT_UID", me if owner_is_root else me + 4243)


# --- the root ------------------------------------------------------------------------------------

def test_a_new_root_is_private_marked_and_its_entries_are_not_group_writable(tmp_path):
    old = os.umask(0o002)           # Debian's default for users: files come out group-writable
    try:
        cache = KernelCache(tmp_path / "new" / "cache")
        entry, compiled = cache.get_or_build(parts(), "job", fake_build())
    finally:
        os.umask(old)
    root = tmp_path / "new" / "cache"
    assert compiled and mode(root) == 0o700
    for sub in ("tmp", "locks", "index", entry.path.parent.name):
        assert mode(root / sub) == 0o700, sub
    assert (root / ".flowc-cache").is_file()
    assert (root / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    for path in entry.path.iterdir():
        assert not mode(path) & 0o022, path
    assert cache.lookup(parts().key()) is not None       # and we trust what we made


@pytest.mark.parametrize("shared_mode", [0o777, 0o1777, 0o775])
def test_a_root_others_may_write_is_refused_and_nothing_is_loaded_from_it(tmp_path, shared_mode):
    root = tmp_path / "shared"
    KernelCache(root).get_or_build(parts(), "job", fake_build(b"\x7fELF planted by another user"))
    os.chmod(root, shared_mode)
    cache = KernelCache(root)
    with pytest.warns(CacheTrustWarning) as caught:
        entry, compiled = cache.get_or_build(parts(), "job", fake_build())
    message = str(caught[0].message)
    assert str(root) in message and oct(shared_mode) in message and "writable by" in message
    assert "chmod 700" in message and "FLOWC_CACHE_DIR" in message
    assert compiled and root not in entry.path.parents
    assert entry.library.read_bytes() == PAYLOAD
    assert mode(cache._fallback.root) == 0o700 and str(cache._fallback.root) in message
    assert cache.lookup(parts().key()) is None
    assert cache.stats() == {"hits": 0, "misses": 1, "compilations": 1}
    assert cache.trust().startswith("refused: writable by")


def test_a_root_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "theirs"
    KernelCache(root).get_or_build(parts(), "job", fake_build(b"\x7fELF theirs"))
    as_another_user(monkeypatch)
    with pytest.warns(CacheTrustWarning, match=r"owned by .*not by you"):
        entry, compiled = KernelCache(root).get_or_build(parts(), "job", fake_build())
    assert compiled and entry.library.read_bytes() == PAYLOAD and root not in entry.path.parents


@pytest.mark.parametrize("damage", ["entry folder 0777", "library 0666", "meta 0666"])
def test_an_entry_others_may_write_is_not_loaded_but_rebuilt(tmp_path, damage):
    # The attack: another user replaced kernel.so and rewrote its checksum in meta.json.
    cache = KernelCache(tmp_path)
    entry, _ = cache.get_or_build(parts(), "job", fake_build())
    evil = b"\x7fELF planted"
    (entry.path / "kernel.so").write_bytes(evil)
    meta = (entry.path / "meta.json").read_text()
    import hashlib
    meta = meta.replace(hashlib.sha256(PAYLOAD).hexdigest(), hashlib.sha256(evil).hexdigest())
    meta = meta.replace(f"{len(PAYLOAD)}", f"{len(evil)}")
    (entry.path / "meta.json").write_text(meta)
    target = {"entry folder 0777": entry.path, "library 0666": entry.path / "kernel.so",
              "meta 0666": entry.path / "meta.json"}[damage]
    os.chmod(target, 0o777 if target.is_dir() else 0o666)
    fresh = KernelCache(tmp_path)
    assert fresh.lookup(parts().key()) is None
    with pytest.warns(CacheTrustWarning, match="rebuilding it"):
        again, compiled = fresh.get_or_build(parts(), "job", fake_build())
    assert compiled and again.library.read_bytes() == PAYLOAD


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root (chown)")
def test_an_entry_file_owned_by_another_user_is_not_loaded(tmp_path):
    cache = KernelCache(tmp_path)
    entry, _ = cache.get_or_build(parts(), "job", fake_build())
    os.chown(entry.path / "kernel.so", 12345, 12345)
    with pytest.warns(CacheTrustWarning, match=r"owned by uid 12345"):
        again, compiled = KernelCache(tmp_path).get_or_build(parts(), "job", fake_build())
    assert compiled and os.stat(again.library).st_uid == os.geteuid()


def test_a_read_only_cache_pre_filled_by_root_serves_its_entries(tmp_path, monkeypatch):
    root = tmp_path / "system-cache"
    KernelCache(root).get_or_build(parts("int a;"), "prefilled", fake_build())
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(root)], check=True)
    before = sorted(str(p) for p in root.rglob("*"))
    as_another_user(monkeypatch, owner_is_root=True)
    cache = KernelCache(root)
    assert cache.trust().startswith("read-only")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry, compiled = cache.get_or_build(parts("int a;"), "prefilled", fake_build())
    assert not compiled and root in entry.path.parents
    with pytest.warns(CacheTrustWarning, match="read-only for you") as caught:
        other, compiled = cache.get_or_build(parts("int b;"), "missing", fake_build())
    assert compiled and root not in other.path.parents and "docs/security.md" in str(caught[0].message)
    assert sorted(str(p) for p in root.rglob("*")) == before       # nothing written into it
    assert cache.stats() == {"hits": 1, "misses": 1, "compilations": 1}


def test_the_core_folder_is_trusted_on_the_same_terms(tmp_path, monkeypatch):
    core = tmp_path / "core"
    core.mkdir()
    os.chmod(core, 0o777)
    monkeypatch.setenv("FLOWC_CORE_DIR", str(core))
    monkeypatch.setattr(core_library, "_key_parts", lambda: parts("core"))
    monkeypatch.setattr(core_library, "_build", fake_build(extra={"flowc_prelude.h.gch": b"pch"}))
    core_library._ensure_core.cache_clear()
    try:
        with pytest.warns(CacheTrustWarning, match=r"FLOWC_CORE_DIR"):
            built = core_library.ensure_core()
    finally:
        core_library._ensure_core.cache_clear()
    assert core not in built.library.parents and built.compiled


# --- the core folder's files are checksummed -----------------------------------------------------

@pytest.mark.parametrize("damage", ["truncate", "flip a byte"])
def test_a_damaged_precompiled_header_is_found_and_the_entry_rebuilt(tmp_path, damage):
    pch = b"precompiled header " * 100
    build = fake_build(extra={"flowc_prelude.h.gch": pch})
    entry, _ = KernelCache(tmp_path).get_or_build(parts(), "flowc_core", build, verify_all=True)
    gch = entry.path / "flowc_prelude.h.gch"
    data = bytearray(gch.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2:]
    else:
        data[7] ^= 1
    gch.write_bytes(bytes(data))
    again, compiled = KernelCache(tmp_path).get_or_build(parts(), "flowc_core", build, verify_all=True)
    assert compiled and (again.path / "flowc_prelude.h.gch").read_bytes() == pch


def test_loading_checks_the_headers_size_and_compiling_its_checksum(tmp_path):
    build = fake_build(extra={"flowc_prelude.h.gch": b"0123456789"})
    entry, _ = KernelCache(tmp_path).get_or_build(parts(), "flowc_core", build)
    (entry.path / "flowc_prelude.h.gch").write_bytes(b"0123456788")      # same size, other bytes
    assert KernelCache(tmp_path)._check(parts().key())[0] == "ok"
    assert KernelCache(tmp_path)._check(parts().key(), deep=True)[0].startswith("corrupt: flowc_prelude.h.gch")
    (entry.path / "flowc_prelude.h.gch").write_bytes(b"01234")
    assert "5 bytes" in KernelCache(tmp_path)._check(parts().key())[0]


@pytest.mark.slow
def test_a_truncated_real_precompiled_header_is_rebuilt_before_a_step_compiles(tmp_path, monkeypatch):
    from flowc.compiler.toolchain import build_shared_library
    monkeypatch.setenv("FLOWC_CORE_DIR", str(tmp_path / "core"))
    core_library._ensure_core.cache_clear()
    try:
        gch = core_library.ensure_core().include_dir / f"{core_library.PRELUDE}.gch"
        gch.write_bytes(gch.read_bytes()[:4096])
        core_library._ensure_core.cache_clear()             # as a new process would
        res = build_shared_library('extern "C" int answer() { return 42; }\n', name="answer",
                                   cache=KernelCache(tmp_path / "cache"))
    finally:
        core_library._ensure_core.cache_clear()
    assert res.compiled and res.path.is_file()


# --- templates load nothing from disk ------------------------------------------------------------

class _Planted:
    def __reduce__(self):
        return exec, ("import builtins; builtins._flowc_planted_ran = True",)


@pytest.mark.parametrize("content", ["planted code", "torn file"])
def test_templates_load_no_compiled_code_from_the_core_folder(tmp_path, monkeypatch, content):
    import jinja2
    from jinja2.bccache import bc_magic

    from flowc.compiler.codegen import templates
    core = tmp_path / "core"
    monkeypatch.setenv("FLOWC_CORE_DIR", str(core))
    name = "pointwise.cpp.j2"
    filename = templates.environment("cpu").loader.get_source(jinja2.Environment(), name)[1]
    planted = core / "templates" / f"__jinja2_{jinja2.FileSystemBytecodeCache().get_cache_key(name, filename)}.cache"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(bc_magic + (pickle.dumps(_Planted(), 2) if content == "planted code" else b"\x80\x02X"))
    os.chmod(core, 0o555)           # a read-only core folder: rendering must not try to write there
    try:
        templates.environment("cpu").get_template(name)
    finally:
        os.chmod(core, 0o755)
        ran = getattr(builtins, "_flowc_planted_ran", False)
        if ran:
            del builtins._flowc_planted_ran
    assert not ran
    assert [p.name for p in (core / "templates").iterdir()] == [planted.name]


def test_a_failed_compile_is_kept_where_this_process_builds_not_in_a_refused_root(tmp_path):
    from flowc.compiler.toolchain import ToolchainError, build_shared_library
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o1777)
    cache = KernelCache(root)
    with pytest.warns(CacheTrustWarning), pytest.raises(ToolchainError) as info:
        build_shared_library("this is not C++", name="broken", cache=cache)
    assert str(cache._fallback.root) in str(info.value) and not (root / "failed").exists()


def test_a_group_writable_prefix_folder_of_a_private_root_is_repaired_not_a_dead_end(tmp_path):
    cache = KernelCache(tmp_path)
    entry, _ = cache.get_or_build(parts(), "job", fake_build())
    os.chmod(entry.path.parent, 0o775)          # as an older flowc made it under umask 002
    with pytest.warns(CacheTrustWarning, match="writable by its group"):
        again, compiled = KernelCache(tmp_path).get_or_build(parts(), "job", fake_build())
    assert compiled and mode(again.path.parent) == 0o755
    assert KernelCache(tmp_path).lookup(parts().key()) is not None
