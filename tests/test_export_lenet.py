"""`flowc export` end to end on the LeNet of examples/export: a C program built with the system C compiler
computes the Python job's logits bit for bit, four instances on four threads agree, the library needs
only the C++ runtime, OpenMP and libc, and every bad weights file is refused with its code and message.

One trained checkpoint and one export (through the `flowc export` command) serve the whole module."""
from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import flow
from flowc.compiler.export.weights import ERROR_CODES, encode_weights, read_weights

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "export"
IMAGES = 200          # held-out digits the C programs and the Python job classify


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _run(argv: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=_env(), **kw)
    assert proc.returncode == 0, f"{argv[:3]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _c_compiler() -> str:
    found = shutil.which("cc") or shutil.which("gcc")
    assert found, "no system C compiler (cc or gcc) on PATH"
    return found


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint folder, export folder, images file, labels file, labels)."""
    base = tmp_path_factory.mktemp("export")
    ckpt, out = base / "ckpt", base / "lenet_c"
    _run([sys.executable, EXAMPLES / "lenet_predict.py", ckpt])
    proc = _run([sys.executable, "-m", "flowc", "export", f"{EXAMPLES / 'lenet_predict.py'}:predict_job",
                 "--checkpoint", ckpt, "-o", out, "--prefix", "lenet"])
    assert "wrote" in proc.stdout and "liblenet.so" in proc.stdout
    _, (x, y) = flow.data.load_mnist_sample(100, 1)
    images, labels = np.ascontiguousarray(x[:IMAGES], np.float32), np.ascontiguousarray(y[:IMAGES], np.int32)
    images.tofile(base / "images.bin")
    labels.tofile(base / "labels.bin")
    return ckpt, out, base / "images.bin", base / "labels.bin", labels.ravel()


def _python_logits(ckpt: Path) -> np.ndarray:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import lenet_predict
    finally:
        sys.path.remove(str(EXAMPLES))
    job = lenet_predict.make_jobs(1)
    flow.load_variables(flow.checkpoint.get(str(ckpt)))
    _, (x, _y) = flow.data.load_mnist_sample(100, 1)
    return np.concatenate([job(np.ascontiguousarray(image, np.float32)) for image in x[:IMAGES]])


def test_files_and_header_document_the_api(exported):
    _, out, *_ = exported
    for name in ("liblenet.so", "liblenet.a", "lenet.h", "lenet.weights", "README.txt", "src/build.sh"):
        assert (out / name).is_file(), name
    header = (out / "lenet.h").read_text()
    for api in ("lenet_create_from_file", "lenet_create_from_memory", "lenet_run", "lenet_set_num_threads",
                "lenet_input_info", "lenet_output_info", "lenet_destroy", "lenet_last_error", "LENET_ERR_CHECKSUM",
                "one model instance per thread", "CRC-32"):
        assert api in header, api
    assert "cc -O2 app.c -I. -L. -llenet" in (out / "README.txt").read_text()
    # its convolutions keep process-wide scratch (packed weights): steps of different instances take a mutex
    assert "#define LENET_SERIALIZED 1" in header


def test_c_program_matches_the_python_job_bit_for_bit(exported, tmp_path):
    ckpt, out, images, labels_file, labels = exported
    exe = tmp_path / "predict"
    _run([_c_compiler(), "-std=c99", "-O2", "-Wall", "-Werror", EXAMPLES / "predict.c", f"-I{out}", f"-L{out}",
          "-llenet", f"-Wl,-rpath,{out}", "-o", exe])
    proc = _run([exe, out / "lenet.weights", images, labels_file, tmp_path / "logits.bin"])
    c_logits = np.fromfile(tmp_path / "logits.bin", dtype=np.float32).reshape(IMAGES, 10)
    py_logits = _python_logits(ckpt)
    assert c_logits.tobytes() == py_logits.tobytes(), np.abs(c_logits - py_logits).max()
    right = int((py_logits.argmax(1) == labels).sum())
    assert f"accuracy {right}/{IMAGES}" in proc.stdout
    assert right >= 0.8 * IMAGES          # the trained model, not an untrained one (chance is 10%)


def test_four_instances_on_four_threads_from_the_static_library(exported, tmp_path):
    ckpt, out, images, *_ = exported
    exe = tmp_path / "predict_threads"
    _run(["g++", "-std=c++17", "-O2", "-Wall", "-Werror", EXAMPLES / "predict_threads.cpp", f"-I{out}",
          out / "liblenet.a", "-fopenmp", "-pthread", "-o", exe])
    proc = _run([exe, out / "lenet.weights", images, 4, tmp_path / "logits.bin"])
    assert "4 instances on 4 threads, 200 batches each: all equal" in proc.stdout
    logits = np.fromfile(tmp_path / "logits.bin", dtype=np.float32).reshape(IMAGES, 10)
    assert logits.tobytes() == _python_logits(ckpt).tobytes()


ALLOWED_LIBRARIES = ("linux-vdso", "libstdc++", "libgomp", "libgcc_s", "libm.", "libc.", "ld-linux")


def test_library_needs_only_the_cxx_runtime_openmp_and_libc(exported):
    _, out, *_ = exported
    ldd = _run(["ldd", out / "liblenet.so"]).stdout
    needed = [line.split()[0] for line in ldd.strip().splitlines()]
    assert needed and all(n.startswith(ALLOWED_LIBRARIES) or n.startswith("/lib") for n in needed), ldd
    undefined = _run(["nm", "-D", "--undefined-only", out / "liblenet.so"]).stdout
    assert not any(word in undefined for word in ("Py", "numpy", "cffi", "_cffi")), undefined
    exported_symbols = _run(["nm", "-D", "--defined-only", out / "liblenet.so"]).stdout.split()[2::3]
    assert exported_symbols and all(s.startswith("lenet_") for s in exported_symbols), exported_symbols


class _Lib:
    """liblenet.so through ctypes: the loader's codes and messages (the library itself has no Python)."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.lenet_last_error.restype = ctypes.c_char_p
        self.lib.lenet_create_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.lenet_create_from_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self.lib.lenet_destroy.argtypes = [ctypes.c_void_p]

    def create(self, blob: bytes) -> tuple[int, str]:
        model = ctypes.c_void_p(1)
        code = self.lib.lenet_create_from_memory(blob, len(blob), ctypes.byref(model))
        message = self.lib.lenet_last_error().decode()
        if code == 0:
            self.lib.lenet_destroy(model)
        else:
            assert model.value is None, "a failed create must leave no model"
        return code, message


def _recrc(blob: bytearray) -> bytes:
    data_offset, data_size = struct.unpack_from("<QQ", blob, 32)
    struct.pack_into("<I", blob, 48, zlib.crc32(bytes(blob[64:data_offset + data_size])))
    return bytes(blob)


def _bad_weights(good: bytes, arrays: dict) -> dict[str, tuple[bytes, str, list[str]]]:
    data_offset = struct.unpack_from("<Q", good, 32)[0]
    version, flipped, offset = bytearray(good), bytearray(good), bytearray(good)
    struct.pack_into("<I", version, 8, 2)
    flipped[data_offset + 1000] ^= 0x01
    rank = struct.unpack_from("<I", good, 64 + 8)[0]
    struct.pack_into("<Q", offset, 64 + 16 + 8 * rank, 1 << 40)
    transposed = {**arrays, "dense2-weight": np.ascontiguousarray(arrays["dense2-weight"].T)}
    as_double = {**arrays, "conv1-bias": arrays["conv1-bias"].astype(np.float64)}
    missing = {k: v for k, v in arrays.items() if k != "dense2-bias"}
    return {
        "truncated": (good[:-100], "TRUNCATED", ["bytes"]),
        "short header": (good[:10], "TRUNCATED", ["64-byte header"]),
        "wrong magic": (b"XXXXXXXX" + good[8:], "MAGIC", ["not a flowc weights file"]),
        "wrong version": (bytes(version), "VERSION", ["version 2", "reads version 1"]),
        "shape mismatch": (encode_weights(transposed), "SHAPE", ["'dense2-weight'", "[512, 10]", "[10, 512]"]),
        "dtype mismatch": (encode_weights(as_double), "DTYPE", ["'conv1-bias'", "float64", "float32"]),
        "unknown variable": (encode_weights({**arrays, "extra": np.zeros(3, np.float32)}), "VARIABLE",
                             ["'extra' is not a variable"]),
        "missing variable": (encode_weights(missing), "VARIABLE", ["'dense2-bias' is missing"]),
        "checksum mismatch": (bytes(flipped), "CHECKSUM", ["checksum mismatch"]),
        "offset out of range": (_recrc(offset), "RANGE", ["do not fit"]),
    }


def test_each_bad_weights_file_gives_its_code_and_message(exported):
    _, out, *_ = exported
    lib = _Lib(out / "liblenet.so")
    good = (out / "lenet.weights").read_bytes()
    assert lib.create(good) == (0, "")
    arrays = read_weights(out / "lenet.weights")
    for case, (blob, kind, words) in _bad_weights(good, arrays).items():
        code, message = lib.create(blob)
        assert code == ERROR_CODES[kind], (case, code, message)
        assert message.startswith("weights in memory: ") and all(w in message for w in words), (case, message)
    model = ctypes.c_void_p()
    missing = str(out / "no-such.weights").encode()
    assert lib.lib.lenet_create_from_file(missing, ctypes.byref(model)) == ERROR_CODES["IO"]
    assert "no-such.weights: cannot open" in lib.lib.lenet_last_error().decode()
