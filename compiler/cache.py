"""Content-addressed on-disk cache of compiled kernels.

Every compiled shared library lives in its own directory named by a SHA-256 key
over everything that can change the machine code: the generated source, the
full compiler command line, the compiler version, the flowc version, the CPU
target and the bytes of every header the source can include.  If any of those
change the key changes, so a stale entry can never be picked up after an
upgrade; a miss can say which part changed (:meth:`KernelCache.explain_miss`).

Layout under the cache root::

    <root>/<key[:2]>/<key>/kernel.cpp    the generated source, kept for reading
    <root>/<key[:2]>/<key>/kernel.so     the compiled library
    <root>/<key[:2]>/<key>/meta.json     key parts, size and sha256 of every file, timings

A CUDA entry holds ``kernel.cu`` and ``step.so`` instead (``CUDA_STEP_FILES``: the kernels
and the host step that launches them), or ``kernel.cubin`` for the per-launch path (``CUDA_FILES``);
meta.json names an entry's two files, so both kinds share one root, one
``info``/``list``/``clear`` and one locking scheme.  An entry may hold more
files (the core library's precompiled header); meta.json checksums them all.

    <root>/CACHEDIR.TAG, .flowc-cache   markers: a cache (for backup tools), flowc's (`clear` needs it)
    <root>/index/<name>.json             key parts of the last build of each name
    <root>/locks/<key>.lock, .use        flock files: building, in use (compiler/cache_locks.py)
    <root>/tmp/                          build folders (``build-<key>-<pid>-*``) before they are renamed in
    <root>/failed/                       sources of failed compiles, kept for users

flowc loads native code from here, so it uses a root only when no other user
could have written it: folders are created 0700, and a root or entry another
user owns, or that its group or others may write, is refused
(compiler/cache_trust.py says the rule and what happens instead).

This module knows nothing about compilers: :mod:`compiler.toolchain` computes
the key parts and passes a ``build`` callback to :meth:`KernelCache.get_or_build`.
It must not import anything GPU-related.

Example::

    >>> cache = KernelCache("/tmp/flowc-doc-cache")          # doctest: +SKIP
    >>> parts = make_key_parts(source="int f();", command="g++ ...",
    ...                        compiler_version="g++ 12", cpu_target="x86-64",
    ...                        include_dir=None)              # doctest: +SKIP
    >>> cache.key(parts)[:8]                                   # doctest: +SKIP
    '3f1c9a0e'
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from flowc.compiler import cache_locks, settings
from flowc.compiler.cache_trust import (CacheTrustWarning, is_writable, make_private_folder,
                                        private_fallback_folder, why_untrusted)

__all__ = [
    "CacheEntry",
    "CacheError",
    "CacheTrustWarning",
    "Cleared",
    "KernelCache",
    "KeyParts",
    "default_cache",
    "default_cache_dir",
    "hash_headers",
    "make_key_parts",
    "package_version",
    "stats",
]

# Used when flowc runs from a source checkout that was never pip-installed, so
# importlib.metadata has nothing to report.  Keep in step with setup.cfg.
FALLBACK_PACKAGE_VERSION = "0.1.0"

# Bumped when the on-disk layout or meta.json schema changes; part of every key
# so an old flowc and a new one never read each other's entries.
# 2: meta.json checksums every file of the entry (the core's precompiled header too).
CACHE_FORMAT = 2

SOURCE_FILE = "kernel.cpp"
LIBRARY_FILE = "kernel.so"
META_FILE = "meta.json"
# (source, artifact) file names of an entry: the default is the CPU pair above.
CPU_FILES = (SOURCE_FILE, LIBRARY_FILE)
CUDA_FILES = ("kernel.cu", "kernel.cubin")
CUDA_STEP_FILES = ("kernel.cu", "step.so")     # the kernels and their host step (flowc_step) in one library

# The markers of a cache root flowc made (https://bford.info/cachedir/ for the first).
CACHEDIR_TAG = "CACHEDIR.TAG"
CACHEDIR_TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                     "# This file is a cache directory tag created by flowc.\n"
                     "# For information about cache directory tags, see https://bford.info/cachedir/\n")
MARKER_FILE = ".flowc-cache"
MARKER_TEXT = ("flowc made this folder for its kernel cache; `flowc cache clear` removes only what flowc "
               "made here, and only from folders that hold this file.\n")
# Tries at moving a new entry into its prefix folder, which a concurrent `clear` may remove when empty.
_RENAME_ATTEMPTS = 10
_TMP_NAME = re.compile(r"(build|trash)-([0-9a-f]{64})-")
_FAILED_NAME = re.compile(r".+-([0-9a-f]{16})")
# The folders of a cache root besides its entries, and the names flowc gives what it puts in them
# (tmp/: also the "build-<key[:12]>-" of flowc 0.1; templates/: flowc 0.1's compiled templates).
_OWN_FOLDERS = {
    "tmp": re.compile(r"(build|trash)-[0-9a-f]{12}.*"),
    "locks": re.compile(r"[0-9a-f]{64}\.(lock|use)"),
    "index": re.compile(r".+\.json"),
    "failed": _FAILED_NAME,
    "templates": re.compile(r"__jinja2_[0-9a-f]+\.cache"),
}

HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inc")

# Human names of the key parts, in the order explain_miss reports them.
_PART_LABELS = {
    "source_sha256": "source",
    "command": "command",
    "compiler_version": "compiler version",
    "package_version": "package version",
    "cpu_target": "cpu target",
    "headers": "headers",
}


class CacheError(RuntimeError):
    """Raised for cache misuse (e.g. an unusable cache root)."""


def default_cache_dir() -> Path:
    """Return the cache root: ``$FLOWC_CACHE_DIR`` if set, else ``~/.cache/flowc``.

    Example::

        >>> settings.set_cache_dir("/tmp/fc")          # doctest: +SKIP
        >>> default_cache_dir()                          # doctest: +SKIP
        PosixPath('/tmp/fc')
    """
    return settings.cache_dir()


def package_version() -> str:
    """Return the installed flowc version, or the source-tree fallback.

    Example::

        >>> package_version()   # doctest: +SKIP
        '0.1.0'
    """
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8 is not supported anyway
        return FALLBACK_PACKAGE_VERSION
    try:
        return version("flowc")
    except PackageNotFoundError:
        return FALLBACK_PACKAGE_VERSION


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_headers(include_dir: Path | None) -> tuple[tuple[str, str], ...]:
    """Return ``((relative name, sha256), ...)`` for every header under ``include_dir``.

    Hashing the contents (not mtimes) means editing a header invalidates every
    entry that might include it, while a fresh checkout with identical headers
    still hits.

    Example::

        >>> hash_headers(Path("codegen_templates/cpu"))   # doctest: +SKIP
        (('flowc_runtime.h', '9b2c...'),)
    """
    if include_dir is None or not include_dir.is_dir():
        return ()
    out = []
    for path in sorted(include_dir.rglob("*")):
        if path.is_file() and path.suffix in HEADER_SUFFIXES:
            out.append((path.relative_to(include_dir).as_posix(), _sha256_file(path)))
    return tuple(out)


@dataclass(frozen=True)
class KeyParts:
    """Everything that goes into a cache key, kept separately so a miss can be explained.

    The source is stored by digest: the index files stay small and the key is
    the same as hashing the full text.

    Example::

        >>> parts = make_key_parts(source="int x;", command="g++ $SRC -o $OUT",
        ...     compiler_version="g++ 12", cpu_target="skylake", include_dir=None)
        >>> parts.source_sha256 == hashlib.sha256(b"int x;").hexdigest()
        True
    """

    source_sha256: str
    command: str
    compiler_version: str
    package_version: str
    cpu_target: str
    headers: tuple[tuple[str, str], ...]

    def to_json(self) -> dict:
        """Return a JSON-ready dict (headers as a name -> sha256 mapping)."""
        d = dataclasses.asdict(self)
        d["headers"] = dict(self.headers)
        return d

    @classmethod
    def from_json(cls, data: dict) -> KeyParts:
        """Inverse of :meth:`to_json`; raises KeyError/TypeError on malformed input."""
        return cls(
            source_sha256=str(data["source_sha256"]),
            command=str(data["command"]),
            compiler_version=str(data["compiler_version"]),
            package_version=str(data["package_version"]),
            cpu_target=str(data["cpu_target"]),
            headers=tuple(sorted((str(k), str(v)) for k, v in dict(data["headers"]).items())),
        )

    def key(self) -> str:
        """Return the SHA-256 hex key of these parts."""
        blob = json.dumps({"format": CACHE_FORMAT, **self.to_json()}, sort_keys=True)
        return _sha256_bytes(blob.encode("utf-8"))


def make_key_parts(
    *,
    source: str,
    command: str,
    compiler_version: str,
    cpu_target: str,
    include_dir: Path | None,
    package_version_: str | None = None,
) -> KeyParts:
    """Build :class:`KeyParts` from raw inputs.

    ``command`` must already have the source/output paths replaced by fixed
    placeholders, so the key does not depend on temporary file names.

    Example::

        >>> p = make_key_parts(source="int x;", command="g++ -O3 $SRC -o $OUT",
        ...     compiler_version="g++ 12.2.0", cpu_target="znver3", include_dir=None)
        >>> len(p.key())
        64
    """
    return KeyParts(
        source_sha256=_sha256_bytes(source.encode("utf-8")),
        command=command,
        compiler_version=compiler_version,
        package_version=package_version_ if package_version_ is not None else package_version(),
        cpu_target=cpu_target,
        headers=hash_headers(include_dir),
    )


@dataclass(frozen=True)
class CacheEntry:
    """One valid entry on disk.

    ``size`` is the total bytes of the entry directory, ``age`` seconds since
    it was created.
    """

    key: str
    name: str
    path: Path
    size: int
    age: float
    files: tuple[str, str] = CPU_FILES     # (source, artifact) names, from meta.json

    @property
    def library(self) -> Path:
        """Path of the compiled artifact (``kernel.so``, or ``kernel.cubin`` for CUDA)."""
        return self.path / self.files[1]

    @property
    def source(self) -> Path:
        """Path of the generated source the artifact was compiled from."""
        return self.path / self.files[0]


def _safe_name(name: str) -> str:
    # Names come from user job functions; keep them usable as file names.
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "kernel"
    return cleaned[:100]


def _entry_files(meta: dict) -> tuple[str, str]:
    """The (source, artifact) file names meta.json records; the CPU pair when it records none."""
    files = meta.get("files")
    if isinstance(files, list) and len(files) == 2 and all(isinstance(f, str) and "/" not in f for f in files):
        return files[0], files[1]
    return CPU_FILES


def _write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class Cleared:
    """What :meth:`KernelCache.clear` did: entries removed, and entries kept because a process uses them."""

    removed: int
    in_use: int


class KernelCache:
    """A content-addressed directory of compiled kernels, safe across processes.

    Counters ``hits``, ``misses`` and ``compilations`` count this process's
    activity on this object: a hit is an entry served from disk (including one
    another process finished while we waited for its lock), a miss is a lookup
    that had to build, and ``compilations`` counts builds that succeeded.

    The root is used only when it is trusted (compiler/cache_trust.py): a root
    another user could write is refused with a `CacheTrustWarning`, and this
    object then builds into a private temporary folder; a trusted root this user
    may not write (a read-only cache pre-filled by root) serves its entries, and
    what it lacks is built into such a folder.  ``setting`` names the variable
    that chooses the root, for messages.

    Example::

        >>> cache = KernelCache(tmp_path)                        # doctest: +SKIP
        >>> entry, built = cache.get_or_build(parts, "answer", build_fn)   # doctest: +SKIP
        >>> cache.hits, cache.misses, cache.compilations         # doctest: +SKIP
        (0, 1, 1)
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, setting: str = "FLOWC_CACHE_DIR") -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.setting = setting
        self.hits = 0
        self.misses = 0
        self.compilations = 0
        # (key, file name) -> (st_size, st_mtime_ns, st_ino) of a file whose sha256 we
        # already checked; lets repeated lookups skip re-hashing while still noticing a
        # truncated or replaced file.
        self._verified: dict[tuple[str, str], tuple[int, int, int]] = {}
        # name -> key last written to the index by this process.
        self._indexed: dict[str, str] = {}
        self._prepare_lock = threading.Lock()
        self._prepared = False
        self._refused: str | None = None        # why the root is not trusted, once checked
        self._writable = False                  # may this process write into the root?
        self._fallback: KernelCache | None = None
        self._told_read_only = False
        self._made_here = False                 # a fallback: this process made the root with mkdtemp

    @classmethod
    def _private(cls, setting: str) -> KernelCache:
        """A cache in a new temporary folder only this user can read (the fallback of a refused root)."""
        cache = cls(private_fallback_folder("cache"), setting=setting)
        cache._made_here = True      # trusted by construction: never check it (nor fall back from it)
        return cache

    # ------------------------------------------------------------------ paths
    def entry_dir(self, key: str) -> Path:
        """Directory that holds (or would hold) the entry for ``key``."""
        return self.root / key[:2] / key

    def _lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def _use_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.use"

    def _index_path(self, name: str) -> Path:
        return self.root / "index" / f"{_safe_name(name)}.json"

    def failed_dir(self, name: str, key: str) -> Path:
        """A fresh directory where the toolchain keeps sources of failed compiles.

        Example::

            >>> cache.failed_dir("train_job", key)   # doctest: +SKIP
            PosixPath('/root/.cache/flowc/failed/train_job-3f1c9a0e1b2c4d5e')
        """
        self._prepare()
        if self._refused is not None or not self._writable:      # kept where this process builds
            if self._fallback is None:
                self._fallback = KernelCache._private(self.setting)
            return self._fallback.failed_dir(name, key)
        path = self.root / "failed" / f"{_safe_name(name)}-{key[:16]}"
        make_private_folder(path.parent)
        make_private_folder(path)
        return path

    # ------------------------------------------------------------ the root
    def _prepare(self) -> None:
        """Once per object: create the root (0700), check it may be trusted, mark it, sweep leftovers."""
        with self._prepare_lock:
            if self._prepared:
                return
            try:
                make_private_folder(self.root)
                st = os.stat(self.root)
            except OSError as e:
                raise CacheError(
                    f"cannot create the flowc kernel cache at {self.root}: {e}; "
                    f"set {self.setting} to a writable directory"
                ) from e
            self._refused = None if self._made_here else why_untrusted(st)
            self._writable = self._made_here or (self._refused is None and is_writable(st))
            if self._refused is not None:
                self._fallback = KernelCache._private(self.setting)
                warnings.warn(CacheTrustWarning(
                    f"flowc: not using the cache {self.root}: it is {self._refused}, so another user could "
                    f"have put code there that flowc would load. This process builds into a private "
                    f"temporary cache instead ({self._fallback.root}), so nothing is reused across runs. "
                    f"Fix: make the folder yours and private (`chown $USER {self.root} && chmod 700 "
                    f"{self.root}`), or set {self.setting} to a folder of your own."), stacklevel=4)
            elif self._writable:
                try:
                    for sub in ("tmp", "locks", "index"):
                        make_private_folder(self.root / sub)
                except OSError as e:
                    raise CacheError(
                        f"cannot create the flowc kernel cache at {self.root}: {e}; "
                        f"set {self.setting} to a writable directory"
                    ) from e
                self._adopt()
                self._sweep_tmp()
            self._prepared = True

    def _adopt(self) -> None:
        # The marker says "flowc made this folder": `clear` refuses a folder without it.  A folder
        # that holds anything flowc does not make is used, but not marked (so never cleared).
        if (self.root / MARKER_FILE).exists():
            return
        if all(self._made_by_flowc(name) for name in os.listdir(self.root)):
            (self.root / CACHEDIR_TAG).write_text(CACHEDIR_TAG_TEXT)
            (self.root / MARKER_FILE).write_text(MARKER_TEXT)

    def _made_by_flowc(self, name: str) -> bool:
        """Could flowc (this one or an older one, without markers) have made `name` in the root?"""
        path = self.root / name
        if (path / MARKER_FILE).is_file():          # a nested cache (the tests keep the core inside)
            return True
        if name in (CACHEDIR_TAG, MARKER_FILE):
            return path.is_file()
        if len(name) == 2 and _is_hex(name):
            children = re.compile(name + "[0-9a-f]{62}")
        elif name in _OWN_FOLDERS:
            children = _OWN_FOLDERS[name]
        else:
            return False
        return path.is_dir() and all(children.fullmatch(child) for child in os.listdir(path))

    def _via_fallback(self, call: Callable[[KernelCache], tuple[CacheEntry, bool]]) -> tuple[CacheEntry, bool]:
        assert self._fallback is not None
        fallback = self._fallback
        before = fallback.stats()
        try:
            return call(fallback)
        finally:
            for counter, value in fallback.stats().items():
                setattr(self, counter, getattr(self, counter) + value - before[counter])

    def _tell_read_only(self, name: str) -> None:
        """Make the fallback for what a read-only root lacks; say so once."""
        if self._fallback is None:
            self._fallback = KernelCache._private(self.setting)
        if not self._told_read_only:
            self._told_read_only = True
            owner = _owner_words(self.root)
            warnings.warn(CacheTrustWarning(
                f"flowc: the cache {self.root} is read-only for you (it belongs to {owner}) and lacks "
                f"{name!r}; this process builds what it lacks into a private temporary cache "
                f"({self._fallback.root}). Pre-fill the shared cache with this job (docs/security.md), or "
                f"set {self.setting} to a folder of your own."), stacklevel=4)

    # ------------------------------------------------------------------- keys
    @staticmethod
    def key(parts: KeyParts) -> str:
        """Return the cache key of ``parts`` (same as ``parts.key()``)."""
        return parts.key()

    # ----------------------------------------------------------- validation
    def _read_meta(self, key: str) -> dict | None:
        try:
            with open(self.entry_dir(key) / META_FILE) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def _check(self, key: str, deep: bool = False) -> tuple[str, CacheEntry | None]:
        """Return ``("ok", entry)``, ``("missing", None)``, ``("corrupt: why", None)`` or ``("untrusted: why", None)``.

        Every file the entry holds must be a plain file of the size meta.json records, trusted
        (cache_trust.py); the artifact's sha256 is checked too, and with ``deep`` every file's
        (the core's precompiled header, before a compile reads it).
        """
        d = self.entry_dir(key)
        for folder in (d.parent, d):
            try:
                st = os.lstat(folder)
            except FileNotFoundError:
                return "missing", None
            except OSError as e:
                return f"corrupt: {folder}: {e.strerror}", None
            if not stat.S_ISDIR(st.st_mode):
                return f"corrupt: {folder} is not a folder", None
            why = self._distrust(st)
            if why is not None:
                return f"untrusted: {folder} is {why}", None
        status = self._check_file(d / META_FILE, None, None, key, False)
        if status is not None:
            return status, None
        meta = self._read_meta(key)
        if meta is None:
            return "corrupt: meta.json missing or unparsable", None
        if meta.get("key") != key:
            return "corrupt: meta.json belongs to another key", None
        files = _entry_files(meta)
        checksums = meta.get("checksums")
        if not isinstance(checksums, dict) or not set(files) <= set(checksums):
            return "corrupt: meta.json lists no checksums of the entry's files", None
        size = (d / META_FILE).stat().st_size
        for file_name, recorded in sorted(checksums.items()):
            if not (isinstance(file_name, str) and "/" not in file_name and isinstance(recorded, list)
                    and len(recorded) == 2 and isinstance(recorded[0], int) and isinstance(recorded[1], str)):
                return "corrupt: meta.json's checksums are malformed", None
            recorded_size, recorded_sha256 = recorded
            status = self._check_file(d / file_name, recorded_size, recorded_sha256, key,
                                      deep or file_name == files[1])
            if status is not None:
                return status, None
            size += int(recorded_size)
        created = float(meta.get("created", 0.0))
        entry = CacheEntry(key=key, name=str(meta.get("name", "")), path=d, size=size,
                           age=max(0.0, time.time() - created), files=files)
        return "ok", entry

    def _check_file(self, path: Path, size: int | None, sha256: str | None, key: str, hash_it: bool) -> str | None:
        """None when `path` is a trusted plain file of `size` bytes (and `sha256`, when `hash_it`); else why not."""
        try:
            st = os.lstat(path)
        except OSError:
            return f"corrupt: {path.name} missing"
        if not stat.S_ISREG(st.st_mode):
            return f"corrupt: {path.name} is not a plain file"
        why = self._distrust(st)
        if why is not None:
            return f"untrusted: {path} is {why}"
        if size is not None and st.st_size != size:
            return f"corrupt: {path.name} is {st.st_size} bytes, meta.json says {size}"
        sig = (st.st_size, st.st_mtime_ns, st.st_ino)
        if hash_it and self._verified.get((key, path.name)) != sig:
            if _sha256_file(path) != sha256:
                return f"corrupt: {path.name} sha256 does not match meta.json"
            self._verified[(key, path.name)] = sig
        return None

    def _distrust(self, st: os.stat_result) -> str | None:
        # Nobody but this user (and root) can put anything into a 0700 folder this process made.
        return None if self._made_here else why_untrusted(st)

    def lookup(self, key: str) -> CacheEntry | None:
        """Return the valid entry for ``key`` or None; does not touch counters or repair.

        None too when the root is not trusted (nothing is read from it).

        Example::

            >>> cache.lookup("0" * 64) is None   # doctest: +SKIP
            True
        """
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        if why_untrusted(st) is not None:
            return None
        return self._check(key)[1]

    def _remove_entry(self, key: str) -> None:
        # Rename first so other processes see the entry vanish in one step
        # rather than half-deleted; then delete at leisure.  A process that has
        # the old .so mapped keeps working because the inode lives on.  The
        # caller holds the key's lock, which keeps the sweep off the trash folder.
        d = self.entry_dir(key)
        if not os.path.lexists(d):
            return
        trash = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix=f"trash-{key}-{os.getpid()}-"))
        try:
            os.rename(d, trash / key)
        except FileNotFoundError:
            pass
        except OSError as e:
            shutil.rmtree(trash, ignore_errors=True)
            raise CacheError(f"cannot remove the damaged or untrusted cache entry {d}: {e}; remove it "
                             f"by hand, or set {self.setting} to a folder of your own") from e
        shutil.rmtree(trash, ignore_errors=True)
        for name in [n for (k, n) in self._verified if k == key]:
            self._verified.pop((key, name), None)

    # ---------------------------------------------------------------- locking
    def _locked(self, key: str, what: str) -> contextlib.AbstractContextManager[None]:
        # Lock files are never deleted: deleting one while in use would let two
        # processes hold "the" lock on different inodes.
        return cache_locks.exclusive(self._lock_path(key), what)

    # ------------------------------------------------------------------ build
    def get_or_build(
        self,
        parts: KeyParts,
        name: str,
        build: Callable[[Path], None],
        *,
        source: str | None = None,
        files: tuple[str, str] = CPU_FILES,
        verify_all: bool = False,
    ) -> tuple[CacheEntry, bool]:
        """Return ``(entry, compiled)`` for ``parts``, building it if needed.

        ``build(tmpdir)`` must leave the two ``files`` (source, artifact;
        ``kernel.cpp`` and ``kernel.so`` unless told otherwise, e.g.
        ``CUDA_FILES``) in ``tmpdir``, and may leave more (the core's
        precompiled header); if it raises, the temporary directory is
        removed and the exception propagates.  When ``source`` is given and
        ``build`` did not write the source file, it is written for it.
        ``verify_all`` checks the sha256 of every file of a found entry, not
        only of its artifact.  The entry stays pinned while this process runs
        (compiler/cache_locks.py), so `clear` leaves it in place.

        Example::

            >>> def build(d): compile_to(d / "kernel.cpp", d / "kernel.so")   # doctest: +SKIP
            >>> entry, compiled = cache.get_or_build(parts, "answer", build)     # doctest: +SKIP
        """
        self._prepare()
        if self._refused is not None:
            return self._via_fallback(lambda fallback: fallback.get_or_build(
                parts, name, build, source=source, files=files, verify_all=verify_all))
        key = parts.key()
        what = f"cache entry {key[:16]} ({name!r}) in {self.root}"
        if self._writable:
            _PINS.pin(self._use_path(key), what)
        status, entry = self._check(key, verify_all)
        if entry is not None:
            self.hits += 1
            self._record_index(name, key, parts)
            return entry, False
        if status.startswith("untrusted"):
            warnings.warn(CacheTrustWarning(f"flowc: ignored the cache entry {self.entry_dir(key)} of {name!r}: "
                                            f"{status.removeprefix('untrusted: ')}; "
                                            f"{'rebuilding it' if self._writable else 'building it elsewhere'}"),
                          stacklevel=2)
        if not self._writable:
            self._tell_read_only(name)
            return self._via_fallback(lambda fallback: fallback.get_or_build(
                parts, name, build, source=source, files=files, verify_all=verify_all))

        with self._locked(key, what):
            # Another process may have finished (or repaired) it while we waited.
            status, entry = self._check(key, verify_all)
            if entry is not None:
                self.hits += 1
                self._record_index(name, key, parts)
                return entry, False
            if status != "missing":
                self._remove_entry(key)
            self.misses += 1
            entry = self._build_locked(key, parts, name, build, source, files)
        self.compilations += 1
        self._record_index(name, key, parts)
        return entry, True

    def _build_locked(
        self,
        key: str,
        parts: KeyParts,
        name: str,
        build: Callable[[Path], None],
        source: str | None,
        files: tuple[str, str] = CPU_FILES,
    ) -> CacheEntry:
        # The temp dir is inside the root so the final os.rename stays on one
        # filesystem and is atomic.  Its name carries the key (whose lock we hold:
        # the sweep of leftovers takes that lock first) and our pid, for people.
        tmp: Path | None = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix=f"build-{key}-{os.getpid()}-"))
        assert tmp is not None
        try:
            t0 = time.perf_counter()
            build(tmp)
            seconds = time.perf_counter() - t0
            source_file, library_file = files
            if source is not None and not (tmp / source_file).exists():
                (tmp / source_file).write_text(source)
            so = tmp / library_file
            if not so.is_file():
                raise CacheError(f"build callback for {name!r} did not produce {library_file}")
            meta = {
                "format": CACHE_FORMAT,
                "key": key,
                "name": name,
                "parts": parts.to_json(),
                "so_sha256": _sha256_file(so),
                "so_size": so.stat().st_size,
                "checksums": _seal(tmp),
                "created": time.time(),
                "compile_seconds": round(seconds, 6),
            }
            if files != CPU_FILES:      # old entries have no names: they are the CPU pair
                meta["files"] = list(files)
            _write_json_atomic(tmp / META_FILE, meta)
            os.chmod(tmp / META_FILE, 0o644)
            final = self.entry_dir(key)
            for attempt in range(_RENAME_ATTEMPTS):
                try:
                    make_private_folder(final.parent)
                    _take_write_from_others(final.parent)
                    os.rename(tmp, final)
                except FileNotFoundError:
                    # `clear` removed the empty prefix folder meanwhile: make it again.
                    if attempt == _RENAME_ATTEMPTS - 1:
                        raise
                    continue
                except OSError:
                    # Only possible if a process that ignored the lock (or an older
                    # flowc) got there first; its entry is as good as ours.
                    if not final.is_dir():
                        raise
                else:
                    tmp = None
                break
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        status, entry = self._check(key)
        if entry is None:
            raise CacheError(f"cache entry {key} is unusable right after building it ({status})")
        return entry

    # ------------------------------------------------------------ index/miss
    def _record_index(self, name: str, key: str, parts: KeyParts) -> None:
        # Hits are the hot path: skip the (fsynced) write when this process
        # already recorded the same key for this name.
        if self._indexed.get(name) == key or not self._writable:
            return
        try:
            _write_json_atomic(self._index_path(name),
                               {"name": name, "key": key, "parts": parts.to_json(),
                                "time": time.time()})
            self._indexed[name] = key
        except OSError:
            # The index only serves explanations; never fail a build over it.
            pass

    def last_parts(self, name: str) -> KeyParts | None:
        """Key parts of the last build recorded for ``name``, or None."""
        try:
            with open(self._index_path(name)) as f:
                return KeyParts.from_json(json.load(f)["parts"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def explain_miss(self, name: str, parts: KeyParts) -> str:
        """Say which key parts changed since the last build of ``name``.

        Call it before building: a build records ``parts`` as the new last
        build.

        Example::

            >>> cache.explain_miss("train_job", new_parts)   # doctest: +SKIP
            "cache miss for 'train_job': source changed since the last build"
        """
        if self._refused is not None and self._fallback is not None:     # nothing is read from a refused root
            return self._fallback.explain_miss(name, parts)
        old = self.last_parts(name)
        if old is None:
            return f"cache miss for {name!r}: no previous build of this name in {self.root}"
        changed = []
        for field, label in _PART_LABELS.items():
            a, b = getattr(old, field), getattr(parts, field)
            if a == b:
                continue
            if field == "headers":
                da, db = dict(a), dict(b)
                names = sorted(n for n in set(da) | set(db) if da.get(n) != db.get(n))
                changed.append(f"headers ({', '.join(names)})")
            elif field in ("compiler_version", "package_version", "cpu_target"):
                changed.append(f"{label} ({a!r} -> {b!r})")
            else:
                changed.append(label)
        if not changed:
            status, _ = self._check(parts.key())
            if status == "ok":
                return f"no miss for {name!r}: the entry is in the cache"
            return (f"cache miss for {name!r}: key parts unchanged since the last build, "
                    f"but the entry is {status} (cache cleared or damaged)")
        return f"cache miss for {name!r}: {', '.join(changed)} changed since the last build"

    # -------------------------------------------------------------- admin
    def _entry_dirs(self) -> Iterator[Path]:
        if not self.root.is_dir():
            return
        for prefix in sorted(self.root.iterdir()):
            if len(prefix.name) == 2 and _is_hex(prefix.name) and prefix.is_dir() and not prefix.is_symlink():
                for d in sorted(prefix.iterdir()):
                    if d.name.startswith(prefix.name) and len(d.name) == 64 and _is_hex(d.name) and d.is_dir():
                        yield d

    def entries(self) -> list[CacheEntry]:
        """Return all valid entries (corrupt ones are skipped, not removed).

        Example::

            >>> [(e.name, e.size) for e in cache.entries()]   # doctest: +SKIP
            [('answer', 16152)]
        """
        out = []
        for d in self._entry_dirs():
            entry = self._check(d.name)[1]
            if entry is not None:
                out.append(entry)
        return out

    def recorded_parts(self) -> list[tuple[str, KeyParts, float]]:
        """(key, key parts, creation time) of every entry as its meta.json records them, without
        checking the entry's files (cheap: `lookup` the key to use one).  Entries whose parts do not
        parse or do not hash to their own key are left out: no key could ask for them.

        Example::

            >>> [p.compiler_version for _, p, _ in cache.recorded_parts()]   # doctest: +SKIP
            ['Cuda compilation tools, release 13.0, V13.0.88; Build ...']
        """
        out = []
        for d in self._entry_dirs():
            meta = self._read_meta(d.name) or {}
            try:
                parts = KeyParts.from_json(meta["parts"])
                created = float(meta.get("created", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            if parts.key() == d.name:
                out.append((d.name, parts, created))
        return out

    def trust(self) -> str:
        """In words, whether flowc uses this root: private, read-only (pre-filled), refused (and why), or absent."""
        try:
            st = os.stat(self.root)
        except OSError:
            return "absent (made private, mode 0700, at the first build)"
        why = why_untrusted(st)
        if why is not None:
            return f"refused: {why}"
        return "private" if is_writable(st) else f"read-only (owned by {_owner_words(self.root)})"

    def info(self) -> dict:
        """Summary for ``flowc cache info``: root, whether it is trusted, entry count, bytes, counters.

        Example::

            >>> cache.info()["entries"]   # doctest: +SKIP
            3
        """
        entries = self.entries()
        return {
            "root": str(self.root),
            "trust": self.trust(),
            "entries": len(entries),
            "bytes": sum(e.size for e in entries),
            "hits": self.hits,
            "misses": self.misses,
            "compilations": self.compilations,
        }

    def stats(self) -> dict[str, int]:
        """This process's counters as a dict."""
        return {"hits": self.hits, "misses": self.misses, "compilations": self.compilations}

    def clear(self) -> Cleared:
        """Delete what this cache made -- entries, index, failed sources, leftover temp folders -- if idle.

        Refuses (CacheError) a folder without flowc's marker file or not owned by this user, so a
        mistyped ``--cache-dir`` deletes nothing.  An entry that a running process (this one
        included) was handed or builds now is kept and counted in ``in_use`` (compiler/cache_locks.py);
        so is a build folder in use.  Lock files are kept: removing one while another process holds
        it would break mutual exclusion.

        Example::

            >>> cache.clear()   # doctest: +SKIP
            Cleared(removed=3, in_use=0)
        """
        self._refuse_to_clear_unless_ours()
        removed = in_use = 0
        make_private_folder(self.root / "tmp")
        make_private_folder(self.root / "locks")
        for d in list(self._entry_dirs()):
            if self._remove_if_idle(d.name):
                removed += 1
            else:
                in_use += 1
        for prefix in self.root.iterdir():
            if len(prefix.name) == 2 and _is_hex(prefix.name) and prefix.is_dir():
                with contextlib.suppress(OSError):
                    prefix.rmdir()
        self._clear_index()
        self._clear_failed()
        self._sweep_tmp()
        _clear_legacy_templates(self.root / "templates")
        self._verified.clear()
        self._indexed.clear()
        return Cleared(removed=removed, in_use=in_use)

    def _refuse_to_clear_unless_ours(self) -> None:
        if not (self.root / MARKER_FILE).is_file():
            raise CacheError(f"{self.root} is not a flowc cache (it has no {MARKER_FILE} marker file, which flowc "
                             f"writes into the caches it creates); nothing was removed. Check the folder you "
                             f"named ({self.setting}, --cache-dir).")
        if not is_writable(os.stat(self.root)):
            raise CacheError(f"{self.root} belongs to {_owner_words(self.root)}, not to you; nothing was "
                             f"removed. Only its owner can clear it.")

    def _remove_if_idle(self, key: str) -> bool:
        # The key's lock: nobody builds or repairs it now; its .use lock: no running process was handed it.
        with cache_locks.try_exclusive(self._lock_path(key)) as not_building:
            if not not_building:
                return False
            with cache_locks.try_exclusive(self._use_path(key)) as unused:
                if not unused:
                    return False
                self._remove_entry(key)
        return True

    def _clear_index(self) -> None:
        # Only the files flowc writes there: "<name>.json" and its ".tmp-*.json" partners.
        index = self.root / "index"
        if not index.is_dir():
            return
        for path in index.iterdir():
            if path.suffix == ".json" and path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.unlink()

    def _clear_failed(self) -> None:
        # "<name>-<key[:16]>" folders; one whose key a process holds (it is writing there) is kept.
        failed = self.root / "failed"
        if not failed.is_dir():
            return
        locks = [p.name[:-len(".lock")] for p in (self.root / "locks").glob("*.lock")]
        for path in failed.iterdir():
            match = _FAILED_NAME.fullmatch(path.name)
            if match is None or not path.is_dir() or path.is_symlink():
                continue
            keys = [k for k in locks if k.startswith(match.group(1))]
            with contextlib.ExitStack() as held:
                if all(held.enter_context(cache_locks.try_exclusive(self._lock_path(k))) for k in keys):
                    shutil.rmtree(path, ignore_errors=True)

    def _sweep_tmp(self) -> None:
        """Remove build and trash folders under tmp/ that no process uses: their key's lock is free.

        A process that dies while building leaves its folder behind (the kernel drops its lock);
        the next process to open the cache removes it.
        """
        tmp = self.root / "tmp"
        if not tmp.is_dir():
            return
        for path in tmp.iterdir():
            match = _TMP_NAME.match(path.name)
            if match is None or path.is_symlink():
                continue
            with cache_locks.try_exclusive(self._lock_path(match.group(2))) as idle:
                if idle:
                    shutil.rmtree(path, ignore_errors=True)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _owner_words(path: Path) -> str:
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "nobody (it is gone)"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _take_write_from_others(folder: Path) -> None:
    # A prefix folder an older flowc made under a umask of 002 is group-writable, and _check would
    # refuse every entry in it.  Inside a private root only this user could have written it, so
    # fixing its mode is safe; one another user owns stays as it is (and _check refuses it).
    st = os.stat(folder)
    if is_writable(st) and st.st_mode & 0o022:
        os.chmod(folder, stat.S_IMODE(st.st_mode) & ~0o022)


def _seal(folder: Path) -> dict[str, list]:
    """Strip group/other write from every file of a new entry and return ``{name: [size, sha256]}``."""
    out: dict[str, list] = {}
    for path in sorted(folder.iterdir()):
        if path.name == META_FILE:
            continue
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"a build left {path.name} in its folder, which is not a plain file; "
                             "a cache entry holds plain files only")
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)   # the umask may have left them group-writable
        out[path.name] = [st.st_size, _sha256_file(path)]
    return out


def _clear_legacy_templates(folder: Path) -> None:
    # flowc up to 0.1 kept Jinja2's compiled templates in the core folder (compiler/codegen/templates.py
    # no longer does): remove exactly those files.
    if not folder.is_dir() or folder.is_symlink():
        return
    for path in folder.glob("__jinja2_*.cache"):
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


# The entries this process was handed, whichever cache object handed them out.
_PINS = cache_locks.Pins()

_default_caches: dict[Path, KernelCache] = {}


def default_cache() -> KernelCache:
    """Return the process-wide cache for :func:`default_cache_dir`.

    One object per root, so counters survive repeated calls while a changed
    ``FLOWC_CACHE_DIR`` still takes effect.

    Example::

        >>> default_cache().root == default_cache_dir()   # doctest: +SKIP
        True
    """
    root = default_cache_dir()
    cache = _default_caches.get(root)
    if cache is None:
        cache = _default_caches[root] = KernelCache(root)
    return cache


def stats() -> dict[str, int]:
    """Counters (hits, misses, compilations) of the default cache in this process.

    Example::

        >>> stats()   # doctest: +SKIP
        {'hits': 0, 'misses': 1, 'compilations': 1}
    """
    return default_cache().stats()
