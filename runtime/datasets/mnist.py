"""The full MNIST set for `flow.data.load_mnist`, with OneFlow 0.3's semantics.

OneFlow's `flow.data.load_mnist` downloads `mnist.npz` (keys `x_train`,
`y_train`, `x_test`, `y_test`: uint8 images (N, 28, 28) and integer labels (N,))
into `out_dir`, checks its SHA-256 and returns the four arrays batched.  This
module does the same with the standard library only, and more robustly:

* the download goes to `mnist.npz.part`; a partial file left by an interrupted
  download is resumed with an HTTP Range request (a server that answers 200
  instead of 206 simply sends the whole file again);
* the file is renamed to `mnist.npz` only after its checksum matched; a
  mismatch deletes the downloaded bytes and raises MnistChecksumError naming
  the expected and the actual hash;
* two processes (or threads) downloading to the same folder at once do not
  share the `.part` file: the download holds an exclusive `flock` on it, so
  the second waits (and says so) and then uses the file the first one
  finished and checked;
* the download stops at `MNIST_MAX_BYTES` (the largest file 70,000 MNIST
  digits can make, uncompressed) and raises MnistDownloadTooLargeError, so a
  wrong or hostile server cannot fill the disk before the checksum is checked;
* without network it fails within seconds (10 s connect timeout) and says
  where to put the file by hand, and that `flow.data.load_mnist_sample()`
  (5,000 digits shipped with flowc) works offline.  The timeout also bounds
  each read, so a stalled transfer fails (and is resumed) after 10 s without
  data; name resolution is the system's and is not bounded by it.

It also reads the four original idx files (`train-images-idx3-ubyte.gz`,
`train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
`t10k-labels-idx1-ubyte.gz`, gzip-compressed or plain without the `.gz`).

Where `load_mnist` looks, first match wins:

1. `out_dir/mnist.npz` (OneFlow's cache): prints
   `File mnist.npz already exist, path: <out_dir/mnist.npz>`, checks the hash,
   never downloads.
2. `url` naming a local path (a plain path or a `file://` URL): a file is read
   as the npz (hash checked); a folder is read as `folder/mnist.npz` if there
   is one (hash checked), otherwise as a folder of idx files.  Nothing is
   copied into `out_dir`.
3. idx files in `out_dir`: as soon as any of the four is there, `out_dir` is
   read as an idx folder, and a missing one is an error that lists it (it does
   not fall back to downloading).
4. otherwise `url` is downloaded to `out_dir/mnist.npz` as described above.

`hash_check` is the npz's SHA-256; `None` (or "") skips the check.  Idx files
are not hash-checked: their magic numbers, sizes and counts are.
"""
from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import http.client
import operator
import os
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from flowc.compiler.errors import FlowError
from flowc.runtime.datasets import _check_batch_size

__all__ = [
    "MNIST_URL", "MNIST_SHA256", "IDX_FILES", "load_mnist", "read_idx", "read_idx_folder",
    "download_file", "MnistError", "MnistDownloadError", "MnistDownloadTooLargeError", "MnistChecksumError",
    "MnistFormatError", "MnistMissingFilesError", "MNIST_MAX_BYTES",
]

# OneFlow 0.3's defaults for flow.data.load_mnist (its source and its documentation's FAQ).
MNIST_URL = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
MNIST_SHA256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"

NPZ_NAME = "mnist.npz"
CONNECT_TIMEOUT_S = 10.0

# The most bytes a download of mnist.npz may bring.  OneFlow does not publish the file's size, but
# its content bounds it: 70,000 uint8 images of 28x28 and 70,000 labels (int64 at the widest),
# stored uncompressed, plus 64 KiB for the zip and .npy headers.  About 55.5 MB; a compressed file
# is far smaller.  Anything longer is not this file, whatever its checksum would have said.
MNIST_MAX_BYTES = 70_000 * 28 * 28 + 70_000 * 8 + (64 << 10)

IMAGES_MAGIC = 2051   # 0x00000803: unsigned bytes, 3 dimensions
LABELS_MAGIC = 2049   # 0x00000801: unsigned bytes, 1 dimension

# part -> (images file, labels file), the names of the original distribution.
IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

_CHUNK = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"


class MnistError(FlowError):
    """Base of the errors of loading the full MNIST set."""


class MnistDownloadError(MnistError, OSError):
    """The file could not be downloaded (no network, server error, connection dropped)."""


class MnistDownloadTooLargeError(MnistDownloadError):
    """The server sent (or announced) more bytes than the file can have; nothing is kept."""


class MnistChecksumError(MnistError, ValueError):
    """A file's SHA-256 is not the expected one."""


class MnistFormatError(MnistError, ValueError):
    """A file is not a valid MNIST npz or idx file."""


class MnistMissingFilesError(MnistError, FileNotFoundError):
    """A folder of idx files lacks some of the four files."""


Split = tuple[np.ndarray, np.ndarray]


# --------------------------------------------------------------------------- idx files

def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it is gzip (told by its first two bytes, not its name)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise MnistFormatError(f"{path}: corrupt gzip data ({exc})") from exc


def read_idx(path: str | os.PathLike, expected_magic: int | None = None) -> np.ndarray:
    """One idx file (gzip or plain) as a uint8 array of the shape its header gives.

    `expected_magic` is 2051 for image files (N, rows, cols) and 2049 for label
    files (N,); a different magic number, a truncated file or a file with bytes
    past its data raises MnistFormatError.

    Example:
        >>> read_idx("t10k-labels-idx1-ubyte.gz", 2049).shape
        (10000,)
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise MnistFormatError(f"{path}: {len(data)} bytes, too short for an idx header")
    (magic,) = struct.unpack(">I", data[:4])
    if expected_magic is not None and magic != expected_magic:
        kinds = {IMAGES_MAGIC: "an image file", LABELS_MAGIC: "a label file"}
        raise MnistFormatError(
            f"{path}: magic number {magic} (0x{magic:08x}), expected {expected_magic} "
            f"({kinds.get(expected_magic, 'idx')})"
            + (f"; this looks like {kinds[magic]}" if magic in kinds else "")
        )
    if magic >> 16 != 0 or (magic >> 8) & 0xFF != 0x08:
        raise MnistFormatError(f"{path}: magic number {magic} (0x{magic:08x}) is not an unsigned-byte idx file")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise MnistFormatError(f"{path}: truncated header ({len(data)} bytes, needs {header})")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    size = int(np.prod(shape, dtype=np.int64))
    if len(data) - header != size:
        raise MnistFormatError(
            f"{path}: header says shape {tuple(shape)} = {size} bytes of data, "
            f"the file has {len(data) - header}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape).copy()


def _find_idx(folder: Path, gz_name: str) -> Path | None:
    """`name.gz` or the plain `name` in folder, whichever exists (gz first)."""
    for name in (gz_name, gz_name[:-3]):
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def _any_idx_present(folder: Path) -> bool:
    return any(_find_idx(folder, name) for pair in IDX_FILES.values() for name in pair)


def read_idx_folder(folder: str | os.PathLike, parts: tuple[str, ...] = ("train", "test")) -> dict[str, Split]:
    """The idx files of `parts` ("train", "test") in folder as {part: (images, labels)}.

    Images are uint8 (N, 28, 28), labels uint8 (N,).  Each file may be gzip
    (`name.gz`) or plain (`name` without .gz).  Missing files are listed in one
    MnistMissingFilesError; a bad magic number, mismatched counts or labels
    outside 0..9 raise MnistFormatError.

    Example:
        >>> test_images, test_labels = read_idx_folder("/data/mnist", parts=("test",))["test"]
    """
    folder = Path(folder)
    unknown = [p for p in parts if p not in IDX_FILES]
    if unknown:
        raise ValueError(f"unknown MNIST part(s) {unknown}; known: {sorted(IDX_FILES)}")
    found: dict[str, Path] = {}
    missing: list[str] = []
    for part in parts:
        for name in IDX_FILES[part]:
            path = _find_idx(folder, name)
            if path is None:
                missing.append(name)
            else:
                found[name] = path
    if missing:
        raise MnistMissingFilesError(
            f"MNIST idx folder {folder.resolve()} lacks {len(missing)} file(s): {', '.join(missing)} "
            f"(each gzip-compressed, or plain without the .gz)"
        )
    out: dict[str, Split] = {}
    for part in parts:
        images_name, labels_name = IDX_FILES[part]
        images = read_idx(found[images_name], IMAGES_MAGIC)
        labels = read_idx(found[labels_name], LABELS_MAGIC)
        _check_arrays(images, labels, f"{found[images_name]} / {found[labels_name]}")
        out[part] = (images, labels)
    return out


# --------------------------------------------------------------------------- npz file

def _check_arrays(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise MnistFormatError(f"{where}: images have shape {images.shape}, expected (N, 28, 28)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise MnistFormatError(f"{where}: {len(images)} images but labels of shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise MnistFormatError(f"{where}: labels outside 0..9 (min {labels.min()}, max {labels.max()})")


def _read_npz(path: Path) -> dict[str, Split]:
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path, allow_pickle=False) as f:
            absent = [k for k in keys if k not in f.files]
            if absent:
                raise MnistFormatError(f"{path}: lacks the array(s) {', '.join(absent)}; has {f.files}")
            arrays = {k: np.asarray(f[k]) for k in keys}
    except MnistFormatError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        # BadZipFile / EOFError / zlib.error: a truncated or damaged file (an interrupted copy).
        raise MnistFormatError(
            f"{path}: not a readable npz file ({type(exc).__name__}: {exc}); the file is truncated or "
            f"damaged: delete it (or copy it again); load_mnist downloads a fresh one when out_dir "
            f"holds no {NPZ_NAME}"
        ) from exc
    out: dict[str, Split] = {}
    for part, (x, y) in (("train", ("x_train", "y_train")), ("test", ("x_test", "y_test"))):
        images, labels = arrays[x], arrays[y]
        if images.dtype != np.uint8:
            raise MnistFormatError(f"{path}: {x} has dtype {images.dtype}, expected uint8")
        if not np.issubdtype(labels.dtype, np.integer):
            raise MnistFormatError(f"{path}: {y} has dtype {labels.dtype}, expected integers")
        _check_arrays(images, labels, f"{path} ({x}, {y})")
        out[part] = (images, labels)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_hash(path: Path, expected: str | None, *, hint: str) -> None:
    if not expected:
        return
    actual = _sha256(path)
    if actual != expected.lower():
        raise MnistChecksumError(
            f"SHA-256 mismatch for {path}: expected {expected.lower()}, got {actual}. {hint}"
        )


# --------------------------------------------------------------------------- download

class _Progress:
    """One stderr line, rewritten with \\r: bytes done / total (and percent when the total is known)."""

    def __init__(self, name: str, total: int | None, done: int, stream: IO[str]):
        self.name, self.total, self.done, self.stream = name, total, done, stream
        self._last = 0.0

    def update(self, n: int, force: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        if self.total:
            text = (f"\rDownloading {self.name}: {self.done:,} / {self.total:,} bytes "
                    f"({100.0 * self.done / self.total:5.1f}%)")
        else:
            text = f"\rDownloading {self.name}: {self.done:,} bytes"
        self.stream.write(text)
        self.stream.flush()

    def finish(self) -> None:
        self.update(0, force=True)
        self.stream.write("\n")
        self.stream.flush()


def _offline_hint(dest: Path, url: str, sha256: str | None) -> str:
    checksum = f" (SHA-256 {sha256})" if sha256 else ""
    folder = dest.parent.resolve()
    return (
        f"Without network, download {url} on another machine and place it by hand at "
        f"{dest.resolve()}{checksum}, or put the four idx files "
        f"({', '.join(n for pair in IDX_FILES.values() for n in pair)}) in {folder}. "
        f"flow.data.load_mnist_sample() works offline (5,000 digits shipped with flowc)."
    )


def _open(url: str, offset: int, timeout: float):
    headers = {"User-Agent": "flowc-load-mnist", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    # A fresh opener per call (not urlopen's global one), so proxy settings are read from the
    # environment as it is now.
    opener = urllib.request.build_opener()
    return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)


def _content_range_start(value: str | None) -> int | None:
    """The first byte of a `Content-Range: bytes START-END/TOTAL` header."""
    if not value or not value.strip().startswith("bytes "):
        return None
    try:
        return int(value.strip()[6:].split("-", 1)[0])
    except ValueError:
        return None


def _too_large(url: str, limit: int, what: str) -> MnistDownloadTooLargeError:
    return MnistDownloadTooLargeError(
        f"Refusing the download of {url}: {what}, more than the {limit:,} bytes the file can have. "
        f"The server is not sending the expected file; nothing was kept. Check the url."
    )


def _download_once(url: str, part: Path, timeout: float, stream: IO[str], max_bytes: int | None) -> None:
    """Fetch url into part, resuming from its current size; raise on any failure, leaving part for a resume."""
    offset = part.stat().st_size if part.exists() else 0
    try:
        resp = _open(url, offset, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            # Range not satisfiable: part is probably complete already; the checksum decides.
            exc.close()
            return
        raise
    with resp:
        status = getattr(resp, "status", 200)
        length_header = resp.headers.get("Content-Length")
        length = int(length_header) if length_header and length_header.isdigit() else None
        if offset and status == 206 and _content_range_start(resp.headers.get("Content-Range")) == offset:
            mode, done = "ab", offset
        else:
            # No Range asked for, or the server ignored it (200): the whole file comes again.
            mode, done = "wb", 0
        total = done + length if length is not None else None
        if max_bytes is not None and total is not None and total > max_bytes:
            raise _too_large(url, max_bytes, f"the server announces {total:,} bytes")
        if done:
            stream.write(f"Resuming {part.name} at byte {done:,}\n")
        progress = _Progress(part.name.removesuffix(".part"), total, done, stream)
        with open(part, mode) as out:
            while True:
                block = resp.read(_CHUNK)
                if not block:
                    break
                if max_bytes is not None and progress.done + len(block) > max_bytes:
                    # A server that sends more than it announced, or announced nothing: stop here.
                    raise _too_large(url, max_bytes, f"the server sent over {max_bytes:,} bytes")
                out.write(block)
                progress.update(len(block))
        progress.finish()
    if total is not None and part.stat().st_size != total:
        raise MnistDownloadError(
            f"connection closed after {part.stat().st_size:,} of {total:,} bytes"
        )


def _lock_part(part: Path, stream: IO[str]) -> int:
    """An open descriptor of `part` holding an exclusive flock, `part` still being that file.

    flock (not a lock-by-creating-a-file scheme): the kernel drops it when its holder dies, so a
    killed download never blocks the next one.  It locks an open file, so after waiting we check
    that the path still names the file we locked: the holder may have renamed it to the finished
    file, or deleted it after a checksum mismatch, and then we start over on a fresh `.part`.
    """
    said = False
    while True:
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if not said:
                    stream.write(f"Waiting for another process or thread downloading {part.name} into "
                                 f"{part.parent} to finish\n")
                    stream.flush()
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if part.exists() and os.path.samestat(os.fstat(fd), part.stat()):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)                                   # the file we locked is gone: start over


def download_file(url: str, dest: str | os.PathLike, sha256: str | None = None, *,
                  timeout: float = CONNECT_TIMEOUT_S, attempts: int = 3,
                  stream: IO[str] | None = None, max_bytes: int | None = None) -> Path:
    """Download url to dest through `dest.part`, resuming, checking sha256 (None: no check).

    A connection that drops after some bytes arrived is resumed up to
    `attempts` times; a failure to connect at all is raised at once as
    MnistDownloadError.  On a checksum mismatch the downloaded file is deleted
    and MnistChecksumError raised.  dest appears only once complete and checked.
    More than `max_bytes` (None: no limit) raises MnistDownloadTooLargeError
    and deletes what came.  Concurrent calls for the same dest, from threads or
    processes, take turns: a later one finds dest finished and returns it.
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    stream = stream if stream is not None else sys.stderr
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock_part(part, stream)
    except OSError as exc:
        raise MnistDownloadError(f"Could not download {url} into {dest.parent}: cannot write {part} "
                                 f"({exc.strerror or exc})") from exc
    try:
        if dest.is_file():            # another process finished it while we waited
            _remove_if_empty(part)
            _check_hash(dest, sha256, hint="Delete it to download it again.")
            return dest
        _download_locked(url, dest, part, sha256, timeout, attempts, stream, max_bytes)
        return dest
    finally:
        os.close(fd)                  # releases the lock


def _remove_if_empty(part: Path) -> None:
    """Delete part if it holds no byte (our lock created it); a partial download stays for a resume."""
    try:
        if part.stat().st_size == 0:
            part.unlink()
    except FileNotFoundError:
        pass


def _download_locked(url: str, dest: Path, part: Path, sha256: str | None, timeout: float, attempts: int,
                     stream: IO[str], max_bytes: int | None) -> None:
    """download_file's work, with the lock on part held."""
    for attempt in range(1, attempts + 1):
        before = part.stat().st_size if part.exists() else 0
        try:
            _download_once(url, part, timeout, stream, max_bytes)
            break
        except MnistDownloadTooLargeError:
            part.unlink(missing_ok=True)       # not the file: resuming it would only make it longer
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # OSError: URLError (refused, no route, DNS), HTTPError, timeouts and resets mid-stream;
            # HTTPException: a broken response; ValueError: a malformed URL.
            after = part.stat().st_size if part.exists() else 0
            if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
                reason = exc.reason
            else:
                reason = exc
            if after > before and attempt < attempts:
                stream.write(f"\nDownload interrupted ({reason}); resuming ({attempt}/{attempts - 1})\n")
                continue
            _remove_if_empty(part)
            kept = (f" The {after:,} bytes received so far stay in {part} and a later call resumes."
                    if after else "")
            raise MnistDownloadError(
                f"Could not download {url}: {reason}.{kept}\n{_offline_hint(dest, url, sha256)}"
            ) from exc
    if sha256:
        actual = _sha256(part)
        if actual != sha256.lower():
            part.unlink()
            raise MnistChecksumError(
                f"SHA-256 mismatch for the file downloaded from {url}: expected {sha256.lower()}, "
                f"got {actual}. The file was deleted; try again, or pass the right hash_check "
                f"(None skips the check)."
            )
    os.replace(part, dest)


# --------------------------------------------------------------------------- load_mnist

def _local_path(url: str) -> Path | None:
    """The local path url names (a plain path or file:// URL), or None for a remote URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme == "" or os.path.exists(url):
        return Path(url)
    return None


def _resolve(url: str, hash_check: str | None, out_dir: str) -> dict[str, Split]:
    """The train and test arrays from where the module docstring's rule says to look."""
    path = Path(os.path.join(out_dir, NPZ_NAME))
    if path.is_file():
        print(f"File {NPZ_NAME} already exist, path: {os.path.join(out_dir, NPZ_NAME)}")
        _check_hash(path, hash_check,
                    hint="Delete it to download it again, or pass hash_check=None to use it as is.")
        return _read_npz(path)

    local = _local_path(url)
    if local is not None:
        if local.is_dir():
            npz = local / NPZ_NAME
            if npz.is_file():
                _check_hash(npz, hash_check, hint="Pass hash_check=None to use it as is.")
                return _read_npz(npz)
            return read_idx_folder(local)
        if local.is_file():
            _check_hash(local, hash_check, hint="Pass hash_check=None to use it as is.")
            return _read_npz(local)
        raise MnistMissingFilesError(f"url {url!r} names a local path that does not exist: {local}")

    folder = Path(out_dir)
    if folder.is_dir() and _any_idx_present(folder):
        return read_idx_folder(folder)

    download_file(url, path, hash_check or None, max_bytes=MNIST_MAX_BYTES)
    return _read_npz(path)


def _check_positive_int(value: object, arg: str) -> None:
    try:
        size = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        size = 0
    if isinstance(value, bool) or size <= 0:
        raise ValueError(f"{arg} must be a positive int, got {value!r}")


def _batches(images: np.ndarray, labels: np.ndarray, batch: int, data_format: str) -> Split:
    x = images.astype(np.float32) / np.float32(255.0)
    x = x[..., np.newaxis] if data_format == "NHWC" else x[:, np.newaxis]
    x = x.reshape((len(images) // batch, batch) + x.shape[1:])
    y = labels.astype(np.int32).reshape(len(labels) // batch, batch)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def load_mnist(
    train_batch_size: int = 100,
    test_batch_size: int = 100,
    data_format: str = "NCHW",
    url: str = MNIST_URL,
    hash_check: str | None = MNIST_SHA256,
    out_dir: str = ".",
) -> tuple[Split, Split]:
    """The full MNIST set (60,000 train, 10,000 test digits), downloaded once into out_dir, in batches.

    Returns `((train_images, train_labels), (test_images, test_labels))`:
    images float32 in [0, 1] shaped (N/bs, bs, 1, 28, 28) for "NCHW" or
    (N/bs, bs, 28, 28, 1) for "NHWC"; labels int32 (N/bs, bs).  Where the data
    is read from (out_dir/mnist.npz, a local `url`, idx files in out_dir, or a
    download of `url`) is described in this module's docstring.

    Raises ValueError for a bad data_format or a batch size that does not
    divide its set (the message lists the sizes that would), MnistDownloadError
    (an OSError) when the file cannot be downloaded, MnistChecksumError on a
    hash mismatch, MnistFormatError / MnistMissingFilesError for bad local files.

    Example:
        >>> (train_x, train_y), (test_x, test_y) = flow.data.load_mnist(100, 100)
        >>> train_x.shape, test_y.shape
        ((600, 100, 1, 28, 28), (100, 100))
    """
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    for arg, value in (("train_batch_size", train_batch_size), ("test_batch_size", test_batch_size)):
        _check_positive_int(value, arg)   # before any download; divisibility once the sizes are known
    parts = _resolve(os.fspath(url), hash_check, os.fspath(out_dir))
    (train_x, train_y), (test_x, test_y) = parts["train"], parts["test"]
    train_bs = _check_batch_size(train_batch_size, len(train_y), "train_batch_size", "training")
    test_bs = _check_batch_size(test_batch_size, len(test_y), "test_batch_size", "test")
    return _batches(train_x, train_y, train_bs, data_format), _batches(test_x, test_y, test_bs, data_format)
