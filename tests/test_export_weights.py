"""The weights file of `flowc export` (compiler/export/weights.py) and the export's checks that need no
C compiler: every field of a bad file refused with its error kind, names escaped for C, prefixes and
jobs refused with messages naming them.  The exported library's own loader: test_export_lenet.py."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.codegen.sanitise import c_string
from flowc.compiler.export.exporter import check_exportable
from flowc.compiler.export.spec import ExportError, check_prefix, shares_scratch
from flowc.compiler.export.weights import (ALIGN, DTYPE_CODES, FORMAT_VERSION, HEADER_BYTES, MAGIC, WeightsError,
                                           encode_weights, parse_weights, read_weights, write_weights)


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"conv1-weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
            "bias": rng.standard_normal(4).astype(np.float64),
            "table": rng.integers(-5, 5, (3, 2)).astype(np.int32),
            "scalar": np.array(7, dtype=np.int64)}


def _with_crc(blob: bytearray) -> bytes:
    """`blob` with its header's checksum recomputed (a file whose other fields were edited on purpose)."""
    data_offset, data_size = struct.unpack_from("<QQ", blob, 32)
    struct.pack_into("<I", blob, 48, zlib.crc32(bytes(blob[HEADER_BYTES:data_offset + data_size])))
    return bytes(blob)


def test_round_trip_keeps_names_dtypes_shapes_and_values(tmp_path):
    arrays = _arrays()
    arrays["ünïcode\n\"name*/"] = np.arange(5, dtype=np.uint8)
    path = tmp_path / "m.weights"
    write_weights(path, arrays)
    back = read_weights(path)
    assert list(back) == list(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape
        np.testing.assert_array_equal(back[name], a)


def test_layout_header_fields_alignment_and_crc():
    blob = encode_weights(_arrays())
    magic, version, count, table_offset, table_size, data_offset, data_size, crc = \
        struct.unpack_from("<8sIIQQQQI", blob)
    assert (magic, version, count, table_offset) == (MAGIC, FORMAT_VERSION, 4, HEADER_BYTES)
    assert data_offset % ALIGN == 0 and data_offset >= table_offset + table_size
    assert len(blob) == data_offset + data_size
    assert crc == zlib.crc32(blob[HEADER_BYTES:])
    entries, _ = parse_weights(blob)
    assert all(e.offset % ALIGN == 0 for e in entries)
    assert [e.dtype for e in entries] == ["float32", "float64", "int32", "int64"]


def _bad_files() -> dict[str, tuple[bytes, str]]:
    good = encode_weights(_arrays())
    data_offset = struct.unpack_from("<Q", good, 32)[0]
    version = bytearray(good)
    struct.pack_into("<I", version, 8, FORMAT_VERSION + 1)
    flipped = bytearray(good)
    flipped[data_offset + 5] ^= 0x10
    out_of_range = bytearray(good)
    struct.pack_into("<Q", out_of_range, HEADER_BYTES + 16 + 8 * 4, 1 << 40)    # the first entry's offset
    unknown_dtype = bytearray(good)
    struct.pack_into("<I", unknown_dtype, HEADER_BYTES + 4, 99)
    return {
        "short header": (good[:40], "TRUNCATED"),
        "truncated data": (good[:-3], "TRUNCATED"),
        "wrong magic": (b"NOTFLOWC" + good[8:], "MAGIC"),
        "wrong version": (bytes(version), "VERSION"),
        "checksum": (bytes(flipped), "CHECKSUM"),
        "offset out of range": (_with_crc(out_of_range), "RANGE"),
        "unknown dtype": (_with_crc(unknown_dtype), "DTYPE"),
    }


@pytest.mark.parametrize("case", list(_bad_files()))
def test_each_bad_file_is_refused_with_its_kind(case):
    blob, kind = _bad_files()[case]
    with pytest.raises(WeightsError) as info:
        parse_weights(blob, "m.weights")
    assert info.value.kind == kind, (case, str(info.value))
    assert "m.weights" in str(info.value)


def test_a_dtype_without_a_code_is_refused_naming_the_variable():
    with pytest.raises(WeightsError, match="'c'.*complex64"):
        encode_weights({"c": np.zeros(2, np.complex64)})
    assert set(DTYPE_CODES) == {"float16", "float32", "float64", "int8", "uint8", "int32", "int64"}


def test_c_string_escapes_hostile_names_to_their_exact_bytes():
    name = 'a"b\\c??/\n*/é\x00'
    literal = c_string(name)
    assert literal.startswith('"') and literal.endswith('"')
    body = literal[1:-1]
    assert "\n" not in body and "??" not in body and "*/" in body     # "*/" is harmless inside a string
    # Decode the C escapes back: the literal spells exactly the UTF-8 bytes of the name.
    decoded, i = bytearray(), 0
    while i < len(body):
        if body[i] == "\\":
            if body[i + 1] in '"\\?':
                decoded.append(ord(body[i + 1]))
                i += 2
            else:
                decoded.append(int(body[i + 1:i + 4], 8))
                i += 4
        else:
            decoded.append(ord(body[i]))
            i += 1
    assert bytes(decoded) == name.encode("utf-8")


@pytest.mark.parametrize("prefix", ["lenet", "Model_2", "a"])
def test_prefix_accepted(prefix):
    assert check_prefix(prefix, "--prefix") == prefix


@pytest.mark.parametrize("prefix", ["_x", "a__b", "2net", "le-net", "prédire", "x" * 65, ""])
def test_prefix_refused_saying_what_to_pass(prefix):
    with pytest.raises(ExportError, match="--prefix NAME"):
        check_prefix(prefix, "--prefix")


def test_shared_scratch_is_found_in_kernel_bodies_only():
    assert shares_scratch("FLOWC_KERNEL void k() {\n  static std::vector<float> wpack(16);\n}")
    assert not shares_scratch("  static const std::vector<int> rows = f();\n"
                              "  static thread_local std::vector<float> p;\n"
                              "  static constexpr int k = 3;\n  x = static_cast<int>(y);")


def test_train_job_gpu_and_dynamic_inputs_are_refused_naming_the_job():
    @flow.global_function(type="train")
    def fit(x: tp.Numpy.Placeholder((2, 3), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    with pytest.raises(ExportError, match="job 'fit' is a train job"):
        check_exportable(fit, "cpu")

    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="predict", function_config=config)
    def ragged(x: tp.ListNumpy.Placeholder((8, 3), dtype=flow.float)) -> tp.ListNumpy:
        return flow.math.relu(x)

    with pytest.raises(ExportError, match="job 'ragged': input 'x' has a dynamic shape.*--dynamic-at-max"):
        check_exportable(ragged, "cpu")
    check_exportable(ragged, "cpu", dynamic_at_max=True)
    check_exportable(ragged, "gpu", dynamic_at_max=True)      # the GPU library: tests/test_export_cuda*.py


def test_values_missing_or_of_another_shape_are_refused_naming_the_variable():
    from flowc.compiler.export.exporter import weights_of
    from flowc.compiler.export.spec import ExportSpec, Tensor
    from flowc.compiler.ir import TensorType
    spec = ExportSpec("job", "job", [], [], [Tensor("w", "float32", (2, 3), 24)], 1, 0, 64, {}, False)
    declared = {"w": TensorType((2, 3), "float32")}
    with pytest.raises(ExportError, match="no value for variable 'w'.*job 'job'"):
        weights_of(spec, declared, {})
    with pytest.raises(ExportError, match=r"'w' is float64\[2, 3\].*reads float32\[2, 3\]"):
        weights_of(spec, declared, {"w": np.zeros((2, 3))})
    np.testing.assert_array_equal(weights_of(spec, declared, {"w": np.ones((2, 3), np.float32)})["w"], 1)
