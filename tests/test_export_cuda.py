"""`flowc export --device gpu --arch sm_90` on a machine without a GPU: the export writes the CPU
export's files, nvcc and the host compiler build them, the header keeps the CPU API (and adds the
device entry points), the library exports only that API and needs libcuda.so.1 and no CUDA
runtime, and, under a test double of the driver (tests/fake_libcuda.cpp), bad weights files get the
CPU library's codes and messages before the driver is touched, and failed driver calls are
ERR_CUDA naming the call and the CUresult.  The kernels' results: tests/test_export_cuda_emulated.py
(emulated) and tests/test_export_cuda_gpu.py (on a GPU).  nvcc builds: slow."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import flow
import flow.typing as tp
from flowc.compiler.codegen.sanitise import c_string
from flowc.compiler.export import ExportError, export_job
from flowc.compiler.export.cuda_export import GPU_ERROR_CODES
from flowc.compiler.export.render import render_sources
from flowc.compiler.export.weights import ERROR_CODES, read_weights
from tests.export_cuda_support import (EXAMPLES, build_emulated_kernels, build_fake_driver, fake_driver_env,
                                       lenet_job, needs_nvcc, run, seeded_values)

pytestmark = [pytest.mark.slow, needs_nvcc]

BATCH = 2


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export result, job, values, the fake driver's folder, the emulated kernels)."""
    base = tmp_path_factory.mktemp("export_cuda")
    job = lenet_job(BATCH)
    values = seeded_values(job)
    result = export_job(job, values, base / "lenet_gpu", prefix="lenet", device="gpu", arch="sm_90")
    source = (result.folder / "src" / "step.cu").read_text()
    kernels = re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))? (\w+)\(', source)
    emulated = build_emulated_kernels(source, base / "emulated", kernels)
    return result, job, values, build_fake_driver(base / "driver"), emulated


def test_the_export_writes_the_cpu_exports_files_and_embeds_an_sm90_fat_binary(exported):
    result, *_ = exported
    out = result.folder
    for name in ("liblenet.so", "liblenet.a", "lenet.h", "lenet.weights", "README.txt", "src/build.sh",
                 "src/step.cu", "src/kernels.fatbin", "src/lenet_api.cpp"):
        assert (out / name).is_file(), name
    assert not (out / "src" / "stub").exists(), "the driver's link stub is deleted after the link"
    fatbin = (out / "src" / "kernels.fatbin").read_bytes()
    assert fatbin[:4] == bytes([0x50, 0xED, 0x55, 0xBA])                   # a fat binary's magic
    if shutil.which("cuobjdump"):          # the toolkit's own reader: SASS for sm_90 and PTX of compute_90
        listing = run(["cuobjdump", "--list-elf", "--list-ptx", out / "src" / "kernels.fatbin"]).stdout
        assert "sm_90" in listing, listing
    build = (out / "src" / "build.sh").read_text()
    assert "-gencode=arch=compute_90,code=sm_90" in build and "-gencode=arch=compute_90,code=compute_90" in build
    # the fat binary is in the library, byte for byte (image.S's .incbin)
    assert fatbin in (out / "liblenet.so").read_bytes()
    readme = (out / "README.txt").read_text()
    assert "libcuda.so.1" in readme and "cc -O2 app.c -I. -L. -llenet" in readme
    np.testing.assert_array_equal(read_weights(result.weights)["dense2-bias"], exported[2]["dense2-bias"])


def _declarations(header: str) -> list[str]:
    """The API's declarations of a header, one string each (continuation lines joined)."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    return [" ".join(d.split()) for d in re.findall(r"^[A-Z0-9_]+_API [^;]*;", text, flags=re.M)]


def test_the_header_keeps_the_cpu_api_and_adds_the_device_entry_points(exported):
    result, *_ = exported
    gpu = result.header.read_text()
    cpu = render_sources(result.spec, "", "test")["lenet.h"]
    cpu_api, gpu_api = _declarations(cpu), _declarations(gpu)
    assert len(cpu_api) == 10 and set(cpu_api) <= set(gpu_api), set(cpu_api) - set(gpu_api)
    added = {re.search(r"(lenet_\w+)\(", d).group(1) for d in set(gpu_api) - set(cpu_api)}
    assert added == {"lenet_run_device", "lenet_create_from_file_on_device", "lenet_create_from_memory_on_device",
                     "lenet_context"}
    for name, code in ERROR_CODES.items():         # the same codes, the same numbers, the dtypes too
        assert f"LENET_ERR_{name} = {code}," in gpu and f"LENET_ERR_{name} = {code}," in cpu
    assert f"LENET_ERR_CUDA = {GPU_ERROR_CODES['CUDA']}," in gpu
    assert re.search(r"typedef struct \{.*?\} lenet_tensor_info;", cpu, re.S).group(0) in gpu
    assert "#define LENET_SERIALIZED 0" in gpu and "#define LENET_GPU 1" in gpu
    for words in ("cuGetErrorName", "primary context", "one model instance per thread", "CRC-32", "sm_90"):
        assert words in gpu, words


ALLOWED_NEEDED = {"libcuda.so.1", "libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6",
                  "ld-linux-x86-64.so.2"}


def test_the_library_exports_only_the_api_and_needs_the_driver_not_the_cuda_runtime(exported):
    result, *_ = exported
    lib = result.shared_library
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", lib]).stdout))
    assert "libcuda.so.1" in needed and needed <= ALLOWED_NEEDED, needed
    defined = run(["nm", "-D", "--defined-only", lib]).stdout.split()[2::3]
    assert defined and all(s.startswith("lenet_") for s in defined), defined
    undefined = run(["nm", "-D", "--undefined-only", lib]).stdout
    driver = set(re.findall(r"\b(cu[A-Z]\w*)", undefined))
    assert {"cuInit", "cuModuleLoadData", "cuLaunchKernel", "cuMemAlloc_v2", "cuGetErrorName"} <= driver, driver
    assert not re.search(r"\bcuda[A-Z]\w*", undefined), "a CUDA runtime (cudart) symbol"
    assert not any(w in undefined for w in ("Py", "numpy", "cffi", "omp_", "GOMP")), undefined


def test_a_c_program_written_for_the_cpu_library_builds_against_the_gpu_one(exported, tmp_path):
    result, _job, _values, driver, _kernels = exported
    out = result.folder
    run(["cc", "-std=c99", "-O2", "-Wall", "-Werror", EXAMPLES / "predict.c", f"-I{out}", f"-L{out}", "-llenet",
         f"-Wl,-rpath,{out}", f"-Wl,-rpath-link,{driver}", "-o", tmp_path / "predict"])
    # and the static library, with the driver
    run(["cc", "-std=c99", "-O2", EXAMPLES / "predict.c", f"-I{out}", out / "liblenet.a", f"-L{driver}",
         "-l:libcuda.so.1", "-lstdc++", "-lm", "-o", tmp_path / "predict_static"])


def _probe(result, driver: Path, kernels: Path, blobs: dict[str, bytes], folder: Path, device: int = 0,
           **env: str) -> dict[str, dict]:
    """case -> {code, message, counts} from tests/export_cuda_probe.py under the fake driver."""
    paths = []
    for case, blob in blobs.items():
        path = folder / f"{len(paths)}.weights"
        path.write_bytes(blob)
        paths.append((case, path))
    proc = run([sys.executable, "-m", "tests.export_cuda_probe", result.shared_library, "lenet", device,
                *(p for _, p in paths)], env=fake_driver_env(driver, kernels, **env))
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return {case: row for (case, _), row in zip(paths, rows)}


def test_bad_weights_get_the_cpu_librarys_codes_and_messages_before_the_driver_is_touched(exported, tmp_path):
    from tests.test_export_lenet import _bad_weights
    result, _job, values, driver, kernels = exported
    good = result.weights.read_bytes()
    cases = _bad_weights(good, read_weights(result.weights))
    rows = _probe(result, driver, kernels, {"good": good, **{c: blob for c, (blob, _, _) in cases.items()}}, tmp_path)
    assert rows["good"]["code"] == 0 and rows["good"]["message"] == "", rows["good"]
    # destroy gave back every allocation, the module, the stream and the retained context; no launch ran
    assert rows["good"]["counts"] == [0, 0, 0, 0, 0], rows["good"]
    for case, (_blob, kind, words) in cases.items():
        row = rows[case]
        assert row["code"] == ERROR_CODES[kind], (case, row)
        assert row["message"].startswith("weights in memory: ") and all(w in row["message"] for w in words), row
        assert row["model_left"] is None and row["counts"] == [0, 0, 0, 0, 0], row


def test_a_failed_driver_call_is_err_cuda_naming_the_call_and_the_curesult(exported, tmp_path):
    result, _job, _values, driver, kernels = exported
    good = {"good": result.weights.read_bytes()}
    cuda = GPU_ERROR_CODES["CUDA"]
    row = _probe(result, driver, kernels, good, tmp_path, FLOWC_FAKE_CUDA_FAIL="cuMemAlloc")["good"]
    assert row["code"] == cuda and row["model_left"] is None, row
    assert row["message"] == "cuMemAlloc (the arena) failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", row
    assert row["counts"] == [0, 0, 0, 0, 0], "a failed create frees what it made"
    row = _probe(result, driver, kernels, good, tmp_path, FLOWC_FAKE_CUDA_FAIL="cuInit")["good"]
    assert (row["code"], row["message"]) == (cuda, "cuInit failed: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable "
                                                   "device is detected"), row
    row = _probe(result, driver, kernels, good, tmp_path, device=1)["good"]
    assert row["code"] == cuda and row["message"].startswith("cuDeviceGet(1) failed: CUDA_ERROR_INVALID_DEVICE"), row
    row = _probe(result, driver, kernels, good, tmp_path, device=1, FLOWC_FAKE_CUDA_DEVICES="2")["good"]
    assert row["code"] == 0 and row["counts"] == [0, 0, 0, 0, 0], row
    row = _probe(result, driver, kernels, good, tmp_path, device=-1)["good"]
    assert row["code"] == ERROR_CODES["ARGUMENT"] and "device is -1" in row["message"], row


HOSTILE_JOB = 'évil"\\\n*/job'
HOSTILE_VARIABLE = 'w"*\\n\n??=é\t}'


def test_hostile_names_reach_the_gpu_sources_only_escaped_or_sanitised(tmp_path):
    def predict(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float)) -> tp.Numpy:
        w = flow.get_variable(HOSTILE_VARIABLE, shape=(3, 5), initializer=flow.random_normal_initializer())
        return flow.math.relu(flow.matmul(x, w))
    predict.__name__ = HOSTILE_JOB
    job = flow.global_function(type="predict")(predict)
    values = {HOSTILE_VARIABLE: np.ones((3, 5), np.float32)}
    with pytest.raises(ExportError, match="cannot start C symbol names: give --prefix NAME"):
        export_job(job, values, tmp_path / "refused", device="gpu", arch="sm_90")
    result = export_job(job, values, tmp_path / "out", prefix="hostile", device="gpu", arch="sm_90")
    for path in (result.header, result.folder / "src" / "hostile_api.cpp", result.folder / "src" / "image.S"):
        assert "\n*/job" not in path.read_text() and "??=" not in path.read_text(), path
    # the variable's name is an escaped literal (the loader compares it byte for byte), the job's a comment
    api = (result.folder / "src" / "hostile_api.cpp").read_text()
    assert c_string(HOSTILE_VARIABLE) in api and HOSTILE_VARIABLE not in api
    assert read_weights(result.weights).keys() == {HOSTILE_VARIABLE}


def test_an_unknown_arch_and_a_labels_check_are_refused_naming_them(tmp_path):
    job = lenet_job(BATCH)
    with pytest.raises(ExportError, match=r"--arch: GPU arch 'hopper' is not of the form sm_XY"):
        export_job(job, seeded_values(job), tmp_path / "a", prefix="lenet", device="gpu", arch="hopper")

    def scored(x: tp.Numpy.Placeholder((4, 3), dtype=flow.float),
               labels: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 5), initializer=flow.random_normal_initializer())
        return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, flow.matmul(x, w))
    job = flow.global_function(type="predict")(scored)
    with pytest.raises(ExportError, match="job 'scored' reads labels that the Python runtime checks"):
        export_job(job, {"w": np.ones((3, 5), np.float32)}, tmp_path / "b", device="gpu", arch="sm_90")


def test_the_cli_exports_for_the_gpu(tmp_path):
    module = tmp_path / "tiny.py"
    module.write_text(
        "import flow\nimport flow.typing as tp\n\n\n"
        "@flow.global_function(type='predict')\n"
        "def tiny(x: tp.Numpy.Placeholder((2, 3), dtype=flow.float)) -> tp.Numpy:\n"
        "    w = flow.get_variable('w', shape=(3, 4), initializer=flow.random_normal_initializer())\n"
        "    return flow.math.tanh(flow.matmul(x, w))\n")
    ckpt = tmp_path / "ckpt"
    run([sys.executable, "-c", f"import runpy, flow, numpy as np; m = runpy.run_path({str(module)!r}); "
                               f"m['tiny'](np.zeros((2, 3), np.float32)); flow.checkpoint.save({str(ckpt)!r})"],
        env={"PYTHONPATH": str(EXAMPLES.parents[1])})
    out = tmp_path / "tiny_gpu"
    proc = run([sys.executable, "-m", "flowc", "export", f"{module}:tiny", "--checkpoint", ckpt, "-o", out,
                "--device", "gpu", "--arch", "sm_90"], env={"PYTHONPATH": str(EXAMPLES.parents[1])})
    assert f"wrote {out / 'libtiny.so'}" in proc.stdout
    assert "tiny_run_device" in (out / "tiny.h").read_text()
    proc = run([sys.executable, "-m", "flowc", "export", f"{module}:tiny", "--checkpoint", ckpt, "-o",
                tmp_path / "other", "--device", "gpu", "--arch", "sm9"], env={"PYTHONPATH": str(EXAMPLES.parents[1])},
               check=False)
    assert proc.returncode != 0 and "--arch: GPU arch 'sm9' is not of the form sm_XY" in proc.stderr, proc.stderr
