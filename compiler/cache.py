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
    <root>/<key[:2]>/<key>/meta.json     key parts, sha256 and size of the .so, timings

A CUDA entry holds ``kernel.cu`` and ``kernel.cubin`` instead (``CUDA_FILES``);
meta.json names an entry's two files, so both kinds share one root, one
``info``/``list``/``clear`` and one locking scheme.
    <root>/index/<name>.json             key parts of the last build of each name
    <root>/locks/<key>.lock              one flock file per key
    <root>/tmp/                          build directories before they are renamed in
    <root>/failed/                       sources of failed compiles, kept for users

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
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from flowc.compiler import settings

__all__ = [
    "CacheEntry",
    "CacheError",
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
CACHE_FORMAT = 1

SOURCE_FILE = "kernel.cpp"
LIBRARY_FILE = "kernel.so"
META_FILE = "meta.json"
# (source, artifact) file names of an entry: the default is the CPU pair above.
CPU_FILES = (SOURCE_FILE, LIBRARY_FILE)
CUDA_FILES = ("kernel.cu", "kernel.cubin")

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


class KernelCache:
    """A content-addressed directory of compiled kernels, safe across processes.

    Counters ``hits``, ``misses`` and ``compilations`` count this process's
    activity on this object: a hit is an entry served from disk (including one
    another process finished while we waited for its lock), a miss is a lookup
    that had to build, and ``compilations`` counts builds that succeeded.

    Example::

        >>> cache = KernelCache(tmp_path)                        # doctest: +SKIP
        >>> entry, built = cache.get_or_build(parts, "answer", build_fn)   # doctest: +SKIP
        >>> cache.hits, cache.misses, cache.compilations         # doctest: +SKIP
        (0, 1, 1)
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.compilations = 0
        # key -> (st_size, st_mtime_ns, st_ino) of a .so whose sha256 we already
        # checked; lets repeated lookups skip re-hashing while still noticing a
        # truncated or replaced file.
        self._verified: dict[str, tuple[int, int, int]] = {}
        # name -> key last written to the index by this process.
        self._indexed: dict[str, str] = {}

    # ------------------------------------------------------------------ paths
    def entry_dir(self, key: str) -> Path:
        """Directory that holds (or would hold) the entry for ``key``."""
        return self.root / key[:2] / key

    def _lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def _index_path(self, name: str) -> Path:
        return self.root / "index" / f"{_safe_name(name)}.json"

    def failed_dir(self, name: str, key: str) -> Path:
        """A fresh directory where the toolchain keeps sources of failed compiles.

        Example::

            >>> cache.failed_dir("train_job", key)   # doctest: +SKIP
            PosixPath('/root/.cache/flowc/failed/train_job-3f1c9a0e1b2c4d5e')
        """
        path = self.root / "failed" / f"{_safe_name(name)}-{key[:16]}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _ensure_root(self) -> None:
        try:
            for sub in ("tmp", "locks", "index"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(
                f"cannot create the flowc kernel cache at {self.root}: {e}; "
                "set FLOWC_CACHE_DIR to a writable directory"
            ) from e

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

    def _check(self, key: str) -> tuple[str, CacheEntry | None]:
        """Return ``("ok", entry)``, ``("missing", None)`` or ``("corrupt: why", None)``."""
        d = self.entry_dir(key)
        if not d.exists():
            return "missing", None
        meta = self._read_meta(key)
        if meta is None:
            return "corrupt: meta.json missing or unparsable", None
        files = _entry_files(meta)
        source_file, library_file = files
        so = d / library_file
        try:
            st = so.stat()
        except OSError:
            return f"corrupt: {library_file} missing", None
        if not (d / source_file).is_file():
            return f"corrupt: {source_file} missing", None
        if meta.get("key") != key:
            return "corrupt: meta.json belongs to another key", None
        if st.st_size != meta.get("so_size"):
            return f"corrupt: {library_file} is {st.st_size} bytes, meta.json says {meta.get('so_size')}", None
        sig = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._verified.get(key) != sig:
            if _sha256_file(so) != meta.get("so_sha256"):
                return f"corrupt: {library_file} sha256 does not match meta.json", None
            self._verified[key] = sig
        size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
        created = float(meta.get("created", st.st_mtime))
        entry = CacheEntry(key=key, name=str(meta.get("name", "")), path=d, size=size,
                           age=max(0.0, time.time() - created), files=files)
        return "ok", entry

    def lookup(self, key: str) -> CacheEntry | None:
        """Return the valid entry for ``key`` or None; does not touch counters or repair.

        Example::

            >>> cache.lookup("0" * 64) is None   # doctest: +SKIP
            True
        """
        return self._check(key)[1]

    def _remove_entry(self, key: str) -> None:
        # Rename first so other processes see the entry vanish in one step
        # rather than half-deleted; then delete at leisure.  A process that has
        # the old .so mapped keeps working because the inode lives on.
        d = self.entry_dir(key)
        if not d.exists():
            return
        trash = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix="trash-"))
        try:
            os.rename(d, trash / key)
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
        self._verified.pop(key, None)

    # ---------------------------------------------------------------- locking
    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        # flock, not a lock-by-creating-a-file scheme: the kernel drops the lock
        # when a process dies, so a crashed compile never wedges the cache.
        # Lock files are never deleted while in use; deleting them would let
        # two processes hold "the" lock on different inodes.
        path = self._lock_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # ------------------------------------------------------------------ build
    def get_or_build(
        self,
        parts: KeyParts,
        name: str,
        build: Callable[[Path], None],
        *,
        source: str | None = None,
        files: tuple[str, str] = CPU_FILES,
    ) -> tuple[CacheEntry, bool]:
        """Return ``(entry, compiled)`` for ``parts``, building it if needed.

        ``build(tmpdir)`` must leave the two ``files`` (source, artifact;
        ``kernel.cpp`` and ``kernel.so`` unless told otherwise, e.g.
        ``CUDA_FILES``) in ``tmpdir``; if it raises, the temporary directory is
        removed and the exception propagates.  When ``source`` is given and
        ``build`` did not write the source file, it is written for it.

        Example::

            >>> def build(d): compile_to(d / "kernel.cpp", d / "kernel.so")   # doctest: +SKIP
            >>> entry, compiled = cache.get_or_build(parts, "answer", build)     # doctest: +SKIP
        """
        key = parts.key()
        status, entry = self._check(key)
        if entry is not None:
            self.hits += 1
            self._record_index(name, key, parts)
            return entry, False

        self._ensure_root()
        with self._locked(key):
            # Another process may have finished (or repaired) it while we waited.
            status, entry = self._check(key)
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
        # filesystem and is atomic.
        tmp = Path(tempfile.mkdtemp(dir=self.root / "tmp", prefix=f"build-{key[:12]}-"))
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
                "created": time.time(),
                "compile_seconds": round(seconds, 6),
            }
            if files != CPU_FILES:      # old entries have no names: they are the CPU pair
                meta["files"] = list(files)
            _write_json_atomic(tmp / META_FILE, meta)
            final = self.entry_dir(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:
                # Only possible if a process that ignored the lock (or an older
                # flowc) got there first; its entry is as good as ours.
                if not final.is_dir():
                    raise
            else:
                tmp = None  # type: ignore[assignment]
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
        if self._indexed.get(name) == key:
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
            if len(prefix.name) == 2 and prefix.is_dir():
                for d in sorted(prefix.iterdir()):
                    if d.is_dir() and d.name.startswith(prefix.name) and len(d.name) == 64:
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

    def info(self) -> dict:
        """Summary for ``flowc cache info``: root, entry count, bytes, counters.

        Example::

            >>> cache.info()["entries"]   # doctest: +SKIP
            3
        """
        entries = self.entries()
        return {
            "root": str(self.root),
            "entries": len(entries),
            "bytes": sum(e.size for e in entries),
            "hits": self.hits,
            "misses": self.misses,
            "compilations": self.compilations,
        }

    def stats(self) -> dict[str, int]:
        """This process's counters as a dict."""
        return {"hits": self.hits, "misses": self.misses, "compilations": self.compilations}

    def clear(self) -> int:
        """Delete every entry, index, failed source and temp dir; return entries removed.

        Lock files are kept: removing one while another process holds it would
        break mutual exclusion. Do not run while other processes are compiling.

        Example::

            >>> cache.clear()   # doctest: +SKIP
            3
        """
        removed = 0
        for d in list(self._entry_dirs()):
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
        if self.root.is_dir():
            for prefix in self.root.iterdir():
                if len(prefix.name) == 2 and prefix.is_dir():
                    with contextlib.suppress(OSError):
                        prefix.rmdir()
        for sub in ("index", "failed", "tmp"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        self._verified.clear()
        self._indexed.clear()
        return removed


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
