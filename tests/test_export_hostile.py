"""`flowc export` with hostile names: a variable and a job named with quotes, backslashes, newlines,
comment delimiters and non-ASCII reach the exported C only as escaped literals, and the library
reports them byte for byte; a step's own error (a label out of range) is an error code and a message
naming the user's line, never an abort.  Built with the system compiler, so slow."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.export import ExportError, export_job
from flowc.compiler.export.weights import ERROR_CODES, encode_weights

pytestmark = pytest.mark.slow

HOSTILE_VARIABLE = 'w"*\\n\n??=é\t}'
HOSTILE_JOB = 'évil"\\\n*/job'


def _job():
    def predict(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float),
                labels: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable(HOSTILE_VARIABLE, shape=(3, 5), initializer=flow.random_normal_initializer())
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, flow.matmul(x, w))   # the line named
    predict.__name__ = HOSTILE_JOB
    return flow.global_function(type="predict")(predict)


def _lib(path):
    lib = ctypes.CDLL(str(path))
    lib.hostile_last_error.restype = ctypes.c_char_p
    lib.hostile_create_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.hostile_create_from_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.hostile_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.hostile_destroy.argtypes = [ctypes.c_void_p]
    return lib


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_size_t)]


def test_hostile_names_and_a_step_error_through_the_exported_library(tmp_path):
    job = _job()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 4, 2, 1], np.int32)
    expected = job(x, labels)
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    with pytest.raises(ExportError, match="cannot start C symbol names: give --prefix NAME"):
        export_job(job, flow.checkpoint.get(str(tmp_path / "ckpt")), tmp_path / "refused")
    result = export_job(job, flow.checkpoint.get(str(tmp_path / "ckpt")), tmp_path / "out", prefix="hostile")
    assert "\n*/job" not in result.header.read_text()        # the job's name is a comment there, sanitised
    assert "#define HOSTILE_SERIALIZED 0" in result.header.read_text()   # no kernel keeps process-wide scratch
    lib = _lib(result.shared_library)

    info = TensorInfo()
    assert lib.hostile_input_info(1, ctypes.byref(info)) == 0
    assert (info.name, info.dtype, info.rank, info.nbytes) == (b"labels", 3, 1, 16)
    assert lib.hostile_input_info(2, ctypes.byref(info)) == ERROR_CODES["ARGUMENT"]
    assert b"index 2 out of range [0, 2)" in lib.hostile_last_error()

    model = ctypes.c_void_p()
    assert lib.hostile_create_from_file(str(result.weights).encode(), ctypes.byref(model)) == 0, \
        lib.hostile_last_error()
    out = np.empty_like(expected)
    inputs = (ctypes.c_void_p * 2)(x.ctypes.data, labels.ctypes.data)
    outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
    assert lib.hostile_run(model, inputs, outputs) == 0, lib.hostile_last_error()
    assert out.tobytes() == expected.tobytes()

    bad = np.array([0, 5, 2, 1], np.int32)                     # 5 classes: label 5 is out of range
    inputs[1] = bad.ctypes.data
    assert lib.hostile_run(model, inputs, outputs) == ERROR_CODES["STEP"]
    message = lib.hostile_last_error().decode("utf-8")
    assert "test_export_hostile.py:" in message and "sparse_softmax_cross_entropy" in message
    assert repr(HOSTILE_JOB) in message                          # the job's name, byte for byte
    lib.hostile_destroy(model)

    blob = encode_weights({})
    model = ctypes.c_void_p()
    assert lib.hostile_create_from_memory(blob, len(blob), ctypes.byref(model)) == ERROR_CODES["VARIABLE"]
    assert lib.hostile_last_error().decode("utf-8") == f"weights in memory: variable '{HOSTILE_VARIABLE}' is missing"


def test_instances_of_a_model_without_shared_scratch_run_at_once(tmp_path):
    """HOSTILE_SERIALIZED is 0: four instances step on four threads at the same time (ctypes releases
    the GIL for each call) and every result equals the Python job's."""
    import threading
    job = _job()
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    labels = np.array([1, 0, 3, 2], np.int32)
    expected = [job(x, labels) for x in xs]
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    result = export_job(job, flow.checkpoint.get(str(tmp_path / "ckpt")), tmp_path / "out", prefix="hostile")
    lib = _lib(result.shared_library)
    failures: list[str] = []

    def serve(x: np.ndarray, want: np.ndarray) -> None:
        model = ctypes.c_void_p()
        if lib.hostile_create_from_file(str(result.weights).encode(), ctypes.byref(model)) != 0:
            failures.append(lib.hostile_last_error().decode())
            return
        out = np.empty_like(want)
        inputs = (ctypes.c_void_p * 2)(x.ctypes.data, labels.ctypes.data)
        outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
        for _ in range(300):
            if lib.hostile_run(model, inputs, outputs) != 0 or out.tobytes() != want.tobytes():
                failures.append(f"run: {lib.hostile_last_error().decode()!r}, {out} != {want}")
                break
        lib.hostile_destroy(model)

    threads = [threading.Thread(target=serve, args=(x, want)) for x, want in zip(xs, expected)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
