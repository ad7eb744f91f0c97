"""Create models of an exported GPU library from weights blobs, or run one, in a process of its own
(the library loads libcuda.so.1: under the fake driver, that must be the only one in the process).

    python -m tests.export_cuda_probe LIB PREFIX DEVICE BLOB...

prints one JSON line per blob: the create's return code and message, then the fake driver's counts
(live allocations, modules, streams, retained contexts, launches) after the model was destroyed,
when the fake driver is the one loaded (else null).

    python -m tests.export_cuda_probe run LIB PREFIX WEIGHTS OUT.npy IN.npy...

runs one step on the inputs (host buffers) and prints the run's code and message as JSON; the
outputs go to OUT.npy (numpy.save of each output's bytes, in order, into one file)."""
from __future__ import annotations

import ctypes
import json
import sys


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_size_t)]


def run_step(argv: list[str]) -> int:
    import numpy as np
    lib_path, prefix, weights, out, *inputs = argv
    lib = ctypes.CDLL(lib_path)
    fn = {name: getattr(lib, f"{prefix}_{name}") for name in ("last_error", "create_from_file", "run", "destroy",
                                                               "output_info", "num_outputs")}
    fn["last_error"].restype = ctypes.c_char_p
    fn["create_from_file"].argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    fn["run"].argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn["destroy"].argtypes = [ctypes.c_void_p]
    model = ctypes.c_void_p()
    if fn["create_from_file"](weights.encode(), ctypes.byref(model)) != 0:
        print(json.dumps({"stage": "create", "message": fn["last_error"]().decode()}))
        return 1
    arrays = [np.ascontiguousarray(np.load(p)) for p in inputs]
    outputs = []
    for o in range(fn["num_outputs"]()):
        info = TensorInfo()
        fn["output_info"](o, ctypes.byref(info))
        outputs.append(np.empty(info.nbytes, np.uint8))
    code = fn["run"](model, (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays]),
                     (ctypes.c_void_p * len(outputs))(*[a.ctypes.data for a in outputs]))
    print(json.dumps({"stage": "run", "code": code, "message": fn["last_error"]().decode("utf-8", "replace")}))
    fn["destroy"](model)
    with open(out, "wb") as f:
        for a in outputs:
            np.save(f, a)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "run":
        return run_step(argv[1:])
    lib_path, prefix, device, *blobs = argv
    lib = ctypes.CDLL(lib_path)
    last_error = getattr(lib, f"{prefix}_last_error")
    last_error.restype = ctypes.c_char_p
    create = getattr(lib, f"{prefix}_create_from_memory_on_device")
    create.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    destroy = getattr(lib, f"{prefix}_destroy")
    destroy.argtypes = [ctypes.c_void_p]
    try:
        counts_fn = ctypes.CDLL("libcuda.so.1").fake_cuda_counts
    except AttributeError:
        counts_fn = None
    for path in blobs:
        with open(path, "rb") as f:
            blob = f.read()
        model = ctypes.c_void_p(1)
        code = create(blob, len(blob), int(device), ctypes.byref(model))
        message = last_error().decode("utf-8", errors="replace")
        left = model.value
        if code == 0:
            destroy(model)
        counts = None
        if counts_fn is not None:
            buf = (ctypes.c_int * 5)()
            counts_fn(buf)
            counts = list(buf)
        print(json.dumps({"blob": path, "code": code, "message": message, "model_left": left, "counts": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
