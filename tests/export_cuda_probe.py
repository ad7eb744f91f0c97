"""Create models of an exported GPU library from weights blobs, in a process of its own (the library
loads libcuda.so.1: under the fake driver, that must be the only one in the process).

    python -m tests.export_cuda_probe LIB PREFIX DEVICE BLOB...

prints one JSON line per blob: the create's return code and message, then the fake driver's counts
(live allocations, modules, streams, retained contexts, launches) after the model was destroyed,
when the fake driver is the one loaded (else null)."""
from __future__ import annotations

import ctypes
import json
import sys


def main(argv: list[str]) -> int:
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
