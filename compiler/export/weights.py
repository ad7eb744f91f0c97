"""The `.weights` file of an exported job: its variables in one flat, checked file.

The exported library's loader (codegen_templates/export/flowc_weights.h) reads it; this module
writes it, and reads it back with the same checks (tests, `flowc export`'s own verification).
All integers are little-endian:

    offset  size  field
    0       8     magic "FLOWCWTS"
    8       4     version (FORMAT_VERSION)
    12      4     count: the number of variables
    16      8     table_offset (HEADER_BYTES)
    24      8     table_size: bytes of the table
    32      8     data_offset: where the data begins (a multiple of ALIGN)
    40      8     data_size: bytes of data (the file ends there)
    48      4     checksum: CRC-32 (IEEE 802.3, the polynomial of zlib's crc32) of the bytes
                  [table_offset, data_offset + data_size): the table, the padding and the data
    52      12    zero
    then count table entries, each:
            4     name_len (bytes of UTF-8), 4 dtype (DTYPE_CODES), 4 rank, 4 zero,
            8*rank dims, 8 offset (from data_offset, a multiple of ALIGN), 8 nbytes,
            name_len bytes of name, zero padding to a multiple of 8
    then zero padding to data_offset, then the data: each variable's C-order bytes at its offset.

Example:
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "m.weights")
    >>> write_weights(path, {"w": np.ones((2, 3), np.float32)})
    >>> read_weights(path)["w"].shape
    (2, 3)
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from flowc.compiler.ir import numpy_dtype

MAGIC = b"FLOWCWTS"
FORMAT_VERSION = 1
HEADER_BYTES = 64
ALIGN = 64                  # each variable's data starts on a cache line (AVX loads)
MAX_NAME_BYTES = 4096
MAX_RANK = 8

# dtype name <-> its code in the file and in the exported header (the same table renders both).
DTYPE_CODES: dict[str, int] = {"float32": 1, "float64": 2, "int32": 3, "int64": 4, "int8": 5, "uint8": 6,
                               "float16": 7}
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}

_HEADER = struct.Struct("<8sIIQQQQI12x")
_ENTRY = struct.Struct("<IIII")

# The loader's error codes (the exported header's `<PREFIX>_ERR_*`): one per way a file is refused.
ERROR_CODES: dict[str, int] = {"ARGUMENT": 1, "IO": 2, "TRUNCATED": 3, "MAGIC": 4, "VERSION": 5, "VARIABLE": 6,
                               "SHAPE": 7, "DTYPE": 8, "RANGE": 9, "CHECKSUM": 10, "MEMORY": 11, "STEP": 12,
                               "INTERNAL": 13}


class WeightsError(ValueError):
    """A weights file that cannot be read; `kind` is its ERROR_CODES name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int            # from data_offset
    nbytes: int


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _entry_bytes(entry: Entry) -> bytes:
    name = entry.name.encode("utf-8")
    fixed = _ENTRY.pack(len(name), DTYPE_CODES[entry.dtype], len(entry.shape), 0)
    dims = struct.pack(f"<{len(entry.shape)}Q", *entry.shape)
    tail = struct.pack("<QQ", entry.offset, entry.nbytes)
    body = fixed + dims + tail + name
    return body + b"\0" * (_round_up(len(body), 8) - len(body))


def encode_weights(arrays: dict[str, np.ndarray]) -> bytes:
    """The file's bytes for `arrays` (name -> array, in the order given)."""
    entries, offset = [], 0
    for name, array in arrays.items():
        dtype = np.dtype(array.dtype).name
        if dtype not in DTYPE_CODES:
            raise WeightsError("DTYPE", f"variable {name!r}: dtype {dtype} has no code in the weights format")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES or array.ndim > MAX_RANK:
            raise WeightsError("ARGUMENT", f"variable {name!r}: name longer than {MAX_NAME_BYTES} bytes or rank "
                                           f"above {MAX_RANK}")
        entries.append(Entry(name, dtype, tuple(int(d) for d in array.shape), offset, int(array.nbytes)))
        offset = _round_up(offset + array.nbytes, ALIGN)
    table = b"".join(_entry_bytes(e) for e in entries)
    data_offset = _round_up(HEADER_BYTES + len(table), ALIGN)
    data = bytearray(entries[-1].offset + entries[-1].nbytes if entries else 0)
    for e, array in zip(entries, arrays.values()):
        le = np.ascontiguousarray(array, dtype=np.dtype(array.dtype).newbyteorder("<"))
        data[e.offset:e.offset + e.nbytes] = le.tobytes()
    body = table + b"\0" * (data_offset - HEADER_BYTES - len(table)) + bytes(data)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(entries), HEADER_BYTES, len(table), data_offset, len(data),
                          zlib.crc32(body))
    return header + body


def write_weights(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` (name -> array) as a weights file at `path`."""
    with open(path, "wb") as f:
        f.write(encode_weights(arrays))


def parse_weights(blob: bytes, where: str = "weights") -> tuple[list[Entry], int]:
    """The table of a weights file and its data offset, every field checked (WeightsError otherwise):
    the same checks, in the same order, as the exported library's loader before it compares the
    table with the job's variables."""
    if len(blob) < HEADER_BYTES:
        raise WeightsError("TRUNCATED", f"{where}: {len(blob)} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, count, table_offset, table_size, data_offset, data_size, checksum = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise WeightsError("MAGIC", f"{where}: not a flowc weights file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise WeightsError("VERSION", f"{where}: format version {version}, this reader reads {FORMAT_VERSION}")
    if table_offset != HEADER_BYTES or data_offset % ALIGN or data_offset < table_offset + table_size:
        raise WeightsError("RANGE", f"{where}: table or data offset out of range")
    if data_offset + data_size > len(blob):
        raise WeightsError("TRUNCATED", f"{where}: {len(blob)} bytes, the header says {data_offset + data_size}")
    if zlib.crc32(blob[table_offset:data_offset + data_size]) != checksum:
        raise WeightsError("CHECKSUM", f"{where}: checksum mismatch (the file is corrupt)")
    entries, at, end = [], table_offset, table_offset + table_size
    for _ in range(count):
        if at + _ENTRY.size > end:
            raise WeightsError("RANGE", f"{where}: the table ends inside an entry")
        name_len, code, rank, _zero = _ENTRY.unpack_from(blob, at)
        at += _ENTRY.size
        if rank > MAX_RANK or name_len > MAX_NAME_BYTES or at + 8 * rank + 16 + name_len > end:
            raise WeightsError("RANGE", f"{where}: a table entry's rank or name length is out of range")
        shape = struct.unpack_from(f"<{rank}Q", blob, at)
        offset, nbytes = struct.unpack_from("<QQ", blob, at + 8 * rank)
        name = blob[at + 8 * rank + 16:at + 8 * rank + 16 + name_len].decode("utf-8", errors="replace")
        at += _round_up(8 * rank + 16 + name_len + _ENTRY.size, 8) - _ENTRY.size
        if code not in DTYPE_NAMES:
            raise WeightsError("DTYPE", f"{where}: variable {name!r} has unknown dtype code {code}")
        if offset % ALIGN or offset + nbytes > data_size:
            raise WeightsError("RANGE", f"{where}: variable {name!r}: data [{offset}, {offset + nbytes}) out of "
                                        f"range of the {data_size} data bytes")
        entries.append(Entry(name, DTYPE_NAMES[code], tuple(shape), offset, nbytes))
    return entries, data_offset


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of the weights file at `path`, checked as `parse_weights` does."""
    with open(path, "rb") as f:
        blob = f.read()
    entries, data_offset = parse_weights(blob, os.fspath(path))
    out = {}
    for e in entries:
        dtype = numpy_dtype(e.dtype).newbyteorder("<")
        count = int(np.prod(e.shape, dtype=np.int64))
        if count * dtype.itemsize != e.nbytes:
            raise WeightsError("SHAPE", f"{path}: variable {e.name!r}: {e.nbytes} bytes for shape {list(e.shape)}")
        out[e.name] = np.frombuffer(blob, dtype=dtype, count=count,
                                    offset=data_offset + e.offset).reshape(e.shape).astype(dtype.newbyteorder("="))
    return out
