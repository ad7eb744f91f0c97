"""Tests of flow.data.load_mnist: download (progress, cache, checksum, resume, offline), idx files, errors.

Every download is served by a local HTTP server on 127.0.0.1 (an ephemeral port) with a small
generated npz (200 train / 100 test digits); nothing here touches the internet.
"""
from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import os
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.runtime.datasets import load_mnist_sample
from flowc.runtime.datasets import mnist
from flowc.runtime.datasets.mnist import (IDX_FILES, MNIST_MAX_BYTES, MNIST_SHA256, MNIST_URL, MnistChecksumError,
                                    MnistDownloadError, MnistDownloadTooLargeError, MnistFormatError,
                                    MnistMissingFilesError, load_mnist, read_idx, read_idx_folder)

N_TRAIN, N_TEST = 200, 100
OFFICIAL_MNIST = Path("/work/shared/data/mnist")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    """Requests to 127.0.0.1 must not go through a proxy set in the environment."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


def _digits(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.integers(0, 256, (N_TRAIN, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, N_TRAIN).astype(np.uint8),
        "x_test": rng.integers(0, 256, (N_TEST, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, N_TEST).astype(np.uint8),
    }


@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    return _digits()


@pytest.fixture(scope="module")
def payload(digits) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **digits)
    return buf.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves server.payload at /mnist.npz; Range support, and dropping the first response, are switches."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        with srv.lock:
            srv.requests.append({"path": self.path, "range": self.headers.get("Range")})
            first = len(srv.requests) == 1
        if not first:
            srv.second_request.set()
        if self.path != "/mnist.npz":
            self.send_error(404)
            return
        data = srv.payload
        rng = self.headers.get("Range")
        if srv.support_range and rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            body = data[start:]
        else:
            self.send_response(200)
            body = data
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if srv.support_range:
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if srv.hold_first and first:
            # Send half, then wait (2 s at most) for a second request to arrive while this one is
            # unfinished: a second downloader that does not wait for the first one makes it arrive.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            srv.second_request.wait(2.0)
            self.wfile.write(body[len(body) // 2:])
            return
        if srv.drop_first and first:
            # Announce the whole body, send half of it, then hang up.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/mnist.npz"


@pytest.fixture
def make_server(payload):
    servers: list[_Server] = []

    def make(support_range: bool = True, drop_first: bool = False, data: bytes | None = None,
             hold_first: bool = False) -> _Server:
        srv = _Server(("127.0.0.1", 0), _Handler)
        srv.payload = payload if data is None else data
        srv.support_range = support_range
        srv.drop_first = drop_first
        srv.hold_first = hold_first
        srv.second_request = threading.Event()
        srv.requests = []
        srv.lock = threading.Lock()
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server(make_server):
    return make_server()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _free_port() -> int:
    """A port on 127.0.0.1 with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected(digits, part: str, batch: int, data_format: str = "NCHW"):
    x = digits[f"x_{part}"].astype(np.float32) / np.float32(255.0)
    x = x[:, np.newaxis] if data_format == "NCHW" else x[..., np.newaxis]
    return x.reshape((-1, batch) + x.shape[1:]), digits[f"y_{part}"].astype(np.int32).reshape(-1, batch)


def _check_result(result, digits, train_bs: int, test_bs: int, data_format: str = "NCHW"):
    (train_x, train_y), (test_x, test_y) = result
    for (x, y), part, bs in (((train_x, train_y), "train", train_bs), ((test_x, test_y), "test", test_bs)):
        ex, ey = _expected(digits, part, bs, data_format)
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.shape == ex.shape and y.shape == ey.shape
        assert x.flags.c_contiguous and y.flags.c_contiguous
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
        assert 0.0 <= x.min() and x.max() <= 1.0


# --------------------------------------------------------------------------- download and cache

def test_flow_data_exports():
    assert flow.data.load_mnist is load_mnist
    assert flow.data.load_mnist_sample is load_mnist_sample
    (x, y), _ = flow.data.load_mnist_sample(100, 100)
    assert x.shape == (45, 100, 1, 28, 28) and y.dtype == np.int32


def test_oneflow_defaults():
    import inspect
    params = inspect.signature(flow.data.load_mnist).parameters
    assert list(params) == ["train_batch_size", "test_batch_size", "data_format", "url", "hash_check", "out_dir"]
    assert params["url"].default == MNIST_URL
    assert MNIST_URL == "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
    assert params["hash_check"].default == MNIST_SHA256
    assert (params["train_batch_size"].default, params["test_batch_size"].default) == (100, 100)
    assert (params["data_format"].default, params["out_dir"].default) == ("NCHW", ".")


def test_download_progress_then_cache(tmp_path, server, payload, digits, capsys):
    out = tmp_path / "data"   # does not exist yet: created by the download
    result = flow.data.load_mnist(50, 25, url=server.url, hash_check=_sha(payload), out_dir=str(out))
    err = capsys.readouterr().err
    _check_result(result, digits, 50, 25)
    assert len(server.requests) == 1 and server.requests[0]["range"] is None
    assert "\rDownloading mnist.npz:" in err
    assert f"{len(payload):,} / {len(payload):,} bytes (100.0%)" in err
    assert (out / "mnist.npz").read_bytes() == payload
    assert not (out / "mnist.npz.part").exists()

    again = flow.data.load_mnist(50, 25, url=server.url, hash_check=_sha(payload), out_dir=str(out))
    captured = capsys.readouterr()
    assert f"File mnist.npz already exist, path: {os.path.join(str(out), 'mnist.npz')}" in captured.out
    assert "Downloading" not in captured.err
    assert len(server.requests) == 1          # the second call made no request
    _check_result(again, digits, 50, 25)


def test_cached_line_with_default_out_dir(tmp_path, server, payload, digits, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    flow.data.load_mnist(100, 100, url=server.url, hash_check=_sha(payload))
    assert (tmp_path / "mnist.npz").is_file()
    capsys.readouterr()
    flow.data.load_mnist(100, 100, url=server.url, hash_check=_sha(payload))
    assert capsys.readouterr().out.strip() == "File mnist.npz already exist, path: ./mnist.npz"
    assert len(server.requests) == 1


def test_nhwc(tmp_path, server, payload, digits):
    result = load_mnist(20, 10, data_format="NHWC", url=server.url, hash_check=_sha(payload),
                        out_dir=str(tmp_path))
    (train_x, _), (test_x, _) = result
    assert train_x.shape == (10, 20, 28, 28, 1) and test_x.shape == (10, 10, 28, 28, 1)
    _check_result(result, digits, 20, 10, "NHWC")
    nchw = load_mnist(20, 10, url=server.url, hash_check=_sha(payload), out_dir=str(tmp_path))
    np.testing.assert_array_equal(nchw[0][0], np.moveaxis(train_x, -1, 2))


def test_hash_check_none_skips_check(tmp_path, server, digits):
    _check_result(load_mnist(100, 100, url=server.url, hash_check=None, out_dir=str(tmp_path)), digits, 100, 100)


def test_checksum_mismatch_deletes_file(tmp_path, server, payload):
    wrong = "0" * 64
    with pytest.raises(MnistChecksumError) as info:
        load_mnist(url=server.url, hash_check=wrong, out_dir=str(tmp_path))
    message = str(info.value)
    assert wrong in message and _sha(payload) in message
    assert isinstance(info.value, ValueError)
    assert list(tmp_path.iterdir()) == []    # neither mnist.npz nor mnist.npz.part is left


def test_cached_file_with_wrong_hash_is_an_error_and_kept(tmp_path, payload):
    (tmp_path / "mnist.npz").write_bytes(payload)
    with pytest.raises(MnistChecksumError, match="expected " + "1" * 64):
        load_mnist(url="http://127.0.0.1:9/mnist.npz", hash_check="1" * 64, out_dir=str(tmp_path))
    assert (tmp_path / "mnist.npz").read_bytes() == payload   # a file the user placed is not deleted


# --------------------------------------------------------------------------- resume

def test_resume_partial_file_with_range(tmp_path, server, payload, digits, capsys):
    half = len(payload) // 2
    (tmp_path / "mnist.npz.part").write_bytes(payload[:half])
    result = load_mnist(100, 100, url=server.url, hash_check=_sha(payload), out_dir=str(tmp_path))
    _check_result(result, digits, 100, 100)
    assert [r["range"] for r in server.requests] == [f"bytes={half}-"]
    assert f"Resuming mnist.npz.part at byte {half:,}" in capsys.readouterr().err
    assert (tmp_path / "mnist.npz").read_bytes() == payload
    assert not (tmp_path / "mnist.npz.part").exists()


def test_resume_when_server_ignores_range(tmp_path, make_server, payload, digits):
    srv = make_server(support_range=False)
    (tmp_path / "mnist.npz.part").write_bytes(payload[: len(payload) // 2])
    result = load_mnist(100, 100, url=srv.url, hash_check=_sha(payload), out_dir=str(tmp_path))
    _check_result(result, digits, 100, 100)
    assert server_ranges(srv) == [f"bytes={len(payload) // 2}-"]   # asked, answered 200, whole file taken
    assert (tmp_path / "mnist.npz").read_bytes() == payload


def test_complete_part_file_answered_416(tmp_path, server, payload, digits):
    (tmp_path / "mnist.npz.part").write_bytes(payload)
    _check_result(load_mnist(100, 100, url=server.url, hash_check=_sha(payload), out_dir=str(tmp_path)),
                  digits, 100, 100)
    assert (tmp_path / "mnist.npz").read_bytes() == payload


def test_dropped_connection_resumes_in_the_same_call(tmp_path, make_server, payload, digits):
    srv = make_server(drop_first=True)
    result = load_mnist(100, 100, url=srv.url, hash_check=_sha(payload), out_dir=str(tmp_path))
    _check_result(result, digits, 100, 100)
    ranges = server_ranges(srv)
    assert len(ranges) == 2 and ranges[0] is None and ranges[1] == f"bytes={len(payload) // 2}-"


def test_bad_bytes_in_part_file_fail_checksum_and_are_deleted(tmp_path, server, payload):
    (tmp_path / "mnist.npz.part").write_bytes(b"\0" * 100)     # not a prefix of the file
    with pytest.raises(MnistChecksumError):
        load_mnist(url=server.url, hash_check=_sha(payload), out_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    load_mnist(url=server.url, hash_check=_sha(payload), out_dir=str(tmp_path))   # the next call starts over
    assert (tmp_path / "mnist.npz").read_bytes() == payload


def test_two_downloads_at_once_take_turns(tmp_path, make_server, payload, digits, capsys):
    """Two callers (threads, each with its own open file: flock treats them as two processes)
    downloading into one folder: the second waits for the first and uses its file."""
    srv = make_server(hold_first=True)
    results: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            results[i] = load_mnist(100, 100, url=srv.url, hash_check=_sha(payload), out_dir=str(tmp_path))
        except BaseException as exc:   # noqa: BLE001 - reported by the assertions below
            results[i] = exc

    first = threading.Thread(target=call, args=(0,), daemon=True)
    first.start()
    deadline = time.monotonic() + 10
    while not srv.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.requests, "the first download never reached the server"
    second = threading.Thread(target=call, args=(1,), daemon=True)
    second.start()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    for i in (0, 1):
        assert not isinstance(results[i], BaseException), results[i]
        _check_result(results[i], digits, 100, 100)
    assert len(srv.requests) == 1                  # the second caller did not download again
    assert "Waiting for another process or thread downloading mnist.npz.part" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnist.npz"]


class _EndlessResponse:
    """What urllib's opener returns, for a server that sends zeros without end (or announces a size).

    It does end, 1 MiB past the cap, so that a loader without the cap fails this test instead of
    filling the disk.
    """

    def __init__(self, length: int | None = None) -> None:
        self.status = 200
        self.headers = {"Content-Length": str(length)} if length is not None else {}
        self.sent = 0

    def read(self, n: int) -> bytes:
        n = max(0, min(n, MNIST_MAX_BYTES + (1 << 20) - self.sent))
        self.sent += n
        return b"\0" * n

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_endless_download_stops_near_the_expected_size(tmp_path, monkeypatch):
    response = _EndlessResponse()
    monkeypatch.setattr(mnist, "_open", lambda url, offset, timeout: response)
    with pytest.raises(MnistDownloadTooLargeError) as info:
        load_mnist(url="http://junk.invalid/mnist.npz", out_dir=str(tmp_path))
    assert response.sent <= MNIST_MAX_BYTES + (1 << 16)     # stopped within one read of the cap
    assert MNIST_MAX_BYTES < 60_000_000
    assert f"{MNIST_MAX_BYTES:,} bytes" in str(info.value) and "junk.invalid" in str(info.value)
    assert isinstance(info.value, MnistDownloadError)
    assert list(tmp_path.iterdir()) == []                     # nothing kept, nothing to resume


def test_announced_oversize_download_is_refused_before_writing(tmp_path, monkeypatch):
    response = _EndlessResponse(length=300_000_000)
    monkeypatch.setattr(mnist, "_open", lambda url, offset, timeout: response)
    with pytest.raises(MnistDownloadTooLargeError, match="announces 300,000,000 bytes"):
        load_mnist(url="http://junk.invalid/mnist.npz", out_dir=str(tmp_path))
    assert response.sent == 0
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out_dir_is_a_download_error_naming_the_file(tmp_path, server):
    (tmp_path / "file").write_text("")
    with pytest.raises(MnistDownloadError, match=r"cannot write .*file/data/mnist\.npz\.part"):
        load_mnist(url=server.url, out_dir=str(tmp_path / "file" / "data"))
    assert server.requests == []


def test_truncated_cached_npz_is_a_format_error_saying_what_to_do(tmp_path, payload):
    cached = tmp_path / "mnist.npz"
    cached.write_bytes(payload[: len(payload) // 2])      # an interrupted copy
    with pytest.raises(MnistFormatError) as info:
        load_mnist(url="http://127.0.0.1:9/mnist.npz", hash_check=None, out_dir=str(tmp_path))
    message = str(info.value)
    assert str(cached) in message and "truncated or damaged" in message and "delete it" in message


def server_ranges(srv) -> list:
    return [r["range"] for r in srv.requests]


# --------------------------------------------------------------------------- offline

def test_unreachable_server_fails_fast_with_the_path(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/mnist.npz"
    start = time.monotonic()
    with pytest.raises(MnistDownloadError) as info:
        load_mnist(url=url, out_dir=str(tmp_path))
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert str((tmp_path / "mnist.npz").resolve()) in message
    assert "flow.data.load_mnist_sample()" in message and "offline" in message
    assert MNIST_SHA256 in message
    assert isinstance(info.value, OSError)
    assert list(tmp_path.iterdir()) == []


def test_http_error_is_a_download_error(tmp_path, server):
    with pytest.raises(MnistDownloadError, match="404"):
        load_mnist(url=server.url.replace("mnist.npz", "missing.npz"), out_dir=str(tmp_path))


# --------------------------------------------------------------------------- idx files

def _idx(array: np.ndarray, magic: int | None = None) -> bytes:
    if magic is None:
        magic = 0x0800 | array.ndim
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def _write_idx_folder(folder: Path, digits, parts=("train", "test"), compress: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for part in parts:
        images_name, labels_name = IDX_FILES[part]
        key = "train" if part == "train" else "test"
        for name, array in ((images_name, digits[f"x_{key}"]), (labels_name, digits[f"y_{key}"])):
            data = _idx(array)
            if compress:
                (folder / name).write_bytes(gzip.compress(data))
            else:
                (folder / name[:-3]).write_bytes(data)
    return folder


def test_idx_folder_as_out_dir(tmp_path, digits):
    folder = _write_idx_folder(tmp_path / "idx", digits)
    unreachable = f"http://127.0.0.1:{_free_port()}/mnist.npz"   # proves nothing is downloaded
    _check_result(load_mnist(50, 20, url=unreachable, out_dir=str(folder)), digits, 50, 20)
    assert not (folder / "mnist.npz").exists()


def test_idx_folder_as_url(tmp_path, digits):
    folder = _write_idx_folder(tmp_path / "idx", digits, compress=False)   # plain files work too
    out = tmp_path / "out"
    out.mkdir()
    result = load_mnist(100, 50, data_format="NHWC", url=str(folder), out_dir=str(out))
    _check_result(result, digits, 100, 50, "NHWC")
    _check_result(load_mnist(100, 50, url=folder.as_uri(), out_dir=str(out)), digits, 100, 50)
    assert list(out.iterdir()) == []


def test_local_npz_file_as_url(tmp_path, payload, digits):
    npz = tmp_path / "elsewhere.npz"
    npz.write_bytes(payload)
    _check_result(load_mnist(100, 100, url=str(npz), hash_check=_sha(payload), out_dir=str(tmp_path)),
                  digits, 100, 100)
    with pytest.raises(MnistChecksumError):
        load_mnist(url=str(npz), hash_check="2" * 64, out_dir=str(tmp_path))


def test_missing_local_url_path(tmp_path):
    with pytest.raises(MnistMissingFilesError, match="does not exist"):
        load_mnist(url=str(tmp_path / "nowhere"), out_dir=str(tmp_path))


def test_idx_magic_mismatch(tmp_path, digits):
    folder = _write_idx_folder(tmp_path / "idx", digits)
    # An image file where the training labels belong.
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(digits["x_train"])))
    with pytest.raises(MnistFormatError) as info:
        load_mnist(out_dir=str(folder), url=f"http://127.0.0.1:{_free_port()}/mnist.npz")
    message = str(info.value)
    assert "train-labels-idx1-ubyte.gz" in message
    assert "magic number 2051" in message and "expected 2049" in message


def test_idx_truncated_file(tmp_path, digits):
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(_idx(digits["x_test"])[:-10])
    with pytest.raises(MnistFormatError, match="78400 bytes of data, the file has 78390"):
        read_idx(path, 2051)


def test_idx_missing_files_are_listed(tmp_path, digits):
    folder = _write_idx_folder(tmp_path / "idx", digits, parts=("test",))
    with pytest.raises(MnistMissingFilesError) as info:
        load_mnist(out_dir=str(folder), url=f"http://127.0.0.1:{_free_port()}/mnist.npz")
    message = str(info.value)
    assert "train-images-idx3-ubyte.gz" in message and "train-labels-idx1-ubyte.gz" in message
    assert "t10k" not in message
    assert isinstance(info.value, FileNotFoundError)


def test_idx_count_mismatch(tmp_path, digits):
    folder = _write_idx_folder(tmp_path / "idx", digits)
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(digits["y_test"][:99])))
    with pytest.raises(MnistFormatError, match="100 images but labels of shape"):
        read_idx_folder(folder)


# --------------------------------------------------------------------------- argument errors

def test_indivisible_batch_size(tmp_path, payload):
    (tmp_path / "mnist.npz").write_bytes(payload)
    with pytest.raises(ValueError) as info:
        load_mnist(train_batch_size=7, hash_check=None, out_dir=str(tmp_path))
    message = str(info.value)
    assert "train_batch_size=7" in message and "200" in message
    assert "1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 200" in message
    with pytest.raises(ValueError, match="test_batch_size=30 does not divide the 100"):
        load_mnist(train_batch_size=100, test_batch_size=30, hash_check=None, out_dir=str(tmp_path))


@pytest.mark.parametrize("kwargs", [{"data_format": "NCWH"}, {"data_format": "nchw"},
                                    {"train_batch_size": 0}, {"test_batch_size": -5},
                                    {"train_batch_size": 2.5}, {"train_batch_size": True}])
def test_bad_arguments_fail_before_any_download(tmp_path, kwargs):
    with pytest.raises(ValueError):
        # The URL has nothing listening: a ValueError (not MnistDownloadError) shows no request was tried.
        load_mnist(url=f"http://127.0.0.1:{_free_port()}/mnist.npz", out_dir=str(tmp_path), **kwargs)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- the official test set

@pytest.mark.skipif(not (OFFICIAL_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
                    reason="official MNIST t10k files not present in /work/shared/data/mnist")
def test_official_t10k_files():
    images, labels = read_idx_folder(OFFICIAL_MNIST, parts=("test",))["test"]
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    assert sorted(np.unique(labels).tolist()) == list(range(10))
    assert np.bincount(labels, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert images.max() == 255 and images.min() == 0
